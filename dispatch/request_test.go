package dispatch

import (
	"bytes"
	"strings"
	"testing"
)

func TestUnitParseRequestHeadValid(t *testing.T) {
	type want struct {
		method, path, host string
		body               bodyKind
		length             int64
		http10, close      bool
		upgrade, expect    bool
		accept             string
		connTokens         []string
	}
	tests := []struct {
		name string
		head []byte
		want want
	}{
		{"simple GET", get(), want{method: "GET", path: "/", host: testHost}},
		{"GET with query", head("GET /a/b?c=d&e HTTP/1.1", "Host: "+testHost),
			want{method: "GET", path: "/a/b?c=d&e", host: testHost}},
		{"POST with Content-Length", head("POST /submit HTTP/1.1", "Host: "+testHost, "Content-Length: 5"),
			want{method: "POST", path: "/submit", host: testHost, body: bodyLength, length: 5}},
		{"POST with Content-Length 0 has no body", head("POST / HTTP/1.1", "Host: "+testHost, "Content-Length: 0"),
			want{method: "POST", path: "/", host: testHost}},
		{"Content-Length with leading zeros", head("POST / HTTP/1.1", "Host: "+testHost, "Content-Length: 007"),
			want{method: "POST", path: "/", host: testHost, body: bodyLength, length: 7}},
		{"Content-Length 18 digits", head("PUT / HTTP/1.1", "Host: "+testHost, "Content-Length: 999999999999999999"),
			want{method: "PUT", path: "/", host: testHost, body: bodyLength, length: 999999999999999999}},
		{"chunked", head("POST / HTTP/1.1", "Host: "+testHost, "Transfer-Encoding: chunked"),
			want{method: "POST", path: "/", host: testHost, body: bodyChunked}},
		// OWS around a field value is not part of the value (RFC 9110 §5.5):
		// trimming it before comparing with "chunked" is safe.
		{"chunked with OWS", head("POST / HTTP/1.1", "Host: "+testHost, "Transfer-Encoding: \t chunked \t"),
			want{method: "POST", path: "/", host: testHost, body: bodyChunked}},
		{"chunked any case", head("POST / HTTP/1.1", "Host: "+testHost, "transfer-encoding: Chunked"),
			want{method: "POST", path: "/", host: testHost, body: bodyChunked}},
		{"OPTIONS asterisk", head("OPTIONS * HTTP/1.1", "Host: "+testHost),
			want{method: "OPTIONS", path: "*", host: testHost}},
		{"absolute-form", head("GET http://"+testHost+"/x?y HTTP/1.1", "Host: "+testHost),
			want{method: "GET", path: "/x?y", host: testHost}},
		{"absolute-form https, upper-case scheme, port", head("GET HTTPS://"+strings.ToUpper(testHost)+":443/a HTTP/1.1", "Host: "+testHost),
			want{method: "GET", path: "/a", host: testHost}},
		{"absolute-form without path", head("GET http://"+testHost+" HTTP/1.1", "Host: "+testHost),
			want{method: "GET", path: "/", host: testHost}},
		{"absolute-form with query only", head("GET http://"+testHost+"?q=1 HTTP/1.1", "Host: "+testHost),
			want{method: "GET", path: "/?q=1", host: testHost}},
		{"HTTP/1.0 closes", head("GET / HTTP/1.0", "Host: "+testHost),
			want{method: "GET", path: "/", host: testHost, http10: true, close: true}},
		{"HTTP/1.0 keep-alive", head("GET / HTTP/1.0", "Host: "+testHost, "Connection: Keep-Alive"),
			want{method: "GET", path: "/", host: testHost, http10: true}},
		{"HTTP/1.1 Connection close", get("Connection: close"),
			want{method: "GET", path: "/", host: testHost, close: true}},
		{"HTTP/1.1 keep-alive is a no-op", get("Connection: keep-alive"),
			want{method: "GET", path: "/", host: testHost}},
		{"Connection tokens", get("Connection: X-Foo, keep-alive,, x-bar "),
			want{method: "GET", path: "/", host: testHost, connTokens: []string{"X-Foo", "x-bar"}}},
		{"Expect 100-continue", head("PUT / HTTP/1.1", "Host: "+testHost, "Expect: 100-Continue", "Content-Length: 3"),
			want{method: "PUT", path: "/", host: testHost, body: bodyLength, length: 3, expect: true}},
		{"Expect other", get("Expect: something"),
			want{method: "GET", path: "/", host: testHost}},
		{"Accept captured", get("Accept: text/html, */*;q=0.8"),
			want{method: "GET", path: "/", host: testHost, accept: "text/html, */*;q=0.8"}},
		{"obs-text and tab in value", get("X-Latin: caf\xe9\tok", "X-Empty:", "X-Spaces:   v  "),
			want{method: "GET", path: "/", host: testHost}},
		{"host with port and any case", head("GET / HTTP/1.1", "hOsT: Team--Demo--Web.Apps.Test:8443"),
			want{method: "GET", path: "/", host: "Team--Demo--Web.Apps.Test:8443"}},
		{"lower-case method is a token", head("get / HTTP/1.1", "Host: "+testHost),
			want{method: "get", path: "/", host: testHost}},
		{"extension method", head("PROPFIND /dav HTTP/1.1", "Host: "+testHost),
			want{method: "PROPFIND", path: "/dav", host: testHost}},
		{"websocket", get("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"),
			want{method: "GET", path: "/", host: testHost, upgrade: true}},
	}
	var r request
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := parseRequestHead(&r, tc.head, 100); err != nil {
				t.Fatalf("parseRequestHead(%q) = %v", tc.head, err)
			}
			w := tc.want
			if string(r.method) != w.method || string(r.path) != w.path || string(r.host) != w.host {
				t.Errorf("method, path, host = %q %q %q; want %q %q %q", r.method, r.path, r.host, w.method, w.path, w.host)
			}
			if r.body != w.body || r.length != w.length {
				t.Errorf("body, length = %v %d; want %v %d", r.body, r.length, w.body, w.length)
			}
			if r.http10 != w.http10 || r.close != w.close || r.upgrade != w.upgrade || r.expect != w.expect {
				t.Errorf("http10 close upgrade expect = %v %v %v %v; want %v %v %v %v",
					r.http10, r.close, r.upgrade, r.expect, w.http10, w.close, w.upgrade, w.expect)
			}
			if string(r.accept) != w.accept {
				t.Errorf("accept = %q; want %q", r.accept, w.accept)
			}
			var toks []string
			for _, tk := range r.connTokens {
				toks = append(toks, string(tk))
			}
			if strings.Join(toks, "|") != strings.Join(w.connTokens, "|") {
				t.Errorf("connTokens = %q; want %q", toks, w.connTokens)
			}
		})
	}
}

