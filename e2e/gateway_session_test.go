package e2e

// End-to-end tests of the gateway session and the supervisor process
// lifecycle: the reference gateway and a shared-mode supervisor as real
// processes (see gateway_harness_test.go).

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// gatewayEnv is a gateway serving web and api of team/demo to one supervisor.
type gatewayEnv struct {
	gw  *memGateway
	sup *gatewaySupervisor
	demoBackends
}

func newGatewayEnv(t *testing.T, gatewayFlags []string, cfg supervisorConfig) *gatewayEnv {
	t.Helper()
	e := &gatewayEnv{demoBackends: newDemoBackends(t)}
	e.gw = newMemGateway(t, e.doc(true, true), gatewayFlags...)
	e.gw.start(t)
	e.sup = e.gw.startSupervisor(t, cfg)
	return e
}

// doc is sup-1's document with the chosen services of team/demo.
func (e *gatewayEnv) doc(web, api bool) []byte {
	return routesDocument(docEntry{sandbox: "demo", services: e.services(web, api)})
}

// expectServed checks one GET on each host through fresh connections.
func (e *gatewayEnv) expectServed(t *testing.T, what string) {
	t.Helper()
	for _, h := range []struct{ host, name string }{{hostWeb, "web"}, {hostAPI, "api"}} {
		c, _ := e.sup.client(t, h.host)
		if err := expect200(c, h.host, h.name); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c.Transport.(*http.Transport).CloseIdleConnections()
	}
}

// TestGatewayPushWithdrawal: routes delivered by the push session serve
// traffic; withdrawing a service in the gateway's file reaches the
// supervisor at once (handshakes refused in under a second), closes its
// WebSocket with 1008, and leaves the other service's WebSocket echoing.
func TestGatewayPushWithdrawal(t *testing.T) {
	t.Parallel()
	e := newGatewayEnv(t, nil, supervisorConfig{})
	p := e.sup
	e.expectServed(t, "routes from the gateway")

	wsWeb := p.wsDial(t, hostWeb)
	must(t, wsEcho(wsWeb, websocket.TextMessage, []byte("web before")))
	wsAPI := p.wsDial(t, hostAPI)
	must(t, wsEcho(wsAPI, websocket.TextMessage, []byte("api before")))
	if v := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "push", "result": "applied"}); v < 1 {
		t.Fatalf("precondition: no document applied from the push session (deliveries{push,applied} = %v)", v)
	}

	wsDone := watchClose(wsWeb, 5*time.Second)
	start := time.Now()
	e.gw.writeDoc(t, e.doc(false, true))
	var latency time.Duration
	testutil.Eventually(t, 5*time.Second, "new handshakes for the withdrawn web route to be refused", func() bool {
		if isUnrecognizedName(p.handshakeErr(hostWeb)) {
			latency = time.Since(start)
			return true
		}
		return false
	})
	t.Logf("push withdrawal latency (gateway file renamed -> handshake refused): %v", latency)
	if latency >= time.Second {
		t.Errorf("withdrawal took %v to reach the supervisor over the push session; want < 1s", latency)
	}
	p.handshakeRefused(t, tlsConfig(hostWeb))

	wc := awaitClose(t, "withdrawn web WebSocket", wsDone)
	t.Logf("withdrawn WebSocket closed %v after the file was renamed: %v", wc.at.Sub(start), wc.err)
	expectCloseCode(t, "withdrawn web WebSocket", wc.err, websocket.ClosePolicyViolation)

	must(t, wsEcho(wsAPI, websocket.TextMessage, []byte("api after")))
	must(t, wsEcho(wsAPI, websocket.BinaryMessage, []byte{0, 1, 2}))
	c, _ := p.client(t, hostAPI)
	if err := expect200(c, hostAPI, "api"); err != nil {
		t.Fatalf("api after web was withdrawn: %v", err)
	}
	// The change came over the healthy push session: nothing was polled.
	if v := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "poll"}); v != 0 {
		t.Errorf("the supervisor polled (%v deliveries): the push session was interrupted", v)
	}
}

