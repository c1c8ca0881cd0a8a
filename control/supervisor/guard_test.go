package supervisor

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
)

// injectPanics makes the entry point where panic for id, n times, then
// lets it be; it returns how many panics were injected so far.
func injectPanics(t *testing.T, where, id string, n int64) (injected func() int64) {
	t.Helper()
	var count atomic.Int64
	restore := panicguard.SetTestHook(func(w, got string) {
		if w == where && got == id && count.Add(1) <= n {
			panic("injected panic at " + w)
		}
	})
	t.Cleanup(restore)
	return func() int64 { return min(count.Load(), n) }
}

// TestSessionPanicIsOneFailedAttempt: a panic in the push session or a
// poll (three in a row, injected where each attempt starts) is recovered,
// counted in applistener_panics_total{where="supervisor_session"} and
// logged with its stack; the session loop goes on after its backoff and
// installs the route. The process (the test) lives.
func TestSessionPanicIsOneFailedAttempt(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "3"))
	c := newTestClient(t, g.url, 3*time.Second, ca)
	before := panicguard.Count(panicguard.SupervisorSession)
	const n = 3
	injected := injectPanics(t, panicguard.SupervisorSession, fakeSupervisor, n)
	c.run(t, false)
	testutil.Eventually(t, 10*time.Second, "the route installed after the panics", func() bool {
		return injected() == n && c.routed() && c.Connected()
	})
	if got := panicguard.Count(panicguard.SupervisorSession); got != before+n {
		t.Fatalf("applistener_panics_total{where=supervisor_session} = %v; want %v", got, before+n)
	}
	logs := c.logs.String()
	if got := strings.Count(logs, `msg="panic recovered`); got != n {
		t.Fatalf("%d panic log lines; want %d:\n%s", got, n, logs)
	}
	for _, want := range []string{"where=supervisor_session", "supervisor=" + fakeSupervisor, "stack=", "injected panic at supervisor_session"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the panic's log line lacks %s", want)
		}
	}
}

// TestAdvertisePanicIsOneFailedAttempt: a panic while advertising the
// installations is one failed advertisement: counted, logged, retried,
// and the gateway gets the advertisement.
func TestAdvertisePanicIsOneFailedAttempt(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "3"))
	c := newTestClient(t, g.url, 3*time.Second, ca)
	before := panicguard.Count(panicguard.SupervisorAdvertise)
	injected := injectPanics(t, panicguard.SupervisorAdvertise, fakeSupervisor, 2)
	c.run(t, true)
	testutil.Eventually(t, 10*time.Second, "an advertisement of the route after the panics", func() bool {
		for _, r := range g.log(isPut) {
			if strings.Contains(string(r.body), testHost) {
				return injected() == 2
			}
		}
		return false
	})
	if got := panicguard.Count(panicguard.SupervisorAdvertise); got != before+2 {
		t.Fatalf("applistener_panics_total{where=supervisor_advertise} = %v; want %v", got, before+2)
	}
	if !c.routed() {
		t.Fatal("the route is not installed: the advertiser's panics reached the session")
	}
}