func TestUnitParseRequestHeadFieldsAreSlices(t *testing.T) {
	h := get("X-A: 1", "X-B:  two  ")
	var r request
	if err := parseRequestHead(&r, h, 100); err != nil {
		t.Fatal(err)
	}
	if len(r.fields) != 3 {
		t.Fatalf("got %d fields, want 3", len(r.fields))
	}
	if string(r.fields[2].name) != "X-B" || string(r.fields[2].value) != "two" {
		t.Errorf("field 2 = %q: %q", r.fields[2].name, r.fields[2].value)
	}
	// The fields point into the head: no copies.
	if &r.fields[2].value[0] != &h[bytes.Index(h, []byte("two"))] {
		t.Error("field value is not a slice of the head")
	}
}

// TestUnitParseRequestHeadReset: a request struct is reused across a
// keep-alive connection; nothing of the previous request may leak into the
// next one.
func TestUnitParseRequestHeadReset(t *testing.T) {
	var r request
	first := head("POST http://"+testHost+"/x HTTP/1.0", "Host: "+testHost, "Connection: keep-alive, X-Foo",
		"Content-Length: 10", "Expect: 100-continue", "Accept: text/html")
	if err := parseRequestHead(&r, first, 100); err != nil {
		t.Fatal(err)
	}
	if err := parseRequestHead(&r, get(), 100); err != nil {
		t.Fatal(err)
	}
	if r.body != bodyNone || r.length != 0 || r.http10 || r.close || r.expect || r.upgrade ||
		len(r.accept) != 0 || len(r.connTokens) != 0 || len(r.fields) != 1 || string(r.path) != "/" {
		t.Errorf("state leaked from the previous request: %+v", r)
	}
	// A failed parse followed by a good one.
	if err := parseRequestHead(&r, head("GET / HTTP/1.1", "Host: a", "Host: b"), 100); err == nil {
		t.Fatal("two Hosts accepted")
	}
	if err := parseRequestHead(&r, get(), 100); err != nil || string(r.host) != testHost {
		t.Errorf("after a failed parse: %v host=%q", err, r.host)
	}
}

