package e2e

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// The freshness promise on the replicated control plane and through the
// edge (issue 25, tests 1 and 2): what freshness_outage_test.go and
// freshness_restart_test.go show for one memory-store gateway, here for
// two gateway replicas on a real three-member etcd, and for an edge
// splicing across an outage.

// lastRenewal reads when a supervisor last had its configuration renewed.
func lastRenewal(t testing.TB, adminAddr string) time.Time {
	v := metricAt(t, adminAddr, "applistener_config_last_success_timestamp_seconds", nil)
	sec, frac := math.Modf(v)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// edgeChecks are the periodic checks of traffic through the edge: a GET on
// a new connection every 200 ms and an echo on a WebSocket it splices
// every second.
func edgeChecks(edgeAddr, host, greeting string, ws *websocket.Conn) []*periodicCheck {
	echoes := 0
	return []*periodicCheck{
		{name: "GET through the edge every 200ms", every: 200 * time.Millisecond, fn: func() error {
			body, err := edgeGet(edgeAddr, host)
			if err == nil && strings.TrimSpace(body) != greeting {
				err = fmt.Errorf("answered %q", body)
			}
			return err
		}},
		{name: "WebSocket echo through the edge every second", every: time.Second, fn: func() error {
			echoes++
			return wsEcho(ws, websocket.TextMessage, fmt.Appendf(nil, "edge echo %d", echoes))
		}},
	}
}

// TestEtcdPairOutageShorterThanFreshness: both gateway replicas (etcd
// store, default session TTL) are killed for 20 s under the default 30 s
// route freshness: longer than the session TTL, so etcd expires the
// supervisor's session meanwhile. A request every 200 ms over HTTP/1.1
// and HTTP/2 to the supervisor and through the edge never fails, and a
// WebSocket held directly and one through the edge stay open; after the
// return the supervisor renews within a fraction of its validity and the
// restarted replicas publish its route at once (recovery after every
// replica was down), so the edge keeps it.
func TestEtcdPairOutageShorterThanFreshness(t *testing.T) {
	const (
		routeFreshness = 30 * time.Second
		outage         = 20 * time.Second
	)
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, "--keepalive", "5s")
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	sup := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", freshness: routeFreshness,
		extra: []string{"--gateway-poll-interval", "10s", "--gateway-stream-timeout", "15s"}})
	edge := startEdgeOn(t, g.urls())
	testutil.Eventually(t, waitTimeout, "GET through the edge", func() bool {
		_, err := edgeGet(edge.appAddr, demoHost)
		return err == nil
	})
	h1, _ := sup.client(t, demoHost)
	h2 := sup.h2Client(t, demoHost)
	direct := sup.wsDial(t, demoHost)
	defer func() { _ = direct.Close() }()
	viaEdge, err := edgeWS(edge.appAddr, demoHost)
	if err != nil {
		t.Fatalf("WebSocket through the edge: %v", err)
	}
	defer func() { _ = viaEdge.Close() }()
	echoes := 0
	checks := func() []*periodicCheck {
		return append([]*periodicCheck{
			{name: "HTTP/1.1 request every 200ms", every: 200 * time.Millisecond, fn: func() error { return expect200(h1, demoHost, "web1") }},
			{name: "HTTP/2 request every 200ms", every: 200 * time.Millisecond, fn: func() error { return expect200(h2, demoHost, "web1") }},
			{name: "direct WebSocket echo every second", every: time.Second, fn: func() error {
				echoes++
				return wsEcho(direct, websocket.TextMessage, fmt.Appendf(nil, "echo %d", echoes))
			}},
		}, edgeChecks(edge.appAddr, demoHost, "hello from web1", viaEdge)...)
	}
	holdsFor(t, time.Second, checks()...)

	killed := time.Now()
	g.kill(t, 0)
	g.kill(t, 1)
	held := routeFreshness - time.Since(lastRenewal(t, sup.adminAddr))
	holdsFor(t, outage, checks()...)
	launched := time.Now()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { g.replicas[i].start(t) })
	}
	wg.Wait()
	answered := time.Now()
	// The first renewal after the return, watched while traffic is checked
	// (a later keepalive renews again).
	var renewed time.Time
	watchRenewal := &periodicCheck{name: "the supervisor's first renewal (watched every 100ms)", every: 100 * time.Millisecond, fn: func() error {
		if at := lastRenewal(t, sup.adminAddr); renewed.IsZero() && at.After(launched) {
			renewed = at
		}
		return nil
	}}
	holdsFor(t, 10*time.Second, append(checks(), watchRenewal)...) // past the expires_at held before the outage
	if renewed.IsZero() {
		t.Fatal("no renewal within 10 s of the replicas' return")
	}
	logFigure(t, "etcd pair down %v (routes held %v when it went); back after %v; answering after %v more; supervisor renewed %v after they answered",
		outage, held.Round(time.Millisecond), launched.Sub(killed).Round(time.Millisecond), answered.Sub(launched).Round(time.Millisecond),
		renewed.Sub(answered).Round(time.Millisecond))
	if gap := renewed.Sub(answered); gap > 3*time.Second {
		t.Errorf("routes renewed %v after the replicas answered again; want within a fraction of the validity left", gap)
	}
	if n := edge.metricOrNegative("applistener_edge_splices_closed_total", map[string]string{"reason": "route_gone"}); n > 0 {
		t.Errorf("the edge closed %v splices for a route gone", n)
	}
}

