package panicguard

import (
	"bytes"
	"errors"
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

func TestCallRecoversIntoAnErrorAndCounts(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	if err := Call(log, DiscoveryWatch, "team", func() error { return nil }); err != nil {
		t.Fatalf("Call of a function that returns nil: %v", err)
	}
	before := Count(DiscoveryWatch)
	err := Call(log, DiscoveryWatch, "team", func() error { panicsHere(); return nil }, "workspace", "team")
	var pe *PanicError
	if !errors.Is(err, ErrPanic) || !errors.As(err, &pe) || pe.Where != DiscoveryWatch || pe.Value != "boom" {
		t.Fatalf("Call of a panicking function = %v; want a *PanicError of discovery_watch, boom", err)
	}
	if got := Count(DiscoveryWatch); got != before+1 {
		t.Fatalf("Count = %v; want %v", got, before+1)
	}
	out := buf.String()
	for _, want := range []string{`"where":"discovery_watch"`, `"workspace":"team"`, "panicguard.panicsHere"} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %s:\n%s", want, out)
		}
	}
	// The hook is called first, with the id.
	restore := SetTestHook(func(where, id string) {
		if where == DiscoveryWatch && id == "team" {
			panic("injected")
		}
	})
	defer restore()
	ran := false
	if err := Call(log, DiscoveryWatch, "team", func() error { ran = true; return nil }); !errors.Is(err, ErrPanic) || ran {
		t.Fatalf("Call with an injected panic: %v, f ran: %v; want ErrPanic before f", err, ran)
	}
}