func TestUnitParseRequestHeadRejects(t *testing.T) {
	h := "Host: " + testHost
	tests := []struct {
		name   string
		head   []byte
		status int
		reason string // substring of the reason, when it matters
	}{
		// Framing (smuggling).
		{"CL and TE", head("POST / HTTP/1.1", h, "Content-Length: 5", "Transfer-Encoding: chunked"), 400, "both"},
		{"TE and CL", head("POST / HTTP/1.1", h, "Transfer-Encoding: chunked", "Content-Length: 0"), 400, "both"},
		{"two CL equal", head("POST / HTTP/1.1", h, "Content-Length: 5", "Content-Length: 5"), 400, "multiple Content-Length"},
		{"two CL different", head("POST / HTTP/1.1", h, "Content-Length: 5", "content-length: 6"), 400, "multiple Content-Length"},
		{"CL list", head("POST / HTTP/1.1", h, "Content-Length: 5, 5"), 400, "Content-Length"},
		{"two TE", head("POST / HTTP/1.1", h, "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400, "Transfer-Encoding"},
		{"TE gzip, chunked", head("POST / HTTP/1.1", h, "Transfer-Encoding: gzip, chunked"), 400, "Transfer-Encoding"},
		{"TE chunked, identity", head("POST / HTTP/1.1", h, "Transfer-Encoding: chunked, identity"), 400, "Transfer-Encoding"},
		{"TE chunked,chunked", head("POST / HTTP/1.1", h, "Transfer-Encoding: chunked,chunked"), 400, "Transfer-Encoding"},
		{"TE identity", head("POST / HTTP/1.1", h, "Transfer-Encoding: identity"), 400, "Transfer-Encoding"},
		{"TE empty", head("POST / HTTP/1.1", h, "Transfer-Encoding:"), 400, "Transfer-Encoding"},
		{"TE xchunked", head("POST / HTTP/1.1", h, "Transfer-Encoding: xchunked"), 400, "Transfer-Encoding"},
		{"TE chunked with vertical tab", head("POST / HTTP/1.1", h, "Transfer-Encoding: \vchunked"), 400, ""},
		{"TE in HTTP/1.0", head("POST / HTTP/1.0", h, "Transfer-Encoding: chunked"), 400, "HTTP/1.0"},
		{"CL -1", head("POST / HTTP/1.1", h, "Content-Length: -1"), 400, "Content-Length"},
		{"CL 1e3", head("POST / HTTP/1.1", h, "Content-Length: 1e3"), 400, "Content-Length"},
		{"CL +5", head("POST / HTTP/1.1", h, "Content-Length: +5"), 400, "Content-Length"},
		{"CL hex", head("POST / HTTP/1.1", h, "Content-Length: 0x10"), 400, "Content-Length"},
		{"CL 19 digits", head("POST / HTTP/1.1", h, "Content-Length: 1000000000000000000"), 400, "Content-Length"},
		{"CL 20 digits overflow", head("POST / HTTP/1.1", h, "Content-Length: 18446744073709551617"), 400, "Content-Length"},
		{"CL empty", head("POST / HTTP/1.1", h, "Content-Length:"), 400, "Content-Length"},
		{"CL inner space", head("POST / HTTP/1.1", h, "Content-Length: 1 2"), 400, "Content-Length"},
		// Field syntax.
		{"obs-fold", head("GET / HTTP/1.1", h, "X-A: a", " folded"), 400, "folding"},
		{"obs-fold tab", head("GET / HTTP/1.1", h, "X-A: a", "\tfolded"), 400, "folding"},
		{"first field folded", head("GET / HTTP/1.1", " "+h), 400, ""},
		{"space before colon", head("GET / HTTP/1.1", "Host : "+testHost), 400, ""},
		{"tab before colon", head("GET / HTTP/1.1", h, "Content-Length\t: 5"), 400, ""},
		{"space before colon on TE", head("POST / HTTP/1.1", h, "Transfer-Encoding : chunked", "Content-Length: 3"), 400, ""},
		{"name with paren", head("GET / HTTP/1.1", h, "X(y): z"), 400, "header name"},
		{"name with space", head("GET / HTTP/1.1", h, "X y: z"), 400, "header name"},
		{"name with slash", head("GET / HTTP/1.1", h, "X/y: z"), 400, "header name"},
		{"name non-ASCII", head("GET / HTTP/1.1", h, "X-\xe9: z"), 400, "header name"},
		{"empty name", head("GET / HTTP/1.1", h, ": z"), 400, ""},
		{"no colon", head("GET / HTTP/1.1", h, "NoColon"), 400, ""},
		{"NUL in value", head("GET / HTTP/1.1", h, "X-A: a\x00b"), 400, "invalid byte"},
		{"CR in value", head("GET / HTTP/1.1", h, "X-A: a\rb"), 400, "invalid byte"},
		{"CR at end of value", head("GET / HTTP/1.1", h, "X-A: a\r"), 400, ""},
		{"LF in value", head("GET / HTTP/1.1", h, "X-A: a\nb"), 400, "invalid byte"},
		{"DEL in value", head("GET / HTTP/1.1", h, "X-A: a\x7fb"), 400, "invalid byte"},
		{"ESC in value", head("GET / HTTP/1.1", h, "X-A: a\x1bb"), 400, "invalid byte"},
		{"bare LF after request line", []byte("GET / HTTP/1.1\n" + h + "\r\n\r\n"), 400, ""},
		{"bare LF between fields", []byte("GET / HTTP/1.1\r\n" + h + "\nX-A: b\r\n\r\n"), 400, ""},
		{"bare LF smuggling a TE", []byte("POST / HTTP/1.1\r\n" + h + "\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"), 400, ""},
		{"bare CR line end", []byte("GET / HTTP/1.1\r\n" + h + "\rX-A: b\r\n\r\n"), 400, ""},
		{"empty line inside head", []byte("GET / HTTP/1.1\r\n\r\n" + h + "\r\n\r\n"), 400, ""},
		// Host.
		{"missing Host", head("GET / HTTP/1.1", "X-A: b"), 400, "Host"},
		{"missing Host HTTP/1.0", head("GET / HTTP/1.0"), 400, "Host"},
		{"two Hosts", head("GET / HTTP/1.1", h, h), 400, "Host"},
		{"two Hosts different", head("GET / HTTP/1.1", h, "host: evil.test"), 400, "Host"},
		// Request line.
		{"two spaces after method", head("GET  / HTTP/1.1", h), 400, "request line"},
		{"two spaces before version", head("GET /  HTTP/1.1", h), 400, "request line"},
		{"leading space", head(" GET / HTTP/1.1", h), 400, "request line"},
		{"trailing space", head("GET / HTTP/1.1 ", h), 400, "request line"},
		{"tab separators", head("GET\t/\tHTTP/1.1", h), 400, "request line"},
		{"tab after method", head("GET\t/ HTTP/1.1", h), 400, "request line"},
		{"tab before version", head("GET /\tHTTP/1.1", h), 400, "request line"},
		{"no version", head("GET /", h), 400, "request line"},
		{"only method", head("GET", h), 400, "request line"},
		{"empty request line", head("", h), 400, ""},
		{"target with space", head("GET /a b HTTP/1.1", h), 400, "request line"},
		{"lower-case version", head("GET / http/1.1", h), 400, "request line"},
		{"version HTTP/1", head("GET / HTTP/1", h), 400, "request line"},
		{"version HTTP/1.1x", head("GET / HTTP/1.1x", h), 400, "request line"},
		{"version HTTP/1.10", head("GET / HTTP/1.10", h), 400, "request line"},
		{"version HTTP/11", head("GET / HTTP/11", h), 400, "request line"},
		{"invalid method chars", head("G(T / HTTP/1.1", h), 400, "request line"},
		{"method with NUL", head("GE\x00T / HTTP/1.1", h), 400, "request line"},
		{"method non-ASCII", head("G\xc9T / HTTP/1.1", h), 400, "request line"},
		{"method with colon", head("GET: / HTTP/1.1", h), 400, "request line"},
		{"target non-ASCII", head("GET /caf\xc3\xa9 HTTP/1.1", h), 400, "request line"},
		{"target DEL", head("GET /a\x7f HTTP/1.1", h), 400, "request line"},
		{"target NUL", head("GET /a\x00 HTTP/1.1", h), 400, "request line"},
		{"target CR", head("GET /a\rb HTTP/1.1", h), 400, "request line"},
		{"target relative", head("GET a/b HTTP/1.1", h), 400, "target"},
		{"target query only", head("GET ?a HTTP/1.1", h), 400, "target"},
		{"asterisk with GET", head("GET * HTTP/1.1", h), 400, "asterisk"},
		{"asterisk with POST", head("POST * HTTP/1.1", h), 400, "asterisk"},
		{"double asterisk", head("OPTIONS ** HTTP/1.1", h), 400, "target"},
		{"absolute-form userinfo", head("GET http://a@"+testHost+"/ HTTP/1.1", h), 400, "target"},
		{"absolute-form userinfo with password", head("GET http://u:p@"+testHost+"/ HTTP/1.1", h), 400, "target"},
		{"absolute-form other scheme", head("GET ftp://"+testHost+"/ HTTP/1.1", h), 400, "target"},
		{"absolute-form ws scheme", head("GET ws://"+testHost+"/ HTTP/1.1", h), 400, "target"},
		{"absolute-form empty authority", head("GET http:///x HTTP/1.1", h), 400, "target"},
		{"absolute-form only scheme", head("GET http:// HTTP/1.1", h), 400, "target"},
		{"absolute-form fragment", head("GET http://"+testHost+"#f HTTP/1.1", h), 400, "target"},
		{"scheme without slashes", head("GET http:"+testHost+"/ HTTP/1.1", h), 400, "target"},
		// Versions.
		{"HTTP/2.0", head("GET / HTTP/2.0", h), 505, ""},
		{"HTTP/3.0", head("GET / HTTP/3.0", h), 505, ""},
		{"HTTP/0.9", head("GET / HTTP/0.9", h), 505, ""},
		{"h2 preface", []byte("PRI * HTTP/2.0\r\n\r\n"), 505, ""},
		// Authority mismatch.
		{"absolute-form other host", head("GET http://evil.test/x HTTP/1.1", h), 421, ""},
		{"absolute-form suffix confusion", head("GET http://"+testHost+".evil/x HTTP/1.1", h), 421, ""},
		{"absolute-form other workspace", head("GET http://other--demo--web.apps.test/x HTTP/1.1", h), 421, ""},
	}
	var r request
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := parseRequestHead(&r, tc.head, 100)
			if err == nil {
				t.Fatalf("parseRequestHead(%q) accepted; want %d", tc.head, tc.status)
			}
			pe := asParseError(t, err)
			if pe.status != tc.status {
				t.Errorf("parseRequestHead(%q) status = %d (%s); want %d", tc.head, pe.status, pe.reason, tc.status)
			}
			if tc.reason != "" && !strings.Contains(pe.reason, tc.reason) {
				t.Errorf("reason = %q; want it to mention %q", pe.reason, tc.reason)
			}
		})
	}
}

