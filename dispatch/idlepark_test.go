package dispatch

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/listener"
)

// serveGoroutines counts goroutines serving an HTTP/1.1 client connection.
func serveGoroutines() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "dispatch.(*clientConn).serve(")
}

const idleGet = "GET / HTTP/1.1\r\nHost: team--demo--web.apps.test\r\n\r\n"

// openIdleH1 opens n keep-alive connections to web, one request each.
func openIdleH1(t *testing.T, e *h2Env, n int) []*h1Conn {
	t.Helper()
	conns := make([]*h1Conn, n)
	for i := range conns {
		conns[i] = e.h1("team--demo--web." + h2Domain)
		if st, _, _ := conns[i].do(t, idleGet); st != http.StatusOK {
			t.Fatalf("conn %d: status %d", i, st)
		}
	}
	return conns
}

// parkedH1 is the condition: want connections parked, none with a goroutine.
func parkedH1(e *h2Env, want int) func() bool {
	return func() bool { return e.srv.idleH1.waiters() == want && serveGoroutines() == 0 }
}

// waitClosed reads from c until the server closes it (EOF or reset).
func waitClosed(t *testing.T, c *h1Conn) {
	t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.br.ReadByte(); err == nil {
		t.Fatal("read a byte; want the connection closed")
	} else if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection still open: %v", err)
	}
}

// TestH1IdleParksWithoutGoroutines: idle HTTP/1.1 keep-alive connections
// are handed to the idle poller with no goroutine left per connection; the
// next request on each (and a pipelined pair) is served; a client that
// hangs up while parked is released; a revocation ends the parked ones.
// goleak at the end: the poller's goroutine is gone too.
func TestH1IdleParksWithoutGoroutines(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	const n = 20
	conns := openIdleH1(t, e, n)
	testutil.Eventually(t, 5*time.Second, "every connection parked, no serve goroutine", parkedH1(e, n))

	for i, c := range conns {
		if st, _, _ := c.do(t, idleGet); st != http.StatusOK {
			t.Fatalf("conn %d after parking: status %d", i, st)
		}
	}
	// Two requests in one write: the second is buffered when the first is
	// answered and must not wait for the socket.
	if _, err := io.WriteString(conns[0].conn, idleGet+idleGet); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < 2; k++ {
		resp, err := http.ReadResponse(conns[0].br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("pipelined response %d: %v %v", k, resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	testutil.Eventually(t, 5*time.Second, "parked again after traffic", parkedH1(e, n))

	// Clients hanging up while parked: released.
	for _, c := range conns[:5] {
		_ = c.conn.Close()
	}
	testutil.Eventually(t, 5*time.Second, "hung-up connections released", func() bool {
		return e.srv.Connections() == n-5 && parkedH1(e, n-5)()
	})

	// The route is revoked: every parked connection is closed.
	e.apply(0, false)
	for _, c := range conns[5:] {
		waitClosed(t, c)
	}
	testutil.Eventually(t, 5*time.Second, "revoked connections released", func() bool {
		return e.srv.Connections() == 0 && e.srv.idleH1.waiters() == 0
	})
}

// TestH1IdleParkedTimeoutAndDrain: a parked connection is still closed at
// its idle timeout, and a drain closes parked connections at once.
func TestH1IdleParkedTimeoutAndDrain(t *testing.T) {
	h2Verify(t)
	t.Run("idle timeout", func(t *testing.T) {
		e := newH2Env(t, 0, Config{IdleTimeout: 2 * time.Second})
		conns := openIdleH1(t, e, 3)
		testutil.Eventually(t, 5*time.Second, "parked", parkedH1(e, 3))
		for _, c := range conns {
			waitClosed(t, c)
		}
		testutil.Eventually(t, 5*time.Second, "released", func() bool {
			return e.srv.Connections() == 0 && e.srv.idleH1.waiters() == 0
		})
	})
	t.Run("drain", func(t *testing.T) {
		e := newH2Env(t, 0, Config{})
		conns := openIdleH1(t, e, 3)
		testutil.Eventually(t, 5*time.Second, "parked", parkedH1(e, 3))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		for _, c := range conns {
			waitClosed(t, c)
		}
		if w := e.srv.idleH1.waiters(); w != 0 {
			t.Fatalf("%d still parked after the drain", w)
		}
	})
}

// BenchmarkIdleH1ConnMemory reports the memory that idle HTTP/1.1
// keep-alive TLS connections hold, per connection: heap in use plus
// goroutine stacks after GC, with 200 connections open and idle past
// parkAfter. The clients' side is in the same process and counted too (the
// same for every version), so compare figures across changes.
func BenchmarkIdleH1ConnMemory(b *testing.B) {
	const n = 200
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer app.Close()
	table, srvCfg, cliCfg := oneRouteTLS(b, app.Listener.Addr().(*net.TCPAddr).Port)
	var perConn float64
	for b.Loop() {
		srv := New(Config{Logger: slog.New(slog.DiscardHandler)})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				raw, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					tc := tls.Server(raw, srvCfg)
					if err := tc.Handshake(); err != nil {
						_ = raw.Close()
						return
					}
					srv.ServeConn(listener.Conn{Conn: tc, Raw: raw, SNI: tc.ConnectionState().ServerName, Route: table.Lookup(tc.ConnectionState().ServerName)})
				})
			}
		})
		before := heldBytes()
		conns := make([]net.Conn, n)
		br := bufio.NewReader(nil)
		for i := range conns {
			c, err := tls.Dial("tcp", ln.Addr().String(), cliCfg)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.WriteString(c, idleGet); err != nil {
				b.Fatal(err)
			}
			br.Reset(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			conns[i] = c
		}
		for deadline := time.Now().Add(5 * time.Second); srv.idleH1.waiters() < n && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond) // benchmark only: no test asserts on it
		}
		time.Sleep(2 * parkAfter) // without parking: past parkAfter all the same
		perConn = float64(heldBytes()-before) / n
		for _, c := range conns {
			_ = c.Close()
		}
		_ = ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(ctx)
		cancel()
		wg.Wait()
	}
	b.ReportMetric(perConn, "B/idle-conn")
}

// heldBytes is the heap in use and the goroutine stacks, after GC.
func heldBytes() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}
