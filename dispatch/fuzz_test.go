package dispatch

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/applistener/applistener/internal/httpgrammar"
)

func requestSeeds() []string {
	h := "Host: " + testHost + "\r\n"
	return []string{
		"GET / HTTP/1.1\r\n" + h + "\r\n",
		string(benchBrowserHead()),
		"POST /p HTTP/1.1\r\n" + h + "Content-Length: 5\r\n\r\n",
		"POST /p HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n",
		"POST /p HTTP/1.1\r\n" + h + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /p HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /p HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n",
		"POST /p HTTP/1.0\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n",
		"POST /p HTTP/1.1\r\n" + h + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : " + testHost + "\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: a\nTransfer-Encoding: chunked\r\n\r\n",
		"GET http://" + testHost + "/x?y HTTP/1.1\r\n" + h + "\r\n",
		"GET http://evil.test/x HTTP/1.1\r\n" + h + "\r\n",
		"GET http://a@" + testHost + "/ HTTP/1.1\r\n" + h + "\r\n",
		"OPTIONS * HTTP/1.1\r\n" + h + "\r\n",
		"GET * HTTP/1.1\r\n" + h + "\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.0\r\n" + h + "Connection: keep-alive, X-Foo\r\nX-Foo: 1\r\n\r\n",
		"GET /ws HTTP/1.1\r\n" + h + "Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Connection: close, Host, Content-Length, X-Forwarded-For\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X-Forwarded-For: 10.0.0.1\r\nForwarded: for=10.0.0.1\r\nX-Real-IP: 1.1.1.1\r\nX-Applistener-User: root\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: evil\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "Keep-Alive: 5\r\nProxy-Connection: x\r\nProxy-Authorization: y\r\nTE: trailers\r\nTrailer: z\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + h + "\r\n",
		"GET /\x80 HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: \x80\xff\t\r\n\r\n",
		"CONNECT " + testHost + ":443 HTTP/1.1\r\nHost: " + testHost + ":443\r\n\r\n",
	}
}

// FuzzParseRequestHead: the parser never panics, refuses only with the
// documented statuses, and whatever it accepts is forwarded as a
// well-formed, unambiguous HTTP/1.1 head.
func FuzzParseRequestHead(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add([]byte(s), false, false, false)
		f.Add([]byte(s), true, true, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, trusted, preserve, ipv6 bool) {
		// What readHead hands over: leading empty lines skipped, the head
		// up to and including the first CRLFCRLF.
		for len(data) >= 2 && data[0] == '\r' && data[1] == '\n' {
			data = data[2:]
		}
		end := findHeadEnd(data)
		if end < 0 {
			return
		}
		h := data[:end]
		var r request
		err := parseRequestHead(&r, h, 32)
		if err != nil {
			var pe *parseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *parseError", err)
			}
			switch pe.status {
			case 400, 421, 431, 505:
			default:
				t.Fatalf("unexpected status %d (%s)", pe.status, pe.reason)
			}
			return
		}
		if string(r.method) == "CONNECT" {
			// Answered 405 by the server, never forwarded.
			if string(r.path) != string(r.target) {
				t.Fatalf("CONNECT path %q, target %q", r.path, r.target)
			}
			return
		}
		checkParsedRequest(t, &r)
		fi := &forwardInfo{
			client:      netip.MustParseAddr("203.0.113.7"),
			trusted:     trusted,
			publicHost:  testHost,
			backendHost: "127.0.0.1:8080",
			preserve:    preserve,
		}
		if ipv6 {
			fi.client = netip.MustParseAddr("2001:db8::7")
		}
		out := appendRequestHead(nil, &r, fi)
		checkForwardedHead(t, &r, fi, out)
	})
}

func checkParsedRequest(t *testing.T, r *request) {
	t.Helper()
	if !httpgrammar.IsToken(r.method) {
		t.Fatalf("accepted method %q", r.method)
	}
	if !httpgrammar.IsVisible(r.path) || (r.path[0] != '/' && string(r.path) != "*") {
		t.Fatalf("accepted path %q", r.path)
	}
	if string(r.path) == "*" && string(r.method) != "OPTIONS" && !httpgrammar.EqualFold(r.method, "options") {
		t.Fatalf("asterisk-form with %q", r.method)
	}
	switch r.body {
	case bodyNone:
	case bodyLength:
		if r.length <= 0 {
			t.Fatalf("bodyLength with length %d", r.length)
		}
	case bodyChunked:
		if r.http10 {
			t.Fatal("chunked HTTP/1.0 request accepted")
		}
	default:
		t.Fatalf("request body kind %v", r.body)
	}
	if r.upgrade && (string(r.method) != "GET" || r.body != bodyNone) {
		t.Fatalf("upgrade with method %q, body %v", r.method, r.body)
	}
	if r.http10 && r.body == bodyChunked {
		t.Fatal("HTTP/1.0 chunked")
	}
}

