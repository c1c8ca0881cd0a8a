package dispatch

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

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
	b := appendResponseHead(nil, r, out, closeConn, headReq, nil)
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
			b := appendResponseHead(nil, &r, out, out == bodyUntilClose, false, nil)
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

// TestUnitConnectionOptionFoldIsASCII: a response field named in
// Connection is dropped when the names are equal ASCII case aside
// (HTTP/1.1 through appendResponseHead; HTTP/2 responses go through the
// same connectionNamed), and only then: an option with a non-ASCII rune
// that Unicode folds onto the name (U+212A KELVIN SIGN onto 'k') is not a
// token and names no field.
func TestUnitConnectionOptionFoldIsASCII(t *testing.T) {
	h := head(
		"HTTP/1.1 200 OK",
		"Connection: x-INTERNAL, X-\u212aey",
		"X-Internal: secret",
		"X-Key: kept",
		"Content-Length: 0",
	)
	_, fields, _ := relayHead(t, h, "GET", false)
	if got := values(fields, "X-Internal"); got != nil {
		t.Errorf("X-Internal = %q; want it dropped", got)
	}
	if got := values(fields, "X-Key"); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("X-Key = %q; want it kept", got)
	}
	for _, tc := range []struct {
		name, option string
		want         bool
	}{
		{"X-Internal", "x-internal", true},
		{"x-internal", "X-INTERNAL", true},
		{"X-Key", "X-\u212aey", false},
		{"X-Ks", "X-K\u017f", false},
		{"X-Key", "X-Ke", false},
	} {
		if got := connectionNamed([]byte(tc.name), [][]byte{[]byte("other"), []byte(tc.option)}); got != tc.want {
			t.Errorf("connectionNamed(%q, %q) = %v; want %v", tc.name, tc.option, got, tc.want)
		}
	}
}