func TestUnitParseRequestHeadTooManyFields(t *testing.T) {
	var r request
	lines := []string{"GET / HTTP/1.1", "Host: " + testHost}
	for i := range 4 {
		lines = append(lines, "X-N: "+string(rune('a'+i)))
	}
	h := head(lines...)
	if err := parseRequestHead(&r, h, 5); err != nil {
		t.Fatalf("5 fields with limit 5: %v", err)
	}
	err := parseRequestHead(&r, h, 4)
	if pe := asParseError(t, err); pe.status != 431 {
		t.Errorf("5 fields with limit 4: status %d, want 431", pe.status)
	}
	// Default limit.
	lines = lines[:2]
	for range DefaultMaxHeaderFields {
		lines = append(lines, "X-N: v")
	}
	if pe := asParseError(t, parseRequestHead(&r, head(lines...), DefaultMaxHeaderFields)); pe.status != 431 {
		t.Errorf("%d fields: status %d, want 431", len(lines)-1, pe.status)
	}
}

// TestUnitParseRequestHeadHTTP10ConnectionClose: RFC 9112 §9.3 — when
// "close" is among the connection options the connection does not persist,
// whatever else is listed and in whatever order.
func TestUnitParseRequestHeadHTTP10ConnectionClose(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
	}{
		{"keep-alive, close", []string{"Connection: keep-alive, close"}},
		{"close, keep-alive", []string{"Connection: close, keep-alive"}},
		{"close then keep-alive lines", []string{"Connection: close", "Connection: keep-alive"}},
	}
	for _, tc := range tests {
		for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
			t.Run(proto+" "+tc.name, func(t *testing.T) {
				var r request
				lines := append([]string{"GET / " + proto, "Host: " + testHost}, tc.lines...)
				if err := parseRequestHead(&r, head(lines...), 100); err != nil {
					t.Fatal(err)
				}
				if !r.close {
					t.Errorf("%s with %q: close = false; the client asked to close", proto, tc.lines)
				}
			})
			t.Run(proto+" response "+tc.name, func(t *testing.T) {
				// The same rule for the app's response: a backend connection
				// the app announced it will close must not be pooled.
				var r response
				lines := append([]string{proto + " 200 OK", "Content-Length: 0"}, tc.lines...)
				if err := parseResponseHead(&r, head(lines...), false, 100); err != nil {
					t.Fatal(err)
				}
				if !r.close {
					t.Errorf("%s response with %q: close = false; the app announced close", proto, tc.lines)
				}
			})
		}
	}
}