// TestSessionQuietPush: a push session with nothing but keepalives (200ms)
// keeps a 2s freshness window renewed for 3 windows: requests, readiness,
// the health port and an open WebSocket are never disturbed.
func TestSessionQuietPush(t *testing.T) {
	t.Parallel()
	e := newGatewayEnv(t, []string{"--keepalive", "200ms"}, supervisorConfig{})
	p := e.sup
	c, dials := p.client(t, hostWeb)
	if err := expect200(c, hostWeb, "web"); err != nil {
		t.Fatal(err)
	}
	ws := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("quiet start")))
	testutil.Eventually(t, waitTimeout, "the health port to accept connections", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	renewed0 := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "push", "result": "renewed"})

	holdsFor(t, 3*freshness,
		&periodicCheck{name: "keep-alive request every 250ms", every: 250 * time.Millisecond, fn: func() error {
			return expect200(c, hostWeb, "web")
		}},
		&periodicCheck{name: "/readyz 200", every: 100 * time.Millisecond, fn: func() error {
			if code, body := readyzAt(p.adminAddr); code != http.StatusOK {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		}},
		&periodicCheck{name: "health port open", every: 100 * time.Millisecond, fn: func() error {
			return dialHealth(p.healthAddr)
		}},
	)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("quiet end")))
	if n := dials.Load(); n != 1 {
		t.Errorf("the keep-alive client dialed %d times; want 1 (renewals must not touch connections)", n)
	}
	renewed := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "push", "result": "renewed"}) - renewed0
	polls := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "poll"})
	t.Logf("keepalive renewals during %v: %v; polls: %v", 3*freshness, renewed, polls)
	if renewed < 5 {
		t.Errorf("only %v keepalive renewals in %v with --keepalive 200ms", renewed, 3*freshness)
	}
	if polls != 0 {
		t.Errorf("the supervisor polled (%v deliveries): the quiet push session was dropped", polls)
	}
}

// TestPollOnlyGateway: a gateway that refuses push (--no-push): the
// supervisor polls, 304 answers renew the routes for 3 windows, and a change
// is picked up by the next poll.
func TestPollOnlyGateway(t *testing.T) {
	t.Parallel()
	e := newGatewayEnv(t, []string{"--no-push"}, supervisorConfig{})
	p := e.sup
	e.expectServed(t, "routes from a polled gateway")
	c, _ := p.client(t, hostWeb)

	holdsFor(t, 3*freshness,
		&periodicCheck{name: "request every 250ms", every: 250 * time.Millisecond, fn: func() error {
			return expect200(c, hostWeb, "web")
		}},
		&periodicCheck{name: "/readyz 200", every: 100 * time.Millisecond, fn: func() error {
			if code, body := readyzAt(p.adminAddr); code != http.StatusOK {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		}},
	)
	renewed := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "poll", "result": "renewed"})
	applied := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "poll", "result": "applied"})
	pushed := metricAt(t, p.adminAddr, "applistener_config_deliveries_total", map[string]string{"source": "push"})
	got304 := metricAt(t, e.gw.adminAddr, "applistener_gateway_requests_total", map[string]string{"endpoint": "config", "code": "304"})
	refused := metricAt(t, e.gw.adminAddr, "applistener_gateway_requests_total", map[string]string{"endpoint": "watch", "code": "501"})
	t.Logf("supervisor: poll renewed (304) %v, poll applied (200) %v, push %v; gateway: 304 answers %v, watch refused (501) %v",
		renewed, applied, pushed, got304, refused)
	if renewed <= 0 {
		t.Errorf(`applistener_config_deliveries_total{result="renewed",source="poll"} = %v; want > 0 (304 answers renew)`, renewed)
	}
	if applied < 1 {
		t.Errorf(`applistener_config_deliveries_total{result="applied",source="poll"} = %v; want >= 1`, applied)
	}
	if pushed != 0 {
		t.Errorf("push deliveries %v from a --no-push gateway", pushed)
	}
	// At most a few watch attempts: a 501 means "poll, ask again much later".
	if refused < 1 || refused > 3 {
		t.Errorf("the supervisor asked for a push session %v times in %v; want 1 (a 501 is not retried soon)", refused, 3*freshness)
	}

	start := time.Now()
	e.gw.writeDoc(t, e.doc(true, false))
	var latency time.Duration
	testutil.Eventually(t, waitTimeout, "the withdrawn api route to be refused", func() bool {
		if isUnrecognizedName(p.handshakeErr(hostAPI)) {
			latency = time.Since(start)
			return true
		}
		return false
	})
	t.Logf("poll withdrawal latency (file renamed -> handshake refused): %v", latency)
	if limit := gatewayPollInterval + 250*time.Millisecond + time.Second; latency > limit {
		t.Errorf("a change took %v to arrive by polling every %v; want < %v", latency, gatewayPollInterval, limit)
	}
	if err := expect200(c, hostWeb, "web"); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayOutage: when the gateway dies, routes stay valid until their