// emittedByListener are the names appendRequestHead writes itself.
var emittedByListener = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade",
	"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded"}

func checkForwardedHead(t *testing.T, r *request, fi *forwardInfo, out []byte) {
	t.Helper()
	start, fields := headerLines(t, out)
	if want := string(r.method) + " " + string(r.path) + " HTTP/1.1"; start != want {
		t.Fatalf("request line %q; want %q", start, want)
	}
	wantHost := fi.backendHost
	switch {
	case fi.preserve && len(r.host) > 0:
		wantHost = string(r.host) // as the client sent it
	case fi.preserve:
		wantHost = fi.publicHost
	}
	if got := values(fields, "Host"); !slices.Equal(got, []string{wantHost}) {
		t.Fatalf("Host lines %q; want exactly %q", got, wantHost)
	}
	var wantTE, wantCL []string
	switch r.body {
	case bodyChunked:
		wantTE = []string{"chunked"}
	case bodyLength:
		wantCL = []string{strconv.FormatInt(r.length, 10)}
	}
	if got := values(fields, "Transfer-Encoding"); !slices.Equal(got, wantTE) {
		t.Fatalf("Transfer-Encoding lines %q; want %q", got, wantTE)
	}
	if got := values(fields, "Content-Length"); !slices.Equal(got, wantCL) &&
		(r.body != bodyNone || !slices.Equal(got, []string{"0"})) {
		t.Fatalf("Content-Length lines %q; want %q", got, wantCL)
	}
	var wantConn, wantUp []string
	if r.upgrade {
		wantConn, wantUp = []string{"Upgrade"}, []string{"websocket"}
	}
	if got := values(fields, "Connection"); !slices.Equal(got, wantConn) {
		t.Fatalf("Connection lines %q; want %q", got, wantConn)
	}
	if got := values(fields, "Upgrade"); !slices.Equal(got, wantUp) {
		t.Fatalf("Upgrade lines %q; want %q", got, wantUp)
	}
	for _, name := range []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer"} {
		if v := values(fields, name); len(v) > 0 {
			t.Fatalf("hop-by-hop %s forwarded: %q", name, v)
		}
	}
	for _, tok := range r.connTokens {
		if slices.Contains(emittedByListener, strings.ToLower(string(tok))) {
			continue
		}
		if v := values(fields, string(tok)); len(v) > 0 {
			t.Fatalf("%s is listed in Connection but forwarded: %q", tok, v)
		}
	}
	if got := values(fields, "Forwarded"); len(got) != 1 || !strings.HasSuffix(got[0], ";host="+fi.publicHost+";proto=https") {
		t.Fatalf("Forwarded lines %q", got)
	}
	xff := values(fields, "X-Forwarded-For")
	if len(xff) != 1 || !strings.HasSuffix(xff[0], fi.client.String()) {
		t.Fatalf("X-Forwarded-For lines %q", xff)
	}
	if !fi.trusted {
		if xff[0] != fi.client.String() {
			t.Fatalf("untrusted X-Forwarded-For %q", xff[0])
		}
		for _, f := range fields {
			n := strings.ToLower(f[0])
			if forwardingHeader([]byte(n)) && !slices.Contains(emittedByListener, n) {
				t.Fatalf("untrusted client's %s forwarded", f[0])
			}
		}
		for _, name := range []string{"X-Forwarded-Proto", "X-Forwarded-Host"} {
			if got := values(fields, name); len(got) != 1 {
				t.Fatalf("%s lines %q", name, got)
			}
		}
	}
	// net/http reads the head the same way. Its URL parser is stricter than
	// RFC 9112 about the target (percent-escapes), so the target itself is
	// checked above and replaced here.
	line := bytes.IndexByte(out, '\n')
	normalized := append([]byte(string(r.method)+" / HTTP/1.1\r\n"), out[line+1:]...)
	hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(normalized)))
	if err != nil {
		t.Fatalf("net/http rejects the forwarded head %q: %v", out, err)
	}
	if hr.Host != wantHost {
		t.Fatalf("net/http Host %q", hr.Host)
	}
	switch r.body {
	case bodyNone:
		if hr.ContentLength != 0 || len(hr.TransferEncoding) != 0 {
			t.Fatalf("net/http sees a body: CL %d TE %q", hr.ContentLength, hr.TransferEncoding)
		}
	case bodyLength:
		if hr.ContentLength != r.length {
			t.Fatalf("net/http CL %d; want %d", hr.ContentLength, r.length)
		}
	case bodyChunked:
		if !slices.Equal(hr.TransferEncoding, []string{"chunked"}) {
			t.Fatalf("net/http TE %q", hr.TransferEncoding)
		}
	}
}

