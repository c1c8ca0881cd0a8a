package dispatch

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
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
	fi := untrusted()
	fi.preserve = true
	_, fields, hr, _ = forward(t, h, fi)
	if got := values(fields, "Host"); !slices.Equal(got, []string{testHost}) {
		t.Errorf("preserve: Host = %q; want %q", got, testHost)
	}
	if hr.Host != testHost {
		t.Errorf("preserve: net/http Host = %q", hr.Host)
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

func TestUnitParseResponseHead(t *testing.T) {
	tests := []struct {
		name      string
		head      []byte
		headReq   bool
		status    int
		body      bodyKind
		length    int64
		close     bool
		upgradeWS bool
	}{
		{"200 CL", head("HTTP/1.1 200 OK", "Content-Length: 5"), false, 200, bodyLength, 5, false, false},
		{"200 CL 0", head("HTTP/1.1 200 OK", "Content-Length: 0"), false, 200, bodyLength, 0, false, false},
		{"200 CL duplicate equal", head("HTTP/1.1 200 OK", "Content-Length: 5", "content-length: 5"), false, 200, bodyLength, 5, false, false},
		{"200 chunked", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), false, 200, bodyChunked, 0, false, false},
		{"200 CL and chunked", head("HTTP/1.1 200 OK", "Content-Length: 10", "Transfer-Encoding: chunked"), false, 200, bodyChunked, 10, true, false},
		{"200 no framing", head("HTTP/1.1 200 OK"), false, 200, bodyUntilClose, 0, true, false},
		{"200 no reason", head("HTTP/1.1 200"), false, 200, bodyUntilClose, 0, true, false},
		{"200 empty reason", head("HTTP/1.1 200 ", "Content-Length: 1"), false, 200, bodyLength, 1, false, false},
		{"200 Connection close", head("HTTP/1.1 200 OK", "Content-Length: 1", "Connection: close"), false, 200, bodyLength, 1, true, false},
		{"HTTP/1.0 200", head("HTTP/1.0 200 OK", "Content-Length: 1"), false, 200, bodyLength, 1, true, false},
		{"HTTP/1.0 keep-alive", head("HTTP/1.0 200 OK", "Content-Length: 1", "Connection: keep-alive"), false, 200, bodyLength, 1, false, false},
		{"HEAD 200 CL", head("HTTP/1.1 200 OK", "Content-Length: 99"), true, 200, bodyNone, 99, false, false},
		{"HEAD 200 chunked", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), true, 200, bodyNone, 0, false, false},
		{"HEAD no framing", head("HTTP/1.1 200 OK"), true, 200, bodyNone, 0, false, false},
		{"204", head("HTTP/1.1 204 No Content"), false, 204, bodyNone, 0, false, false},
		{"304 with CL", head("HTTP/1.1 304 Not Modified", "Content-Length: 42"), false, 304, bodyNone, 42, false, false},
		{"100", head("HTTP/1.1 100 Continue"), false, 100, bodyNone, 0, false, false},
		{"103", head("HTTP/1.1 103 Early Hints", "Link: </s.css>; rel=preload"), false, 103, bodyNone, 0, false, false},
		{"101 websocket", head("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), false, 101, bodyNone, 0, false, true},
		{"101 WebSocket any case", head("HTTP/1.1 101 Switching Protocols", "upgrade: WebSocket", "Connection: upgrade"), false, 101, bodyNone, 0, false, true},
		{"101 h2c", head("HTTP/1.1 101 Switching Protocols", "Upgrade: h2c", "Connection: Upgrade"), false, 101, bodyNone, 0, false, false},
		{"200 with Upgrade websocket", head("HTTP/1.1 200 OK", "Upgrade: websocket", "Content-Length: 0"), false, 200, bodyLength, 0, false, false},
		{"404", head("HTTP/1.1 404 Not Found", "Content-Length: 3"), false, 404, bodyLength, 3, false, false},
		{"599", head("HTTP/1.1 599 Whatever", "Content-Length: 3"), false, 599, bodyLength, 3, false, false},
		{"reason with obs-text and tab", head("HTTP/1.1 200 \xc3\x9cber\tOK", "Content-Length: 3"), false, 200, bodyLength, 3, false, false},
	}
	var r response
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := parseResponseHead(&r, tc.head, tc.headReq, 100); err != nil {
				t.Fatalf("parseResponseHead(%q) = %v", tc.head, err)
			}
			if r.status != tc.status || r.body != tc.body || r.length != tc.length || r.close != tc.close || r.upgradeWS != tc.upgradeWS {
				t.Errorf("status body length close upgradeWS = %d %v %d %v %v; want %d %v %d %v %v",
					r.status, r.body, r.length, r.close, r.upgradeWS, tc.status, tc.body, tc.length, tc.close, tc.upgradeWS)
			}
		})
	}
}

