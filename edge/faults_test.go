package edge

import (
	"context"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

// syncLog is a log destination safe for concurrent writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newLoggingEdge is an edge fixture of workspace team with withdrawal
// grace grace whose logs (JSON) go to the returned log.
func newLoggingEdge(t *testing.T, grace time.Duration, src Source, pool *x509.CertPool) (*edgeFixture, *syncLog) {
	t.Helper()
	logs := &syncLog{}
	f := newEdgeFixtureConfig(t, Config{
		Source:           src,
		Workspaces:       []string{"team"},
		HelloTimeout:     2 * time.Second,
		HalfCloseTimeout: 2 * time.Second,
		WithdrawGrace:    grace,
		Logger:           slog.New(slog.NewJSONHandler(logs, nil)),
	}, pool)
	return f, logs
}

// TestPanicEdgeClosesOnlyItsConnection: a panic in the edge's
// per-connection goroutine or in a direction of a splice closes that
// connection only; a spliced connection of another sandbox keeps
// echoing, the panic is logged with the SNI and counted, the edge lives.
func TestPanicEdgeClosesOnlyItsConnection(t *testing.T) {
	for _, where := range []string{panicguard.EdgeConn, panicguard.EdgePipe} {
		t.Run(where, func(t *testing.T) {
			ca := newCA(t)
			sup := newFakeSupervisor(t, ca, "sup-1")
			src := newFakeSource()
			f, logs := newLoggingEdge(t, -1, src, ca.Pool())
			exp := time.Now().Add(time.Minute)
			src.send(t, "team", routeTo(hostA, sup, 1, exp), routeTo(hostB, sup, 1, exp))
			bystander := f.mustDial(hostB)
			bystander.echo(t, "before")

			before := panicguard.Count(where)
			restore := panicguard.SetTestHook(func(w, id string) {
				if w == where && id == hostA {
					panic("injected panic at " + w)
				}
			})
			t.Cleanup(restore)
			if c, err := f.dial(hostA); err == nil {
				_ = c.Close()
				t.Fatalf("the victim's connection was served (%q); want it closed", c.greeting)
			}
			// The connection is closed before the panic is counted.
			testutil.Eventually(t, 5*time.Second, "the panic counted", func() bool {
				return panicguard.Count(where) >= before+1
			})
			bystander.echo(t, "after")
			f.expectOwner(hostB, sup)
			out := logs.String()
			for _, want := range []string{`"where":"` + where + `"`, `"sni":"` + hostA + `"`, `"stack":"goroutine `} {
				if !strings.Contains(out, want) {
					t.Errorf("the panic's log line lacks %s:\n%s", want, out)
				}
			}
			testutil.Eventually(t, 5*time.Second, "no victim splice left", func() bool {
				return f.metric("applistener_edge_active_splices") == 1
			})
		})
	}
}

// A route withdrawn and back (same endpoint) within the grace keeps its
// spliced connections: the grace is cancelled, not left to close them.
// A later withdrawal gets a grace of its own, never cut short by the
// first one's timer.
func TestEdgeWithdrawGraceCancelledWhenRouteReturns(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	const grace = 2 * time.Second
	f, logs := newLoggingEdge(t, grace, src, ca.Pool())
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup, 1, exp), routeTo(hostB, sup, 1, exp))
	a := f.mustDial(hostA)
	first := time.Now()
	src.send(t, "team", routeTo(hostB, sup, 1, exp))
	f.expectUnrecognized(hostA)
	src.send(t, "team", routeTo(hostA, sup, 1, exp), routeTo(hostB, sup, 1, exp))
	f.expectOwner(hostA, sup)
	testutil.Eventually(t, 5*time.Second, "the cancelled grace's log line", func() bool {
		return strings.Contains(logs.String(), "withdrawal grace cancelled")
	})
	// Well into the first grace, withdraw again.
	time.Sleep(grace / 2)
	second := time.Now()
	src.send(t, "team", routeTo(hostB, sup, 1, exp))
	// Past the end of the first grace the connection still echoes.
	for time.Since(first) < grace+grace/4 {
		a.echo(t, "the first grace is over, the second is not")
		time.Sleep(50 * time.Millisecond)
	}
	if n := f.metric("applistener_edge_splices_closed_total", "reason", "route_gone"); n != 0 {
		t.Fatalf("%v connections closed by a grace; want none yet", n)
	}
	a.expectClosed(t, grace+5*time.Second)
	if took := time.Since(second); took < grace {
		t.Fatalf("closed %v after the second withdrawal; want its full %v grace", took, grace)
	}
}