// freshness runs out and then close (handshakes refused, streams closed),
// readiness and the health port drop; when it comes back on the same port,
// everything returns without restarting the supervisor. PollOnly covers the
// return through a 304 (the document did not change).
func TestGatewayOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		gatewayFlags []string
	}{
		{"Push", nil},
		{"PollOnly", []string{"--no-push"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testGatewayOutage(t, tc.gatewayFlags)
		})
	}
}

func testGatewayOutage(t *testing.T, gatewayFlags []string) {
	e := newGatewayEnv(t, gatewayFlags, supervisorConfig{})
	p := e.sup
	pid := p.cmd.Process.Pid
	testutil.Eventually(t, waitTimeout, "the health port to accept connections", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	ws := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before the outage")))
	ka := p.raw(t, hostAPI)
	if resp, body := ka.roundTrip(t, "GET /before HTTP/1.1\r\nHost: "+hostAPI+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %d %q", resp.StatusCode, body)
	}

	start := time.Now()
	e.gw.kill(t)
	limit := start.Add(freshness + deadlineMargin)
	wsDone := watchClose(ws, until(limit))

	// Readiness and the health port drop as soon as the session is
	// noticed lost, at the latest when the routes expire.
	var notReady, healthClosed time.Duration
	testutil.Eventually(t, until(limit), "/readyz 503 and the health port refusing connections", func() bool {
		if notReady == 0 && p.readyz() == http.StatusServiceUnavailable {
			notReady = time.Since(start)
		}
		if healthClosed == 0 && isRefused(dialHealth(p.healthAddr)) {
			healthClosed = time.Since(start)
		}
		return notReady != 0 && healthClosed != 0
	})
	wc := awaitClose(t, "WebSocket of an expiring route", wsDone)
	err, wsClosed := wc.err, wc.at.Sub(start)
	expectCloseCode(t, "WebSocket of an expired route", err, websocket.ClosePolicyViolation)
	// The last renewal was at most one keepalive or poll before the kill:
	// the routes keep their deadline (a lost session is not a withdrawal).
	if wsClosed < freshness/2 {
		t.Errorf("the WebSocket closed %v after the gateway died; want the routes to stay valid until their freshness (%v) runs out", wsClosed, freshness)
	}
	ka.expectClosed(t, until(limit))
	for _, sni := range []string{hostWeb, hostAPI} {
		testutil.Eventually(t, until(limit), "handshakes for "+sni+" to be refused", func() bool {
			return isUnrecognizedName(p.handshakeErr(sni))
		})
	}
	p.handshakeRefused(t, tlsConfig(hostWeb))
	t.Logf("after SIGKILL of the gateway: /readyz 503 after %v, health port closed after %v, WebSocket closed after %v (%v)",
		notReady, healthClosed, wsClosed, err)
	if code := p.readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d during the outage; want 503", code)
	}
	if err := dialHealth(p.healthAddr); !isRefused(err) {
		t.Errorf("health port during the outage: %v; want connection refused", err)
	}

	restart := time.Now()
	e.gw.start(t)
	var back time.Duration
	testutil.Eventually(t, waitTimeout, "/readyz 200 after the gateway restarted", func() bool {
		if p.readyz() == http.StatusOK {
			back = time.Since(restart)
			return true
		}
		return false
	})
	testutil.Eventually(t, waitTimeout, "the health port to accept connections again", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	for _, sni := range []string{hostWeb, hostAPI} {
		testutil.Eventually(t, waitTimeout, "handshakes for "+sni+" to succeed again", func() bool {
			return p.handshakeOK(sni)
		})
	}
	t.Logf("gateway restarted: /readyz 200 after %v, routes after %v", back, time.Since(restart))
	e.expectServed(t, "after the gateway came back")
	ws2 := p.wsDial(t, hostWeb)
	must(t, wsEcho(ws2, websocket.TextMessage, []byte("after the outage")))
	if p.exited() || p.cmd.Process.Pid != pid {
		t.Fatal("the supervisor was restarted")
	}
}

// TestGatewayInvalidInstance: the gateway refuses a configuration file in
// which one instance's entry is invalid (as `applistener validate gateway`
// would), logs the problem at its JSON path and keeps serving the document
// it imported last: both instances stay served. A document that reaches a
// supervisor with an invalid entry all the same (its routes file here; from
// a gateway, one of another version) withdraws only that instance: its
// streams close, its hostname is refused; the valid instance's streams are
// untouched.
func TestGatewayInvalidInstance(t *testing.T) {
	t.Parallel()
	a, b := newBackend(t, "alpha"), newBackend(t, "beta")
	hostA, hostB := serviceHost("team", "alpha", "web"), serviceHost("team", "beta", "web")
	doc := func(aPort, bPort int) []byte {
		return routesDocument(
			docEntry{sandbox: "alpha", services: []service{{Name: "web", Port: aPort, Revision: 1}}},
			docEntry{sandbox: "beta", services: []service{{Name: "web", Port: bPort, Revision: 1}}},
		)
	}
	// The gateway's supervisor has backends of its own.
	ga, gb := newBackend(t, "alpha"), newBackend(t, "beta")
	gw := newMemGateway(t, doc(ga.port, gb.port))
	gw.start(t)
	gs := gw.startSupervisor(t, supervisorConfig{})
	cGB, _ := gs.client(t, hostB)
	if err := expect200(cGB, hostB, "beta"); err != nil {
		t.Fatal(err)
	}
	gw.writeDoc(t, doc(ga.port, 70000))
	testutil.Eventually(t, waitTimeout, "the gateway to refuse the file", func() bool {
		return strings.Contains(gw.stderr.String(), `"at":"supervisors.`+supervisorID+`.instances[1].services[0].port"`)
	})
	if err := expect200(cGB, hostB, "beta"); err != nil {
		t.Fatalf("beta after the gateway refused the file: %v", err)
	}

	p := startProc(t, doc(a.port, b.port))
	cA, dialsA := p.client(t, hostA)
	cB, _ := p.client(t, hostB)
	if err := expect200(cA, hostA, "alpha"); err != nil {
		t.Fatal(err)
	}
	if err := expect200(cB, hostB, "beta"); err != nil {
		t.Fatal(err)
	}
	wsA := p.wsDial(t, hostA)
	must(t, wsEcho(wsA, websocket.TextMessage, []byte("alpha before")))
	wsB := p.wsDial(t, hostB)
	must(t, wsEcho(wsB, websocket.TextMessage, []byte("beta before")))
	rejected0 := metricAt(t, p.adminAddr, "applistener_config_rejected_instances_total", nil)

	wsDone := watchClose(wsB, 5*time.Second)
	start := time.Now()
	p.writeRoutes(t, doc(a.port, 70000))
	wc := awaitClose(t, "WebSocket of the rejected instance", wsDone)
	t.Logf("beta's WebSocket closed %v after its entry became invalid: %v", wc.at.Sub(start), wc.err)
	expectCloseCode(t, "WebSocket of the rejected instance", wc.err, websocket.ClosePolicyViolation)
	testutil.Eventually(t, waitTimeout, "the rejected instance's hostname to be refused", func() bool {
		return isUnrecognizedName(p.handshakeErr(hostB))
	})
	p.handshakeRefused(t, tlsConfig(hostB))
	testutil.Eventually(t, waitTimeout, "beta's app connections (pooled and WebSocket) to close", func() bool {
		return b.open.Load() == 0
	})

	must(t, wsEcho(wsA, websocket.TextMessage, []byte("alpha after")))
	must(t, wsEcho(wsA, websocket.BinaryMessage, []byte{1, 2, 3}))
	if err := expect200(cA, hostA, "alpha"); err != nil {
		t.Fatalf("the valid instance after the other was rejected: %v", err)
	}
	if n := dialsA.Load(); n != 1 {
		t.Errorf("alpha's keep-alive client dialed %d times; want 1 (its connection must not be touched)", n)
	}
	if r := metricAt(t, p.adminAddr, "applistener_config_rejected_instances_total", nil); r <= rejected0 {
		t.Errorf("applistener_config_rejected_instances_total stayed at %v", r)
	}
}

// TestHealthListenerLifecycle: the health port refuses connections until a
// configuration is accepted from the gateway, accepts them while the
// session holds, refuses them again once the session is lost, and accepts
// them again when the gateway returns.
func TestHealthListenerLifecycle(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}))
	p := gw.startSupervisor(t, supervisorConfig{noWait: true}) // the gateway is not running yet

	holdsFor(t, time.Second,
		&periodicCheck{name: "health port refused before any configuration", every: 100 * time.Millisecond, fn: func() error {
			if err := dialHealth(p.healthAddr); !isRefused(err) {
				return fmt.Errorf("health dial: %v; want connection refused", err)
			}
			return nil
		}},
		&periodicCheck{name: "/readyz 503 before any configuration", every: 100 * time.Millisecond, fn: func() error {
			if code, body := readyzAt(p.adminAddr); code != http.StatusServiceUnavailable {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		}},
	)

	start := time.Now()
	gw.start(t)
	testutil.Eventually(t, waitTimeout, "the health port to open once the gateway delivers", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	opened := time.Since(start)
	if code := p.readyz(); code != http.StatusOK {
		t.Errorf("/readyz %d with the health port open; want 200", code)
	}

	lost := time.Now()
	gw.kill(t)
	testutil.Eventually(t, freshness+deadlineMargin, "the health port to close after the gateway died", func() bool {
		return isRefused(dialHealth(p.healthAddr))
	})
	closed := time.Since(lost)

	back := time.Now()
	gw.start(t)
	testutil.Eventually(t, waitTimeout, "the health port to reopen when the gateway returns", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	t.Logf("health port: opened %v after the gateway started, closed %v after it died, reopened %v after it returned",
		opened, closed, time.Since(back))
}

// TestDrainOnSIGTERM: SIGTERM stops accepting at once, lets an in-flight
// request finish, closes WebSockets (1001) and exits 0 within the drain
// timeout.
func TestDrainOnSIGTERM(t *testing.T) {
	t.Parallel()

	t.Run("InFlightRequest", func(t *testing.T) {
		t.Parallel()
		// The request takes 1.5 s of the drain: 5 s leave a loaded machine
		// time to relay it; the supervisor exits once it is done.
		const drain = 5 * time.Second
		e := newGatewayEnv(t, nil, supervisorConfig{extra: []string{"--drain-timeout", drain.String()}})
		p := e.sup
		testutil.Eventually(t, waitTimeout, "the health port to accept connections", func() bool {
			return dialHealth(p.healthAddr) == nil
		})
		c, _ := p.client(t, hostWeb)
		type result struct {
			code int
			body string
			err  error
			at   time.Time
		}
		done := make(chan result, 1)
		go func() {
			code, body, err := getWithin(c, "https://"+hostWeb+"/slow?ms=1500", 10*time.Second)
			done <- result{code, body, err, time.Now()}
		}()
		testutil.Eventually(t, waitTimeout, "the slow request to reach the app", func() bool {
			return slices.ContainsFunc(e.web.requests(), func(r *recorded) bool { return strings.HasPrefix(r.URI, "/slow") })
		})

		sig := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// A dial that starts later than 1 s after SIGTERM and connects
		// proves the listener still accepted then; the time the refusal
		// is seen is only an upper bound, which a starved test process
		// stretches, so it is logged, not checked.
		var refused, healthClosed, lastAccepted time.Duration
		testutil.Eventually(t, waitTimeout, "new connections to the app listener to be refused", func() bool {
			dialed := time.Since(sig)
			conn, err := net.DialTimeout("tcp", p.appAddr, time.Second)
			if err != nil {
				refused = time.Since(sig)
				return true
			}
			lastAccepted = dialed
			_ = conn.Close()
			return false
		})
		testutil.Eventually(t, waitTimeout, "the health port to close", func() bool {
			if isRefused(dialHealth(p.healthAddr)) {
				healthClosed = time.Since(sig)
				return true
			}
			return false
		})
		if lastAccepted > time.Second {
			t.Errorf("a connection dialled %v after SIGTERM was accepted; want none after 1s", lastAccepted)
		}

		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the in-flight request did not finish")
		}
		if r.err != nil || r.code != http.StatusOK || r.body != "hello from web\n" {
			t.Errorf("request in flight at SIGTERM: %d %q %v; want 200 from web", r.code, r.body, r.err)
		}
		select {
		case <-p.done:
		case <-time.After(until(sig.Add(drain + deadlineMargin))):
			t.Fatalf("the supervisor was still running %v after SIGTERM with --drain-timeout %v", time.Since(sig), drain)
		}
		exited := time.Since(sig)
		t.Logf("SIGTERM: dials refused after %v, health port closed after %v, in-flight request done after %v, exit %d after %v",
			refused, healthClosed, r.at.Sub(sig), p.exitCode, exited)
		if p.exitCode != 0 {
			t.Errorf("exit code %d after SIGTERM (%v); want 0", p.exitCode, p.waitErr)
		}
	})

	t.Run("WebSocket", func(t *testing.T) {
		t.Parallel()
		const drain = time.Second
		e := newGatewayEnv(t, nil, supervisorConfig{extra: []string{"--drain-timeout", drain.String()}})
		p := e.sup
		ws := p.wsDial(t, hostWeb)
		must(t, wsEcho(ws, websocket.TextMessage, []byte("before SIGTERM")))

		sig := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		limit := sig.Add(drain + deadlineMargin)
		err := wsExpectClosed(t, ws, until(limit))
		wsClosed := time.Since(sig)
		expectCloseCode(t, "WebSocket at shutdown", err, websocket.CloseGoingAway)
		select {
		case <-p.done:
		case <-time.After(until(limit)):
			t.Fatalf("the supervisor was still running %v after SIGTERM with --drain-timeout %v", time.Since(sig), drain)
		}
		t.Logf("SIGTERM with an open WebSocket: closed after %v (%v), exit %d after %v", wsClosed, err, p.exitCode, time.Since(sig))
		if p.exitCode != 0 {
			t.Errorf("exit code %d after SIGTERM (%v); want 0", p.exitCode, p.waitErr)
		}
	})
}

// TestParentLivenessStdin: with --parent-liveness-stdin the supervisor exits
// 0 soon after its stdin reaches EOF (the parent died).
func TestParentLivenessStdin(t *testing.T) {
	t.Parallel()
	var stdin io.WriteCloser
	e := newGatewayEnv(t, nil, supervisorConfig{
		extra: []string{"--parent-liveness-stdin"},
		setup: func(cmd *exec.Cmd) {
			var err error
			if stdin, err = cmd.StdinPipe(); err != nil {
				t.Fatal(err)
			}
		},
	})
	p := e.sup
	// The supervisor keeps running while the pipe is open.
	holdsFor(t, 300*time.Millisecond, &periodicCheck{name: "running with stdin open", every: 50 * time.Millisecond, fn: func() error {
		if p.exited() {
			return fmt.Errorf("exited with %d", p.exitCode)
		}
		return nil
	}})

	start := time.Now()
	if err := stdin.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(waitTimeout):
		t.Fatalf("the supervisor still runs %v after stdin was closed", waitTimeout)
	}
	took := time.Since(start)
	t.Logf("exited %v after stdin EOF (code %d)", took, p.exitCode)
	if took >= 3*time.Second {
		t.Errorf("exit took %v after stdin EOF; want < 3s", took)
	}
	if p.exitCode != 0 {
		t.Errorf("exit code %d after stdin EOF (%v); want 0", p.exitCode, p.waitErr)
	}
}