// FuzzCopyChunked: the decoder never panics, never reports more bytes than
// it was given, behaves the same however the bytes arrive, agrees with
// net/http's decoder, and its re-encoding decodes to the same bytes.
func FuzzCopyChunked(f *testing.F) {
	for _, s := range []string{
		"0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\n",
		"5;ext=1\r\nhello\r\n6;a=b\r\n world\r\n0;last\r\nX-Trailer: v\r\n\r\nNEXT",
		"A\r\n0123456789\r\n0\r\n\r\n",
		"fffffffffffffff\r\nabc",
		"1000000000000000\r\nx\r\n0\r\n\r\n",
		"5\r\nhelloX\r\n0\r\n\r\n",
		"5\nhello\r\n0\r\n\r\n",
		"5\r\nhello\n0\r\n\r\n",
		"0\r\nX: a\r\n b\r\n\r\n",
		"0\r\nNoColon\r\n\r\n",
		"-1\r\n\r\n",
		" 5\r\nhello\r\n0\r\n\r\n",
		"5\r\nhel",
		"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, encode bool) {
		type result struct {
			n    int64
			err  error
			out  []byte
			rest []byte
		}
		run := func(r io.Reader, encode bool) result {
			in := newInbuf(r, 8192)
			var out bytes.Buffer
			n, err := copyChunked(&out, in, encode, nil)
			var rest []byte
			if err == nil {
				rest, _ = io.ReadAll(in)
			}
			return result{n, err, out.Bytes(), rest}
		}
		whole := run(bytes.NewReader(data), encode)
		if whole.n < 0 || whole.n > int64(len(data)) {
			t.Fatalf("returned %d bytes from a %d-byte input", whole.n, len(data))
		}
		if whole.err != nil {
			if !errors.Is(whole.err, errBadChunk) && !errors.Is(whole.err, errLineTooBig) && !errors.Is(whole.err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error %v", whole.err)
			}
		}
		// Independent of how the bytes arrive (except the line-length
		// limit, which is checked only while a line is incomplete).
		one := run(iotest.OneByteReader(bytes.NewReader(data)), encode)
		if !errors.Is(whole.err, errLineTooBig) && !errors.Is(one.err, errLineTooBig) {
			if (whole.err == nil) != (one.err == nil) || whole.n != one.n || !bytes.Equal(whole.out, one.out) || !bytes.Equal(whole.rest, one.rest) {
				t.Fatalf("whole reader: %d %v %q; one-byte reader: %d %v %q", whole.n, whole.err, whole.out, one.n, one.err, one.out)
			}
		}
		if whole.err != nil {
			return
		}
		decoded := whole.out
		if encode {
			// The re-encoding decodes (ours and net/http's) to the same bytes.
			dec := run(bytes.NewReader(whole.out), false)
			if dec.err != nil || dec.n != whole.n || len(dec.rest) != 0 {
				t.Fatalf("re-encoded output %q does not decode: %v", whole.out, dec.err)
			}
			decoded = dec.out
			plain := run(bytes.NewReader(data), false)
			if plain.err != nil || !bytes.Equal(plain.out, decoded) || !bytes.Equal(plain.rest, whole.rest) {
				t.Fatalf("decode %q vs re-encode+decode %q", plain.out, decoded)
			}
			ref, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(whole.out)))
			if err != nil || !bytes.Equal(ref, decoded) {
				t.Fatalf("net/http decodes the re-encoding as %q, %v; want %q", ref, err, decoded)
			}
		}
		if int64(len(decoded)) != whole.n {
			t.Fatalf("returned %d; decoded %d bytes", whole.n, len(decoded))
		}
		// net/http accepts what we accept, with the same data.
		ref, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(data)))
		if err != nil || !bytes.Equal(ref, decoded) {
			t.Fatalf("net/http decodes the input as %q, %v; we decoded %q", ref, err, decoded)
		}
	})
}