func TestUnitParseResponseHeadRejects(t *testing.T) {
	tests := []struct {
		name string
		head []byte
	}{
		{"conflicting CL", head("HTTP/1.1 200 OK", "Content-Length: 5", "Content-Length: 6")},
		// Transfer codings other than a single chunked cannot be relayed to
		// clients (they do not decode them): refused, answered 502.
		{"unknown TE", head("HTTP/1.1 200 OK", "Transfer-Encoding: x-custom")},
		{"TE gzip, chunked", head("HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked")},
		{"TE chunked twice", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked")},
		{"TE chunked, chunked", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked, chunked")},
		{"TE empty", head("HTTP/1.1 200 OK", "Transfer-Encoding:")},
		{"CL list", head("HTTP/1.1 200 OK", "Content-Length: 5, 5")},
		{"CL negative", head("HTTP/1.1 200 OK", "Content-Length: -5")},
		{"CL empty", head("HTTP/1.1 200 OK", "Content-Length:")},
		{"CL 19 digits", head("HTTP/1.1 200 OK", "Content-Length: 1000000000000000000")},
		{"two-digit code", head("HTTP/1.1 20 OK")},
		{"four-digit code", head("HTTP/1.1 2000 OK")},
		{"code letters", head("HTTP/1.1 abc OK")},
		{"code 600", head("HTTP/1.1 600 X")},
		{"code 099", head("HTTP/1.1 099 X")},
		{"code 0", head("HTTP/1.1 000 X")},
		{"tab after code", head("HTTP/1.1 200\tOK")},
		{"two spaces after version", head("HTTP/1.1  200 OK")},
		{"HTTP/2", head("HTTP/2 200 OK")},
		{"HTTP/2.0", head("HTTP/2.0 200 OK")},
		{"lower-case version", head("http/1.1 200 OK")},
		{"ICY", head("ICY 200 OK")},
		{"empty status line", head("")},
		{"NUL in reason", head("HTTP/1.1 200 O\x00K")},
		{"CR in reason", head("HTTP/1.1 200 O\rK")},
		{"bare LF status line", []byte("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n")},
		{"obs-fold", head("HTTP/1.1 200 OK", "X-A: a", " b")},
		{"space before colon", head("HTTP/1.1 200 OK", "Content-Length : 5")},
		{"invalid name", head("HTTP/1.1 200 OK", "X A: b")},
		{"NUL in value", head("HTTP/1.1 200 OK", "X-A: \x00")},
	}
	var r response
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := parseResponseHead(&r, tc.head, false, 100); err == nil {
				t.Errorf("parseResponseHead(%q) accepted: status %d body %v", tc.head, r.status, r.body)
			}
		})
	}
	// Too many fields.
	lines := []string{"HTTP/1.1 200 OK"}
	for range 5 {
		lines = append(lines, "X-A: b")
	}
	if err := parseResponseHead(&r, head(lines...), false, 4); err == nil {
		t.Error("5 fields accepted with a limit of 4")
	}
}

// relayHead runs a response head through parseResponseHead and
// appendResponseHead the way the server does, and reads the result back
// with net/http.
func relayHead(t *testing.T, h []byte, method string, http10 bool) (*response, [][2]string, *http.Response) {
	t.Helper()
	r := new(response)
	headReq := method == "HEAD"
	if err := parseResponseHead(r, h, headReq, 100); err != nil {
		t.Fatalf("parseResponseHead(%q): %v", h, err)
	}
	out := r.body
	closeConn := false
	if out == bodyChunked && http10 {
		out = bodyUntilClose
	}
	if out == bodyUntilClose {
		closeConn = true
	}
	b := appendResponseHead(nil, r, out, closeConn, headReq)
	start, fields := headerLines(t, b)
	if !strings.HasPrefix(start, "HTTP/1.1 "+strconv.Itoa(r.status)+" ") {
		t.Errorf("status line = %q", start)
	}
	hr, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(b), strings.NewReader(""))), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("net/http cannot read the relayed head %q: %v", b, err)
	}
	return r, fields, hr
}

func TestUnitAppendResponseHeadHopByHop(t *testing.T) {
	h := head(
		"HTTP/1.1 200 OK",
		"Content-Type: text/plain",
		"Connection: keep-alive, X-Internal",
		"X-Internal: secret",
		"Keep-Alive: timeout=5",
		"Proxy-Authenticate: Basic",
		"Proxy-Connection: keep-alive",
		"Trailer: X-Sum",
		"TE: trailers",
		"Upgrade: h2c",
		"Transfer-Encoding: chunked",
		"Set-Cookie: a=1; Path=/",
		"Set-Cookie: b=2; Path=/",
	)
	_, fields, hr := relayHead(t, h, "GET", false)
	for _, name := range append(slices.Clone(hopByHopNames), "X-Internal") {
		want := []string(nil)
		if name == "Transfer-Encoding" {
			want = []string{"chunked"} // re-created by the listener
		}
		if got := values(fields, name); !slices.Equal(got, want) {
			t.Errorf("%s = %q; want %q", name, got, want)
		}
	}
	if got := values(fields, "Set-Cookie"); !slices.Equal(got, []string{"a=1; Path=/", "b=2; Path=/"}) {
		t.Errorf("Set-Cookie = %q", got)
	}
	if hr.Header.Get("Content-Type") != "text/plain" || !slices.Equal(hr.TransferEncoding, []string{"chunked"}) {
		t.Errorf("net/http sees %v TE=%q", hr.Header, hr.TransferEncoding)
	}
}

