package dispatch

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// The per-route pool under many concurrent clients, over HTTP/1.1 and
// HTTP/2, against a real app that counts the connections it accepts.

// appConns counts the connections an app accepted and those still open.
type appConns struct{ accepted, open atomic.Int64 }

// countAppConns replaces e's web app by one that counts its connections
// (whose /block requests queue up to 1,024 arrivals and whose /slow
// requests take 2 ms), and reinstalls the routes with maxStreams.
func countAppConns(e *h2Env, maxStreams int) *appConns {
	e.t.Helper()
	cnt := &appConns{}
	a := &h2App{name: "web", arrived: make(chan string, 1024), release: make(chan struct{})}
	a.ts = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			// An app that takes a moment to answer: the requests of many
			// clients overlap at the app, as they do under load.
			time.Sleep(2 * time.Millisecond)
		}
		a.serve(w, r)
	}))
	a.ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			cnt.accepted.Add(1)
			cnt.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			cnt.open.Add(-1)
		}
	}
	a.ts.Start()
	old := e.web
	e.web = a
	e.apply(maxStreams, true)
	old.close()
	// These tests outlast the routes' freshness (30 s) on a slow machine
	// with -race: keep them renewed, as the control plane would.
	stop := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				e.table.Renew()
			}
		}
	})
	e.t.Cleanup(func() { close(stop); renewing.Wait() })
	return cnt
}

// poolClient sends requests to the web route over one protocol: "h1"
// (conns keep-alive connections, one request at a time on each) or "h2"
// (every request a stream of one HTTP/2 connection).
type poolClient func(path string) error

func newPoolClient(t *testing.T, e *h2Env, proto string, conns int) poolClient {
	t.Helper()
	if proto == "h2" {
		cc := e.dial(h2WebHost)
		return func(path string) error {
			res := h2Do(cc, h2Req(t, "GET", h2WebHost, path, nil))
			if res.err != nil {
				return res.err
			}
			if res.status != http.StatusOK {
				return fmt.Errorf("GET %s: status %d %q", path, res.status, res.body)
			}
			return nil
		}
	}
	// The connections are opened one after another: as many TLS
	// handshakes at once could outlast the test listener's handshake
	// deadline on a slow machine.
	free := make(chan *h1PoolConn, conns)
	for range conns {
		tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{
			ServerName: h2WebHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tc.Close() })
		free <- &h1PoolConn{tc: tc, br: bufio.NewReader(tc)}
	}
	return func(path string) error {
		c := <-free
		defer func() { free <- c }()
		_ = c.tc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(c.tc, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, h2WebHost); err != nil {
			return err
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			return fmt.Errorf("GET %s: status %d (close %v)", path, resp.StatusCode, resp.Close)
		}
		return nil
	}
}

// h1PoolConn is one HTTP/1.1 keep-alive client connection.
type h1PoolConn struct {
	tc *tls.Conn
	br *bufio.Reader
}

// runClients runs n concurrent clients, each sending the requests of
// paths one after another, and returns the first error.
func runClients(n int, do poolClient, paths ...string) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for _, p := range paths {
				if err := do(p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// warmPool makes n requests wait at the app at once, so that the route's
// pool holds n connections once they are answered.
func warmPool(t *testing.T, e *h2Env, do poolClient, n int) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- runClients(n, do, "/block") }()
	testutil.Eventually(t, time.Minute, fmt.Sprintf("%d requests waiting at the app", n), func() bool {
		return len(e.web.arrived) == n
	})
	e.web.unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func repeat(path string, n int) []string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = path
	}
	return ps
}

// TestPoolManyClientsSteadyState: with more concurrent clients (96) than
// the old fixed idle bound (64), the route's pool keeps an app connection
// for each: in steady state the listener dials the app fewer than 5 times per
// 1,000 requests, counted where the app accepts them, over HTTP/1.1
// connections and HTTP/2 streams alike; applistener_connector_dials_total
// counts every dial.
func TestPoolManyClientsSteadyState(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h2Verify(t)
			const clients, perClient = 96, 20
			reg := prometheus.NewRegistry()
			e := newH2Env(t, 0, Config{BackendIdleTimeout: time.Minute, Registerer: reg})
			app := countAppConns(e, 0)
			do := newPoolClient(t, e, proto, clients)
			warmPool(t, e, do, clients)
			if got := app.accepted.Load(); got != clients {
				t.Fatalf("warm-up: the app accepted %d connections; want %d", got, clients)
			}

			base := app.accepted.Load()
			if err := runClients(clients, do, repeat("/slow", perClient)...); err != nil {
				t.Fatal(err)
			}
			dials := app.accepted.Load() - base
			requests := int64(clients * perClient)
			if dials*1000 >= 5*requests {
				t.Errorf("%d app connections opened for %d requests from %d concurrent clients: %.1f per 1,000; want < 5",
					dials, requests, clients, float64(dials)*1000/float64(requests))
			}
			if got := promtest.ToFloat64(e.srv.m.dials.WithLabelValues("ok")); got != float64(app.accepted.Load()) {
				t.Errorf("applistener_connector_dials_total{result=\"ok\"} = %v; the app accepted %d", got, app.accepted.Load())
			}
		})
	}
}