// TestStderrStalled: a supervisor whose stderr is a pipe nobody reads keeps
// serving (the log writer drops lines instead of blocking) and counts the
// dropped lines.
func TestStderrStalled(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	doc := routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}})
	gw := newMemGateway(t, doc)
	gw.start(t)
	// The drained supervisor has a gateway of its own: both use the same
	// supervisor id, and a newer session of an id supersedes the older.
	gw2 := newMemGateway(t, doc)
	gw2.start(t)

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the supervisor's cleanup, so it runs after the
	// supervisor has exited: the read end stays open (and unread) for the
	// whole life of the process.
	t.Cleanup(func() { _ = r.Close() })
	stalled := gw.startSupervisor(t, supervisorConfig{setup: func(cmd *exec.Cmd) {
		cmd.Stdout = nil
		cmd.Stderr = w
	}})
	_ = w.Close()
	drained := gw2.startSupervisor(t, supervisorConfig{})

	const measured = 300
	run := func(name string, p *gatewaySupervisor) []time.Duration {
		// Flood: requests whose Host is not the SNI are denied (421) and
		// logged, one line each.
		const flooders, perFlooder = 4, 1000
		var wg sync.WaitGroup
		var floodErrs atomic.Int64
		var floodErr atomic.Value
		for range flooders {
			conn, err := p.dialTLS(tlsConfig(hostWeb))
			if err != nil {
				t.Fatalf("%s: flood connection: %v", name, err)
			}
			rc := &rawConn{Conn: conn, br: bufio.NewReader(conn)}
			wg.Go(func() {
				defer func() { _ = conn.Close() }()
				for i := range perFlooder {
					resp, _, err := rc.tryRoundTrip(fmt.Sprintf("GET /flood?%d HTTP/1.1\r\nHost: other--host.%s\r\n\r\n", i, domain))
					if err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
						floodErrs.Add(1)
						if err == nil {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
						floodErr.Store(err.Error())
						return
					}
				}
			})
		}
		c, _ := p.client(t, hostWeb)
		lat := make([]time.Duration, 0, measured)
		slow := 0
		for i := range measured {
			t0 := time.Now()
			if err := expect200(c, hostWeb, "web"); err != nil {
				t.Errorf("%s: request %d: %v", name, i, err)
				break
			}
			d := time.Since(t0)
			lat = append(lat, d)
			if d > 2*time.Second {
				slow++
			}
		}
		wg.Wait()
		if n := floodErrs.Load(); n > 0 {
			t.Errorf("%s: %d flood connections failed: %v", name, n, floodErr.Load())
		}
		if slow > 0 {
			t.Errorf("%s: %d of %d requests took more than 2s", name, slow, len(lat))
		}
		return lat
	}
	median := func(d []time.Duration) (time.Duration, time.Duration) {
		if len(d) == 0 {
			return 0, 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2], s[len(s)-1]
	}

	start := time.Now()
	latStalled := run("stalled stderr", stalled)
	tookStalled := time.Since(start)
	testutil.Eventually(t, waitTimeout, "applistener_log_lines_dropped_total to rise above 0", func() bool {
		return metricAt(t, stalled.adminAddr, "applistener_log_lines_dropped_total", nil) > 0
	})
	droppedStalled := metricAt(t, stalled.adminAddr, "applistener_log_lines_dropped_total", nil)

	start = time.Now()
	latDrained := run("drained stderr", drained)
	tookDrained := time.Since(start)
	droppedDrained := metricAt(t, drained.adminAddr, "applistener_log_lines_dropped_total", nil)

	ms, xs := median(latStalled)
	md, xd := median(latDrained)
	t.Logf("stalled stderr: %d requests in %v, median %v, max %v, log lines dropped %v", len(latStalled), tookStalled, ms, xs, droppedStalled)
	t.Logf("drained stderr: %d requests in %v, median %v, max %v, log lines dropped %v", len(latDrained), tookDrained, md, xd, droppedDrained)
	if len(latStalled) != measured {
		t.Errorf("stalled stderr: %d of %d requests succeeded", len(latStalled), measured)
	}
	if code := stalled.readyz(); code != http.StatusOK {
		t.Errorf("stalled stderr: /readyz %d; want 200", code)
	}
}

