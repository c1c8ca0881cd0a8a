package dispatch

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// forward parses h and returns the head appendRequestHead produces, after
// proving it well-formed with net/http.
func forward(t *testing.T, h []byte, fi *forwardInfo) (start string, fields [][2]string, req *http.Request, r *request) {
	t.Helper()
	r = new(request)
	if err := parseRequestHead(r, h, 100); err != nil {
		t.Fatalf("parseRequestHead(%q): %v", h, err)
	}
	out := appendRequestHead(nil, r, fi)
	start, fields = headerLines(t, out)
	hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(out)))
	if err != nil {
		t.Fatalf("net/http cannot read the forwarded head %q: %v", out, err)
	}
	if hr.ProtoMajor != 1 || hr.ProtoMinor != 1 {
		t.Errorf("forwarded as %s; want HTTP/1.1", hr.Proto)
	}
	if n := len(values(fields, "Host")); n != 1 {
		t.Errorf("forwarded head has %d Host lines: %q", n, out)
	}
	return start, fields, hr, r
}

func untrusted() *forwardInfo {
	return &forwardInfo{
		client:      netip.MustParseAddr("203.0.113.7"),
		publicHost:  testHost,
		backendHost: "127.0.0.1:8080",
	}
}

func trustedFI() *forwardInfo {
	fi := untrusted()
	fi.trusted = true
	return fi
}

var hopByHopNames = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"TE", "Trailer", "Transfer-Encoding", "Upgrade",
}

var forwardingNames = []string{
	"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Real-IP",
	"X-Forwarded-Client-Cert", "X-SSL-Client-Cert", "X-Client-Cert",
}

func TestUnitAppendRequestHeadHopByHop(t *testing.T) {
	h := get(
		"Connection: keep-alive, X-Secret, x-other",
		"X-Secret: s1",
		"x-SECRET: s2",
		"X-Other: o",
		"Keep-Alive: timeout=5",
		"Proxy-Connection: keep-alive",
		"Proxy-Authorization: Basic Zm9vOmJhcg==",
		"Proxy-Authenticate: Basic",
		"TE: trailers",
		"Trailer: X-Checksum",
		"Upgrade: h2c",
		"Authorization: Bearer abc.def.ghi",
		"Cookie: a=1",
		"Cookie: b=2",
		"X-Kept: yes",
	)
	start, fields, hr, _ := forward(t, h, untrusted())
	if start != "GET / HTTP/1.1" {
		t.Errorf("request line = %q", start)
	}
	for _, name := range append(hopByHopNames, "X-Secret", "X-Other") {
		if v := values(fields, name); len(v) > 0 {
			t.Errorf("hop-by-hop %s forwarded: %q", name, v)
		}
	}
	if got := values(fields, "Authorization"); !slices.Equal(got, []string{"Bearer abc.def.ghi"}) {
		t.Errorf("Authorization = %q", got)
	}
	if got := values(fields, "Cookie"); !slices.Equal(got, []string{"a=1", "b=2"}) {
		t.Errorf("Cookie = %q", got)
	}
	if got := hr.Header.Get("X-Kept"); got != "yes" {
		t.Errorf("X-Kept = %q", got)
	}
	if hr.Host != "127.0.0.1:8080" {
		t.Errorf("Host = %q; want 127.0.0.1:8080", hr.Host)
	}
	if hr.ContentLength != 0 || len(hr.TransferEncoding) != 0 {
		t.Errorf("GET forwarded with a body: CL=%d TE=%q", hr.ContentLength, hr.TransferEncoding)
	}
}

func TestUnitAppendRequestHeadHost(t *testing.T) {
	h := head("GET http://"+testHost+"/p?q=1 HTTP/1.1", "Host: "+strings.ToUpper(testHost)+":443")
	start, fields, hr, _ := forward(t, h, untrusted())
	if start != "GET /p?q=1 HTTP/1.1" {
		t.Errorf("request line = %q; want origin-form", start)
	}
	if got := values(fields, "Host"); !slices.Equal(got, []string{"127.0.0.1:8080"}) {
		t.Errorf("Host = %q", got)
	}
	if got := hr.Header.Get("X-Forwarded-Host"); got != testHost {
		t.Errorf("X-Forwarded-Host = %q; want %q", got, testHost)
	}
	// With preserve, the client's Host goes to the app exactly as sent,
	// port included.
	fi := untrusted()
	fi.preserve = true
	for _, host := range []string{strings.ToUpper(testHost) + ":443", testHost + ":8443", testHost} {
		_, fields, hr, _ = forward(t, head("GET /p HTTP/1.1", "Host: "+host), fi)
		if got := values(fields, "Host"); !slices.Equal(got, []string{host}) {
			t.Errorf("preserve: Host = %q; want %q", got, host)
		}
		if hr.Host != host {
			t.Errorf("preserve: net/http Host = %q; want %q", hr.Host, host)
		}
		if got := hr.Header.Get("X-Forwarded-Host"); got != testHost {
			t.Errorf("preserve: X-Forwarded-Host = %q; want %q", got, testHost)
		}
	}
	// OPTIONS * stays in asterisk-form.
	start, _, _, _ = forward(t, head("OPTIONS * HTTP/1.1", "Host: "+testHost), untrusted())
	if start != "OPTIONS * HTTP/1.1" {
		t.Errorf("request line = %q", start)
	}
	// HTTP/1.0 is forwarded as HTTP/1.1.
	start, _, _, _ = forward(t, head("GET /old HTTP/1.0", "Host: "+testHost), untrusted())
	if start != "GET /old HTTP/1.1" {
		t.Errorf("request line = %q", start)
	}
}