func TestUnitParseRequestHeadWebSocketDetection(t *testing.T) {
	tests := []struct {
		name  string
		head  []byte
		want  bool
		close bool
	}{
		{"canonical", get("Connection: Upgrade", "Upgrade: websocket"), true, false},
		{"case-insensitive", get("connection: UPGRADE", "upgrade: WebSocket"), true, false},
		{"in a list", get("Connection: keep-alive, Upgrade", "Upgrade: websocket"), true, false},
		{"upgrade list", get("Connection: Upgrade", "Upgrade: foo/1, websocket"), true, false},
		{"two Connection lines", get("Connection: keep-alive", "Connection: upgrade", "Upgrade: websocket"), true, false},
		{"OWS around tokens", get("Connection: \tkeep-alive ,\tUpgrade\t", "Upgrade:  websocket "), true, false},
		{"no Connection upgrade", get("Connection: keep-alive", "Upgrade: websocket"), false, false},
		{"no Connection", get("Upgrade: websocket"), false, false},
		{"no Upgrade", get("Connection: Upgrade"), false, false},
		{"h2c", get("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA"), false, false},
		{"websocket with version suffix", get("Connection: Upgrade", "Upgrade: websocket/13"), false, false},
		{"prefix confusion", get("Connection: Upgrade", "Upgrade: websockets"), false, false},
		{"Connection: upgrades", get("Connection: upgrades", "Upgrade: websocket"), false, false},
		{"POST", head("POST / HTTP/1.1", "Host: "+testHost, "Connection: Upgrade", "Upgrade: websocket"), false, false},
		{"lower-case get", head("get / HTTP/1.1", "Host: "+testHost, "Connection: Upgrade", "Upgrade: websocket"), false, false},
		{"with close", get("Connection: Upgrade, close", "Upgrade: websocket"), true, true},
		{"with a body", get("Connection: Upgrade", "Upgrade: websocket", "Content-Length: 5"), false, false},
		{"with a chunked body", get("Connection: Upgrade", "Upgrade: websocket", "Transfer-Encoding: chunked"), false, false},
		{"with Content-Length 0", get("Connection: Upgrade", "Upgrade: websocket", "Content-Length: 0"), true, false},
		// RFC 9110 §7.8: a server MUST ignore an Upgrade header field received
		// in an HTTP/1.0 request (and RFC 6455 §4.1 requires HTTP/1.1).
		{"HTTP/1.0", head("GET / HTTP/1.0", "Host: "+testHost, "Connection: keep-alive, Upgrade", "Upgrade: websocket"), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r request
			if err := parseRequestHead(&r, tc.head, 100); err != nil {
				t.Fatal(err)
			}
			if r.upgrade != tc.want {
				t.Errorf("upgrade = %v; want %v", r.upgrade, tc.want)
			}
			if r.close != tc.close {
				t.Errorf("close = %v; want %v", r.close, tc.close)
			}
		})
	}
}

