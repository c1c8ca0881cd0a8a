package supervisor

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/internal/controltest"
	"github.com/applistener/applistener/internal/testutil"
)

// The session rides out outages shorter than the freshness: the only
// gateway goes away (connections refused, the push stream cut) and, later,
// answers 503 (an etcd quorum loss), each for most of the routes'
// validity, with a backoff allowed to grow to 30 s. The route never goes
// stale, and the session renews it within a fraction of the validity left
// once the gateway is back.
func TestSessionRetryBoundedByFreshness(t *testing.T) {
	const freshness = 6 * time.Second
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "1"))
	out := controltest.NewOutage(t, strings.TrimPrefix(g.url, "https://"))
	c := newTestClient(t, "https://"+out.Addr(), freshness, ca)
	c.MaxBackoff = 30 * time.Second
	c.PollInterval = time.Second
	c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "an accepted session", func() bool { return c.Connected() && c.routed() })

	var stale atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			if !c.routed() {
				stale.Add(1)
			}
		}
	}()
	defer func() {
		close(stop)
		<-watched
	}()

	outage := freshness * 2 / 3
	gap := func(what string, down, up func()) {
		down()
		deadline := time.Now().Add(outage)
		for time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		back := time.Now()
		up()
		testutil.Eventually(t, freshness, "a renewal after "+what, func() bool { return c.validUntil.Load()-int64(freshness) > back.UnixNano() })
		g := time.Unix(0, c.validUntil.Load()-int64(freshness)).Sub(back)
		t.Logf("%s of %v: renewed %v after the gateway's return", what, outage, g.Round(time.Millisecond))
		if g > time.Second {
			t.Errorf("%s: renewal %v after the gateway's return; want within a fraction of the validity left (~2 s)", what, g)
		}
	}
	gap("outage", out.Down, out.Up)
	testutil.Eventually(t, 5*time.Second, "the push session back", func() bool { return c.Connected() })
	gap("503s", func() {
		g.set(func(g *fakeGateway) { g.status = http.StatusServiceUnavailable })
		g.endStreams()
	}, func() { g.set(func(g *fakeGateway) { g.status = 0 }) })
	if n := stale.Load(); n != 0 {
		t.Errorf("the route was not routed on %d checks during outages shorter than its freshness", n)
	}
}

// What cannot be applied renews nothing, on push and poll alike: a pushed
// document the supervisor cannot parse (here a top-level field of a newer
// gateway, withdrawing the route) leaves the session not accepted, so the
// keepalives and polls that follow renew nothing and the route goes stale
// within its freshness; a valid document afterwards restores it.
func TestUnparsableDocumentRenewsNothing(t *testing.T) {
	const freshness = 2 * time.Second
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "1"))
	c := newTestClient(t, g.url, freshness, ca)
	c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "an accepted session", func() bool { return c.Connected() && c.routed() })

	sent := time.Now()
	g.setDoc(`{"revision":"r2","from_a_newer_gateway":true,"instances":[]}`)
	testutil.Eventually(t, freshness+3*time.Second, "the route stale", func() bool { return !c.routed() })
	took := time.Since(sent)
	t.Logf("route stale %v after the unparsable document (freshness %v)", took.Round(time.Millisecond), freshness)
	if took > freshness+time.Second {
		t.Errorf("route went stale %v after the unparsable document; want within its freshness %v", took, freshness)
	}
	if c.Connected() {
		t.Error("the session still counts as accepted after a document that cannot be applied")
	}
	if n := c.deliveries("push", "unparsable"); n == 0 {
		t.Error("the unparsable push document was not counted")
	}
	// Keepalives kept coming on the push stream, and renewed nothing.
	if n := g.count(isPush); n != 1 {
		t.Errorf("%d push sessions; want the one stream kept", n)
	}

	g.setDoc(testDocument("r3", "1"))
	testutil.Eventually(t, 5*time.Second, "the route restored by a valid document", func() bool { return c.Connected() && c.routed() })
}

// A gateway that tells a session TTL shorter than three poll intervals:
// with the push session down, the supervisor polls every third of the TTL
// (so its session never lapses between polls) and says why, once.
func TestPollIntervalBoundedBySessionTTL(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "1"))
	g.set(func(g *fakeGateway) {
		g.pushCode = http.StatusNotImplemented
		g.sessionTTL = "900ms"
	})
	c := newTestClient(t, g.url, 30*time.Second, ca)
	c.PollInterval = 5 * time.Second
	c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "a session by polling", func() bool { return c.Connected() && c.routed() })
	start := time.Now()
	polls := g.count(isPoll)
	testutil.Eventually(t, 5*time.Second, "five more polls", func() bool { return g.count(isPoll) >= polls+5 })
	took := time.Since(start)
	t.Logf("five polls in %v (poll interval 5s, session TTL 900ms)", took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("five polls took %v; want about one every 300ms", took)
	}
	if n := strings.Count(c.logs.String(), "too long for the gateway's session TTL"); n != 1 {
		t.Errorf("the poll interval warning was logged %d times; want once", n)
	}
}

// Two gateway URLs, both answering 503, and no routes held: one backoff
// spans both endpoints and both kinds of request, so the attempts thin out
// exponentially (250 ms doubling) instead of restarting at each switch of
// URL.
func TestOneBackoffAcrossEndpoints(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	a := newFakeGateway(t, ca, testDocument("r1", "1"))
	b := newFakeGateway(t, ca, testDocument("r1", "1"))
	for _, g := range []*fakeGateway{a, b} {
		g.set(func(g *fakeGateway) { g.status = http.StatusServiceUnavailable })
	}
	c := newTestClient(t, a.url+","+b.url, 30*time.Second, ca)
	c.MaxBackoff = 30 * time.Second
	// Retries are capped at the poll interval too (as when polling works):
	// a long one, so that only the backoff spaces them here.
	c.PollInterval = 30 * time.Second
	stop := c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "both endpoints tried", func() bool { return a.count(nil) > 0 && b.count(nil) > 0 })
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	n := a.count(nil) + b.count(nil)
	t.Logf("%d requests to two failing endpoints in about 4 s", n)
	// 250 ms doubling (jittered over the upper half) is at most ~7
	// backoff steps in 4 s, each a push and a poll: a backoff that restarts
	// at each switch of URL makes several times as many.
	if n > 24 {
		t.Errorf("%d requests in about 4 s to two failing endpoints; want the attempts to thin out", n)
	}
}
