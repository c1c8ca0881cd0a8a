package dispatch

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawHost is the route to the rawApp of an h2Env (service "raw").
const rawHost = "team--demo--raw." + h2Domain

// rawApp is an HTTP/1.1 app that records the exact bytes of every request
// it reads and counts how often it executed each one. What it does after
// reading a request is chosen per request by act.
type rawApp struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
	reqs  []string       // raw bytes of each request read (head and body)
	execs map[string]int // "METHOD /path" → times read
	act   func(r *http.Request, nth int) rawAction
	resp  func(r *http.Request) string // the response; nil: 200 "ok"
}

// rawAction is what the app does once it has read a request.
type rawAction int

const (
	answer          rawAction = iota // answer and keep the connection
	answerThenClose                  // answer (no Connection: close), then close while idle
	closeUnanswered                  // close without answering (FIN)
	resetUnanswered                  // close without answering with a reset (RST)
	// answerInTwoWrites answers in two small writes, head then body, with
	// Nagle's algorithm on, as Python's http.server and werkzeug do: the
	// body waits until the head is acknowledged.
	answerInTwoWrites
)

func newRawApp(t *testing.T) *rawApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rawApp{ln: ln, execs: map[string]int{}}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns = append(a.conns, c)
			a.mu.Unlock()
			a.wg.Go(func() { a.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		a.mu.Lock()
		for _, c := range a.conns {
			_ = c.Close()
		}
		a.mu.Unlock()
		a.wg.Wait()
	})
	return a
}

func (a *rawApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

// recorder keeps the bytes read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (a *rawApp) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
	rec := &recorder{r: c}
	br := bufio.NewReaderSize(rec, 64<<10)
	for nth := 1; ; nth++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		raw := rec.buf.Bytes()[:rec.buf.Len()-br.Buffered()]
		a.mu.Lock()
		a.reqs = append(a.reqs, string(raw))
		a.execs[req.Method+" "+req.URL.Path]++
		act, resp := answer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if a.act != nil {
			act = a.act(req, nth)
		}
		if a.resp != nil {
			resp = a.resp(req)
		}
		a.mu.Unlock()
		rest := append([]byte(nil), rec.buf.Bytes()[len(raw):]...)
		rec.buf.Reset()
		rec.buf.Write(rest)
		switch act {
		case closeUnanswered:
			return
		case resetUnanswered:
			_ = c.(*net.TCPConn).SetLinger(0)
			return
		}
		if act == answerInTwoWrites {
			_ = c.(*net.TCPConn).SetNoDelay(false)
			head, body, _ := strings.Cut(resp, "\r\n\r\n")
			if _, err := io.WriteString(c, head+"\r\n\r\n"); err != nil {
				return
			}
			resp = body
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
		if act == answerThenClose {
			return
		}
	}
}

func (a *rawApp) setAct(f func(r *http.Request, nth int) rawAction) {
	a.mu.Lock()
	a.act = f
	a.mu.Unlock()
}

func (a *rawApp) setResp(f func(r *http.Request) string) {
	a.mu.Lock()
	a.resp = f
	a.mu.Unlock()
}

func (a *rawApp) lastRequest(t *testing.T) string {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.reqs) == 0 {
		t.Fatal("the app received no request")
	}
	return a.reqs[len(a.reqs)-1]
}

func (a *rawApp) executions(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.execs[key]
}

// newRawEnv is an h2Env whose route rawHost leads to a rawApp.
func newRawEnv(t *testing.T, cfg Config) (*h2Env, *rawApp) {
	t.Helper()
	e := newH2Env(t, 0, cfg)
	app := newRawApp(t)
	e.rawPort = app.port()
	e.apply(0, true)
	return e, app
}

// h1Conn is an HTTP/1.1 client connection to the env, written raw.
type h1Conn struct {
	conn *tls.Conn
	br   *bufio.Reader
}

func (e *h2Env) h1(host string) *h1Conn {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	return &h1Conn{conn: tc, br: bufio.NewReader(tc)}
}

