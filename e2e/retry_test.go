package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// countingApp is an app that counts how often it executed each request
// (by path) and, for paths starting with /drop, reads the request and
// closes the connection without answering; for /last it answers and then
// closes the (idle) connection without saying so.
type countingApp struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	execs map[string]int
	conns []net.Conn
}

func newCountingApp(t *testing.T) *countingApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &countingApp{ln: ln, execs: map[string]int{}}
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

func (a *countingApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *countingApp) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		a.mu.Lock()
		a.execs[req.URL.Path]++
		a.mu.Unlock()
		if strings.HasPrefix(req.URL.Path, "/drop") {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
		if req.URL.Path == "/last" {
			return
		}
	}
}

func (a *countingApp) executions(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.execs[path]
}

// closeWaitTo reports whether a TCP socket connected to port on loopback is
// in CLOSE_WAIT (its peer closed it; this end has not yet), from
// /proc/net/tcp: the listener's pooled connection after the app closed it.
func closeWaitTo(t *testing.T, port int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[2], want) && f[3] == "08" {
			return true
		}
	}
	return false
}

// TestNoReplayedRequestsThroughBinary: through the built binary, over
// HTTP/1.1 and HTTP/2, a POST that the app read on a reused connection
// and then closed without answering is executed once and answered 502; a
// POST on a pooled connection that the app closed while idle goes to a new
// connection and is executed once (200).
func TestNoReplayedRequestsThroughBinary(t *testing.T) {
	t.Parallel()
	app := newCountingApp(t)
	p := startProc(t, routesDoc(service{Name: "web", Port: app.port(), Revision: 1}))
	for _, proto := range []string{"h1", "h2"} {
		tr := &http.Transport{
			DialContext:       p.dial,
			TLSClientConfig:   tlsConfig(hostWeb),
			ForceAttemptHTTP2: proto == "h2",
			DisableKeepAlives: proto == "h1", // each request on its own client connection
		}
		if proto == "h1" {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		c := &http.Client{Transport: tr, Timeout: waitTimeout}
		do := func(method, path string, body []byte) int {
			t.Helper()
			req, err := http.NewRequestWithContext(context.Background(), method, "https://"+hostWeb+path, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s %s %s: %v", proto, method, path, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if want := map[string]int{"h1": 1, "h2": 2}[proto]; resp.ProtoMajor != want {
				t.Fatalf("%s: answered over %s", proto, resp.Proto)
			}
			return resp.StatusCode
		}
		if code := do("GET", "/warm-"+proto, nil); code != 200 {
			t.Fatalf("warm-up: %d", code)
		}
		drop := "/drop-" + proto
		if code := do("POST", drop, []byte("order=1")); code != 502 {
			t.Errorf("%s POST %s: %d; want 502", proto, drop, code)
		}
		if n := app.executions(drop); n != 1 {
			t.Errorf("%s POST %s executed %d times; want exactly 1", proto, drop, n)
		}

		before := p.metric(t, "applistener_app_connections_stale_total")
		if code := do("GET", "/last", nil); code != 200 {
			t.Fatalf("/last: %d", code)
		}
		answered := time.Now()
		testutil.Eventually(t, waitTimeout, "the listener's pooled connection to see the app's close", func() bool {
			// The listener probes connections idle for 1 ms or more.
			return closeWaitTo(t, app.port()) && time.Since(answered) > 5*time.Millisecond
		})
		order := "/order-" + proto
		if code := do("POST", order, []byte("order=2")); code != 200 {
			t.Errorf("%s POST %s after the app closed the idle connection: %d; want 200", proto, order, code)
		}
		if n := app.executions(order); n != 1 {
			t.Errorf("%s POST %s executed %d times; want exactly 1", proto, order, n)
		}
		if after := p.metric(t, "applistener_app_connections_stale_total"); after != before+1 {
			t.Errorf("applistener_app_connections_stale_total went %v → %v; want +1", before, after)
		}
		tr.CloseIdleConnections()
	}
}
