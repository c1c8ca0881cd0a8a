package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

const (
	h2Domain  = "apps.test"
	h2WebHost = "team--demo--web.apps.test"
	h2APIHost = "team--demo--api.apps.test"
	h2Down    = "team--demo--down.apps.test"
)

// h2App is a real HTTP/1.1 backend that counts the requests it receives.
type h2App struct {
	name    string
	ts      *httptest.Server
	hits    atomic.Int64
	arrived chan string   // a /block request arrived (its query)
	release chan struct{} // closed: /block requests answer
	once    sync.Once
}

func newH2App(t *testing.T, name string) *h2App {
	a := &h2App{name: name, arrived: make(chan string, 16), release: make(chan struct{})}
	a.ts = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

func (a *h2App) port() int { return a.ts.Listener.Addr().(*net.TCPAddr).Port }

func (a *h2App) unblock() { a.once.Do(func() { close(a.release) }) }

func (a *h2App) close() {
	a.unblock()
	a.ts.Close()
}

// h2Big is the deterministic 5 MiB body of /big.
var h2Big = func() []byte {
	b := make([]byte, 5<<20)
	for i := range b {
		b[i] = byte(i*7 + i>>13)
	}
	return b
}()

func h2Sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func (a *h2App) serve(w http.ResponseWriter, r *http.Request) {
	a.hits.Add(1)
	switch r.URL.Path {
	case "/headers":
		out := map[string]any{"Host": r.Host}
		for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded",
			"X-Real-Ip", "X-Applistener-User", "X-Forwarded-Client-Cert", "Authorization", "Cookie", "Te", "X-Custom"} {
			if v := r.Header.Values(k); len(v) > 0 {
				out[k] = v
			}
		}
		_ = json.NewEncoder(w).Encode(out)
	case "/upload":
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		_, _ = fmt.Fprintf(w, "%s %d %d %s", h2Sha(body), len(body), r.ContentLength, strings.Join(r.TransferEncoding, ","))
	case "/big":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(h2Big)))
		_, _ = w.Write(h2Big)
	case "/block":
		a.arrived <- r.URL.RawQuery
		select {
		case <-a.release:
			_, _ = io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	case "/events":
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-a.release:
			_, _ = io.WriteString(w, "data: last\n\n")
		case <-r.Context().Done():
		}
	case "/hints":
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "after hints")
	case "/halfhead":
		// An app that sends part of its response head and stalls, until
		// the listener closes the connection (or 10 s).
		if conn := hijackWrite(w, "HTTP/1.1 200 OK\r\nContent-Type: text/pl"); conn != nil {
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = conn.Read(make([]byte, 1))
			_ = conn.Close()
		}
	case "/switch":
		// An app that switches protocols on a plain request.
		if conn := hijackWrite(w, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"); conn != nil {
			_ = conn.Close()
		}
	default:
		w.Header().Set("X-App", a.name)
		_, _ = fmt.Fprintf(w, "%s %s", a.name, r.URL.RawQuery)
	}
}

// hijackWrite takes the app's connection from net/http and writes raw on
// it; nil when it cannot be taken.
func hijackWrite(w http.ResponseWriter, raw string) net.Conn {
	conn, bw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil
	}
	_, _ = bw.WriteString(raw)
	_ = bw.Flush()
	return conn
}