func clientClaims() []string {
	return []string{
		"X-Forwarded-For: 10.9.9.9",
		"X-Forwarded-Proto: http",
		"X-Forwarded-Host: evil.test",
		"Forwarded: for=10.9.9.9;host=evil.test;proto=http",
		"X-Real-IP: 10.9.9.9",
		"X-Forwarded-Client-Cert: Hash=abc;Subject=\"CN=admin\"",
		"X-SSL-Client-Cert: -----BEGIN CERTIFICATE-----",
		"X-Client-Cert: admin",
		"X-Applistener-User: admin",
		"x-applistener-role: root",
		"X-Applistener-: empty suffix",
	}
}

func TestUnitAppendRequestHeadUntrustedClaims(t *testing.T) {
	h := get(append(clientClaims(), "X-Applistene: kept")...)
	_, fields, _, _ := forward(t, h, untrusted())
	for _, name := range forwardingNames {
		var want []string
		switch name {
		case "X-Forwarded-For":
			want = []string{"203.0.113.7"}
		case "X-Forwarded-Proto":
			want = []string{"https"}
		case "X-Forwarded-Host":
			want = []string{testHost}
		case "Forwarded":
			want = []string{"for=203.0.113.7;host=" + testHost + ";proto=https"}
		}
		if got := values(fields, name); !slices.Equal(got, want) {
			t.Errorf("%s = %q; want %q", name, got, want)
		}
	}
	for _, f := range fields {
		if strings.HasPrefix(strings.ToLower(f[0]), "x-applistener-") {
			t.Errorf("client's %s forwarded", f[0])
		}
	}
	if got := values(fields, "X-Applistene"); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("X-Applistene = %q", got)
	}
}

// TestUnitAppendRequestHeadUnderscoreClaims: CGI-style servers (WSGI, Rack,
// PHP-FPM) map both "X-Forwarded-For" and "X_Forwarded_For" to
// HTTP_X_FORWARDED_FOR, so an untrusted client can spoof a forwarding claim
// by spelling it with underscores. nginx drops such fields by default
// (underscores_in_headers off). The contract "values sent by the client are
// dropped unless the peer is a trusted proxy" must hold for these spellings.
func TestUnitAppendRequestHeadUnderscoreClaims(t *testing.T) {
	h := get(
		"X_Forwarded_For: 10.9.9.9",
		"X-Forwarded_Proto: http",
		"X_Real_IP: 10.9.9.9",
		"X_Applistener_User: admin",
		"X_Forwarded_Client_Cert: Subject=\"CN=admin\"",
	)
	_, fields, _, _ := forward(t, h, untrusted())
	for _, f := range fields {
		cgi := strings.ToLower(strings.ReplaceAll(f[0], "_", "-"))
		if strings.Contains(f[0], "_") && forwardingHeader([]byte(cgi)) {
			t.Errorf("untrusted client's %q (CGI name HTTP_%s) reached the app: %q",
				f[0], strings.ToUpper(strings.ReplaceAll(cgi, "-", "_")), f[1])
		}
	}
}

