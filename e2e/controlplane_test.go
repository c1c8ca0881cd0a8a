package e2e

// End-to-end tests of the replicated control plane: two `applistener
// gateway --store etcd` replicas on a real three-member etcd cluster
// (etcd_harness_test.go), supervisors, the edge and discovery watchers, all
// real processes of the built binary. They need /usr/bin/etcd (Debian's
// etcd-server, installed by scripts/test-deps.sh): without it they skip,
// or fail when CI is set.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// The control-plane tests serve demoHost (discovery_test.go).

const (
	// sessionTTL is the gateways' --session-ttl in these tests (at least
	// twice the keepalive, which push streams renew their session with).
	sessionTTL = 4 * time.Second
)

// fastSession are the gateway flags of most tests: a short session TTL and the
// keepalive it allows (supervisors ask for freshness/3, 1 s, anyway).
var fastSession = []string{"--keepalive", "1s", "--session-ttl", sessionTTL.String()}

// logFigure logs a measured figure in a form that is easy to grep for.
func logFigure(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURE "+format, args...)
}

// TestControlPlaneCrossReplica: the supervisor holds its session with
// replica 1 and the edge watches replica 2. An instance written through
// replica 2's admin API reaches the supervisor (through etcd and replica 1),
// the supervisor's advertisement reaches the edge (through replica 1, etcd
// and replica 2), and traffic through the edge is served. Withdrawn through
// replica 1, the route's WebSocket through the edge closes with 1008.
// Then it measures the cross-replica discovery change latency: a write
// accepted by replica 1 until a discovery watch on replica 2 shows it.
func TestControlPlaneCrossReplica(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, fastSession...)
	web := newBackend(t, "web1")

	// The supervisor's document exists (another instance) so that its
	// session is accepted before the route is written.
	g.put(t, 1, "sup-1", newStoredInstance("idle", map[string]int{"web": web.port}))
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", gateways: g.url(0)})
	edge := startEdgeOn(t, g.url(1))
	testutil.Eventually(t, waitTimeout, "the supervisor's push session on replica 1", func() bool {
		v, _, err := scrapeMetric(g.replicas[0].adminAddr, "applistener_gateway_watchers", nil)
		return err == nil && v == 1
	})

	start := time.Now()
	g.put(t, 1, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	r := g.waitRoute(t, 1, demoHost, "sup-1", false)
	logFigure(t, "write on replica 2 -> supervisor on replica 1 -> route in discovery on replica 2: %v", time.Since(start).Round(time.Millisecond))
	if r.Endpoint.Host != "127.0.0.1" || r.Endpoint.Port != portOf(sup.appAddr) {
		t.Fatalf("published endpoint %+v, want the supervisor's listener %s", r.Endpoint, sup.appAddr)
	}
	var body string
	testutil.Eventually(t, waitTimeout, "GET through the edge (discovery from replica 2)", func() bool {
		var err error
		body, err = edgeGet(edge.appAddr, demoHost)
		return err == nil
	})
	if body != "hello from web1" {
		t.Fatalf("through the edge: %q", body)
	}
	// One WebSocket through the edge, one straight to the supervisor.
	ws, err := edgeWS(edge.appAddr, demoHost)
	if err != nil {
		t.Fatalf("WebSocket through the edge: %v", err)
	}
	defer func() { _ = ws.Close() }()
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before")))
	direct := sup.wsDial(t, demoHost)
	must(t, wsEcho(direct, websocket.TextMessage, []byte("before")))

	// Withdrawn through the other replica: the supervisor closes the
	// route's WebSockets with 1008, and the edge, told by discovery at the
	// same moment, leaves the splice to the supervisor for its withdrawal
	// grace, so the close frame reaches the client through the edge too.
	closedDirect := watchClose(direct, waitTimeout)
	closedEdge := watchClose(ws, waitTimeout)
	t0 := time.Now()
	g.del(t, 0, "sup-1", "demo")
	res := awaitClose(t, "WebSocket to the supervisor after the withdrawal on replica 1", closedDirect)
	expectCloseCode(t, "WebSocket to the supervisor", res.err, websocket.ClosePolicyViolation)
	resEdge := awaitClose(t, "WebSocket through the edge after the withdrawal on replica 1", closedEdge)
	expectCloseCode(t, "WebSocket through the edge", resEdge.err, websocket.ClosePolicyViolation)
	t.Logf("withdrawal on replica 1: WebSocket to the supervisor closed with 1008 after %v; through the edge after %v",
		res.at.Sub(t0).Round(time.Millisecond), resEdge.at.Sub(t0).Round(time.Millisecond))
	g.waitRoute(t, 1, demoHost, "", true)
	testutil.Eventually(t, waitTimeout, "the edge to refuse the withdrawn name", func() bool {
		return isUnrecognizedName(edgeHandshakeErr(edge.appAddr, caPool, demoHost))
	})

	// Cross-replica discovery latency: writes on replica 1, a watch on
	// replica 2. A withdrawal is a document change (the grant goes away at
	// once); a publication also includes the supervisor's round trip
	// (push, install, advertisement through replica 1).
	w := g.startWatch(t, 1)
	const rounds = 100
	var pub, unpub []time.Duration
	idx := 0
	for range rounds {
		t0 := time.Now()
		g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
		i, at := w.waitFor(t, idx, waitTimeout, demoHost+" published", func(s *discoverySnapshot) bool { return s.route(demoHost) != nil })
		pub = append(pub, at.Sub(t0))
		t1 := time.Now()
		g.del(t, 0, "sup-1", "demo")
		i, at = w.waitFor(t, i+1, waitTimeout, demoHost+" withdrawn", func(s *discoverySnapshot) bool { return s.route(demoHost) == nil })
		unpub = append(unpub, at.Sub(t1))
		idx = i + 1
	}
	logFigure(t, "cross-replica discovery change (write on replica 1 -> watch on replica 2), withdrawal: p50 %v p99 %v max %v (n=%d)",
		percentile(unpub, 50), percentile(unpub, 99), percentile(unpub, 100), len(unpub))
	logFigure(t, "cross-replica discovery change, publication incl. the supervisor's round trip: p50 %v p99 %v max %v (n=%d)",
		percentile(pub, 50), percentile(pub, 99), percentile(pub, 100), len(pub))
	if p := percentile(unpub, 50); p > time.Second {
		t.Errorf("median withdrawal latency across replicas %v; want well under a second", p)
	}
}

