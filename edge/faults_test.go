package edge

import (
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

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
			if got := panicguard.Count(where); got < before+1 {
				t.Fatalf("applistener_panics_total{where=%s} = %v; want at least %v", where, got, before+1)
			}
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