// TestUnitAppendRequestHeadOtherForwardingClaims: the rest of the
// X-Forwarded-* family is read by the same framework code that reads
// X-Forwarded-For/Proto/Host once the app trusts its proxy (and this
// listener is the app's only hop): Rack (X-Forwarded-Port, -Ssl, -Scheme),
// Werkzeug ProxyFix (X-Forwarded-Port, -Prefix), Spring
// ForwardedHeaderFilter (X-Forwarded-Port, -Prefix, -Ssl). Passed through
// from an untrusted client, they let it choose the port and path prefix of
// every URL the app generates (redirects, cached pages).
func TestUnitAppendRequestHeadOtherForwardingClaims(t *testing.T) {
	claims := []string{"X-Forwarded-Port: 1337", "X-Forwarded-Prefix: /evil", "X-Forwarded-Ssl: off", "X-Forwarded-Scheme: http"}
	_, fields, _, _ := forward(t, get(claims...), untrusted())
	for _, c := range claims {
		name, _, _ := strings.Cut(c, ":")
		if v := values(fields, name); len(v) > 0 {
			t.Errorf("untrusted client's %s forwarded: %q", name, v)
		}
	}
	// A trusted proxy's values pass.
	_, fields, _, _ = forward(t, get(claims...), trustedFI())
	if v := values(fields, "X-Forwarded-Prefix"); len(v) != 1 {
		t.Errorf("trusted proxy's X-Forwarded-Prefix = %q", v)
	}
}

func TestUnitAppendRequestHeadTrustedClaims(t *testing.T) {
	h := get(append(clientClaims(), "X-Forwarded-For: 10.8.8.8, 10.7.7.7", "Forwarded: for=10.8.8.8")...)
	_, fields, hr, _ := forward(t, h, trustedFI())
	want := map[string][]string{
		"X-Forwarded-For":         {"10.9.9.9, 10.8.8.8, 10.7.7.7, 203.0.113.7"},
		"X-Forwarded-Proto":       {"http"},
		"X-Forwarded-Host":        {"evil.test"},
		"Forwarded":               {"for=10.9.9.9;host=evil.test;proto=http, for=10.8.8.8, for=203.0.113.7;host=" + testHost + ";proto=https"},
		"X-Real-IP":               {"10.9.9.9"},
		"X-Forwarded-Client-Cert": {"Hash=abc;Subject=\"CN=admin\""},
		"X-SSL-Client-Cert":       {"-----BEGIN CERTIFICATE-----"},
		"X-Client-Cert":           {"admin"},
		"X-Applistener-User":      {"admin"},
		"X-Applistener-Role":      {"root"},
	}
	for name, w := range want {
		if got := values(fields, name); !slices.Equal(got, w) {
			t.Errorf("%s = %q; want %q", name, got, w)
		}
	}
	if hr.Host != "127.0.0.1:8080" {
		t.Errorf("Host = %q", hr.Host)
	}
	// A trusted proxy that sends no claims gets the listener's own.
	_, fields, _, _ = forward(t, get(), trustedFI())
	if got := values(fields, "X-Forwarded-For"); !slices.Equal(got, []string{"203.0.113.7"}) {
		t.Errorf("XFF = %q", got)
	}
	if got := values(fields, "X-Forwarded-Proto"); !slices.Equal(got, []string{"https"}) {
		t.Errorf("XFP = %q", got)
	}
}

func TestUnitAppendRequestHeadIPv6(t *testing.T) {
	for _, tc := range []struct {
		addr, xff, fwd string
	}{
		{"::1", "::1", `for="[::1]"`},
		{"2001:db8::7", "2001:db8::7", `for="[2001:db8::7]"`},
		{"192.0.2.1", "192.0.2.1", "for=192.0.2.1"},
	} {
		fi := untrusted()
		fi.client = netip.MustParseAddr(tc.addr)
		_, fields, _, _ := forward(t, get(), fi)
		if got := values(fields, "X-Forwarded-For"); !slices.Equal(got, []string{tc.xff}) {
			t.Errorf("%s: XFF = %q", tc.addr, got)
		}
		if got := values(fields, "Forwarded"); len(got) != 1 || !strings.HasPrefix(got[0], tc.fwd+";") {
			t.Errorf("%s: Forwarded = %q; want prefix %q", tc.addr, got, tc.fwd)
		}
	}
}