// TestUnitParseRequestHeadConnect: DESIGN.md "Requests": CONNECT → 405.
// CONNECT always uses the authority-form target (RFC 9112 §3.2.3), so the
// 405 must not be pre-empted by a 400 from target-form parsing.
func TestUnitParseRequestHeadConnect(t *testing.T) {
	var r request
	h := head("CONNECT "+testHost+":443 HTTP/1.1", "Host: "+testHost+":443")
	err := parseRequestHead(&r, h, 100)
	if err == nil {
		// handle() then answers 405 for CONNECT.
		if string(r.method) != "CONNECT" {
			t.Fatalf("method = %q", r.method)
		}
		return
	}
	if pe := asParseError(t, err); pe.status != 405 {
		t.Errorf("CONNECT in authority-form: status %d (%s); DESIGN.md says 405", pe.status, pe.reason)
	}
}

func TestUnitParseRequestHeadAllocs(t *testing.T) {
	h := benchBrowserHead()
	var r request
	if err := parseRequestHead(&r, h, 100); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := parseRequestHead(&r, h, 100); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("parseRequestHead on a reused request allocates %.1f times; want 0", allocs)
	}
}

func TestUnitSplitAbsolute(t *testing.T) {
	tests := []struct {
		target, authority, path string
		ok                      bool
	}{
		{"http://h/x", "h", "/x", true},
		{"http://h:80/x?y", "h:80", "/x?y", true},
		{"https://h", "h", "/", true},
		{"HtTp://h?q", "h", "/?q", true},
		{"http://[::1]:8080/p", "[::1]:8080", "/p", true},
		{"http://h#f", "", "", false},
		{"http://", "", "", false},
		{"http:///", "", "", false},
		{"http://u@h/", "", "", false},
		{"http:/h/", "", "", false},
		{"ftp://h/", "", "", false},
		{"/x", "", "", false},
		{"h:443", "", "", false},
	}
	for _, tc := range tests {
		a, p, ok := splitAbsolute([]byte(tc.target))
		if ok != tc.ok || string(a) != tc.authority || string(p) != tc.path {
			t.Errorf("splitAbsolute(%q) = %q %q %v; want %q %q %v", tc.target, a, p, ok, tc.authority, tc.path, tc.ok)
		}
	}
}