// portOf is the port of a host:port address.
func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	var n int
	_, _ = fmt.Sscan(p, &n)
	return n
}

// discoveryProbe polls replica i's discovery every interval until stop is
// closed and records every answer that is a 200 without host (empty or
// partial), or anything but 200 or a refused connection (a replica that is
// down); transport errors count separately.
type discoveryProbe struct {
	mu       sync.Mutex
	ok       int
	down     int
	missing  []string
	stop     chan struct{}
	finished chan struct{}
}

func (g *etcdGateways) probeDiscovery(i int, host string, every time.Duration) *discoveryProbe {
	p := &discoveryProbe{stop: make(chan struct{}), finished: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(p.finished)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			code, s, err := g.discovery(i, teamToken, "team")
			p.mu.Lock()
			switch {
			case code == http.StatusOK && s != nil && s.route(host) != nil:
				p.ok++
			case code == http.StatusOK:
				p.missing = append(p.missing, fmt.Sprintf("at %v: a 200 without %s (%d routes)", time.Since(start).Round(time.Millisecond), host, len(s.Routes)))
			case code == 0 || code == http.StatusServiceUnavailable:
				p.down++ // replica down or not loaded: never an empty set
			default:
				p.missing = append(p.missing, fmt.Sprintf("at %v: %v", time.Since(start).Round(time.Millisecond), err))
			}
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// inBackground runs check every interval in the background until the
// returned function is called; that function fails the test if any run of
// check failed, with the first failures.
func inBackground(t testing.TB, name string, every time.Duration, check func() error) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	var runs int
	var fails []string
	start := time.Now()
	go func() {
		defer close(done)
		for {
			runs++
			if err := check(); err != nil {
				fails = append(fails, fmt.Sprintf("at %v: %v", time.Since(start).Round(time.Millisecond), err))
			}
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return func() {
		t.Helper()
		close(stop)
		<-done
		t.Logf("%s: %d checks, %d failed", name, runs, len(fails))
		if len(fails) > 0 {
			t.Errorf("%s failed %d of %d times; first: %s", name, len(fails), runs, strings.Join(fails[:min(5, len(fails))], "; "))
		}
	}
}

// okCount is the number of answers with the route so far.
func (p *discoveryProbe) okCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok
}

// end stops the probe and fails the test if any answer lacked the route.
func (p *discoveryProbe) end(t testing.TB, what string) {
	t.Helper()
	close(p.stop)
	<-p.finished
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("%s: %d answers with the route, %d while down or loading (503/refused)", what, p.ok, p.down)
	if len(p.missing) > 0 {
		t.Errorf("%s: %d answers without the route; first: %s", what, len(p.missing), strings.Join(p.missing[:min(5, len(p.missing))], "; "))
	}
	if p.ok == 0 {
		t.Errorf("%s: no answer with the route at all", what)
	}
}

// TestControlPlaneReplicaFailover: supervisor and edge are given both
// replicas and use replica 1. Replica 1 is killed (SIGKILL): the supervisor
// moves its session to replica 2, the edge its discovery watch; discovery
// never answers with a set that lacks the route, a WebSocket through the
// edge stays open, new connections through the edge keep working. Replica
// 1 is started again and replica 2 killed: the same, the other way round.
func TestControlPlaneReplicaFailover(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, fastSession...)
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	const freshness = 2 * time.Second
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", gateways: g.urls(0, 1), freshness: freshness})
	edge := startEdgeOn(t, g.urls(0, 1))
	g.waitRoute(t, 1, demoHost, "sup-1", false)
	testutil.Eventually(t, waitTimeout, "GET through the edge", func() bool { _, err := edgeGet(edge.appAddr, demoHost); return err == nil })
	ws, err := edgeWS(edge.appAddr, demoHost)
	if err != nil {
		t.Fatalf("WebSocket through the edge: %v", err)
	}
	defer func() { _ = ws.Close() }()

	for _, dead := range []int{0, 1} {
		alive := 1 - dead
		name := fmt.Sprintf("replica %d killed", dead+1)
		// Both clients are on the replica about to die.
		for metric, what := range map[string]string{
			"applistener_gateway_watchers":           "the supervisor's configuration session",
			"applistener_gateway_discovery_watchers": "the edge's discovery watch",
		} {
			testutil.Eventually(t, waitTimeout, fmt.Sprintf("%s on replica %d", what, dead+1), func() bool {
				v, _, err := scrapeMetric(g.replicas[dead].adminAddr, metric, nil)
				return err == nil && v == 1
			})
		}
		pushes := sup.metricOrNegative("applistener_config_deliveries_total", map[string]string{"source": "push", "result": "applied"})
		probe := g.probeDiscovery(alive, demoHost, 50*time.Millisecond)
		edgeRoutes := inBackground(t, name+": the edge's discovery cache holds the route", 20*time.Millisecond, func() error {
			if v := edge.metricOrNegative("applistener_edge_routes", nil); v != 1 {
				return fmt.Errorf("applistener_edge_routes %v", v)
			}
			return nil
		})
		var wsErr atomic.Value
		stopWS := make(chan struct{})
		var wsWG sync.WaitGroup
		wsWG.Go(func() {
			for n := 0; ; n++ {
				if err := wsEcho(ws, websocket.TextMessage, []byte(fmt.Sprintf("%s %d", name, n))); err != nil {
					wsErr.Store(err)
					return
				}
				select {
				case <-stopWS:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})

		t0 := time.Now()
		g.kill(t, dead)
		var supAt, edgeAt time.Duration
		deadline := time.Now().Add(waitTimeout)
		for (supAt == 0 || edgeAt == 0) && time.Now().Before(deadline) {
			if supAt == 0 && sup.metricOrNegative("applistener_config_deliveries_total", map[string]string{"source": "push", "result": "applied"}) > pushes {
				supAt = time.Since(t0)
			}
			if edgeAt == 0 {
				if v, _, err := scrapeMetric(g.replicas[alive].adminAddr, "applistener_gateway_discovery_watchers", nil); err == nil && v == 1 {
					edgeAt = time.Since(t0)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		if supAt == 0 || edgeAt == 0 {
			t.Fatalf("%s: after %v the supervisor's new session delivered: %v, the edge's watch on replica %d: %v", name, waitTimeout, supAt, alive+1, edgeAt)
		}
		logFigure(t, "%s: supervisor session failover (first document of a push session on replica %d) %v", name, alive+1, supAt.Round(time.Millisecond))
		logFigure(t, "%s: discovery watch failover (edge's watch open on replica %d) %v", name, alive+1, edgeAt.Round(time.Millisecond))

		// Routes keep being renewed through the new replica: watch past
		// the freshness window.
		holdsFor(t, freshness+500*time.Millisecond,
			&periodicCheck{name: name + ": GET through the edge", every: 300 * time.Millisecond, fn: func() error {
				body, err := edgeGet(edge.appAddr, demoHost)
				if err == nil && body != "hello from web1" {
					err = fmt.Errorf("body %q", body)
				}
				return err
			}},
			&periodicCheck{name: name + ": supervisor ready", every: 200 * time.Millisecond, fn: func() error {
				if code := sup.readyz(); code != http.StatusOK {
					return fmt.Errorf("/readyz %d", code)
				}
				return nil
			}},
		)
		close(stopWS)
		wsWG.Wait()
		if err, _ := wsErr.Load().(error); err != nil {
			t.Fatalf("%s: the WebSocket through the edge broke: %v", name, err)
		}
		probe.end(t, name+": discovery on replica "+fmt.Sprint(alive+1))
		edgeRoutes()

		// The dead replica comes back on its port: from its first 200 on,
		// it publishes the route (loaded from etcd, never an empty set).
		restart := g.probeDiscovery(dead, demoHost, 20*time.Millisecond)
		g.start(t, dead)
		base := restart.okCount()
		testutil.Eventually(t, waitTimeout, "a few answers of the restarted replica", func() bool { return restart.okCount() >= base+3 })
		restart.end(t, fmt.Sprintf("discovery on replica %d while it restarts", dead+1))
	}
}

// TestControlPlaneEtcdQuorum: one etcd member stopped (the leader): nothing
// changes. Two stopped: both replicas answer 503 to new discovery reads,
// end their discovery watches and refuse writes; the supervisor keeps
// serving its route until its own freshness runs out (no renewals come
// from a gateway that cannot vouch for its state). With the members back,
// everything recovers by itself.
func TestControlPlaneEtcdQuorum(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, fastSession...)
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	const freshness = 5 * time.Second
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", freshness: freshness})
	g.waitRoute(t, 0, demoHost, "sup-1", false)
	g.waitRoute(t, 1, demoHost, "sup-1", false)
	edge := startEdgeOn(t, g.urls(1, 0))
	testutil.Eventually(t, waitTimeout, "GET through the edge", func() bool { _, err := edgeGet(edge.appAddr, demoHost); return err == nil })
	watches := []*discoveryWatch{g.startWatch(t, 0), g.startWatch(t, 1)}

	// One member (the leader) stops: nothing changes.
	leader := -1
	testutil.Eventually(t, waitTimeout, "an etcd leader", func() bool { leader = c.leader(); return leader >= 0 })
	c.stop(t, leader)
	n := 0
	holdsFor(t, 3*time.Second,
		&periodicCheck{name: "one member down: discovery on both replicas", every: 100 * time.Millisecond, fn: func() error {
			for i := range 2 {
				_, s, err := g.discovery(i, teamToken, "team")
				if err != nil {
					return err
				}
				if s.route(demoHost) == nil {
					return fmt.Errorf("replica %d: no %s", i+1, demoHost)
				}
			}
			return nil
		}},
		&periodicCheck{name: "one member down: writes", every: 500 * time.Millisecond, fn: func() error {
			n++
			b := []byte(fmt.Sprintf(`{"workspace":"team","sandbox":"probe","generation":"%d","connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":%d,"revision":1}]}`, n, web.port))
			code, body, err := g.do(n%2, http.MethodPut, "/v1/supervisors/sup-1/instances/team/probe", adminToken, b)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("PUT on replica %d: %d %s", n%2+1, code, body)
			}
			return err
		}},
		&periodicCheck{name: "one member down: supervisor ready, GET through the edge", every: 250 * time.Millisecond, fn: func() error {
			if code := sup.readyz(); code != http.StatusOK {
				return fmt.Errorf("/readyz %d", code)
			}
			_, err := edgeGet(edge.appAddr, demoHost)
			return err
		}},
	)
	for i, w := range watches {
		if ended, _, err := w.ended(); ended {
			t.Fatalf("one member down: the discovery watch on replica %d ended: %v", i+1, err)
		}
	}

	// A second member goes: quorum is lost.
	second := (leader + 1) % 3
	c.kill(t, second)
	t0 := time.Now()
	for i := range 2 {
		testutil.Eventually(t, waitTimeout, fmt.Sprintf("replica %d to answer 503 to discovery", i+1), func() bool {
			code, _, _ := g.discovery(i, teamToken, "team")
			return code == http.StatusServiceUnavailable
		})
	}
	refusedAt := time.Since(t0)
	logFigure(t, "quorum lost -> both replicas answer 503 to discovery: %v", refusedAt.Round(time.Millisecond))
	// The supervisor still serves: its routes are fresh for a while.
	if refusedAt < freshness-time.Second {
		if !sup.handshakeOK(demoHost) {
			t.Fatalf("%v after quorum loss (freshness %v) the supervisor no longer serves its route", refusedAt, freshness)
		}
	} else {
		t.Logf("503 came only %v after quorum loss: cannot check serving within the freshness of %v", refusedAt, freshness)
	}
	for i, w := range watches {
		testutil.Eventually(t, waitTimeout, fmt.Sprintf("the discovery watch on replica %d to end", i+1), func() bool {
			ended, _, _ := w.ended()
			return ended
		})
		// It ended without ever sending a set without the route.
		for _, ev := range w.snapshots() {
			if ev.snap.route(demoHost) == nil {
				t.Errorf("replica %d's watch sent a snapshot without %s at %v", i+1, demoHost, ev.at.Sub(t0))
			}
		}
	}
	for i := range 2 {
		code, body, _ := g.do(i, http.MethodPut, "/v1/supervisors/sup-1/instances/team/probe", adminToken,
			[]byte(`{"workspace":"team","sandbox":"probe","generation":"x","connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":8080,"revision":1}]}`))
		if code != http.StatusServiceUnavailable {
			t.Errorf("write on replica %d without quorum: %d %s; want 503", i+1, code, body)
		}
		code, body, _ = g.do(i, http.MethodGet, "/v1/supervisors/sup-1/config", "cp-sup-sup-1", nil)
		if code != http.StatusServiceUnavailable {
			t.Errorf("configuration poll on replica %d without quorum: %d %s; want 503", i+1, code, body)
		}
	}
	// Without renewals the route expires at the supervisor on time.
	testutil.Eventually(t, freshness+deadlineMargin, "the route to expire at the supervisor", func() bool {
		return isUnrecognizedName(sup.handshakeErr(demoHost))
	})
	expiredAt := time.Since(t0)
	logFigure(t, "quorum lost -> route expired at the supervisor: %v (freshness %v)", expiredAt.Round(time.Millisecond), freshness)
	if expiredAt < freshness-2*time.Second {
		t.Errorf("the route expired %v after quorum loss; the supervisor should keep it about its freshness (%v)", expiredAt, freshness)
	}

	// The members come back: everything recovers without a restart.
	t1 := time.Now()
	c.start(t, second)
	c.start(t, leader)
	for i := range 2 {
		g.waitRoute(t, i, demoHost, "sup-1", false)
	}
	testutil.Eventually(t, waitTimeout, "the supervisor to serve again", func() bool { return sup.handshakeOK(demoHost) })
	testutil.Eventually(t, waitTimeout, "GET through the edge again", func() bool { _, err := edgeGet(edge.appAddr, demoHost); return err == nil })
	logFigure(t, "members restarted -> route served through the edge again: %v", time.Since(t1).Round(time.Millisecond))
	w := g.startWatch(t, 0)
	w.waitFor(t, 0, waitTimeout, demoHost, func(s *discoverySnapshot) bool { return s.route(demoHost) != nil })
}

// TestControlPlanePools: three supervisors with generated ids share one
// pool token; each gets the document written for its own id and serves
// only that. Another pool's token (and another supervisor's token) can
// neither read nor advertise for those ids.
func TestControlPlanePools(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("other-sup")}, fastSession...)
	var ids []string
	var sups []*etcdSupervisor
	var apps []*backend
	for i := range 3 {
		id := fmt.Sprintf("host-%s", randomHex(t, 4))
		ids = append(ids, id)
		apps = append(apps, newBackend(t, id))
		// Ready means its session was accepted: the empty document.
		sups = append(sups, g.startSupervisor(t, etcdSupervisorConfig{id: id, token: poolToken, gateways: g.urls(i%2, 1-i%2)}))
	}
	// The members list shows the three live sessions.
	code, body, err := g.do(1, http.MethodGet, "/v1/pools/"+hostsPool+"/members", adminToken, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("pool members: %d %s %v", code, body, err)
	}
	for _, id := range ids {
		if !strings.Contains(string(body), `"`+id+`"`) {
			t.Errorf("pool members %s do not list %s", body, id)
		}
	}
	// Each gets its own instance.
	hosts := map[string]string{}
	for i, id := range ids {
		sb := fmt.Sprintf("sb%d", i+1)
		g.put(t, i%2, id, newStoredInstance(sb, map[string]int{"web": apps[i].port}))
		hosts[id] = serviceHost("team", sb, "web")
	}
	for i, id := range ids {
		g.waitRoute(t, 0, hosts[id], id, false)
		for j, other := range ids {
			ok := sups[i].handshakeOK(hosts[other])
			if ok != (i == j) {
				t.Errorf("supervisor %s serves %s: %v", id, hosts[other], ok)
			}
		}
		cl, _ := sups[i].client(t, hosts[id])
		if err := expect200(cl, hosts[id], id); err != nil {
			t.Error(err)
		}
	}

	// Another pool's token, and another supervisor's token, get 403 for
	// these ids: no document, no advertisement, no withdrawal.
	ad := []byte(fmt.Sprintf(`{"installations":[{"hostname":%q,"workspace":"team","sandbox":"sb1","name":"web","installation_version":1,"declaration_revision":1,"expires_at":%q,"endpoint":{"host":"127.0.0.1","port":1},"generation":"1"}],"session":"%032x"}`,
		hosts[ids[0]], time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano), 1))
	for _, tok := range []string{pool2Token, "cp-sup-other-sup"} {
		for _, req := range []struct{ method, path string }{
			{http.MethodGet, "/v1/supervisors/" + ids[0] + "/config"},
			{http.MethodGet, "/v1/supervisors/" + ids[0] + "/config?watch=1&session=" + strings.Repeat("ab", 16)},
			{http.MethodPut, "/v1/supervisors/" + ids[0] + "/installations"},
			{http.MethodDelete, "/v1/supervisors/" + ids[0] + "/installations?session=" + strings.Repeat("ab", 16)},
			{http.MethodGet, "/v1/supervisors/" + ids[0] + "/instances"},
			{http.MethodGet, "/v1/pools/" + hostsPool + "/members"},
		} {
			var b []byte
			if req.method == http.MethodPut {
				b = ad
			}
			code, body, err := g.do(0, req.method, req.path, tok, b)
			if err != nil || code != http.StatusForbidden {
				t.Errorf("%s %s with %s: %d %s %v; want 403", req.method, req.path, tok, code, body, err)
			}
		}
	}
	// The other pool binds an id of its own; then pool A cannot have it.
	fresh := "host-" + randomHex(t, 4)
	code, body, _ = g.do(1, http.MethodGet, "/v1/supervisors/"+fresh+"/config?session="+strings.Repeat("cd", 16), pool2Token, nil)
	if code != http.StatusOK {
		t.Fatalf("pool %s's first session for %s: %d %s", pool2, fresh, code, body)
	}
	code, body, _ = g.do(0, http.MethodGet, "/v1/supervisors/"+fresh+"/config?session="+strings.Repeat("ef", 16), poolToken, nil)
	if code != http.StatusForbidden {
		t.Errorf("pool %s's token for %s (bound to %s): %d %s; want 403", hostsPool, fresh, pool2, code, body)
	}
	// Nothing changed in discovery.
	s := g.snapshot(t, 1)
	for _, id := range ids {
		if r := s.route(hosts[id]); r == nil || r.Supervisor != id || r.Endpoint.Port != portOf(sups[indexOf(ids, id)].appAddr) {
			t.Errorf("after the refused requests, %s in discovery: %+v", hosts[id], r)
		}
	}
}

// randomHex returns n random bytes as lowercase hex.
func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// TestControlPlaneSigtermWithdrawsFirst: on SIGTERM a supervisor withdraws
// its installations before its app listener closes: at the moment the
// listener refuses connections, discovery no longer has its names.
func TestControlPlaneSigtermWithdrawsFirst(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, fastSession...)
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", gateways: g.url(0)})
	g.waitRoute(t, 0, demoHost, "sup-1", false)
	g.waitRoute(t, 1, demoHost, "sup-1", false)
	w := g.startWatch(t, 1)
	w.waitFor(t, 0, waitTimeout, demoHost, func(s *discoverySnapshot) bool { return s.route(demoHost) != nil })

	// Connect in a tight loop until the listener refuses.
	closedAt := make(chan time.Time, 1)
	var dialWG sync.WaitGroup
	dialWG.Go(func() {
		deadline := time.Now().Add(waitTimeout)
		for time.Now().Before(deadline) {
			conn, err := net.DialTimeout("tcp", sup.appAddr, time.Second)
			if err == nil {
				_ = conn.Close()
				time.Sleep(time.Millisecond)
				continue
			}
			if isRefused(err) {
				closedAt <- time.Now()
				return
			}
		}
	})
	t0 := time.Now()
	if err := sup.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var closed time.Time
	select {
	case closed = <-closedAt:
	case <-time.After(waitTimeout + time.Second):
		t.Fatal("the app listener did not close after SIGTERM")
	}
	// At that moment the replica that took the withdrawal no longer
	// publishes the name.
	code, s, err := g.discovery(0, teamToken, "team")
	if err != nil || code != http.StatusOK {
		t.Fatalf("discovery right after the listener closed: %d %v", code, err)
	}
	if s.route(demoHost) != nil {
		t.Errorf("the listener closed %v after SIGTERM while replica 1 still published %s", closed.Sub(t0), demoHost)
	}
	dialWG.Wait()
	_, gone := w.waitFor(t, 0, waitTimeout, demoHost+" withdrawn", func(s *discoverySnapshot) bool { return s.route(demoHost) == nil })
	logFigure(t, "SIGTERM -> name gone from the watch on replica 2: %v; SIGTERM -> app listener closed: %v",
		gone.Sub(t0).Round(time.Millisecond), closed.Sub(t0).Round(time.Millisecond))
	select {
	case <-sup.done:
	case <-time.After(waitTimeout):
		t.Fatal("the supervisor did not exit")
	}
	if sup.exitCode != 0 {
		t.Errorf("exit code %d after SIGTERM", sup.exitCode)
	}
	if !strings.Contains(sup.stderr.String(), "installations withdrawn") {
		t.Errorf("the supervisor did not log its withdrawal:\n%s", lastLines(sup.stderr.String(), 20))
	}
}