// do writes raw and reads one response (status, body).
func (c *h1Conn) do(t *testing.T, raw string) (int, http.Header, string) {
	t.Helper()
	if _, err := io.WriteString(c.conn, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("reading the response to %q: %v", firstLineOf(raw), err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header, string(b)
}

func firstLineOf(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	return line
}

// cgiFields reads a forwarded request head the way CGI/WSGI servers do:
// names lower-cased with '_' taken as '-'. It returns each folded name's
// count and whether any name had an underscore.
func cgiFields(t *testing.T, raw string) (map[string]int, []string) {
	t.Helper()
	headEnd := strings.Index(raw, "\r\n\r\n")
	if headEnd < 0 {
		t.Fatalf("no head in %q", raw)
	}
	counts := map[string]int{}
	var underscored []string
	for _, line := range strings.Split(raw[:headEnd], "\r\n")[1:] {
		name, _, _ := strings.Cut(line, ":")
		if strings.Contains(name, "_") {
			underscored = append(underscored, name)
		}
		counts[strings.ToLower(strings.ReplaceAll(name, "_", "-"))]++
	}
	return counts, underscored
}

// aliasFields are request fields spelled with '_' that a CGI/WSGI app
// reads as the listener-owned field of the same name (HTTP_TRANSFER_ENCODING
// for both Transfer-Encoding and Transfer_Encoding).
var aliasFields = []string{
	"Transfer_Encoding: chunked", "Content_Length: 3", "Keep_Alive: 5", "Proxy_Authorization: Basic eA==",
	"Proxy_Connection: keep-alive", "Proxy_Authenticate: Basic", "X_Forwarded_For: 10.6.6.6", "X_Real_IP: 10.6.6.6",
}

// underscoreFields are ordinary fields with '_' in their names: forwarded
// only with AllowUnderscoreHeaders.
var underscoreFields = []string{"X_Custom: kept-if-allowed", "Host_: not-a-host", "TE_: trailers"}

// TestUnderscoreAliasesNeverReachApp: a field whose name contains '_' is
// not forwarded (HTTP/1.1 and HTTP/2 alike); with AllowUnderscoreHeaders,
// ordinary ones are, but an alias of a framing, hop-by-hop, Host, Proxy-*
// or forwarding field never is. The app reads exactly one framing.
func TestUnderscoreAliasesNeverReachApp(t *testing.T) {
	h2Verify(t)
	for _, allow := range []bool{false, true} {
		for _, proto := range []string{"h1", "h2"} {
			t.Run(fmt.Sprintf("%s/allow=%v", proto, allow), func(t *testing.T) {
				e, app := newRawEnv(t, Config{AllowUnderscoreHeaders: allow})
				fields := append(append([]string{"X-Plain: always"}, underscoreFields...), aliasFields...)
				body := "hello"
				switch proto {
				case "h1":
					c := e.h1(rawHost)
					raw := "POST /upload HTTP/1.1\r\nHost: " + rawHost + "\r\nContent-Length: 5\r\n" +
						strings.Join(fields, "\r\n") + "\r\n\r\n" + body
					if code, _, _ := c.do(t, raw); code != 200 {
						t.Fatalf("status %d", code)
					}
				case "h2":
					cc := e.dial(rawHost)
					req := h2Req(t, "POST", rawHost, "/upload", strings.NewReader(body))
					for _, f := range fields {
						name, value, _ := strings.Cut(f, ": ")
						req.Header[name] = []string{value}
					}
					req.ContentLength = int64(len(body))
					h2MustDo(t, cc, req, 200)
				}
				got := app.lastRequest(t)
				counts, underscored := cgiFields(t, got)
				if n := counts["content-length"] + counts["transfer-encoding"]; n != 1 {
					t.Errorf("app saw %d framing fields (CGI reading); want exactly 1:\n%s", n, got)
				}
				if counts["host"] != 1 {
					t.Errorf("app saw %d Host fields (CGI reading):\n%s", counts["host"], got)
				}
				for _, name := range []string{"connection", "upgrade", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-connection"} {
					if counts[name] > 0 {
						t.Errorf("hop-by-hop alias %s reached the app:\n%s", name, got)
					}
				}
				if !strings.Contains(got, "X-Forwarded-For: 127.0.0.1\r\n") || strings.Contains(got, "10.6.6.6") {
					t.Errorf("forwarding claim alias reached the app:\n%s", got)
				}
				if !strings.HasSuffix(got, "\r\n\r\n"+body) {
					t.Errorf("app's body is not %q:\n%q", body, got)
				}
				if counts["x-plain"] != 1 {
					t.Errorf("an ordinary field was lost:\n%s", got)
				}
				wantUnderscored := 0
				if allow {
					wantUnderscored = len(underscoreFields)
				}
				if len(underscored) != wantUnderscored {
					t.Errorf("underscored fields at the app: %q; want %d", underscored, wantUnderscored)
				}
				dropped := promtest.ToFloat64(e.srv.m.headersDropped.WithLabelValues("underscore"))
				if want := float64(len(aliasFields) + len(underscoreFields) - wantUnderscored); dropped != want {
					t.Errorf("applistener_request_headers_dropped_total{reason=underscore} = %v; want %v", dropped, want)
				}
			})
		}
	}
}

// TestRetryRule is the retry rule as a table: method × body × whether the
// connection was reused × where sending failed.
func TestRetryRule(t *testing.T) {
	points := []struct {
		name string
		at   sendFailure
	}{{"unsent", failedUnsent}, {"partly-sent", failedPartlySent}, {"after-send", failedAfterSend}}
	methods := []string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE", "PATCH", "TRACE", "CONNECT", "get"}
	for _, m := range methods {
		for _, inMemory := range []bool{true, false} {
			for _, reused := range []bool{true, false} {
				for _, p := range points {
					for attempt := range 2 {
						want := attempt == 0 && reused && inMemory && p.at == failedUnsent &&
							(m == "GET" || m == "HEAD" || m == "OPTIONS")
						if got := mayRetry([]byte(m), inMemory, reused, p.at, attempt); got != want {
							t.Errorf("mayRetry(%s, body in memory %v, reused %v, %s, attempt %d) = %v; want %v",
								m, inMemory, reused, p.name, attempt, got, want)
						}
					}
				}
			}
		}
	}
	if writeFailure(0) != failedUnsent || writeFailure(1) != failedPartlySent {
		t.Error("writeFailure misclassifies")
	}
}

// waitPoolStale waits until every idle app connection of host's pool has
// been closed by the app (as the listener's probe sees it).
func waitPoolStale(t *testing.T, e *h2Env, host string) {
	t.Helper()
	waitIdleStale(t, e.srv.routePool(e.table.Lookup(host)))
}

// TestNoReplayedRequests: over HTTP/1.1 and HTTP/2, for every method, a
// request the app may have read is never sent to it again: an app that
// reads it on a reused connection and closes (or resets) without answering
// executes it once and the client gets 502. A pooled connection the app
// closed while idle is not a failure: the request takes a new connection
// and is executed once, with 200.
func TestNoReplayedRequests(t *testing.T) {
	h2Verify(t)
	type request struct {
		method string
		body   string
	}
	reqs := []request{{"GET", ""}, {"HEAD", ""}, {"OPTIONS", ""}, {"POST", "payload"}, {"POST", ""},
		{"PUT", "payload"}, {"DELETE", ""}, {"PATCH", "x"}}
	cases := []struct {
		name   string
		second rawAction // what the app does with the request on the reused connection
		first  rawAction // and with the request that opens it
		status int
	}{
		{"read-then-close", closeUnanswered, answer, 502},
		{"read-then-reset", resetUnanswered, answer, 502},
		{"closed-while-idle", answer, answerThenClose, 200},
	}
	for _, proto := range []string{"h1", "h2"} {
		for _, tc := range cases {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				e, app := newRawEnv(t, Config{})
				app.setAct(func(r *http.Request, nth int) rawAction {
					if r.URL.Path == "/warm" {
						return tc.first
					}
					return tc.second
				})
				var cc *http.ClientConn
				send := func(method, path, body string) int {
					// The app connection goes back to the pool just after
					// the response: wait for it, so that the next request
					// finds the pool in a known state.
					defer testutil.Eventually(t, 5*time.Second, "the request to end", func() bool {
						return promtest.ToFloat64(e.srv.m.streamsActive) == 0
					})
					switch proto {
					case "h1":
						raw := method + " " + path + " HTTP/1.1\r\nHost: " + rawHost + "\r\n"
						if body != "" {
							raw += fmt.Sprintf("Content-Length: %d\r\n", len(body))
						}
						h1 := e.h1(rawHost)
						if method == "HEAD" {
							// http.ReadResponse needs to know: no body.
							if _, err := io.WriteString(h1.conn, raw+"\r\n"); err != nil {
								t.Fatal(err)
							}
							resp, err := http.ReadResponse(h1.br, &http.Request{Method: "HEAD"})
							if err != nil {
								t.Fatal(err)
							}
							_ = resp.Body.Close()
							return resp.StatusCode
						}
						code, _, _ := h1.do(t, raw+"\r\n"+body)
						return code
					default:
						if cc == nil {
							cc = e.dial(rawHost)
						}
						var rb io.Reader
						if body != "" {
							rb = strings.NewReader(body)
						}
						res := h2Do(cc, h2Req(t, method, rawHost, path, rb))
						if res.err != nil {
							t.Fatalf("%s %s: %v", method, path, res.err)
						}
						return res.status
					}
				}
				for _, r := range reqs {
					path := "/" + strings.ToLower(r.method) + fmt.Sprint(len(r.body))
					// A request the app answers leaves one pooled connection.
					if code := send("GET", "/warm", ""); code != 200 {
						t.Fatalf("warm-up: %d", code)
					}
					if tc.first == answerThenClose {
						waitPoolStale(t, e, rawHost)
					}
					if code := send(r.method, path, r.body); code != tc.status {
						t.Errorf("%s %s: status %d; want %d", r.method, path, code, tc.status)
					}
					if n := app.executions(r.method + " " + path); n != 1 {
						t.Errorf("%s %s (%q body) executed %d times by the app; want exactly 1", r.method, path, r.body, n)
					}
				}
				if tc.first == answerThenClose {
					if n := promtest.ToFloat64(e.srv.m.staleConns); n < float64(len(reqs)) {
						t.Errorf("applistener_app_connections_stale_total = %v; want >= %d", n, len(reqs))
					}
				}
			})
		}
	}
}

