package supervisor

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/testutil"
)

// count returns the number of requests that match.
func (g *fakeGateway) count(match func(fakeRequest) bool) int { return len(g.log(match)) }

// The session id: 32 lowercase hex characters, on the push request, on
// polls (while push is refused), in the advertisements and on the
// withdrawal, and the same across reconnections, with the session order
// the gateway told (X-Applistener-Session-Order) on every request after its
// first answer. The push request asks for keepalives every freshness/3;
// every request goes over HTTP/2.
func TestSessionIDSentAndStable(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "3"))
	g.set(func(g *fakeGateway) { g.grant, g.order = "100ms", "7" })
	c := newTestClient(t, g.url, 3*time.Second, ca)
	if !ValidSessionID(c.Session) {
		t.Fatalf("session id %q: want 32 lowercase hex characters", c.Session)
	}
	stop := c.run(t, true)
	testutil.Eventually(t, 5*time.Second, "the route installed", c.routed)

	// A reconnection of the push session.
	g.endStreams()
	testutil.Eventually(t, 5*time.Second, "a second push session", func() bool { return g.count(isPush) >= 2 })
	// Push refused: the client polls, then asks for push again.
	g.set(func(g *fakeGateway) { g.pushCode = http.StatusServiceUnavailable })
	g.endStreams()
	testutil.Eventually(t, 5*time.Second, "a poll", func() bool { return g.count(isPoll) >= 1 })
	pushes := g.count(isPush)
	g.set(func(g *fakeGateway) { g.pushCode = 0 })
	testutil.Eventually(t, 5*time.Second, "push again", func() bool { return g.count(isPush) > pushes && c.Connected() })
	testutil.Eventually(t, 5*time.Second, "an advertisement of the route", func() bool {
		for _, r := range g.log(isPut) {
			if strings.Contains(string(r.body), testHost) {
				return true
			}
		}
		return false
	})
	stop()
	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Withdraw(wctx); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}

	sessions := map[string]int{}
	for i, r := range g.log(nil) {
		if want := map[bool]string{true: "", false: "7"}[i == 0]; r.order != want {
			t.Errorf("request %d (%s %s) named the session order %q; want %q", i, r.method, r.path, r.order, want)
		}
		if r.proto != 2 {
			t.Errorf("%s %s over HTTP/%d; want HTTP/2", r.method, r.path, r.proto)
		}
		switch {
		case isPush(r):
			if r.keepalive != "1s" {
				t.Errorf("push request asked for keepalive %q; want 1s (freshness 3s / 3)", r.keepalive)
			}
			sessions[r.session]++
		case isPoll(r), isDelete(r):
			sessions[r.session]++
		case isPut(r):
			var set api.InstallationSet
			if err := json.Unmarshal(r.body, &set); err != nil {
				t.Fatalf("advertisement %s: %v", r.body, err)
			}
			sessions[set.Session]++
			for _, ad := range set.Installations {
				if ad.Generation != "3" || ad.Hostname != testHost {
					t.Errorf("advertised %+v; want %s with generation 3", ad, testHost)
				}
			}
		}
	}
	if len(sessions) != 1 || sessions[c.Session] == 0 {
		t.Errorf("sessions seen by the gateway: %v; want only %s", sessions, c.Session)
	}
	t.Logf("%d push sessions, %d polls, %d advertisements, %d withdrawals, all with session %s",
		g.count(isPush), g.count(isPoll), g.count(isPut), g.count(isDelete), c.Session)
	if g.count(isDelete) != 1 {
		t.Errorf("%d withdrawals; want 1", g.count(isDelete))
	}
	if other := NewSessionID(); other == c.Session || !ValidSessionID(other) {
		t.Errorf("NewSessionID: %q after %q", other, c.Session)
	}
}

