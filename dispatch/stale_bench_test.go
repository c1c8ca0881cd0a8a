//go:build linux

package dispatch

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// benchStaleApp is a raw HTTP/1.1 app for BenchmarkStalePooledConnection:
// it answers each request and then closes the connection, announcing so
// with Connection: close ("fresh": the listener never pools it) or
// silently ("stale": the listener pools it and finds it closed on the next
// request).
type benchStaleApp struct {
	ln     net.Listener
	mode   string
	wg     sync.WaitGroup
	closed atomic.Int64 // connections the app has closed
}

func newBenchStaleApp(b *testing.B, mode string) *benchStaleApp {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	a := &benchStaleApp{ln: ln, mode: mode}
	resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	if mode == "fresh" {
		resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
	}
	a.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.wg.Go(func() {
				defer func() {
					_ = c.Close()
					a.closed.Add(1)
				}()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, resp)
			})
		}
	})
	b.Cleanup(func() {
		_ = ln.Close()
		a.wg.Wait()
	})
	return a
}

// BenchmarkStalePooledConnection is the latency that a pooled app
// connection closed by the app while idle adds to a request. Each op is
// two HTTP/1.1 requests through ServeConn over loopback TCP, one after the
// other on the same server: "stale" finds one such connection in its
// route's pool (a probe sees it closed, it is closed here too, a new
// connection is dialled); "fresh" finds its route's pool empty and dials
// (its app announced Connection: close). It reports the median of each as
// stale-p50-ns/req and fresh-p50-ns/req, and their difference as
// added-p50-ns/req;
// ns/op also counts the untimed wait, before each op, until both apps
// have closed their last connection, the stale one's close has reached
// the listener (as it has for a connection idle for seconds) and it has
// been idle for probeIdleAfter. The wait spins rather than sleeps, so that
// neither request pays for waking up, and the two go first in turn.
func BenchmarkStalePooledConnection(b *testing.B) {
	s := New(Config{Logger: slog.New(slog.DiscardHandler), BackendIdleTimeout: time.Hour, AccessLog: AccessLogOff})
	type side struct {
		app   *benchStaleApp
		cl    net.Conn
		br    *bufio.Reader
		pool  *backendPool
		times []time.Duration
	}
	open := func(mode string) *side {
		app := newBenchStaleApp(b, mode)
		route := testRoute(b, app.ln.Addr().(*net.TCPAddr).Port)
		cl, br := clientOf(b, s, route)
		_ = cl.SetDeadline(time.Time{})
		if code, err := roundTripErr(cl, br); err != nil || code != 200 {
			b.Fatalf("%s warm-up: %d %v", mode, code, err)
		}
		return &side{app: app, cl: cl, br: br, pool: s.routePool(route)}
	}
	stale, fresh := open("stale"), open("fresh")
	timed := func(sd *side) {
		start := time.Now()
		if code, err := roundTripErr(sd.cl, sd.br); err != nil || code != 200 {
			b.Fatalf("%d %v", code, err)
		}
		sd.times = append(sd.times, time.Since(start))
	}
	n := 0
	for b.Loop() {
		// Both apps have closed their last connection, and the stale one's
		// close has reached the listener: both requests start from rest.
		for stale.app.closed.Load() <= int64(n) || fresh.app.closed.Load() <= int64(n) || !poolAllStale(stale.pool) {
			runtime.Gosched()
		}
		if n%2 == 0 { // neither always goes first
			timed(stale)
			timed(fresh)
		} else {
			timed(fresh)
			timed(stale)
		}
		n++
	}
	if found := promtest.ToFloat64(s.m.staleConns); found != float64(n) {
		b.Fatalf("%v stale connections found in %d requests; want one per request", found, n)
	}
	if idle := fresh.pool.idleCount(); idle != 0 {
		b.Fatalf("the fresh route pooled %d connections; want none", idle)
	}
	// Medians: on a shared machine a few requests wait for a CPU for
	// milliseconds, which would swamp a mean.
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2])
	}
	perStale, perFresh := median(stale.times), median(fresh.times)
	b.ReportMetric(perStale, "stale-p50-ns/req")
	b.ReportMetric(perFresh, "fresh-p50-ns/req")
	b.ReportMetric(perStale-perFresh, "added-p50-ns/req")
}