// TestGatewayTokenWrong: a supervisor with a wrong token stays not ready,
// says why on stderr, keeps retrying with backoff (not hammering the
// gateway), and becomes ready without a restart once the token file is
// fixed.
func TestGatewayTokenWrong(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}))
	gw.start(t)
	p := gw.startSupervisor(t, supervisorConfig{noWait: true, token: "wrong-token"})
	pid := p.cmd.Process.Pid

	testutil.Eventually(t, waitTimeout, "stderr to explain the 401 and name --gateway-token-file", func() bool {
		s := p.stderr.String()
		return strings.Contains(s, "401") && strings.Contains(s, "--gateway-token-file")
	})
	code, body := readyzAt(p.adminAddr)
	t.Logf("/readyz with a wrong token: %d %q", code, body)
	if code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d with a wrong token; want 503", code)
	}
	if !strings.Contains(strings.ToLower(body), "gateway") {
		t.Errorf("/readyz reason %q does not mention the gateway (the operator cannot tell that the gateway refuses the token)", body)
	}
	if err := dialHealth(p.healthAddr); !isRefused(err) {
		t.Errorf("health port with a wrong token: %v; want connection refused", err)
	}

	count401 := func(endpoint string) float64 {
		want := map[string]string{"code": "401"}
		if endpoint != "" {
			want["endpoint"] = endpoint
		}
		return metricAt(t, gw.adminAddr, "applistener_gateway_requests_total", want)
	}
	base, baseWatch := count401(""), count401("watch")
	last, lastAt := base, time.Now()
	lastWatch, lastWatchAt := baseWatch, time.Now()
	var gaps, watchGaps []time.Duration
	holdsFor(t, 3*time.Second,
		&periodicCheck{name: "401 counter sampling", every: 50 * time.Millisecond, fn: func() error {
			now := time.Now()
			if v := count401(""); v > last {
				gaps = append(gaps, now.Sub(lastAt).Round(10*time.Millisecond))
				last, lastAt = v, now
			}
			if v := count401("watch"); v > lastWatch {
				watchGaps = append(watchGaps, now.Sub(lastWatchAt).Round(10*time.Millisecond))
				lastWatch, lastWatchAt = v, now
			}
			return nil
		}},
		&periodicCheck{name: "/readyz 503 with a wrong token", every: 100 * time.Millisecond, fn: func() error {
			if code := p.readyz(); code != http.StatusServiceUnavailable {
				return fmt.Errorf("/readyz %d", code)
			}
			return nil
		}},
	)
	retries := last - base
	t.Logf("401 answers in 3s: %v (push attempts %v); gaps between observed increases: all %v, push attempts %v",
		retries, lastWatch-baseWatch, gaps, watchGaps)
	if retries < 2 {
		t.Errorf("%v retries in 3s with a wrong token; want the supervisor to keep retrying", retries)
	}
	if retries >= 50 {
		t.Errorf("%v requests in 3s with a wrong token; want backoff (< 50)", retries)
	}

	fixed := time.Now()
	writeAtomic(t, p.tokenFile, []byte(supervisorToken+"\n"))
	testutil.Eventually(t, waitTimeout, "the supervisor to become ready with the fixed token", func() bool {
		return p.readyz() == http.StatusOK
	})
	t.Logf("ready %v after the token file was fixed", time.Since(fixed))
	c, _ := p.client(t, hostWeb)
	if err := expect200(c, hostWeb, "web"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the health port to open", func() bool {
		return dialHealth(p.healthAddr) == nil
	})
	if p.exited() || p.cmd.Process.Pid != pid {
		t.Fatal("the supervisor was restarted")
	}
}