// Keepalive negotiation: with --route-freshness 2s the client asks for
// keepalives every 666ms. A gateway that grants 5s (and writes nothing else)
// is not enough on its own: the client also polls every 666ms while the push
// session is up, logs once why, and the route never expires during a 20 s
// quiet session. A gateway that says nothing is taken to grant 5s; one that
// grants less than freshness/3 gets no polls.
func TestKeepaliveNegotiation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		grant     string        // the header ("" = none)
		keepalive time.Duration // what the gateway writes
		quiet     time.Duration
		polls     bool
		why       string
	}{
		{"Grant5s", "5s", 5 * time.Second, 20 * time.Second, true, "granted a keepalive interval longer"},
		{"NoHeader", "", 300 * time.Millisecond, 6 * time.Second, true, "did not say"},
		{"Grant500ms", "500ms", 500 * time.Millisecond, 6 * time.Second, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ca := newTestCA(t, "gateway CA")
			g := newFakeGateway(t, ca, testDocument("r1", "1"))
			g.set(func(g *fakeGateway) { g.grant, g.keepalive = tc.grant, tc.keepalive })
			c := newTestClient(t, g.url, 2*time.Second, ca)
			// Shorter than a 5s grant (the grant wins), and more than six of
			// the 300ms keepalives a gateway without the header writes here:
			// at 1s, one stall of the loaded CI machine dropped that quiet
			// session.
			c.StreamIdleTimeout = 2 * time.Second
			c.run(t, false)
			testutil.Eventually(t, 5*time.Second, "the route installed", c.routed)

			start := time.Now()
			checks := 0
			for time.Since(start) < tc.quiet {
				if !c.routed() {
					var polls []string
					for _, p := range g.log(isPoll) {
						polls = append(polls, p.at.Sub(start).Round(time.Millisecond).String())
					}
					t.Fatalf("the route went stale %v into a quiet, healthy session (freshness 2s, grant %q); polls at %v",
						time.Since(start).Round(time.Millisecond), tc.grant, polls)
				}
				checks++
				time.Sleep(20 * time.Millisecond)
			}
			pushes, polls := g.log(isPush), g.log(isPoll)
			t.Logf("%v quiet: route fresh at %d checks; %d push session(s), %d polls beside it; renewals: push %v, fallback polls %v",
				tc.quiet, checks, len(pushes), len(polls), c.deliveries("push", "renewed"), c.deliveries("fallback-poll", "renewed"))
			if len(pushes) != 1 {
				t.Errorf("%d push sessions; want 1 (the quiet session must not be dropped)", len(pushes))
			}
			for _, p := range pushes {
				if p.keepalive != "666ms" {
					t.Errorf("asked for keepalive %q; want 666ms", p.keepalive)
				}
			}
			if c.deliveries("poll", "renewed")+c.deliveries("poll", "applied") != 0 {
				t.Error("polls counted as the push session being down")
			}
			notes := strings.Count(c.logs.String(), "polling beside the push session")
			if !tc.polls {
				if len(polls) != 0 || notes != 0 {
					t.Errorf("%d polls, %d notes with a grant under freshness/3", len(polls), notes)
				}
				return
			}
			if min := int(tc.quiet / (666 * time.Millisecond) * 3 / 4); len(polls) < min {
				t.Errorf("%d polls beside the push session in %v; want at least %d", len(polls), tc.quiet, min)
			}
			for _, p := range polls {
				if p.session != c.Session || p.ifNoneMatch != `"r1"` {
					t.Errorf("poll with session %q, If-None-Match %q", p.session, p.ifNoneMatch)
					break
				}
			}
			if notes != 1 || !strings.Contains(c.logs.String(), tc.why) {
				t.Errorf("the reason was logged %d times (want once, with %q):\n%s", notes, tc.why, c.logs.String())
			}
		})
	}
}