// FuzzParseResponseHead: the response parser never panics, and whatever it
// accepts is relayed as a well-formed head with unambiguous framing.
func FuzzParseResponseHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nX-A: 1\r\nKeep-Alive: 5\r\nTrailer: X\r\nProxy-Authenticate: B\r\n\r\n",
		"HTTP/1.1 200\r\n\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"HTTP/1.1 200 O\x80K\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
		"HTTP/2 200\r\n\r\n",
	} {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), true, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, headReq, http10 bool) {
		end := findHeadEnd(data)
		if end < 0 {
			return
		}
		h := data[:end]
		var r response
		if err := parseResponseHead(&r, h, headReq, 32); err != nil {
			var pe *parseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *parseError", err)
			}
			return
		}
		if r.status < 100 || r.status > 599 {
			t.Fatalf("status %d", r.status)
		}
		if (r.status < 200 || r.status == 204 || r.status == 304 || headReq) && r.body != bodyNone {
			t.Fatalf("status %d (HEAD %v) with body %v", r.status, headReq, r.body)
		}
		if r.upgradeWS && r.status != 101 {
			t.Fatalf("upgradeWS with %d", r.status)
		}
		if r.body == bodyUntilClose && !r.close {
			t.Fatal("close-delimited body on a reusable connection")
		}
		// Frame towards the client as the server does.
		out := r.body
		closeConn := false
		if out == bodyChunked && http10 {
			out = bodyUntilClose
		}
		if out == bodyUntilClose {
			closeConn = true
		}
		b := appendResponseHead(nil, &r, out, closeConn, headReq, nil)
		start, fields := headerLines(t, b)
		if !strings.HasPrefix(start, "HTTP/1.1 "+strconv.Itoa(r.status)+" ") {
			t.Fatalf("status line %q", start)
		}
		var wantCL, wantTE, wantConn, wantUp []string
		switch out {
		case bodyLength:
			wantCL = []string{strconv.FormatInt(r.length, 10)}
		case bodyChunked:
			wantTE = []string{"chunked"}
		}
		if got := values(fields, "Content-Length"); (headReq || r.status == 304) && out == bodyNone {
			for _, v := range got {
				if n, ok := parseContentLength([]byte(v)); !ok || n != r.length {
					t.Fatalf("HEAD/304 Content-Length %q; parsed %d", got, r.length)
				}
			}
		} else if !slices.Equal(got, wantCL) {
			t.Fatalf("Content-Length lines %q; want %q", got, wantCL)
		}
		if got := values(fields, "Transfer-Encoding"); !slices.Equal(got, wantTE) {
			t.Fatalf("Transfer-Encoding lines %q; want %q", got, wantTE)
		}
		switch {
		case r.upgradeWS:
			wantConn, wantUp = []string{"Upgrade"}, []string{"websocket"}
		case closeConn:
			wantConn = []string{"close"}
		}
		if got := values(fields, "Connection"); !slices.Equal(got, wantConn) {
			t.Fatalf("Connection lines %q; want %q", got, wantConn)
		}
		if got := values(fields, "Upgrade"); !slices.Equal(got, wantUp) {
			t.Fatalf("Upgrade lines %q; want %q", got, wantUp)
		}
		for _, name := range []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer"} {
			if v := values(fields, name); len(v) > 0 {
				t.Fatalf("hop-by-hop %s relayed: %q", name, v)
			}
		}
		for _, tok := range r.connTokens {
			n := strings.ToLower(string(tok))
			if n == "content-length" || n == "transfer-encoding" || n == "connection" || n == "upgrade" {
				continue
			}
			if v := values(fields, string(tok)); len(v) > 0 {
				t.Fatalf("%s is listed in Connection but relayed: %q", tok, v)
			}
		}
		method := "GET"
		if headReq {
			method = "HEAD"
		}
		hr, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), &http.Request{Method: method})
		if err != nil {
			t.Fatalf("net/http rejects the relayed head %q: %v", b, err)
		}
		if hr.StatusCode != r.status {
			t.Fatalf("net/http status %d", hr.StatusCode)
		}
		if out == bodyLength && hr.ContentLength != r.length {
			t.Fatalf("net/http CL %d; want %d", hr.ContentLength, r.length)
		}
	})
}