// TestControlPlaneTakeover: one hostname granted to two supervisors. The
// incumbent keeps it while its advertisement is publishable; when it
// withdraws (SIGTERM) or dies (SIGKILL: its advertisement expires with its
// freshness), the other's advertisement is published.
func TestControlPlaneTakeover(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-a"), supervisorTokenOf("sup-b")}, fastSession...)
	appA, appB := newBackend(t, "app-a"), newBackend(t, "app-b")
	g.put(t, 0, "sup-a", newStoredInstance("demo", map[string]int{"web": appA.port}))
	g.put(t, 1, "sup-b", newStoredInstance("demo", map[string]int{"web": appB.port}))
	const freshness = 3 * time.Second
	a := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-a", freshness: freshness})
	g.waitRoute(t, 1, demoHost, "sup-a", false)
	b := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-b", freshness: freshness, gateways: g.urls(1, 0)})
	w := g.startWatch(t, 1)
	// The incumbent keeps the name while B advertises it too.
	holdsFor(t, time.Second, &periodicCheck{name: "incumbent keeps the name", every: 100 * time.Millisecond, fn: func() error {
		s := g.snapshot(t, 0)
		if r := s.route(demoHost); r == nil || r.Supervisor != "sup-a" {
			return fmt.Errorf("owner %+v", r)
		}
		return nil
	}})
	if !b.handshakeOK(demoHost) {
		t.Fatal("supervisor B has not installed the route")
	}

	// Graceful: A withdraws on SIGTERM.
	from := len(w.snapshots())
	t0 := time.Now()
	a.signalAndWait(t, syscall.SIGTERM, waitTimeout)
	_, at := w.waitFor(t, from, waitTimeout, "sup-b owning "+demoHost, func(s *discoverySnapshot) bool {
		r := s.route(demoHost)
		return r != nil && r.Supervisor == "sup-b"
	})
	graceful := at.Sub(t0)
	logFigure(t, "takeover after SIGTERM of the owner (withdrawal) -> new owner in discovery on replica 2: %v", graceful.Round(time.Millisecond))
	for _, ev := range w.snapshots()[from:] {
		if ev.snap.route(demoHost) == nil {
			t.Errorf("during the graceful takeover discovery had no owner for %s at %v", demoHost, ev.at.Sub(t0))
		}
	}
	if graceful > 2*time.Second {
		t.Errorf("graceful takeover took %v; the withdrawal should publish the other advertisement at once", graceful)
	}

	// A comes back (a new session) and advertises too, B keeps the name;
	// then B dies without a word.
	a2 := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-a", freshness: freshness})
	testutil.Eventually(t, waitTimeout, "the new A to install the route", func() bool { return a2.handshakeOK(demoHost) })
	holdsFor(t, time.Second, &periodicCheck{name: "B keeps the name while the new A advertises it", every: 100 * time.Millisecond, fn: func() error {
		if r := g.snapshot(t, 1).route(demoHost); r == nil || r.Supervisor != "sup-b" {
			return fmt.Errorf("owner %+v", r)
		}
		return nil
	}})
	from = len(w.snapshots())
	t1 := time.Now()
	b.kill()
	_, at = w.waitFor(t, from, freshness+sessionTTL+deadlineMargin, "sup-a owning "+demoHost, func(s *discoverySnapshot) bool {
		r := s.route(demoHost)
		return r != nil && r.Supervisor == "sup-a"
	})
	abrupt := at.Sub(t1)
	logFigure(t, "takeover after SIGKILL of the owner -> new owner in discovery on replica 2: %v (freshness %v, session TTL %v)",
		abrupt.Round(time.Millisecond), freshness, sessionTTL)
	if abrupt > freshness+deadlineMargin {
		t.Errorf("abrupt takeover took %v; the dead owner's advertisement expires within its freshness (%v)", abrupt, freshness)
	}
	body, err := func() (string, error) {
		cl, _ := a2.client(t, demoHost)
		_, body, err := getWithin(cl, "https://"+demoHost+"/", 5*time.Second)
		return strings.TrimSpace(body), err
	}()
	if err != nil || body != "hello from app-a" {
		t.Errorf("the new owner serves %q, %v", body, err)
	}
}