func TestUnitParseContentLength(t *testing.T) {
	tests := []struct {
		in   string
		n    int64
		want bool
	}{
		{"0", 0, true},
		{"42", 42, true},
		{"000", 0, true},
		{"999999999999999999", 999999999999999999, true},
		{"1000000000000000000", 0, false},
		{"", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{"1.0", 0, false},
		{"1e3", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"1,1", 0, false},
		{"٣", 0, false},
	}
	for _, tc := range tests {
		n, ok := parseContentLength([]byte(tc.in))
		if ok != tc.want || n != tc.n {
			t.Errorf("parseContentLength(%q) = %d %v; want %d %v", tc.in, n, ok, tc.n, tc.want)
		}
	}
}

func TestUnitHasToken(t *testing.T) {
	tests := []struct {
		list, token string
		want        bool
	}{
		{"websocket", "websocket", true},
		{"WebSocket", "websocket", true},
		{"a, websocket", "websocket", true},
		{"a,websocket,b", "websocket", true},
		{" \twebsocket\t ", "websocket", true},
		{"websockets", "websocket", false},
		{"web socket", "websocket", false},
		{"", "websocket", false},
		{",,,", "websocket", false},
		{"websocket/13", "websocket", false},
	}
	for _, tc := range tests {
		if got := hasToken([]byte(tc.list), tc.token); got != tc.want {
			t.Errorf("hasToken(%q, %q) = %v; want %v", tc.list, tc.token, got, tc.want)
		}
	}
}

func TestUnitFindHeadEnd(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27},
		{"GET / HTTP/1.1\r\nHost: h\r\n\r\nbody", 27},
		{"GET / HTTP/1.1\r\nHost: h\r\n", -1},
		{"GET / HTTP/1.1\nHost: h\n\n", -1},
		{"\r\n\r\n", 4},
		{"", -1},
	}
	for _, tc := range tests {
		if got := findHeadEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("findHeadEnd(%q) = %d; want %d", tc.in, got, tc.want)
		}
	}
}
