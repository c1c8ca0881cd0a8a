package dispatch

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/demoapp"
	"github.com/applistener/applistener/routes"
)

// wsEchoApp is the demo app (gorilla/websocket echo at /ws) on loopback.
func wsEchoApp(t *testing.T) int {
	t.Helper()
	ts := httptest.NewServer(demoapp.Handler("ws"))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().(*net.TCPAddr).Port
}

// gatherGauge reads an unlabelled gauge from reg.
func gatherGauge(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// pumpGoroutines counts goroutines running a WebSocket direction.
func pumpGoroutines() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "dispatch.(*wsPump).run")
}

// TestWSIdleParksWithoutGoroutines: idle WebSockets are handed to the idle
// poller, both directions, with no goroutine left per connection; bytes in
// either direction resume them; a client that hangs up while parked, and a
// revocation while parked, end them and release everything (goleak at the
// end: the poller's own goroutine is gone too).
func TestWSIdleParksWithoutGoroutines(t *testing.T) {
	h2Verify(t)
	reg := prometheus.NewRegistry()
	e := newH2Env(t, 0, Config{Registerer: reg})
	port := wsEchoApp(t)
	apply := func(withWS bool) {
		services := fmt.Sprintf(`{"name":"api","port":%d,"revision":1}`, e.api.port())
		if withWS {
			services += fmt.Sprintf(`,{"name":"ws","port":%d,"revision":1}`, port)
		}
		doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",` +
			`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[` + services + `]}]}`))
		if err != nil || len(doc.Rejected) > 0 {
			t.Fatalf("document: %v %+v", err, doc)
		}
		e.table.Apply(doc)
	}
	apply(true)
	host := "team--demo--ws." + h2Domain
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}},
		HandshakeTimeout: 5 * time.Second,
		NetDial:          func(string, string) (net.Conn, error) { return net.Dial("tcp", e.ln.Addr().String()) },
	}
	const n = 20
	conns := make([]*websocket.Conn, n)
	echo := func(i int, msg string) {
		t.Helper()
		c := conns[i]
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatalf("ws %d write: %v", i, err)
		}
		_, got, err := c.ReadMessage()
		if err != nil || string(got) != msg {
			t.Fatalf("ws %d echo = %q, %v; want %q", i, got, err, msg)
		}
	}
	for i := range conns {
		c, resp, err := dialer.Dial("wss://"+host+"/ws", nil)
		if err != nil {
			t.Fatalf("dial %d: %v (%v)", i, err, resp)
		}
		_ = resp.Body.Close()
		conns[i] = c
		t.Cleanup(func() { _ = c.Close() })
		echo(i, fmt.Sprintf("hello %d", i))
	}
	parked := func(want int) func() bool {
		return func() bool { return e.srv.idle.waiters() == want && pumpGoroutines() == 0 }
	}
	testutil.Eventually(t, 5*time.Second, "every direction parked, no pump goroutine", parked(2*n))
	if v, ok := gatherGauge(t, reg, "applistener_websocket_directions_idle"); !ok || v != 2*n {
		t.Errorf("applistener_websocket_directions_idle = %v (present %v); want %d", v, ok, 2*n)
	}

	// Bytes from the client wake the client direction; the app's echo wakes
	// the app direction; afterwards they park again.
	for i := range conns {
		echo(i, fmt.Sprintf("again %d", i))
	}
	testutil.Eventually(t, 5*time.Second, "parked again after traffic", parked(2*n))

	// A client that hangs up while parked: its WebSocket ends and is released.
	before := e.srv.Connections()
	_ = conns[0].UnderlyingConn().Close()
	testutil.Eventually(t, 5*time.Second, "hung-up WebSocket released", func() bool {
		return e.srv.Connections() == before-1 && e.srv.idle.waiters() == 2*(n-1)
	})

	// Revocation while parked: close frames 1008, everything released.
	apply(false)
	for i := 1; i < n; i++ {
		_ = conns[i].SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err := conns[i].ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 1008 {
			t.Fatalf("ws %d after revocation: %v; want close 1008", i, err)
		}
	}
	testutil.Eventually(t, 5*time.Second, "revoked WebSockets released", func() bool {
		return e.srv.Connections() == 0 && e.srv.idle.waiters() == 0 && pumpGoroutines() == 0
	})
	if ws, streams := promtest.ToFloat64(e.srv.m.websocketsActive), promtest.ToFloat64(e.srv.m.streamsActive); ws != 0 || streams != 0 {
		t.Errorf("after the WebSockets ended: websockets_active %v, streams_active %v; want 0", ws, streams)
	}
}