// TestControlPlaneEndpointPolicySource: with --endpoint-policy=source an
// advertisement whose endpoint is not the address it came from is refused
// (logged, never published); one from its own address is published.
func TestControlPlaneEndpointPolicySource(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("good"), supervisorTokenOf("bad")}, append(fastSession, "--endpoint-policy", "source")...)
	appGood, appBad := newBackend(t, "good"), newBackend(t, "bad")
	g.put(t, 0, "good", newStoredInstance("good", map[string]int{"web": appGood.port}))
	g.put(t, 0, "bad", newStoredInstance("bad", map[string]int{"web": appBad.port}))
	hostGood, hostBad := serviceHost("team", "good", "web"), serviceHost("team", "bad", "web")
	// Both connect from 127.0.0.1; bad advertises another loopback address.
	good := g.startSupervisor(t, etcdSupervisorConfig{id: "good"})
	bad := g.startSupervisor(t, etcdSupervisorConfig{id: "bad", advertise: "127.0.0.2"})
	g.waitRoute(t, 1, hostGood, "good", false)
	if !bad.handshakeOK(hostBad) || !good.handshakeOK(hostGood) {
		t.Fatal("the supervisors have not installed their routes")
	}
	testutil.Eventually(t, waitTimeout, "a replica to count and log the refused endpoint", func() bool {
		for _, r := range g.replicas {
			v, _, _ := scrapeMetric(r.adminAddr, "applistener_gateway_endpoint_policy_refused_total", nil)
			if v == 0 {
				continue
			}
			for _, line := range strings.Split(r.stderr.String(), "\n") {
				if strings.Contains(line, `"WARN"`) && strings.Contains(line, "endpoint policy") && strings.Contains(line, "127.0.0.2") {
					return true
				}
			}
		}
		return false
	})
	// Several advertisement rounds later it is still not published.
	holdsFor(t, 2*time.Second, &periodicCheck{name: "refused endpoint never published", every: 100 * time.Millisecond, fn: func() error {
		for i := range 2 {
			s := g.snapshot(t, i)
			if r := s.route(hostBad); r != nil {
				return fmt.Errorf("replica %d publishes %s at %+v", i+1, hostBad, r.Endpoint)
			}
			if s.route(hostGood) == nil {
				return fmt.Errorf("replica %d lost %s", i+1, hostGood)
			}
		}
		return nil
	}})
}