// h2Env plays the listener: TLS with ALPN h2/http1.1, SNI lookup in a real
// route table, then ServeH2 (or ServeConn).
type h2Env struct {
	t        *testing.T
	ca       *tlsconf.Authority
	table    *routes.Table
	srv      *Server
	ln       net.Listener
	web, api *h2App
	downPort int
	rawPort  int // when set, service "raw" routes to it (security_test.go)
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func h2Prefixes(t *testing.T, ps ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func h2Verify(t *testing.T) {
	t.Helper()
	testutil.VerifyNone(t, goleak.IgnoreCurrent())
}

func newH2Env(t *testing.T, maxStreams int, cfg Config) *h2Env {
	t.Helper()
	e := &h2Env{t: t}
	ca, cert := wildcardAuthority(t, "h2 test CA")
	e.ca = ca
	e.web, e.api = newH2App(t, "web"), newH2App(t, "api")
	// A port nobody listens on.
	dl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.downPort = dl.Addr().(*net.TCPAddr).Port
	_ = dl.Close()

	e.table = routes.NewTable(routes.Options{Domain: h2Domain, Logger: slog.New(slog.DiscardHandler)})
	e.apply(maxStreams, true)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e.srv = New(cfg)

	e.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12}
	e.wg.Go(func() {
		for {
			raw, err := e.ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.wg.Go(func() {
				tc := tls.Server(raw, tlsCfg)
				_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					_ = raw.Close()
					return
				}
				cs := tc.ConnectionState()
				route := e.table.Lookup(cs.ServerName)
				if route == nil {
					_ = raw.Close()
					return
				}
				lc := listener.Conn{Conn: tc, Raw: raw, SNI: cs.ServerName, Route: route}
				if cs.NegotiatedProtocol == "h2" {
					e.srv.ServeH2(lc)
				} else {
					e.srv.ServeConn(lc)
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = e.ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.srv.Shutdown(ctx)
		cancel()
		e.table.Close()
		e.web.unblock()
		e.api.unblock()
		e.wg.Wait()
		e.web.close()
		e.api.close()
	})
	return e
}

// apply installs web, api and down (withWeb false: without web).
func (e *h2Env) apply(maxStreams int, withWeb bool) {
	e.t.Helper()
	var services []string
	if withWeb {
		services = append(services, fmt.Sprintf(`{"name":"web","port":%d,"revision":1}`, e.web.port()))
	}
	if e.rawPort > 0 {
		services = append(services, fmt.Sprintf(`{"name":"raw","port":%d,"revision":1}`, e.rawPort))
	}
	services = append(services,
		fmt.Sprintf(`{"name":"api","port":%d,"revision":1}`, e.api.port()),
		fmt.Sprintf(`{"name":"down","port":%d,"revision":1}`, e.downPort))
	limits := ""
	if maxStreams > 0 {
		limits = fmt.Sprintf(`"limits":{"max_streams":%d},`, maxStreams)
	}
	doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},%s"services":[%s]}]}`, limits, strings.Join(services, ","))))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(doc.Rejected) > 0 {
		e.t.Fatalf("rejected: %+v", doc.Rejected)
	}
	e.table.Apply(doc)
}

// dial opens one HTTP/2 connection with SNI serverName; every request
// sent on the returned ClientConn uses that one connection.
func (e *h2Env) dial(serverName string) *http.ClientConn {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{
		ServerName: serverName, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		e.t.Fatalf("negotiated %q, want h2", p)
	}
	cc, err := h2NewClientConn(tc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// h2NewClientConn runs net/http's HTTP/2 client on tc, a TLS connection
// that negotiated h2: a Transport that speaks HTTP/2 only and whose TLS
// "dial" hands over tc, once. The ClientConn it returns is that one
// connection (never pooled, never redialled); closing it closes tc.
func h2NewClientConn(tc *tls.Conn) (*http.ClientConn, error) {
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	var dialed atomic.Bool
	tr := &http.Transport{
		Protocols: &protocols,
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
			if !dialed.CompareAndSwap(false, true) {
				return nil, errors.New("h2 test: the client connection dialled twice")
			}
			return tc, nil
		},
	}
	return tr.NewClientConn(context.Background(), "https", tc.RemoteAddr().String())
}

func h2Req(t testing.TB, method, host, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "https://"+h2WebHost+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	return req
}

type h2Result struct {
	status int
	header http.Header
	body   string
	err    error
	close  bool // HTTP/1.1: the answer said Connection: close
}

func h2Do(cc *http.ClientConn, req *http.Request) h2Result {
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return h2Result{err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.ProtoMajor != 2 {
		return h2Result{err: fmt.Errorf("response over %s, want HTTP/2", resp.Proto)}
	}
	b, err := io.ReadAll(resp.Body)
	return h2Result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func h2MustDo(t *testing.T, cc *http.ClientConn, req *http.Request, status int) h2Result {
	t.Helper()
	res := h2Do(cc, req)
	if res.err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, res.err)
	}
	if res.status != status {
		t.Fatalf("%s %s (Host %s): status %d, want %d; body %q", req.Method, req.URL.Path, req.Host, res.status, status, res.body)
	}
	return res
}

func h2RecvArrival(t *testing.T, a *h2App) string {
	t.Helper()
	select {
	case q := <-a.arrived:
		return q
	case <-time.After(5 * time.Second):
		t.Fatal("request did not reach the app")
		return ""
	}
}

// TestH2CoalescedMisdirected: a request for another route on a coalesced
// connection gets 421 on its stream only; the connection keeps serving.
func TestH2CoalescedMisdirected(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)

	res := h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/?a=1", nil), 200)
	if res.body != "web a=1" {
		t.Fatalf("body %q", res.body)
	}
	res = h2MustDo(t, cc, h2Req(t, "GET", h2APIHost, "/", nil), 421)
	if !strings.Contains(res.body, "421 Misdirected Request") || !strings.HasSuffix(res.body, "\n") || strings.Count(res.body, "\n") != 1 {
		t.Fatalf("421 body %q", res.body)
	}
	if got := res.header.Get("Cache-Control"); got != "no-store" {
		t.Fatalf("Cache-Control %q", got)
	}
	if got := res.header.Get("Content-Type"); !strings.HasPrefix(got, "text/plain") {
		t.Fatalf("Content-Type %q", got)
	}
	// A browser gets the HTML page; a port and a trailing dot are fine.
	req := h2Req(t, "GET", h2APIHost+".:443", "/", nil)
	req.Header.Set("Accept", "text/html,*/*")
	res = h2MustDo(t, cc, req, 421)
	if !strings.Contains(res.body, "<h1>421 Misdirected Request</h1>") || !strings.HasPrefix(res.header.Get("Content-Type"), "text/html") {
		t.Fatalf("HTML 421: %q %q", res.header.Get("Content-Type"), res.body)
	}
	if n := e.api.hits.Load(); n != 0 {
		t.Fatalf("api app received %d requests", n)
	}
	// Same connection, still serving; case and port of :authority do not matter.
	res = h2MustDo(t, cc, h2Req(t, "GET", "TEAM--demo--WEB.apps.test:8443", "/?b=2", nil), 200)
	if res.body != "web b=2" || res.header.Get("X-App") != "web" {
		t.Fatalf("body %q", res.body)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("%d connections accepted, want 1", n)
	}
	// Neither closed nor closing (GOAWAY): free to take another request.
	if err, n := cc.Err(), cc.Available(); err != nil || n == 0 {
		t.Fatalf("client connection: err %v, %d streams available", err, n)
	}
}

// TestH2ForwardingAndBodies: headers as the app sees them, request bodies
// of known and unknown length, a large response, many concurrent streams.
func TestH2ForwardingAndBodies(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)

	req := h2Req(t, "GET", h2WebHost, "/headers", nil)
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	req.Header.Set("X-Forwarded-Host", "evil.example")
	req.Header.Set("X-Forwarded-Proto", "http")
	req.Header.Set("Forwarded", "for=6.6.6.6")
	req.Header.Set("X-Real-Ip", "6.6.6.6")
	req.Header.Set("X-Applistener-User", "admin")
	req.Header.Set("X-Forwarded-Client-Cert", "forged")
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Add("Cookie", "a=1")
	req.Header.Add("Cookie", "b=2")
	req.Header.Set("X-Custom", "kept")
	res := h2MustDo(t, cc, req, 200)
	var got map[string]any
	if err := json.Unmarshal([]byte(res.body), &got); err != nil {
		t.Fatalf("%v: %q", err, res.body)
	}
	want := map[string]any{
		"Host":              "127.0.0.1:" + strconv.Itoa(e.web.port()),
		"X-Forwarded-For":   []any{"127.0.0.1"},
		"X-Forwarded-Proto": []any{"https"},
		"X-Forwarded-Host":  []any{h2WebHost},
		"Forwarded":         []any{"for=127.0.0.1;host=" + h2WebHost + ";proto=https"},
		"Authorization":     []any{"Bearer secret"},
		"Cookie":            []any{"a=1; b=2"},
		"X-Custom":          []any{"kept"},
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Fatalf("app saw\n%s\nwant\n%s", gotJSON, wantJSON)
	}

	// 1 MiB with a known length.
	up := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	res = h2MustDo(t, cc, h2Req(t, "POST", h2WebHost, "/upload", bytes.NewReader(up)), 200)
	if want := fmt.Sprintf("%s %d %d ", h2Sha(up), len(up), len(up)); res.body != want {
		t.Fatalf("known length upload: app saw %q, want %q", res.body, want)
	}
	// Unknown length: chunked towards the app.
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 64; i++ {
			_, _ = pw.Write(up[i*(len(up)/64) : (i+1)*(len(up)/64)])
		}
		_ = pw.Close()
	}()
	req = h2Req(t, "POST", h2WebHost, "/upload", pr)
	req.ContentLength = -1
	res = h2MustDo(t, cc, req, 200)
	if want := fmt.Sprintf("%s %d -1 chunked", h2Sha(up), len(up)); res.body != want {
		t.Fatalf("unknown length upload: app saw %q, want %q", res.body, want)
	}
	// An empty POST.
	res = h2MustDo(t, cc, h2Req(t, "POST", h2WebHost, "/upload", http.NoBody), 200)
	if want := fmt.Sprintf("%s 0 0 ", h2Sha(nil)); res.body != want {
		t.Fatalf("empty upload: app saw %q, want %q", res.body, want)
	}

	// 5 MiB download.
	res = h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/big", nil), 200)
	if len(res.body) != len(h2Big) || h2Sha([]byte(res.body)) != h2Sha(h2Big) {
		t.Fatalf("download: %d bytes, hash mismatch", len(res.body))
	}
	if got := res.header.Get("Content-Length"); got != strconv.Itoa(len(h2Big)) {
		t.Fatalf("Content-Length %q", got)
	}
	// HEAD keeps the app's Content-Length, no body.
	res = h2MustDo(t, cc, h2Req(t, "HEAD", h2WebHost, "/big", nil), 200)
	if res.body != "" || res.header.Get("Content-Length") != strconv.Itoa(len(h2Big)) {
		t.Fatalf("HEAD: body %d bytes, Content-Length %q", len(res.body), res.header.Get("Content-Length"))
	}

	// 50 concurrent streams on the one connection.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			path := "/?i=" + strconv.Itoa(i)
			if i%5 == 0 {
				path = "/big"
			}
			r := h2Do(cc, h2Req(t, "GET", h2WebHost, path, nil))
			switch {
			case r.err != nil:
				errs <- r.err
			case r.status != 200:
				errs <- fmt.Errorf("stream %d: status %d", i, r.status)
			case i%5 == 0 && h2Sha([]byte(r.body)) != h2Sha(h2Big):
				errs <- fmt.Errorf("stream %d: big body mismatch", i)
			case i%5 != 0 && r.body != "web i="+strconv.Itoa(i):
				errs <- fmt.Errorf("stream %d: body %q", i, r.body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("%d connections accepted, want 1", n)
	}
	if n := e.api.hits.Load(); n != 0 {
		t.Fatalf("api app received %d requests", n)
	}
}

// TestH2TrustedProxy: a trusted peer's forwarding headers are kept and
// extended.
func TestH2TrustedProxy(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{TrustedProxies: h2Prefixes(t, "127.0.0.0/8")})
	cc := e.dial(h2WebHost)
	req := h2Req(t, "GET", h2WebHost, "/headers", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Header.Set("X-Forwarded-Client-Cert", "by-proxy")
	res := h2MustDo(t, cc, req, 200)
	var got map[string][]string
	var host string
	raw := map[string]json.RawMessage{}
	if err := json.Unmarshal([]byte(res.body), &raw); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(raw["Host"], &host)
	delete(raw, "Host")
	b, _ := json.Marshal(raw)
	_ = json.Unmarshal(b, &got)
	if xff := got["X-Forwarded-For"]; len(xff) != 1 || xff[0] != "203.0.113.9, 127.0.0.1" {
		t.Fatalf("X-Forwarded-For %q", xff)
	}
	if xc := got["X-Forwarded-Client-Cert"]; len(xc) != 1 || xc[0] != "by-proxy" {
		t.Fatalf("X-Forwarded-Client-Cert %q", xc)
	}
}

// TestH2Denials: methods, dial failures, an app that switches protocols,
// early hints, server-sent events.
func TestH2Denials(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: -1}) // a refused dial is answered at once
	cc := e.dial(h2WebHost)

	res := h2MustDo(t, cc, h2Req(t, "TRACE", h2WebHost, "/", nil), 405)
	if res.header.Get("Allow") == "" {
		t.Fatal("405 without Allow")
	}
	connect := h2Req(t, "CONNECT", h2WebHost, "", nil)
	connect.URL.Path = ""
	h2MustDo(t, cc, connect, 405)
	// The app switching protocols on an HTTP/2 request.
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/switch", nil), 502)
	// 103 reaches the client before the final answer, whose fields it does
	// not leak into.
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, fmt.Sprintf("%d %s", code, h.Get("Link")))
		return nil
	}}
	req := h2Req(t, "GET", h2WebHost, "/hints", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	res = h2MustDo(t, cc, req, 200)
	if res.body != "after hints" || res.header.Get("Link") != "" || len(hints) != 1 || hints[0] != "103 </style.css>; rel=preload" {
		t.Fatalf("hints %q, final Link %q, body %q", hints, res.header.Get("Link"), res.body)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("%d connections", n)
	}

	// Server-sent events stream: the first event arrives before the app
	// finishes.
	resp, err := cc.RoundTrip(h2Req(t, "GET", h2WebHost, "/events", nil))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("data: first\n\n"))
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, first); done <- err }()
	select {
	case err := <-done:
		if err != nil || string(first) != "data: first\n\n" {
			t.Fatalf("first event %q, %v", first, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event was held back")
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	e.web.unblock()
	rest, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || string(rest) != "data: last\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}

	// Dial refused: 502 saying that nothing listens on the port.
	cd := e.dial(h2Down)
	res = h2MustDo(t, cd, h2Req(t, "GET", h2Down, "/", nil), 502)
	if want := fmt.Sprintf(`{"error":"app_not_listening","port":%d}`+"\n", e.downPort); res.body != want {
		t.Fatalf("502 body %q; want %q", res.body, want)
	}
}

// TestH2Revocation: withdrawing a route closes its HTTP/2 connections, busy
// or idle, and their streams.
func TestH2Revocation(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	route := e.table.Lookup(h2WebHost)
	busy := e.dial(h2WebHost)
	idle := e.dial(h2WebHost)
	h2MustDo(t, idle, h2Req(t, "GET", h2WebHost, "/", nil), 200)

	inflight := make(chan h2Result, 1)
	go func() { inflight <- h2Do(busy, h2Req(t, "GET", h2WebHost, "/block", nil)) }()
	h2RecvArrival(t, e.web)
	testutil.Eventually(t, 2*time.Second, "two connections", func() bool { return e.srv.Connections() == 2 })
	if n := route.Lease.Streams(); n < 2 {
		t.Fatalf("lease has %d streams before revocation", n)
	}

	start := time.Now()
	e.apply(0, false) // web withdrawn
	select {
	case r := <-inflight:
		if r.err == nil {
			t.Fatalf("in-flight request completed with %d %q after revocation", r.status, r.body)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("in-flight request still running 2 s after revocation")
	}
	testutil.Eventually(t, 2*time.Second, "connections closed", func() bool { return e.srv.Connections() == 0 })
	testutil.Eventually(t, 2*time.Second, "client sees the idle connection closed", func() bool { return idle.Err() != nil })
	if d := time.Since(start); d > time.Second {
		t.Fatalf("revocation took %v", d)
	}
	if n := route.Lease.Streams(); n != 0 {
		t.Fatalf("lease still has %d streams", n)
	}
	if r := h2Do(idle, h2Req(t, "GET", h2WebHost, "/", nil)); r.err == nil {
		t.Fatalf("request on a revoked connection answered %d", r.status)
	}
}

// TestH2InstanceLimit: a stream beyond max_streams gets 503 Retry-After: 1.
func TestH2InstanceLimit(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 1, Config{})
	cc := e.dial(h2WebHost)
	inflight := make(chan h2Result, 1)
	go func() { inflight <- h2Do(cc, h2Req(t, "GET", h2WebHost, "/block", nil)) }()
	h2RecvArrival(t, e.web)

	res := h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 503)
	if res.header.Get("Retry-After") != "1" || !strings.Contains(res.body, reasonLimit) {
		t.Fatalf("503: Retry-After %q, body %q", res.header.Get("Retry-After"), res.body)
	}
	e.web.unblock()
	if r := <-inflight; r.err != nil || r.status != 200 || r.body != "done" {
		t.Fatalf("blocked request: %+v", r)
	}
	// The slot is free again once the stream's handler returns, which may
	// be just after its last frame reached the client: wait for it, then
	// the next request is served.
	inst := e.table.Lookup(h2WebHost).Instance
	testutil.Eventually(t, 5*time.Second, "the blocked stream's slot released", func() bool { return inst.Active() == 0 })
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
	testutil.Eventually(t, 5*time.Second, "every stream slot released", func() bool { return inst.Active() == 0 })
}

// TestH2Drain: Shutdown sends GOAWAY, lets the stream in flight finish and
// returns after it.
func TestH2Drain(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)
	idle := e.dial(h2WebHost)
	h2MustDo(t, idle, h2Req(t, "GET", h2WebHost, "/", nil), 200)
	inflight := make(chan h2Result, 1)
	go func() { inflight <- h2Do(cc, h2Req(t, "GET", h2WebHost, "/block", nil)) }()
	h2RecvArrival(t, e.web)

	shutdownDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shutdownDone <- e.srv.Shutdown(ctx)
	}()
	// After a GOAWAY a connection has no stream available for new requests.
	testutil.Eventually(t, 2*time.Second, "GOAWAY on the busy connection", func() bool { return cc.Available() == 0 })
	testutil.Eventually(t, 2*time.Second, "GOAWAY on the idle connection", func() bool { return idle.Available() == 0 })
	if r := h2Do(cc, h2Req(t, "GET", h2WebHost, "/", nil)); r.err == nil {
		t.Fatalf("new request after GOAWAY answered %d", r.status)
	}
	testutil.Eventually(t, 3*time.Second, "idle connection closed", func() bool { return e.srv.Connections() == 1 })
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	e.web.unblock()
	if r := <-inflight; r.err != nil || r.status != 200 || r.body != "done" {
		t.Fatalf("in-flight request: %+v", r)
	}
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Shutdown did not return after the last stream")
	}
	if n := e.srv.Connections(); n != 0 {
		t.Fatalf("%d connections after Shutdown", n)
	}
}

// TestH2DrainDeadline: a stream that never ends is closed when the drain
// deadline passes.
func TestH2DrainDeadline(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)
	inflight := make(chan h2Result, 1)
	go func() { inflight <- h2Do(cc, h2Req(t, "GET", h2WebHost, "/block", nil)) }()
	h2RecvArrival(t, e.web)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := e.srv.Shutdown(ctx)
	d := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	if d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	if n := e.srv.Connections(); n != 0 {
		t.Fatalf("%d connections after Shutdown", n)
	}
	select {
	case r := <-inflight:
		if r.err == nil {
			t.Fatalf("request completed with %d", r.status)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("in-flight request not ended")
	}
	testutil.Eventually(t, 2*time.Second, "client sees the connection closed", func() bool { return cc.Err() != nil })
	// New connections are refused while draining.
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: h2WebHost, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err == nil {
		_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
		c2, err := h2NewClientConn(tc)
		if err == nil {
			if r := h2Do(c2, h2Req(t, "GET", h2WebHost, "/", nil)); r.err == nil {
				t.Fatalf("request on a new connection during drain answered %d", r.status)
			}
			_ = c2.Close()
		}
		_ = tc.Close()
	}
}

// TestH2ClientReset: a stream the client abandons releases its slot and
// its app connection at once.
func TestH2ClientReset(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)
	ctx, cancel := context.WithCancel(context.Background())
	req := h2Req(t, "GET", h2WebHost, "/block", nil).WithContext(ctx)
	inflight := make(chan h2Result, 1)
	go func() { inflight <- h2Do(cc, req) }()
	h2RecvArrival(t, e.web)
	inst := e.table.Lookup(h2WebHost).Instance
	if inst.Active() != 1 {
		t.Fatalf("active %d", inst.Active())
	}
	cancel()
	if r := <-inflight; r.err == nil {
		t.Fatalf("cancelled request answered %d", r.status)
	}
	testutil.Eventually(t, 2*time.Second, "slot released", func() bool { return inst.Active() == 0 })
	// The connection carries on.
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
}

// TestH2ResponseHeadTimeout: an app that does not answer a request within
// the response-head timeout gets 504, the timeout counted from the
// request's write: the wait for the answer that follows the write
// (appwait.go) is part of it, not added to it.
func TestH2ResponseHeadTimeout(t *testing.T) {
	h2Verify(t)
	const timeout = time.Second
	e := newH2Env(t, 0, Config{ResponseHeaderTimeout: timeout})
	cc := e.dial(h2WebHost)
	start := time.Now()
	res := h2Do(cc, h2Req(t, "GET", h2WebHost, "/block", nil))
	d := time.Since(start)
	if res.err != nil || res.status != 504 || !strings.Contains(res.body, reasonRespTimeout) {
		t.Fatalf("app that never answers: %+v, want 504", res)
	}
	if d < timeout || d >= 2*timeout {
		t.Fatalf("504 after %v, want the timeout %v", d, timeout)
	}
	h2RecvArrival(t, e.web)
	// The connection carries on.
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
}

// TestResponseHeadTimeoutPartialHead: an app whose answer starts within
// the response-head timeout but whose head never completes gets 504 at
// the timeout counted from the request's write, on both protocols (the
// read of the rest of the head keeps the deadline of the wait for the
// answer's first bytes).
func TestResponseHeadTimeoutPartialHead(t *testing.T) {
	h2Verify(t)
	const timeout = time.Second
	e := newH2Env(t, 0, Config{ResponseHeaderTimeout: timeout})
	check := func(proto string, status int, body string, d time.Duration) {
		t.Helper()
		if status != 504 || !strings.Contains(body, reasonRespTimeout) {
			t.Errorf("%s: a head that never completes: %d %q, want 504", proto, status, body)
		}
		if d < timeout || d >= 2*timeout {
			t.Errorf("%s: 504 after %v, want the timeout %v", proto, d, timeout)
		}
	}

	cc := e.dial(h2WebHost)
	start := time.Now()
	res := h2Do(cc, h2Req(t, "GET", h2WebHost, "/halfhead", nil))
	if res.err != nil {
		t.Fatal(res.err)
	}
	check("HTTP/2", res.status, res.body, time.Since(start))
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)

	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: h2WebHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Close() }()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	start = time.Now()
	if _, err := fmt.Fprintf(tc, "GET /halfhead HTTP/1.1\r\nHost: %s\r\n\r\n", h2WebHost); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	check("HTTP/1.1", resp.StatusCode, string(b), time.Since(start))
}

// TestH2HeaderLimits: the header list is bounded by Config.MaxHeaderBytes
// (advertised as SETTINGS_MAX_HEADER_LIST_SIZE) and the field count by
// Config.MaxHeaderFields (431).
func TestH2HeaderLimits(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{MaxHeaderBytes: 8192})
	cc := e.dial(h2WebHost)
	req := h2Req(t, "GET", h2WebHost, "/", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 7000))
	h2MustDo(t, cc, req, 200)

	req = h2Req(t, "GET", h2WebHost, "/", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 9000))
	if r := h2Do(cc, req); r.err == nil || !strings.Contains(r.err.Error(), "advertised limit") {
		t.Fatalf("oversized header list: %+v", r)
	}

	req = h2Req(t, "GET", h2WebHost, "/", nil)
	for i := range DefaultMaxHeaderFields + 20 {
		req.Header.Set("X-F"+strconv.Itoa(i), "v")
	}
	res := h2MustDo(t, cc, req, 431)
	if !strings.Contains(res.body, "431") {
		t.Fatalf("431 body %q", res.body)
	}
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("%d connections", n)
	}
}

// TestH2ContinuationFlood: a header block that goes on past the header list
// limit in CONTINUATION frames ends the connection (the CVE-2023-45288
// defence: GOAWAY ENHANCE_YOUR_CALM from the engine, where x/net sent
// PROTOCOL_ERROR) and reaches no app.
func TestH2ContinuationFlood(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: h2WebHost, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Close() }()
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))

	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", h2WebHost}, {":path", "/"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := range 400 {
		_ = enc.WriteField(hpack.HeaderField{Name: "x-h" + strconv.Itoa(i), Value: strings.Repeat("a", 1000)})
	}
	b := block.Bytes()
	fr := http2.NewFramer(tc, tc)
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
			return
		}
		if fr.WriteSettings() != nil {
			return
		}
		const chunk = 16 << 10
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:chunk], EndStream: true}) != nil {
			return
		}
		for rest := b[chunk:]; len(rest) > 0; {
			n := min(chunk, len(rest))
			if fr.WriteContinuation(1, n == len(rest), rest[:n]) != nil {
				return
			}
			rest = rest[n:]
		}
	}()
	var goAway *http2.GoAwayFrame
	for goAway == nil {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			goAway = g
		}
	}
	if goAway == nil || goAway.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %+v, want ENHANCE_YOUR_CALM", goAway)
	}
	// Then the server closes.
	for {
		if _, err := fr.ReadFrame(); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the connection stayed open after GOAWAY")
			}
			break
		}
	}
	_ = tc.Close()
	<-writeDone
	if n := e.web.hits.Load(); n != 0 {
		t.Fatalf("app received %d requests", n)
	}
	testutil.Eventually(t, 2*time.Second, "connection untracked", func() bool { return e.srv.Connections() == 0 })
}

// TestH2StalledClient: a client that stops reading a response has its
// stream reset after BodyTimeout; the slot and the connection are freed
// for other work, and an idle event stream is not cut.
func TestH2StalledClient(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{BodyTimeout: 300 * time.Millisecond})
	cc := e.dial(h2WebHost)
	resp, err := cc.RoundTrip(h2Req(t, "GET", h2WebHost, "/big", nil))
	if err != nil {
		t.Fatal(err)
	}
	inst := e.table.Lookup(h2WebHost).Instance
	// The client's stream window (4 MiB) is less than the body (5 MiB).
	testutil.Eventually(t, 3*time.Second, "stalled stream reset", func() bool { return inst.Active() == 0 })
	_, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err == nil {
		t.Fatal("a stalled response was completed")
	}

	// An event stream idle for longer than BodyTimeout stays open.
	resp, err = cc.RoundTrip(h2Req(t, "GET", h2WebHost, "/events", nil))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("data: first\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(900 * time.Millisecond)
	e.web.unblock()
	rest, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || string(rest) != "data: last\n\n" {
		t.Fatalf("idle event stream: %q, %v", rest, err)
	}
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
}

// TestH2StalledUpload: a request body that stops arriving gets 408 after
// BodyTimeout, and the app connection is not left waiting.
func TestH2StalledUpload(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{BodyTimeout: 300 * time.Millisecond})
	cc := e.dial(h2WebHost)
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	go func() { _, _ = pw.Write([]byte("partial")) }()
	req := h2Req(t, "POST", h2WebHost, "/upload", pr)
	req.ContentLength = 1000
	start := time.Now()
	res := h2Do(cc, req)
	if res.err != nil || res.status != 408 {
		t.Fatalf("stalled upload: %+v", res)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("408 after %v", d)
	}
	inst := e.table.Lookup(h2WebHost).Instance
	testutil.Eventually(t, 2*time.Second, "slot released", func() bool { return inst.Active() == 0 })
	h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200)
}

// TestH2StalePooledRetry: app connections kept in the pool that the app has
// closed meanwhile are not answered with 502: the pool finds them closed
// before writing and the request goes to a new connection. Requests share
// the pool with HTTP/1.1.
func TestH2StalePooledRetry(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	cc := e.dial(h2WebHost)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { h2Do(cc, h2Req(t, "GET", h2WebHost, "/", nil)) })
	}
	wg.Wait()
	route := e.table.Lookup(h2WebHost)
	pool := e.srv.routePool(route)
	// The listener pools an app connection once its stream has ended,
	// which can be after the client has read the response: every one must
	// be pooled before the app closes them, or one pooled after the close
	// could be reused unprobed (it was idle for less than probeIdleAfter).
	testutil.Eventually(t, 5*time.Second, "the app connections pooled", func() bool {
		return route.Instance.Active() == 0 && pool.idleCount() > 0
	})
	e.web.ts.CloseClientConnections()
	waitIdleStale(t, pool)
	res := h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/?after=close", nil), 200)
	if res.body != "web after=close" {
		t.Fatalf("body %q", res.body)
	}
}

// TestH2ExpectContinue: a request with Expect: 100-continue gets the app's
// 100 Continue on its stream before it sends its body (the app sends it
// when it starts reading), then the final answer.
func TestH2ExpectContinue(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	tc, fr := h2RawConn(t, e, h2WebHost)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", h2WebHost},
		{":path", "/upload"}, {"content-length", "5"}, {"expect", "100-continue"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	var statuses []string
	var body []byte
	sentBody := false
	for done := false; !done; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading (statuses %v): %v", statuses, err)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			statuses = append(statuses, f.PseudoValue("status"))
			if f.PseudoValue("status") == "100" && !sentBody {
				sentBody = true
				if err := fr.WriteData(1, true, []byte("hello")); err != nil {
					t.Fatal(err)
				}
			}
			done = f.StreamEnded()
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			done = f.StreamEnded()
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset (%v); statuses %v", f.ErrCode, statuses)
		}
	}
	if len(statuses) != 2 || statuses[0] != "100" || statuses[1] != "200" {
		t.Fatalf("statuses %v; want [100 200]", statuses)
	}
	if want := h2Sha([]byte("hello")) + " 5 5 "; string(body) != want {
		t.Fatalf("body %q; want %q", body, want)
	}
}