// TestCookiesAreHostOnly: an app's Set-Cookie keeps its Domain only when it
// names the request's host; a parent-domain (or any other) Domain is
// removed on HTTP/1.1 and HTTP/2, counted, and kept with PassCookieDomain.
func TestCookiesAreHostOnly(t *testing.T) {
	h2Verify(t)
	setCookies := []string{
		"toss=1; Path=/; Domain=" + h2Domain + "; HttpOnly",
		"dot=1; domain=." + h2Domain,
		"other=1; Domain=team--other--web." + h2Domain + "; Secure",
		"mine=1; Domain=." + strings.ToUpper(rawHost) + "; Path=/",
		"plain=1; Path=/",
	}
	want := []string{
		"toss=1; Path=/; HttpOnly",
		"dot=1",
		"other=1; Secure",
		"mine=1; Domain=." + strings.ToUpper(rawHost) + "; Path=/",
		"plain=1; Path=/",
	}
	for _, pass := range []bool{false, true} {
		for _, proto := range []string{"h1", "h2"} {
			t.Run(fmt.Sprintf("%s/pass=%v", proto, pass), func(t *testing.T) {
				e, app := newRawEnv(t, Config{PassCookieDomain: pass})
				app.setResp(func(*http.Request) string {
					var b strings.Builder
					b.WriteString("HTTP/1.1 200 OK\r\n")
					for _, c := range setCookies {
						b.WriteString("Set-Cookie: " + c + "\r\n")
					}
					b.WriteString("Content-Length: 2\r\n\r\nok")
					return b.String()
				})
				var got []string
				if proto == "h1" {
					_, hdr, _ := e.h1(rawHost).do(t, "GET / HTTP/1.1\r\nHost: "+rawHost+"\r\n\r\n")
					got = hdr.Values("Set-Cookie")
				} else {
					got = h2MustDo(t, e.dial(rawHost), h2Req(t, "GET", rawHost, "/", nil), 200).header.Values("Set-Cookie")
				}
				expect, removed := want, 3.0
				if pass {
					expect, removed = setCookies, 0
				}
				if strings.Join(got, "\n") != strings.Join(expect, "\n") {
					t.Errorf("Set-Cookie at the client:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(expect, "\n"))
				}
				if n := promtest.ToFloat64(e.srv.m.cookieDomains); n != removed {
					t.Errorf("applistener_cookie_domains_removed_total = %v; want %v", n, removed)
				}
			})
		}
	}
}

func TestHostOnlyCookie(t *testing.T) {
	const host = "team--a.apps.test"
	cases := []struct{ in, out string }{
		{"a=1", "a=1"},
		{"a=1; Domain=team--a.apps.test", "a=1; Domain=team--a.apps.test"},
		{"a=1;Domain=apps.test", "a=1"},
		{"a=1; Path=/; DOMAIN = .apps.test ; Secure", "a=1; Path=/; Secure"},
		{"a=1; Domain", "a=1"},
		{"a=1; Domain=", "a=1"},
		{"a=1; Domain=team--a.apps.test; Domain=apps.test", "a=1; Domain=team--a.apps.test"},
		{"a=b=c; Max-Age=5; domain=evil.test; SameSite=Lax", "a=b=c; Max-Age=5; SameSite=Lax"},
		{"a=1; Domainx=apps.test", "a=1; Domainx=apps.test"},
	}
	for _, c := range cases {
		got, n := hostOnlyCookie([]byte(c.in), host)
		if string(got) != c.out {
			t.Errorf("hostOnlyCookie(%q) = %q; want %q", c.in, got, c.out)
		}
		if (n > 0) != (c.in != c.out) {
			t.Errorf("hostOnlyCookie(%q) reported %d removed", c.in, n)
		}
	}
	if a := testing.AllocsPerRun(100, func() { hostOnlyCookie([]byte("a=1; Path=/; Secure"), host) }); a != 0 {
		t.Errorf("a cookie without Domain costs %v allocations", a)
	}
}

// TestBareLFRefusedAtOnce: a head with bare LF line endings is answered
// 400 as soon as the bare LF arrives, not at the head timeout.
func TestBareLFRefusedAtOnce(t *testing.T) {
	h2Verify(t)
	for _, raw := range []string{
		"GET / HTTP/1.1\nHost: " + rawHost + "\n\n",
		"GET / HTTP/1.1\r\nHost: " + rawHost + "\n",
		"GET / HTTP/1.1\rHost: x",
	} {
		e, app := newRawEnv(t, Config{HeaderTimeout: time.Hour})
		c := e.h1(rawHost)
		_ = c.conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c.conn, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("%q: no answer before the test's own 5 s deadline (the head timeout is 1 h): %v", raw, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 400 || !resp.Close {
			t.Errorf("%q: %d (close %v); want 400 and close", raw, resp.StatusCode, resp.Close)
		}
		app.mu.Lock()
		if len(app.reqs) != 0 {
			t.Errorf("%q reached the app", raw)
		}
		app.mu.Unlock()
	}
}

// TestWebSocketEarlyBytesKept: frames a client sends right after its
// upgrade request, before a slow 101 (slower than watchAfter, when the
// listener watches the client connection), reach the app whole and in
// order once the 101 is out: none dropped, none cut mid-frame.
func TestWebSocketEarlyBytesKept(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	early := append(wsFrame(true, 2, patterned(700), true, 0), wsFrame(true, 1, []byte("small"), true, 0)...)
	headIn := make(chan struct{})
	got := make(chan []byte, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		close(headIn)
		// A slow app: the 101 comes after the listener started watching
		// the client connection (watchAfter).
		time.Sleep(watchAfter + 300*time.Millisecond)
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, len(early))
		n, _ := io.ReadFull(br, b)
		got <- b[:n]
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	e.rawPort = ln.Addr().(*net.TCPAddr).Port
	e.apply(0, true)

	c := e.h1(rawHost)
	if _, err := io.WriteString(c.conn, "GET /ws HTTP/1.1\r\nHost: "+rawHost+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-headIn:
	case <-time.After(5 * time.Second):
		t.Fatal("the upgrade request did not reach the app")
	}
	if _, err := c.conn.Write(early); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, early) {
			t.Fatalf("the app got %d early bytes (first difference at %d); want the %d bytes sent, in order",
				len(b), firstDiff(b, early), len(early))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app never got the early frames")
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// h2TestHeadTimeout is the head timeout of TestH2HeadTimeout.
const h2TestHeadTimeout = 600 * time.Millisecond

// h2ClosedWithin reads frames until the server closes the connection,
// failing if that takes longer than limit; it returns how long it took.
func h2ClosedWithin(t *testing.T, tc *tls.Conn, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = tc.SetReadDeadline(start.Add(limit))
	buf := make([]byte, 4096)
	for {
		if _, err := tc.Read(buf); err != nil {
			if isTimeout(err) {
				t.Fatalf("the connection was still open after %v (head timeout %v)", limit, h2TestHeadTimeout)
			}
			return time.Since(start)
		}
	}
}

// TestH2HeadTimeout: an HTTP/2 header block trickled byte by byte, a
// frame header left incomplete, or a connection that never sends a complete
// header block is closed at the head timeout (as HTTP/1.1 heads are), and
// counted as 408; a connection with an open stream that idles, and a slow
// request body, are not cut by it.
func TestH2HeadTimeout(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{HeaderTimeout: h2TestHeadTimeout})
	var enc bytes.Buffer
	henc := hpack.NewEncoder(&enc)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2WebHost}, {":path", "/"},
		{"user-agent", strings.Repeat("slow", 20)}} {
		_ = henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := enc.Bytes()
	limit := 20 * h2TestHeadTimeout

	t.Run("trickled CONTINUATION", func(t *testing.T) {
		tc, fr := h2RawConn(t, e, h2WebHost)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:4], EndStream: true}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 4; i < len(block); i++ {
				select {
				case <-stop:
					return
				case <-time.After(h2TestHeadTimeout / 5):
				}
				if fr.WriteContinuation(1, i == len(block)-1, block[i:i+1]) != nil {
					return
				}
			}
		})
		h2ClosedWithin(t, tc, limit)
		close(stop)
		wg.Wait()
	})
	t.Run("incomplete frame header", func(t *testing.T) {
		tc, _ := h2RawConn(t, e, h2WebHost)
		if _, err := tc.Write([]byte{0, 0, 10, 1}); err != nil {
			t.Fatal(err)
		}
		h2ClosedWithin(t, tc, limit)
	})
	t.Run("no stream", func(t *testing.T) {
		tc, _ := h2RawConn(t, e, h2WebHost)
		h2ClosedWithin(t, tc, limit)
	})
	// Two heads timed out; the connection that never opened a stream was
	// closed without counting (as an idle HTTP/1.1 connection is).
	if n := promtest.ToFloat64(e.srv.m.denials.WithLabelValues("408")); n != 2 {
		t.Errorf("applistener_request_denials_total{status=408} = %v; want 2", n)
	}

	t.Run("idle after a stream, slow body", func(t *testing.T) {
		cc := e.dial(h2WebHost)
		h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
		// Idle for several head timeouts: the connection stays.
		time.Sleep(2 * h2TestHeadTimeout)
		h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
		// A body sent in pieces over several head timeouts is not a head.
		pr, pw := io.Pipe()
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 4 {
				time.Sleep(h2TestHeadTimeout / 2)
				if _, err := pw.Write([]byte("part")); err != nil {
					return
				}
			}
			_ = pw.Close()
		})
		res := h2MustDo(t, cc, h2Req(t, "POST", h2WebHost, "/upload", pr), 200)
		wg.Wait()
		if !strings.Contains(res.body, " 16 ") {
			t.Errorf("upload: %q", res.body)
		}
	})
}

// TestEarlyAnswerDuringUpload: an app that answers (413, Connection: close)
// before reading a large upload ends the exchange while the client is
// still sending. The body copy must be stopped and waited for before the
// connection's buffers go back to the pool (under -race a copy that
// outlives the exchange is a data race; without it, a crash).
func TestEarlyAnswerDuringUpload(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = c.Close() }()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	e.rawPort = ln.Addr().(*net.TCPAddr).Port
	e.apply(0, true)

	chunk := bytes.Repeat([]byte("x"), 16<<10)
	for i := range 40 {
		c := e.h1(rawHost)
		if _, err := io.WriteString(c.conn, "POST /upload HTTP/1.1\r\nHost: "+rawHost+"\r\nContent-Length: 104857600\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		var up sync.WaitGroup
		up.Go(func() {
			for {
				if _, err := c.conn.Write(chunk); err != nil {
					return
				}
			}
		})
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Fatalf("upload %d: status %d; want the app's 413", i, resp.StatusCode)
		}
		_ = c.conn.Close()
		up.Wait()
	}
	testutil.Eventually(t, 5*time.Second, "every connection to end", func() bool { return e.srv.Connections() == 0 })
}