// TestControlPlaneShortFreshnessQuiet: --route-freshness 2s against a gateway
// with the default keepalive (5 s): the supervisor negotiates a shorter one
// (or polls beside it), so 20 quiet seconds expire nothing and an idle
// WebSocket stays open.
func TestControlPlaneShortFreshnessQuiet(t *testing.T) {
	t.Parallel()
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}) // default keepalive and session TTL
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", freshness: 2 * time.Second})
	r0 := g.waitRoute(t, 0, demoHost, "sup-1", false)
	g.waitRoute(t, 1, demoHost, "sup-1", false)
	ws := sup.wsDial(t, demoHost)
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before")))
	_ = ws.SetReadDeadline(time.Time{})
	// A reader that reports every message and how the socket ended.
	msgs := make(chan string, 8)
	ended := make(chan error, 1)
	go func() {
		for {
			_, m, err := ws.ReadMessage()
			if err != nil {
				ended <- err
				return
			}
			msgs <- string(m)
		}
	}()

	rev0, err := c.revision()
	if err != nil {
		t.Fatal(err)
	}
	quietStart := time.Now()
	holdsFor(t, 20*time.Second,
		&periodicCheck{name: "route installed and unchanged", every: time.Second, fn: func() error {
			if !sup.handshakeOK(demoHost) {
				return fmt.Errorf("handshake refused")
			}
			_, s, err := g.discovery(1, teamToken, "team")
			if err != nil {
				return err
			}
			r := s.route(demoHost)
			if r == nil || r.InstallationVersion != r0.InstallationVersion {
				return fmt.Errorf("discovery %+v, want installation %d", r, r0.InstallationVersion)
			}
			return nil
		}},
		&periodicCheck{name: "WebSocket open", every: time.Second, fn: func() error {
			select {
			case err := <-ended:
				ended <- err
				return fmt.Errorf("closed: %v", err)
			default:
				return nil
			}
		}},
	)
	if v := metricAt(t, sup.adminAddr, "applistener_route_revocations_total", nil); v != 0 {
		t.Errorf("%v route revocations during the quiet period", v)
	}
	// What one quiet supervisor costs etcd (for the sizing advice).
	if rev1, err := c.revision(); err == nil {
		kvs, _ := c.list(g.prefix)
		size := 0
		for _, kv := range kvs {
			size += len(kv.Key) + len(kv.Value)
		}
		logFigure(t, "one quiet supervisor (freshness 2s, 1 route): %.2f etcd writes/s; %d keys, %d bytes under the prefix",
			float64(rev1-rev0)/time.Since(quietStart).Seconds(), len(kvs), size)
	}
	// Still alive after the quiet period: an echo goes through.
	_ = ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := ws.WriteMessage(websocket.TextMessage, []byte("after")); err != nil {
		t.Fatalf("WebSocket write after 20 quiet seconds: %v", err)
	}
	select {
	case m := <-msgs:
		if m != "after" {
			t.Errorf("echo %q", m)
		}
	case err := <-ended:
		t.Fatalf("WebSocket ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no echo after 20 quiet seconds")
	}
	_ = ws.Close()
	<-ended //nolint:errcheck // waits for the reader to end; its error is the Close
}
