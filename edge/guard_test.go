package edge

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

// panickingSource is a Source whose first watches panic.
type panickingSource struct {
	*fakeSource
	panics  int64
	watches atomic.Int64
}

func (p *panickingSource) Watch(ctx context.Context, ws string, fn func(*api.RouteSnapshot)) error {
	if p.watches.Add(1) <= p.panics {
		panic("the source panics")
	}
	return p.fakeSource.Watch(ctx, ws, fn)
}

// TestEdgeWatchPanicIsRetried: a watch that panics (twice) ends as a
// failure: counted in applistener_panics_total{where="edge_watch"},
// logged with the workspace and the stack, and retried; the routes then
// arrive and connections are spliced.
func TestEdgeWatchPanicIsRetried(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := &panickingSource{fakeSource: newFakeSource(), panics: 2}
	before := panicguard.Count(panicguard.EdgeWatch)
	f, logs := newLoggingEdge(t, -1, src, ca.Pool())
	src.send(t, "team", routeTo(hostA, sup, 1, time.Now().Add(time.Minute)))
	f.expectOwner(hostA, sup)
	if got := panicguard.Count(panicguard.EdgeWatch); got != before+2 {
		t.Fatalf("applistener_panics_total{where=edge_watch} = %v; want %v", got, before+2)
	}
	out := logs.String()
	if n := strings.Count(out, `"msg":"panic recovered`); n != 2 {
		t.Fatalf("%d panic log lines; want 2:\n%s", n, out)
	}
	for _, want := range []string{`"where":"edge_watch"`, `"workspace":"team"`, `"stack":"goroutine `, "the source panics"} {
		if !strings.Contains(out, want) {
			t.Errorf("the panic's log line lacks %s:\n%s", want, out)
		}
	}
}

// TestEdgeExpiryPanicRestartsTheLoop: a panic while the expiry loop holds
// the table's lock releases it (connections are still looked up and
// spliced), is counted in applistener_panics_total{where="edge_expiry"},
// and the restarted loop drops the expired route on time.
func TestEdgeExpiryPanicRestartsTheLoop(t *testing.T) {
	ca := newCA(t)
	sup := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f, logs := newLoggingEdge(t, -1, src, ca.Pool())
	before := panicguard.Count(panicguard.EdgeExpiry)
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == panicguard.EdgeExpiry && id == "expire" && injected.Add(1) == 1 {
			panic("injected panic at " + where)
		}
	})
	t.Cleanup(restore)
	soon := time.Now().Add(1500 * time.Millisecond)
	src.send(t, "team", routeTo(hostA, sup, 1, soon), routeTo(hostB, sup, 1, time.Now().Add(time.Minute)))
	testutil.Eventually(t, 10*time.Second, "the expiry loop's panic", func() bool {
		return panicguard.Count(panicguard.EdgeExpiry) >= before+1
	})
	f.expectOwner(hostB, sup) // the lock was released
	testutil.Eventually(t, 10*time.Second, "the expired route dropped by the restarted loop", func() bool {
		return (*f.e.table.Load())[hostA] == nil
	})
	f.expectUnrecognized(hostA)
	f.expectOwner(hostB, sup)
	if got := panicguard.Count(panicguard.EdgeExpiry); got != before+1 {
		t.Fatalf("applistener_panics_total{where=edge_expiry} = %v; want %v", got, before+1)
	}
	if !strings.Contains(logs.String(), `"where":"edge_expiry"`) {
		t.Errorf("no panic log line of the expiry loop:\n%s", logs.String())
	}
}