func TestUnitAppendRequestHeadBody(t *testing.T) {
	tests := []struct {
		name   string
		head   []byte
		cl     []string
		te     []string
		hrCL   int64
		hrTE   []string
		noBody bool
	}{
		{"CL", head("POST / HTTP/1.1", "Host: "+testHost, "content-length: 0012"), []string{"12"}, nil, 12, nil, false},
		{"chunked", head("POST / HTTP/1.1", "Host: "+testHost, "Transfer-Encoding:  chunked "), nil, []string{"chunked"}, -1, []string{"chunked"}, false},
		// RFC 9110 §8.6: a POST/PUT/PATCH without content still carries
		// "Content-Length: 0" (Go's Transport, nginx and HAProxy keep it);
		// some servers answer 411 Length Required without it.
		{"POST CL 0", head("POST / HTTP/1.1", "Host: "+testHost, "Content-Length: 0"), []string{"0"}, nil, 0, nil, true},
		{"PUT CL 00", head("PUT / HTTP/1.1", "Host: "+testHost, "Content-Length: 00"), []string{"0"}, nil, 0, nil, true},
		{"none", get(), nil, nil, 0, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, fields, hr, _ := forward(t, tc.head, untrusted())
			if got := values(fields, "Content-Length"); !slices.Equal(got, tc.cl) {
				t.Errorf("Content-Length lines = %q; want %q", got, tc.cl)
			}
			if got := values(fields, "Transfer-Encoding"); !slices.Equal(got, tc.te) {
				t.Errorf("Transfer-Encoding lines = %q; want %q", got, tc.te)
			}
			if hr.ContentLength != tc.hrCL || !slices.Equal(hr.TransferEncoding, tc.hrTE) {
				t.Errorf("net/http sees CL=%d TE=%q; want %d %q", hr.ContentLength, hr.TransferEncoding, tc.hrCL, tc.hrTE)
			}
		})
	}
}

func TestUnitAppendRequestHeadWebSocket(t *testing.T) {
	h := get(
		"Connection: keep-alive, Upgrade",
		"Upgrade: websocket",
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
		"Sec-WebSocket-Version: 13",
		"Sec-WebSocket-Protocol: chat",
		"Origin: https://"+testHost,
	)
	_, fields, hr, _ := forward(t, h, untrusted())
	if got := values(fields, "Connection"); !slices.Equal(got, []string{"Upgrade"}) {
		t.Errorf("Connection = %q", got)
	}
	if got := values(fields, "Upgrade"); !slices.Equal(got, []string{"websocket"}) {
		t.Errorf("Upgrade = %q", got)
	}
	for _, name := range []string{"Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Protocol", "Origin"} {
		if hr.Header.Get(name) == "" {
			t.Errorf("%s not forwarded", name)
		}
	}
	if hr.Host != "127.0.0.1:8080" {
		t.Errorf("WebSocket Host = %q; want the backend host", hr.Host)
	}
	// Not a WebSocket: h2c upgrade is stripped entirely.
	_, fields, _, _ = forward(t, get("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABk"), untrusted())
	for _, name := range []string{"Connection", "Upgrade", "HTTP2-Settings"} {
		if v := values(fields, name); len(v) > 0 {
			t.Errorf("h2c upgrade: %s forwarded: %q", name, v)
		}
	}
}

func TestUnitAppendRequestHeadAppends(t *testing.T) {
	var r request
	if err := parseRequestHead(&r, get(), 100); err != nil {
		t.Fatal(err)
	}
	out := appendRequestHead([]byte("PREFIX"), &r, untrusted())
	if !bytes.HasPrefix(out, []byte("PREFIXGET / HTTP/1.1\r\n")) {
		t.Errorf("appendRequestHead does not append: %q", out)
	}
}

func TestUnitAppendRequestHeadAllocs(t *testing.T) {
	var r request
	if err := parseRequestHead(&r, benchBrowserHead(), 100); err != nil {
		t.Fatal(err)
	}
	fi := untrusted()
	// With the public port and the request id, as every request has them.
	var id requestID
	id.generate()
	fi.publicPort, fi.requestID = 8443, id.bytes()
	dst := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		dst = appendRequestHead(dst[:0], &r, fi)
	})
	if allocs != 0 {
		t.Errorf("appendRequestHead allocates %.1f times per request; want 0", allocs)
	}
}

func TestUnitHopByHopAndForwardingHeader(t *testing.T) {
	for _, n := range append(hopByHopNames, "content-length", "CONTENT-LENGTH", "te", "keep-ALIVE") {
		if !hopByHop([]byte(n)) {
			t.Errorf("hopByHop(%q) = false", n)
		}
	}
	for _, n := range []string{"Host", "Cookie", "Authorization", "Connectio", "Connections", "TEx", "Upgrade-Insecure-Requests", "Trailers", ""} {
		if hopByHop([]byte(n)) {
			t.Errorf("hopByHop(%q) = true", n)
		}
	}
	for _, n := range append(forwardingNames, "x-forwarded-for", "X-APPLISTENER-ANYTHING", "x-applistener-") {
		if !forwardingHeader([]byte(n)) {
			t.Errorf("forwardingHeader(%q) = false", n)
		}
	}
	for _, n := range []string{"X-Forwarded", "X-Applistener", "X-Real-IPs", "Forward", "Cookie", ""} {
		if forwardingHeader([]byte(n)) {
			t.Errorf("forwardingHeader(%q) = true", n)
		}
	}
}

// --- responses ---