func TestUnitAppendResponseHeadFraming(t *testing.T) {
	tests := []struct {
		name    string
		head    []byte
		method  string
		http10  bool
		cl      []string
		te      []string
		conn    []string
		hrCL    int64
		hrClose bool
	}{
		{"CL", head("HTTP/1.1 200 OK", "Content-Length: 0005"), "GET", false, []string{"5"}, nil, nil, 5, false},
		{"CL+chunked becomes chunked and close", head("HTTP/1.1 200 OK", "Content-Length: 5", "Transfer-Encoding: chunked"), "GET", false, nil, []string{"chunked"}, nil, -1, false},
		{"until close", head("HTTP/1.1 200 OK"), "GET", false, nil, nil, []string{"close"}, -1, true},
		{"chunked to HTTP/1.0 client", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), "GET", true, nil, nil, []string{"close"}, -1, true},
		{"HEAD keeps the app's CL", head("HTTP/1.1 200 OK", "Content-Length: 1234"), "HEAD", false, []string{"1234"}, nil, nil, 1234, false},
		{"304 keeps the app's CL", head("HTTP/1.1 304 Not Modified", "Content-Length: 77", "ETag: \"x\""), "GET", false, []string{"77"}, nil, nil, 0, false},
		{"204 drops CL", head("HTTP/1.1 204 No Content", "Content-Length: 0"), "GET", false, nil, nil, nil, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, fields, hr := relayHead(t, tc.head, tc.method, tc.http10)
			if got := values(fields, "Content-Length"); !slices.Equal(got, tc.cl) {
				t.Errorf("Content-Length = %q; want %q", got, tc.cl)
			}
			if got := values(fields, "Transfer-Encoding"); !slices.Equal(got, tc.te) {
				t.Errorf("Transfer-Encoding = %q; want %q", got, tc.te)
			}
			if got := values(fields, "Connection"); !slices.Equal(got, tc.conn) {
				t.Errorf("Connection = %q; want %q", got, tc.conn)
			}
			if hr.ContentLength != tc.hrCL || hr.Close != tc.hrClose {
				t.Errorf("net/http sees CL=%d close=%v; want %d %v (parsed %+v)", hr.ContentLength, hr.Close, tc.hrCL, tc.hrClose, r)
			}
		})
	}
}

func TestUnitAppendResponseHeadWebSocket(t *testing.T) {
	h := head("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade",
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "Sec-WebSocket-Protocol: chat")
	_, fields, hr := relayHead(t, h, "GET", false)
	if got := values(fields, "Connection"); !slices.Equal(got, []string{"Upgrade"}) {
		t.Errorf("Connection = %q", got)
	}
	if got := values(fields, "Upgrade"); !slices.Equal(got, []string{"websocket"}) {
		t.Errorf("Upgrade = %q", got)
	}
	if hr.StatusCode != 101 || hr.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" || hr.Header.Get("Sec-WebSocket-Protocol") != "chat" {
		t.Errorf("net/http sees %d %v", hr.StatusCode, hr.Header)
	}
}

// TestUnitResponseTransferCodingsNotDropped: RFC 9112 §6.3 — a response whose
// Transfer-Encoding ends in chunked is chunked-delimited; other codings
// ("gzip, chunked") remain part of the message. The listener must either
// relay such a response faithfully (decode chunked, keep the other coding
// visible to the client) or refuse it. Treating it as close-delimited while
// dropping the Transfer-Encoding header hands the client the raw chunk
// framing and the compressed bytes as if they were the body, and the
// response only ends when the app closes its keep-alive connection.
func TestUnitResponseTransferCodingsNotDropped(t *testing.T) {
	for _, te := range []string{"gzip, chunked", "gzip", "x-custom"} {
		t.Run(te, func(t *testing.T) {
			var r response
			h := head("HTTP/1.1 200 OK", "Content-Type: text/plain", "Transfer-Encoding: "+te)
			if err := parseResponseHead(&r, h, false, 100); err != nil {
				return // refusing it (502) is acceptable
			}
			out := r.body
			b := appendResponseHead(nil, &r, out, out == bodyUntilClose, false)
			_, fields := headerLines(t, b)
			var codings []string
			for _, v := range values(fields, "Transfer-Encoding") {
				for c := range strings.SplitSeq(v, ",") {
					if c = strings.TrimSpace(c); !strings.EqualFold(c, "chunked") {
						codings = append(codings, c)
					}
				}
			}
			if strings.HasSuffix(te, "chunked") && out != bodyChunked {
				t.Errorf("Transfer-Encoding %q: body kind %v; the final coding is chunked", te, out)
			}
			wantCoding, _, _ := strings.Cut(te, ",")
			if !slices.Contains(codings, wantCoding) {
				t.Errorf("Transfer-Encoding %q relayed as %q with body kind %v: the client gets encoded bytes without their coding", te, b, out)
			}
		})
	}
}