// A document from a poll that was sent before the push session applied a
// newer one is dropped: the two never install an older document last.
func TestPollAnswerOlderThanPushIsDropped(t *testing.T) {
	sink := &countingSink{}
	c := &GatewayClient{Sink: sink, Logger: slog.New(slog.DiscardHandler), Metrics: NewMetrics(nil)}
	c.applyMu.Lock()
	sent := c.applied // a poll goes out
	c.applyMu.Unlock()
	if err := c.applyDocument([]byte(testDocument("r2", "1")), "push", nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.applyDocument([]byte(testDocument("r1", "1")), "fallback-poll", &sent, `"r1"`); err != nil {
		t.Fatal(err)
	}
	if applied, _ := sink.snapshot(); len(applied) != 1 || applied[0] != "r2" {
		t.Fatalf("applied %v; want only r2", applied)
	}
	if c.etag != `"r2"` {
		t.Errorf("next If-None-Match %q; want \"r2\"", c.etag)
	}
	sent = c.applied
	if err := c.applyDocument([]byte(testDocument("r3", "1")), "fallback-poll", &sent, `"r3"`); err != nil {
		t.Fatal(err)
	}
	if applied, _ := sink.snapshot(); len(applied) != 2 || applied[1] != "r3" {
		t.Fatalf("applied %v; want r2, r3", applied)
	}
}

// deadEndpoint returns the URL of a loopback port nobody listens on (or
// can be given while the test runs).
func deadEndpoint(t *testing.T) string {
	t.Helper()
	return "https://127.0.0.1:" + strconv.Itoa(testutil.DeadLoopbackPort(t))
}

// Several endpoints: a refused connection and a 503 move the client on; it
// stays on the endpoint that works even when an earlier one recovers; when
// that one fails it moves on again (wrapping around). The advertiser
// follows the session.
func TestGatewayFailoverAndStickiness(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	dead := deadEndpoint(t)
	a := newFakeGateway(t, ca, testDocument("r1", "1"))
	b := newFakeGateway(t, ca, testDocument("r1", "1"))
	a.set(func(g *fakeGateway) { g.status = http.StatusServiceUnavailable })
	c := newTestClient(t, dead+", "+a.url+","+b.url, 3*time.Second, ca)
	c.run(t, true)
	testutil.Eventually(t, 5*time.Second, "a session with the third endpoint", func() bool {
		return c.Connected() && c.CurrentEndpoint() == b.url && c.routed()
	})
	if a.count(nil) == 0 {
		t.Error("the second endpoint was never tried")
	}

	// A recovers; B keeps working: the client stays with B.
	a.set(func(g *fakeGateway) { g.status = 0 })
	seenA := a.count(nil)
	putsB := b.count(isPut)
	testutil.Eventually(t, 5*time.Second, "ten more advertisements to B", func() bool { return b.count(isPut) >= putsB+10 })
	if n := a.count(nil); n != seenA {
		t.Errorf("%d requests went to the recovered endpoint while the current one worked", n-seenA)
	}
	if n := b.count(isPush); n != 1 {
		t.Errorf("%d push sessions with B; want 1", n)
	}

	// B fails: its stream ends and it answers 503. The client moves on,
	// past the dead endpoint, to A; the advertiser follows.
	b.set(func(g *fakeGateway) { g.status = http.StatusServiceUnavailable })
	b.endStreams()
	testutil.Eventually(t, 5*time.Second, "a session with the first working endpoint again", func() bool {
		return c.Connected() && c.CurrentEndpoint() == a.url && a.count(isPush) > 0
	})
	testutil.Eventually(t, 5*time.Second, "an advertisement to A", func() bool { return a.count(isPut) > 0 })
	if !c.routed() {
		t.Error("the route was lost across the failover")
	}
	if !strings.Contains(c.logs.String(), "moving to the next one") {
		t.Error("the failover was not logged")
	}
}

// The withdrawal: DELETE with the session, 204. A 5xx moves to the next
// endpoint; a refusal does not; a gateway that does not answer is given up
// after the bound.
func TestWithdraw(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	a := newFakeGateway(t, ca, testDocument("r1", "1"))
	b := newFakeGateway(t, ca, testDocument("r1", "1"))
	a.set(func(g *fakeGateway) { g.deleteCode = http.StatusBadGateway })
	c := newTestClient(t, a.url+","+b.url, 3*time.Second, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Withdraw(ctx); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
	for _, g := range []*fakeGateway{a, b} {
		d := g.log(isDelete)
		if len(d) != 1 || d[0].session != c.Session || d[0].path != "/v1/supervisors/sup-1/installations" {
			t.Errorf("DELETEs %+v; want one with session %s", d, c.Session)
		}
	}
	if c.CurrentEndpoint() != b.url {
		t.Errorf("current endpoint %s after a 502", c.CurrentEndpoint())
	}

	// A refusal is not retried elsewhere.
	b.set(func(g *fakeGateway) { g.deleteCode = http.StatusMethodNotAllowed })
	if err := c.Withdraw(ctx); err == nil || !strings.Contains(err.Error(), "405") {
		t.Errorf("Withdraw answered 405: %v", err)
	}
	if n := a.count(isDelete); n != 1 {
		t.Errorf("a 405 moved the withdrawal to another endpoint (%d DELETEs there)", n)
	}

	// A gateway that never answers: the bound holds.
	hang := make(chan struct{})
	defer close(hang)
	b.set(func(g *fakeGateway) { g.deleteCode, g.onDelete = 0, func() { <-hang } })
	c2 := newTestClient(t, b.url, 3*time.Second, ca)
	start := time.Now()
	err := c2.Withdraw(context.Background())
	if took := time.Since(start); err == nil || took > 3*time.Second {
		t.Errorf("Withdraw at a silent gateway: %v after %v; want an error within ~2s", err, took)
	}
}

// CA rotation: the gateway moves to a certificate of a new CA; handshakes
// fail until the CA file names the new CA, then the session is back
// without a restart.
func TestGatewayCARotation(t *testing.T) {
	ca1, ca2 := newTestCA(t, "CA 1"), newTestCA(t, "CA 2")
	g := newFakeGateway(t, ca1, testDocument("r1", "1"))
	c := newTestClient(t, g.url, 3*time.Second, ca1)
	c.run(t, false)
	testutil.Eventually(t, 5*time.Second, "the session", c.Connected)

	g.rotate(ca2)
	testutil.Eventually(t, 5*time.Second, "handshakes to fail with the old CA", func() bool {
		return !c.Connected() && strings.Contains(c.LastError(), "certificate")
	})
	t.Logf("with the old CA: %s", c.LastError())
	writeCAFile(t, c.CAFile, ca2.pem)
	start := time.Now()
	testutil.Eventually(t, 5*time.Second, "the session with the new CA", c.Connected)
	t.Logf("session back %v after the CA file was replaced", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(c.logs.String(), "gateway CA file reloaded") {
		t.Error("the reload was not logged")
	}

	// A broken CA file keeps the bundle in use.
	writeCAFile(t, c.CAFile, []byte("not a certificate\n"))
	g.endStreams()
	g.srv.CloseClientConnections()
	pushes := g.count(isPush)
	testutil.Eventually(t, 5*time.Second, "a new push session", func() bool { return g.count(isPush) > pushes && c.Connected() })
	if !strings.Contains(c.logs.String(), "keeping the previous bundle") {
		t.Error("the unusable CA file was not logged")
	}
}

// A withdrawal ends the session: the gateway ends the push stream, and the
// client makes no further request (the gateway would refuse the withdrawn
// session); the route keeps the freshness it has.
func TestWithdrawEndsTheSession(t *testing.T) {
	ca := newTestCA(t, "gateway CA")
	g := newFakeGateway(t, ca, testDocument("r1", "1"))
	g.set(func(f *fakeGateway) { f.onDelete = f.endStreams })
	c := newTestClient(t, g.url, 3*time.Second, ca)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	testutil.Eventually(t, 5*time.Second, "the session", func() bool { return c.Connected() && c.routed() })
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer wcancel()
	if err := c.Withdraw(wctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the session went on after the withdrawal")
	}
	reqs := g.log(nil)
	if last := reqs[len(reqs)-1]; !isDelete(last) {
		t.Errorf("a request after the withdrawal: %s %s", last.method, last.path)
	}
	if !c.routed() || c.Connected() {
		t.Errorf("after the withdrawal: routed %v (want true until the freshness runs out), connected %v", c.routed(), c.Connected())
	}
	c.client.CloseIdleConnections()
}
