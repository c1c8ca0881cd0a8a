package e2e

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// TestGatewayOutageShorterThanFreshness (issue 25, test 1, direct path): the
// only gateway (memory store) is killed for 20 s under the default 30 s
// route freshness and the default poll interval, stream timeout and
// keepalive. A request every 200 ms over HTTP/1.1 and over HTTP/2 never
// fails and a held WebSocket stays open (an echo every second); once the
// gateway is back, the supervisor renews its routes within a fraction of the
// validity they still hold (the retry bound), which the test reports.
func TestGatewayOutageShorterThanFreshness(t *testing.T) {
	t.Parallel()
	const (
		routeFreshness = 30 * time.Second
		outage         = 20 * time.Second
	)
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}),
		"--keepalive", "5s")
	gw.start(t)
	p := gw.startSupervisor(t, supervisorConfig{extra: []string{
		"--route-freshness", routeFreshness.String(), "--gateway-poll-interval", "10s", "--gateway-stream-timeout", "15s"}})

	h1, _ := p.client(t, hostWeb)
	h2 := p.h2Client(t, hostWeb)
	if err := expect200(h1, hostWeb, "web"); err != nil {
		t.Fatal(err)
	}
	ws := p.wsDial(t, hostWeb)
	defer func() { _ = ws.Close() }()
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before the outage")))
	echoes := 0
	checks := func() []*periodicCheck {
		return []*periodicCheck{
			{name: "HTTP/1.1 request every 200ms", every: 200 * time.Millisecond, fn: func() error { return expect200(h1, hostWeb, "web") }},
			{name: "HTTP/2 request every 200ms", every: 200 * time.Millisecond, fn: func() error { return expect200(h2, hostWeb, "web") }},
			{name: "WebSocket echo every second", every: time.Second, fn: func() error {
				echoes++
				return wsEcho(ws, websocket.TextMessage, fmt.Appendf(nil, "echo %d", echoes))
			}},
		}
	}
	lastGood := func() time.Time {
		v := metricAt(t, p.adminAddr, "applistener_config_last_success_timestamp_seconds", nil)
		sec, frac := math.Modf(v)
		return time.Unix(int64(sec), int64(frac*1e9))
	}

	killed := time.Now()
	gw.kill(t)
	held := routeFreshness - time.Since(lastGood())
	holdsFor(t, outage, checks()...)
	launched := time.Now()
	gw.start(t)
	answered := time.Now()
	testutil.Eventually(t, waitTimeout, "a renewal after the gateway's return", func() bool { return lastGood().After(launched) })
	renewed := lastGood()
	t.Logf("gateway down %v (routes held %v of validity when it went); back after %v; answering after %v more; routes renewed %v after it answered (%v after its launch)",
		outage, held.Round(time.Millisecond), launched.Sub(killed).Round(time.Millisecond), answered.Sub(launched).Round(time.Millisecond),
		renewed.Sub(answered).Round(time.Millisecond), renewed.Sub(launched).Round(time.Millisecond))
	// What the routes still held at the return is at least freshness -
	// keepalive - outage (5 s): the retry bound is a tenth of it.
	if gap := renewed.Sub(answered); gap > 2*time.Second {
		t.Errorf("routes renewed %v after the gateway answered again; want within a fraction of the validity left", gap)
	}
	holdsFor(t, 2*time.Second, checks()...)
}