// TestEtcdPairRestartNeverPublishesAPartialSet: both replicas are killed
// until etcd has expired the supervisor's session (--session-ttl 6s) and
// the replicas' liveness keys, then restarted one after the other while
// the supervisor still serves its route (30 s freshness). Discovery on
// each, probed every 50 ms from its first answer, never answers 200
// without the route (issue 25, test 2, etcd).
func TestEtcdPairRestartNeverPublishesAPartialSet(t *testing.T) {
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1")}, "--keepalive", "2s", "--session-ttl", "6s")
	web := newBackend(t, "web1")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", freshness: 30 * time.Second})
	g.waitRoute(t, 0, demoHost, "sup-1", false)

	g.kill(t, 0)
	g.kill(t, 1)
	down := time.Now()
	testutil.Eventually(t, waitTimeout, "the session and the liveness keys expired in etcd", func() bool {
		sessions, err1 := c.list(g.prefix + "sessions/")
		replicas, err2 := c.list(g.prefix + "replicas/")
		return err1 == nil && err2 == nil && len(sessions) == 0 && len(replicas) == 0
	})
	t.Logf("the session expired %v after both replicas were killed", time.Since(down).Round(100*time.Millisecond))

	type tally struct{ full, partial, unavailable, failed int }
	var counts [2]tally
	var firstPartial string
	probe := func(i int) {
		code, s, _ := g.discovery(i, teamToken, "team")
		switch {
		case code == http.StatusOK && s != nil && s.route(demoHost) != nil && s.route(demoHost).ExpiresAt.After(time.Now()):
			counts[i].full++
		case code == http.StatusOK:
			counts[i].partial++
			if firstPartial == "" {
				firstPartial = fmt.Sprintf("replica %d at %v", i+1, time.Since(down).Round(time.Millisecond))
			}
		case code == http.StatusServiceUnavailable:
			counts[i].unavailable++
		default:
			counts[i].failed++ // not answering yet (starting)
		}
	}
	// Replica 1 first; replica 2 a second later, beside it.
	g.replicas[0].start(t)
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(50 * time.Millisecond) {
		probe(0)
	}
	g.replicas[1].start(t)
	for start := time.Now(); time.Since(start) < 3*time.Second; time.Sleep(50 * time.Millisecond) {
		probe(0)
		probe(1)
	}
	for i, n := range counts {
		t.Logf("replica %d after the restart: %d × 200 with the route, %d × 200 without it, %d × 503, %d failed", i+1, n.full, n.partial, n.unavailable, n.failed)
		if n.full == 0 {
			t.Errorf("replica %d never answered 200 with the route", i+1)
		}
	}
	if firstPartial != "" {
		t.Errorf("discovery answered 200 without the supervisor's still-valid route (first: %s)", firstPartial)
	}
}

// TestEdgeAcrossGatewayOutage: the edge splices a WebSocket (and serves a
// GET every 200 ms) across a 20 s outage of the only gateway (memory
// store with its default discovery warmup, default freshness 30 s): it
// keeps its cached route, never closes the splice, and takes the renewed
// route once discovery answers again, which is as soon as the supervisor
// is back (a full 17 s warmup would end past the route's expires_at).
func TestEdgeAcrossGatewayOutage(t *testing.T) {
	t.Parallel()
	const outage = 20 * time.Second
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}),
		"--keepalive", "5s")
	writeAtomic(t, gw.tokensPath, []byte(`{"tokens": [{"token": "`+supervisorToken+`", "supervisor": "`+supervisorID+`"},
		{"token": "`+teamToken+`", "workspaces": ["team"]}]}`))
	gw.start(t)
	p := gw.startSupervisor(t, supervisorConfig{extra: []string{"--route-freshness", "30s", "--gateway-poll-interval", "10s",
		"--gateway-stream-timeout", "15s", "--advertise-address", "127.0.0.1", "--trusted-proxies", "127.0.0.1/32"}})
	edge := startEdgeOn(t, gw.endpoint())
	testutil.Eventually(t, waitTimeout, "GET through the edge", func() bool {
		_, err := edgeGet(edge.appAddr, hostWeb)
		return err == nil
	})
	ws, err := edgeWS(edge.appAddr, hostWeb)
	if err != nil {
		t.Fatalf("WebSocket through the edge: %v", err)
	}
	defer func() { _ = ws.Close() }()
	checks := func() []*periodicCheck { return edgeChecks(edge.appAddr, hostWeb, "hello from web", ws) }
	holdsFor(t, time.Second, checks()...)

	gw.kill(t)
	holdsFor(t, outage, checks()...)
	// The restarted gateway has the default discovery warmup (session TTL
	// + 2 s; the harness turns it off for the first start).
	gw.extra = append(gw.extra, "--discovery-warmup", "17s")
	launched := time.Now()
	gw.start(t)
	holdsFor(t, 10*time.Second, checks()...) // past the route's expires_at of before the outage
	testutil.Eventually(t, waitTimeout, "a renewal after the gateway's return", func() bool { return lastRenewal(t, p.adminAddr).After(launched) })
	if n := edge.metricOrNegative("applistener_edge_splices_closed_total", map[string]string{"reason": "route_gone"}); n > 0 {
		t.Errorf("the edge closed %v splices for a route gone", n)
	}
	if !strings.Contains(gw.stderr.String(), "discovery warmup ended early") {
		t.Error("the restarted gateway's warmup did not end once its supervisor was back")
	}
}
