package dispatch

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// toyApp is a keep-alive HTTP/1.1 app on loopback whose connections the
// test can drop all at once (an app restart keeps its port). The first
// `hold` requests are answered only once all of them have arrived, so that
// they use distinct backend connections.
type toyApp struct {
	ln      net.Listener
	hold    int
	mu      sync.Mutex
	conns   []net.Conn
	arrived int
	gate    chan struct{}
	wg      sync.WaitGroup
	resp    string // the response to every request
}

func newToyApp(t *testing.T, hold int) *toyApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &toyApp{ln: ln, hold: hold, gate: make(chan struct{}), resp: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns = append(a.conns, c)
			a.mu.Unlock()
			a.wg.Add(1)
			go a.serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		a.dropAll()
		a.wg.Wait()
	})
	return a
}

func (a *toyApp) serve(c net.Conn) {
	defer a.wg.Done()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		a.mu.Lock()
		a.arrived++
		n := a.arrived
		if n == a.hold {
			close(a.gate)
		}
		a.mu.Unlock()
		if n <= a.hold {
			<-a.gate
		}
		if _, err := io.WriteString(c, a.resp); err != nil {
			return
		}
	}
}

func (a *toyApp) dropAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.conns {
		_ = c.Close()
	}
	a.conns = nil
}

func (a *toyApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func testRoute(t testing.TB, port int) *routes.Route {
	t.Helper()
	tbl := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(tbl.Close)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":%d,"revision":1}]}]}`, port))
	if err != nil {
		t.Fatal(err)
	}
	tbl.Apply(doc)
	r := tbl.Lookup(testHost)
	if r == nil {
		t.Fatal("route not installed")
	}
	return r
}

// clientOf starts ServeConn on one end of a loopback TCP pair and returns
// the client end.
func clientOf(t testing.TB, s *Server, route *routes.Route) (net.Conn, *bufio.Reader) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeConn(listener.Conn{Conn: srv, Raw: srv, SNI: testHost, Route: route})
	}()
	t.Cleanup(func() {
		_ = cl.Close()
		<-done
	})
	_ = cl.SetDeadline(time.Now().Add(10 * time.Second))
	return cl, bufio.NewReader(cl)
}

func roundTrip(t *testing.T, cl net.Conn, br *bufio.Reader) int {
	t.Helper()
	code, err := roundTripErr(cl, br)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// roundTripErr sends a GET and reads the response; safe off the test goroutine.
func roundTripErr(cl net.Conn, br *bufio.Reader) (int, error) {
	if _, err := io.WriteString(cl, "GET / HTTP/1.1\r\nHost: "+testHost+"\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, fmt.Errorf("reading the response: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestUnitStalePooledConnectionsRetryOnFreshDial: after an app restart every
// pooled backend connection is dead. The pool must find every one of them
// dead before writing on it (backendPool.get's probe) and dial, or the
// first request after any restart of a busy app fails with 502.
func TestUnitStalePooledConnectionsRetryOnFreshDial(t *testing.T) {
	app := newToyApp(t, 2)
	route := testRoute(t, app.port())
	s := New(Config{Logger: slog.New(slog.DiscardHandler), BackendIdleTimeout: time.Minute})

	c1, br1 := clientOf(t, s, route)
	c2, br2 := clientOf(t, s, route)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	errs := make([]error, 2)
	wg.Go(func() { codes[0], errs[0] = roundTripErr(c1, br1) })
	wg.Go(func() { codes[1], errs[1] = roundTripErr(c2, br2) })
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("warm-up statuses %v, errors %v", codes, errs)
	}
	pool := route.Data(func() any { return nil }).(*backendPool)
	testutil.Eventually(t, 5*time.Second, "two idle backend connections", func() bool { return pool.idleCount() == 2 })

	app.dropAll() // the app restarts: both pooled connections are dead
	waitIdleStale(t, pool)

	if code := roundTrip(t, c1, br1); code != 200 {
		t.Errorf("first request after the app dropped its connections: %d; want 200 (retry on a fresh connection)", code)
	}
}

// TestUnitStalePooledConnectionRetried is the control: with one dead pooled
// connection the request goes to a new one.
func TestUnitStalePooledConnectionRetried(t *testing.T) {
	app := newToyApp(t, 1)
	route := testRoute(t, app.port())
	s := New(Config{Logger: slog.New(slog.DiscardHandler), BackendIdleTimeout: time.Minute})
	c1, br1 := clientOf(t, s, route)
	if code := roundTrip(t, c1, br1); code != 200 {
		t.Fatalf("warm-up status %d", code)
	}
	pool := route.Data(func() any { return nil }).(*backendPool)
	testutil.Eventually(t, 5*time.Second, "one idle backend connection", func() bool { return pool.idleCount() == 1 })
	app.dropAll()
	waitIdleStale(t, pool)
	if code := roundTrip(t, c1, br1); code != 200 {
		t.Errorf("request after the app dropped its connection: %d; want 200", code)
	}
	if code := roundTrip(t, c1, br1); code != 200 {
		t.Errorf("next request: %d; want 200", code)
	}
}

// TestUnitGzipChunkedResponseRelayed: an app answers with
// "Transfer-Encoding: gzip, chunked" on a keep-alive connection (valid
// HTTP/1.1: the body is chunk-delimited, RFC 9112 §6.3). The listener must
// either refuse it (502) or relay it with its transfer coding intact and
// complete. It must not strip the Transfer-Encoding header, hand the client
// the raw chunk framing as the body, and then hang until the app closes.
func TestUnitGzipChunkedResponseRelayed(t *testing.T) {
	app := newToyApp(t, 0)
	app.resp = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
	route := testRoute(t, app.port())
	s := New(Config{Logger: slog.New(slog.DiscardHandler)})
	cl, br := clientOf(t, s, route)
	defer app.dropAll() // unblocks the listener if it waits for the app to close
	_ = cl.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(cl, "GET / HTTP/1.1\r\nHost: "+testHost+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	tp := textproto.NewReader(br)
	status, err := tp.ReadLine()
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(status, "HTTP/1.1 502 ") {
		return
	}
	te := strings.ToLower(strings.Join(hdr.Values("Transfer-Encoding"), ","))
	if !strings.Contains(te, "gzip") {
		body, rerr := io.ReadAll(br)
		t.Errorf("relayed as %q %v (transfer coding dropped); body %q, then %v", status, hdr, body, rerr)
	}
}

// TestUnitLargeResponseHead: readAppResponseHead allows app response heads up
// to 64 KiB (maxResponseHead), but the backend read buffer is only
// max(MaxHeaderBytes+1024, 16 KiB) = 17 KiB by default, so a 20 KiB head
// (a large Content-Security-Policy or several big cookies) fills the buffer
// and is answered 502 long before the 64 KiB limit applies.
func TestUnitLargeResponseHead(t *testing.T) {
	app := newToyApp(t, 0)
	app.resp = "HTTP/1.1 200 OK\r\nContent-Security-Policy: " + strings.Repeat("a", 20<<10) + "\r\nContent-Length: 2\r\n\r\nok"
	route := testRoute(t, app.port())
	s := New(Config{Logger: slog.New(slog.DiscardHandler)})
	cl, br := clientOf(t, s, route)
	if code := roundTrip(t, cl, br); code != 200 {
		t.Errorf("20 KiB response head: status %d; want 200 (the limit is 64 KiB)", code)
	}
}
