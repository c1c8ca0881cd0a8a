package dispatch

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
)

// TestUnitH2CRequestHeaderMatchesHTTP1: the fields an h2c app receives are
// those an HTTP/1.1 app receives for the same request (hop-by-hop fields,
// '_' names and untrusted forwarding claims dropped; the listener's
// X-Forwarded-* and Forwarded added, trusted prior values kept first),
// except TE: trailers, which passes, and the framing that each protocol
// writes itself.
func TestUnitH2CRequestHeaderMatchesHTTP1(t *testing.T) {
	lines := []string{
		"X-Custom: a", "X-Custom: b", "Accept: text/html", "Cookie: a=1",
		"TE: trailers", "Keep-Alive: 5", "Proxy-Authorization: secret", "Trailer: X-T", "Upgrade: h2c",
		"X_Custom: underscore", "Transfer_Encoding: chunked",
		"X-Forwarded-For: 198.51.100.1", "X-Forwarded-For: 198.51.100.2", "Forwarded: for=198.51.100.1",
		"X-Forwarded-Proto: http", "X-Real-IP: 198.51.100.9", "X-Applistener-User: mallory",
		"X-Forwarded-Client-Cert: cert", "User-Agent: test/1",
		"X-Request-Id: client-claim", "X_Request_Id: alias", "X-Forwarded-Port: 9443",
	}
	for _, tc := range []struct {
		name        string
		trusted     bool
		underscores bool
		client      string
	}{
		{"untrusted", false, false, "203.0.113.7"},
		{"trusted", true, false, "203.0.113.7"},
		{"underscores allowed", false, true, "203.0.113.7"},
		{"IPv6 client", true, false, "2001:db8::7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newFI := func() *forwardInfo {
				return &forwardInfo{client: netip.MustParseAddr(tc.client), trusted: tc.trusted, publicHost: testHost,
					backendHost: "127.0.0.1:8080", allowUnderscore: tc.underscores, publicPort: 8443,
					requestID: []byte("0af7651916cd43dd8448eb211c80319c")}
			}
			fi1 := newFI()
			_, fields, _, _ := forward(t, get(lines...), fi1)
			h1 := http.Header{}
			for _, f := range fields {
				k := textproto.CanonicalMIMEHeaderKey(f[0])
				if k == "Host" {
					continue
				}
				h1[k] = append(h1[k], f[1])
			}

			var src []h2engine.HeaderField
			for _, l := range lines {
				name, value, _ := strings.Cut(l, ": ")
				src = append(src, h2engine.HeaderField{Name: strings.ToLower(name), Value: value})
			}
			fi2 := newFI()
			h2 := http.Header{}
			for _, f := range h2cRequestFields(nil, src, fi2, 0, nil) {
				if f.Name != strings.ToLower(f.Name) {
					t.Errorf("field name %q not lowercase", f.Name)
				}
				k := textproto.CanonicalMIMEHeaderKey(f.Name)
				h2[k] = append(h2[k], f.Value)
			}
			if fi1.dropped != fi2.dropped {
				t.Errorf("dropped %d fields, HTTP/1.1 %d", fi2.dropped, fi1.dropped)
			}
			if got := h2["Te"]; !slices.Equal(got, []string{"trailers"}) {
				t.Errorf("TE %q, want trailers", got)
			}
			delete(h2, "Te")
			for k, v := range h1 {
				// HTTP/2 has one list per name; HTTP/1.1 may repeat lines.
				if got := h2.Values(k); strings.Join(got, ", ") != strings.Join(v, ", ") {
					t.Errorf("%s: h2c %q, HTTP/1.1 %q", k, got, v)
				}
			}
			for k := range h2 {
				if _, ok := h1[textproto.CanonicalMIMEHeaderKey(k)]; !ok {
					t.Errorf("%s: %q sent to the h2c app only", k, h2[k])
				}
			}
			// The request's id replaces the client's (and its '_' alias);
			// the public port is the trusted peer's, else the client's.
			port := "8443"
			if tc.trusted {
				port = "9443"
			}
			for k, want := range map[string]string{"X-Request-Id": "0af7651916cd43dd8448eb211c80319c",
				"X-Forwarded-Port": port, "X-Forwarded-Host": testHost + ":" + port} {
				if got := h1[k]; !slices.Equal(got, []string{want}) {
					t.Errorf("%s %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestUnitH2CClientFields: the rules h2cClientFields applies to an h2c
// app's response head and trailers, each by itself.
func TestUnitH2CClientFields(t *testing.T) {
	s := New(Config{})
	bp := &backendPool{port: 8080, hostHeader: "127.0.0.1:8080"}
	in := []hpack.HeaderField{
		{Name: "content-type", Value: "application/grpc"},
		{Name: "content-length", Value: "5"},
		{Name: "trailer", Value: "grpc-status"},
		{Name: "connection", Value: "close"},
		{Name: "keep-alive", Value: "timeout=5"},
		{Name: "te", Value: "trailers"},
		{Name: "proxy", Value: "http://evil.example"},
		{Name: "proxy-authenticate", Value: "Basic"},
		{Name: "transfer-encoding", Value: "chunked"},
		{Name: "upgrade", Value: "h2c"},
		{Name: "X-Request-Id", Value: "app-chosen"},
		{Name: "host", Value: "evil.example"},
		{Name: "Set-Cookie", Value: "a=1; Domain=apps.test"},
		{Name: "location", Value: "http://127.0.0.1:8080/next"},
		{Name: "x-app", Value: "kept"},
	}
	str := func(fs []h2engine.HeaderField) string {
		var b strings.Builder
		for _, f := range fs {
			fmt.Fprintf(&b, "%s=%s|", f.Name, f.Value)
		}
		return b.String()
	}
	prefix := []h2engine.HeaderField{{Name: "before", Value: "1"}}
	head := s.h2cClientFields(prefix, in, false, "team--demo--plain.apps.test", 0, bp)
	if got, want := str(head), "before=1|content-type=application/grpc|content-length=5|host=evil.example|x-app=kept|set-cookie=a=1|location=https://team--demo--plain.apps.test/next|"; got != want {
		t.Errorf("head:\n got %s\nwant %s", got, want)
	}
	trailers := s.h2cClientFields(nil, in, true, "team--demo--plain.apps.test", 0, bp)
	if got, want := str(trailers), "content-type=application/grpc|x-app=kept|set-cookie=a=1|location=https://team--demo--plain.apps.test/next|"; got != want {
		t.Errorf("trailers:\n got %s\nwant %s", got, want)
	}
}

// TestUnitH2CConnectionNamedResponseField: a field that an h2c app's
// Connection names is hop-by-hop and does not reach the client, as for
// HTTP/1.1 apps.
func TestUnitH2CConnectionNamedResponseField(t *testing.T) {
	s := New(Config{})
	bp := &backendPool{port: 8080, hostHeader: "127.0.0.1:8080"}
	in := []hpack.HeaderField{{Name: "connection", Value: "x-hop, X-Other"}, {Name: "x-hop", Value: "secret"}, {Name: "x-other", Value: "o"}, {Name: "x-app", Value: "kept"}}
	out := s.h2cClientFields(nil, in, false, "team--demo--plain.apps.test", 0, bp)
	if len(out) != 1 || out[0].Name != "x-app" {
		t.Errorf("fields %v reached the client; want x-app only", out)
	}
}

// TestUnitH2CRequestFields: what h2cRequestFields does beyond the rules
// shared with HTTP/1.1 apps (TestUnitH2CRequestHeaderMatchesHTTP1): the
// client's fields keep their order; cookie crumbs become one field, where
// the first one was, with the listener's access cookie taken out; TE
// passes only as exactly one "trailers"; the request's id and a gRPC
// deadline are never indexed; the body's length and the declared
// trailers follow the listener's fields.
func TestUnitH2CRequestFields(t *testing.T) {
	fi := &forwardInfo{client: netip.MustParseAddr("203.0.113.7"), publicHost: testHost, backendHost: "127.0.0.1:8080",
		publicPort: 443, requestID: []byte("0af7651916cd43dd8448eb211c80319c"), access: &accessForward{user: "alice"}}
	src := []h2engine.HeaderField{
		{Name: "content-type", Value: "application/grpc"},
		{Name: "cookie", Value: "a=1"},
		{Name: "grpc-timeout", Value: "5S"},
		{Name: "te", Value: "trailers"},
		{Name: "cookie", Value: accessCookie + "=secret"},
		{Name: "x-b", Value: "2"},
		{Name: "cookie", Value: "c=3"},
		{Name: "x-a", Value: "1"},
	}
	got := h2cRequestFields(nil, src, fi, 12, []string{"X-Checksum"})
	var lines []string
	for _, f := range got {
		l := f.Name + ": " + f.Value
		if f.Sensitive {
			l += " (never indexed)"
		}
		lines = append(lines, l)
	}
	want := []string{
		"content-type: application/grpc",
		"cookie: a=1; c=3",
		"grpc-timeout: 5S (never indexed)",
		"x-b: 2",
		"x-a: 1",
		"te: trailers",
		"x-forwarded-for: 203.0.113.7",
		"x-forwarded-proto: https",
		"x-forwarded-host: " + testHost,
		"x-forwarded-port: 443",
		"forwarded: for=203.0.113.7;host=" + testHost + ";proto=https",
		"x-request-id: 0af7651916cd43dd8448eb211c80319c (never indexed)",
		"x-forwarded-user: alice",
		"content-length: 12",
		"trailer: X-Checksum",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("fields\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	// Two TE fields, or one that is not "trailers": none passes. Only the
	// access cookie: no cookie field at all.
	for _, te := range [][]h2engine.HeaderField{
		{{Name: "te", Value: "trailers"}, {Name: "te", Value: "trailers"}},
		{{Name: "te", Value: "gzip"}},
		{{Name: "cookie", Value: accessCookie + "=secret"}},
	} {
		for _, f := range h2cRequestFields(nil, te, fi, 0, nil) {
			if f.Name == "te" || f.Name == "cookie" {
				t.Errorf("%v: %s: %s sent", te, f.Name, f.Value)
			}
		}
	}
}