// TestPoolShrinksAndRetires: after a burst, a route used by one client at
// a time keeps using its most recent connection (LIFO) while the others
// sit idle and are closed after the idle timeout; once the route is quiet,
// every connection is closed.
func TestPoolShrinksAndRetires(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h2Verify(t)
			const burst = 20
			e := newH2Env(t, 0, Config{BackendIdleTimeout: 300 * time.Millisecond})
			app := countAppConns(e, 0)
			do := newPoolClient(t, e, proto, burst)
			warmPool(t, e, do, burst)
			if got := app.open.Load(); got != burst {
				t.Fatalf("after the burst the app has %d connections open; want %d", got, burst)
			}
			testutil.Eventually(t, 10*time.Second, "the pool shrunk to the one connection in use", func() bool {
				if err := do("/"); err != nil {
					t.Fatal(err)
				}
				return app.open.Load() <= 1
			})
			testutil.Eventually(t, 5*time.Second, "the last idle connection closed", func() bool {
				return app.open.Load() == 0
			})
			if n := e.srv.routePool(e.table.Lookup(h2WebHost)).idleCount(); n != 0 {
				t.Errorf("%d idle connections left in the pool", n)
			}
		})
	}
}

// TestPoolRevokedRouteDrained: withdrawing a route closes every idle app
// connection of its pool, however many the route's concurrency left there.
func TestPoolRevokedRouteDrained(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			h2Verify(t)
			const clients = 40
			e := newH2Env(t, 0, Config{BackendIdleTimeout: time.Minute})
			app := countAppConns(e, 0)
			do := newPoolClient(t, e, proto, clients)
			warmPool(t, e, do, clients)
			pool := e.srv.routePool(e.table.Lookup(h2WebHost))
			testutil.Eventually(t, 5*time.Second, "the pool holding every connection", func() bool {
				return pool.idleCount() == clients
			})
			e.apply(0, false) // web withdrawn
			testutil.Eventually(t, 5*time.Second, "every app connection closed", func() bool {
				return app.open.Load() == 0
			})
			if n := pool.idleCount(); n != 0 {
				t.Errorf("%d idle connections left in the revoked pool", n)
			}
		})
	}
}

// TestUnitBackendPoolBoundByMaxStreams: the instance's max_streams bounds
// the idle connections, read when a connection comes back (a document may
// lower it); beyond it the oldest idle connection is closed and the one
// just used kept.
func TestUnitBackendPoolBoundByMaxStreams(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 3, Config{})
	inst := e.table.Lookup(h2WebHost).Instance
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newBackendPool(connector.TCP{Host: "127.0.0.1"}, app.port(), 0, inst, time.Minute, newTestPool(1024), lease)
	var bcs []*backendConn
	var peers []net.Conn
	for range 5 {
		bc, peer := app.dialPair(t, p)
		bcs = append(bcs, bc)
		peers = append(peers, peer)
	}
	for _, bc := range bcs {
		p.put(bc)
	}
	if n := p.idleCount(); n != 3 {
		t.Fatalf("idleCount = %d; want max_streams 3", n)
	}
	for i, peer := range peers {
		if want := i >= 2; peerStillOpen(t, peer) != want {
			t.Errorf("connection %d (put %d of 5): open = %v; want %v (the oldest closed)", i, i+1, !want, want)
		}
	}
	e.apply(1, true) // max_streams lowered to 1; the route stays installed
	if inst.MaxStreams() != 1 {
		t.Fatalf("max_streams = %d after the change", inst.MaxStreams())
	}
	bc := p.get()
	p.put(bc)
	if n := p.idleCount(); n != 1 {
		t.Errorf("idleCount = %d after max_streams was lowered to 1", n)
	}
	if got := p.get(); got != bc {
		t.Errorf("get = %p; want the connection just put back %p", got, bc)
	}
	bc.close()
}
