package api_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
	"github.com/applistener/applistener/internal/panicguard"
)

// lockedBuffer is a log destination that tests read while it is written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDiscoveryWatchPanicIsOneFailedStream: a panic where a watch stream
// starts (injected twice) and one in the consumer's callback each end
// that stream only: counted in applistener_panics_total{where=
// "discovery_watch"}, logged with the stack and the workspace, and the
// watch reconnects and delivers.
func TestDiscoveryWatchPanicIsOneFailedStream(t *testing.T) {
	exp := time.Now().Add(time.Minute)
	srv, conns := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", fmt.Sprint(n), discTestRoute("a", "", exp)))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	logs := &lockedBuffer{}
	c := &api.DiscoveryClient{Gateway: srv.URL, MaxBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	defer c.CloseIdleConnections()
	before := panicguard.Count(panicguard.DiscoveryWatch)
	var injected atomic.Int64
	restore := panicguard.SetTestHook(func(where, id string) {
		if where == panicguard.DiscoveryWatch && id == "team" && injected.Add(1) <= 2 {
			panic("injected panic at " + where)
		}
	})
	defer restore()
	col := controltest.NewCollector()
	var calls atomic.Int64
	cancel, _ := controltest.RunWatch(t, func(ctx context.Context) error {
		return c.Watch(ctx, "team", func(s *api.RouteSnapshot) {
			if calls.Add(1) == 1 {
				panic("the consumer panics on its first snapshot")
			}
			col.Add(s)
		})
	})
	s := col.Next(t, 10*time.Second)
	cancel()
	if len(s.Routes) != 1 || s.Routes[0].Hostname != "team--a.apps.test" {
		t.Fatalf("snapshot after the panics: %+v", s)
	}
	if got := panicguard.Count(panicguard.DiscoveryWatch); got != before+3 {
		t.Fatalf("applistener_panics_total{where=discovery_watch} = %v; want %v (two injected, one in the consumer)", got, before+3)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d streams; want 2 (the injected panics come before a request, the consumer's ends the first stream)", n)
	}
	out := logs.String()
	if got := strings.Count(out, `msg="panic recovered`); got != 3 {
		t.Fatalf("%d panic log lines; want 3:\n%s", got, out)
	}
	for _, want := range []string{"where=discovery_watch", "workspace=team", "the consumer panics on its first snapshot", "stack="} {
		if !strings.Contains(out, want) {
			t.Errorf("the panic log lines lack %s:\n%s", want, out)
		}
	}
}
