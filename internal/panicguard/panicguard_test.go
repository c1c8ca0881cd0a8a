package panicguard

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recoverInto recovers the panic of f the way an entry point does.
func recoverInto(log *slog.Logger, f func()) {
	defer func() {
		if r := recover(); r != nil {
			Report(log, EdgeConn, r, "sni", "team--a.apps.test")
		}
	}()
	f()
}

func panicsHere() { panic("boom") }

func TestReportLogsStackOnceAndCounts(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	before := Count(EdgeConn)
	recoverInto(log, panicsHere)
	if got := Count(EdgeConn); got != before+1 {
		t.Fatalf("Count = %v; want %v", got, before+1)
	}
	if got := testutil.ToFloat64(panics.WithLabelValues(EdgeConn)); got != before+1 {
		t.Fatalf("applistener_panics_total{where=edge_conn} = %v; want %v", got, before+1)
	}
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 1 {
		t.Fatalf("%d log lines; want 1:\n%s", n, out)
	}
	// The stack is the panicking goroutine's: it names the function that panicked.
	for _, want := range []string{`"where":"edge_conn"`, `"panic":"boom"`, `"sni":"team--a.apps.test"`, "panicguard.panicsHere"} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %s:\n%s", want, out)
		}
	}
}

func TestEverySeriesExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	if n := testutil.CollectAndCount(reg, "applistener_panics_total"); n != len(Where) {
		t.Fatalf("%d series; want one per entry point (%d)", n, len(Where))
	}
}

func TestPointCallsTheTestHookOnly(t *testing.T) {
	Point(H2Stream, "x") // no hook: nothing
	var got []string
	restore := SetTestHook(func(where, id string) { got = append(got, where+" "+id) })
	Point(H2Stream, "team--a.apps.test")
	restore()
	Point(H2Stream, "after")
	if len(got) != 1 || got[0] != "h2_stream team--a.apps.test" {
		t.Fatalf("hook calls %q", got)
	}
}