// The same, without a second withdrawal: well past the grace, the
// connection of the returned route is open and counted nowhere.
func TestEdgeReturnedRouteOutlivesGrace(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	const grace = 500 * time.Millisecond
	f := newEdgeFixtureGrace(t, grace, src, ca.Pool(), "team")
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup, 1, exp))
	a := f.mustDial(hostA)
	src.send(t, "team")
	f.expectUnrecognized(hostA)
	src.send(t, "team", routeTo(hostA, sup, 1, exp))
	f.expectOwner(hostA, sup)
	time.Sleep(3 * grace) // the grace timer has fired by now
	a.echo(t, "after the grace")
	if n := f.metric("applistener_edge_splices_closed_total", "reason", "route_gone"); n != 0 {
		t.Fatalf("%v connections closed by the cancelled grace", n)
	}
	// It is a live splice again: removing the route closes it (grace).
	src.send(t, "team")
	a.expectClosed(t, grace+5*time.Second)
}

// Draining keeps spliced connections until they end: Shutdown returns as
// soon as the last one has, long before its (long) deadline, and cuts
// nothing.
func TestEdgeDrainWaitsForSplices(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f, logs := newLoggingEdge(t, -1, src, ca.Pool())
	src.send(t, "team", routeTo(hostA, sup, 1, time.Now().Add(time.Minute)))
	c := f.mustDial(hostA)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- f.e.Shutdown(ctx)
	}()
	testutil.Eventually(t, 5*time.Second, "the draining log line", func() bool {
		return strings.Contains(logs.String(), "edge draining")
	})
	for range 5 {
		c.echo(t, "during drain")
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while a connection was spliced", err)
	default:
	}
	_ = c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still waiting 10 s after the last connection ended")
	}
	if n := f.metric("applistener_edge_splices_closed_total", "reason", "shutdown"); n != 0 {
		t.Errorf("%v connections cut by the drain; want none", n)
	}
	if strings.Contains(logs.String(), "spliced connections cut") {
		t.Errorf("the drain logged a cut:\n%s", logs.String())
	}
}

// A drain that times out cuts what is left and logs it per hostname.
func TestEdgeDrainTimeoutLogsWhatItCut(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f, logs := newLoggingEdge(t, -1, src, ca.Pool())
	exp := time.Now().Add(time.Minute)
	src.send(t, "team", routeTo(hostA, sup, 1, exp), routeTo(hostB, sup, 1, exp))
	a1, a2, b := f.mustDial(hostA), f.mustDial(hostA), f.mustDial(hostB)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := f.e.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, c := range []*clientConn{a1, a2, b} {
		c.expectClosed(t, 2*time.Second)
	}
	out := logs.String()
	for _, want := range []string{
		`"msg":"drain timeout: spliced connections cut","hostname":"` + hostA + `","endpoint":"` + sup.endpoint().String() + `","connections":2`,
		`"msg":"drain timeout: spliced connections cut","hostname":"` + hostB + `"`,
		`"msg":"drain timeout: closed the remaining spliced connections","connections":3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the drain's log lacks %s:\n%s", want, out)
		}
	}
}

// countingSource counts the watches a Source was asked for.
type countingSource struct {
	*fakeSource
	watches atomic.Int64
}

func (c *countingSource) Watch(ctx context.Context, ws string, fn func(*api.RouteSnapshot)) error {
	c.watches.Add(1)
	return c.fakeSource.Watch(ctx, ws, fn)
}

// Rewatch (SIGHUP) reopens every discovery watch at once, without a
// retry delay, and keeps the cache: routes and spliced connections stay.
func TestEdgeRewatchReopensWatchesKeepingRoutes(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := &countingSource{fakeSource: newFakeSource()}
	f, logs := newLoggingEdge(t, -1, src, ca.Pool())
	src.send(t, "team", routeTo(hostA, sup, 1, time.Now().Add(time.Minute)))
	a := f.mustDial(hostA)
	before := src.watches.Load()
	f.e.Rewatch()
	testutil.Eventually(t, 5*time.Second, "the watch reopened", func() bool { return src.watches.Load() == before+1 })
	if !strings.Contains(logs.String(), `"msg":"discovery watch reopened"`) {
		t.Errorf("no log line of the reopened watch:\n%s", logs.String())
	}
	a.echo(t, "kept across the rewatch")
	f.expectOwner(hostA, sup)
	src.send(t, "team", routeTo(hostA, sup, 1, time.Now().Add(time.Minute)), routeTo(hostB, sup, 1, time.Now().Add(time.Minute)))
	f.expectOwner(hostB, sup)
	if n := src.watches.Load(); n != before+1 {
		t.Errorf("%d watches after one Rewatch; want %d", n, before+1)
	}
}
