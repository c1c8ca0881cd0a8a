package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// TestWebSocket checks a WebSocket echo through the listener in both
// directions, text and binary, small and 1 MiB, and the upgrade request the
// app saw.
func TestWebSocket(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	for _, tc := range []struct {
		sni string
		b   *backend
	}{{hostWeb, e.web}, {hostAPI, e.api}} {
		t.Run(tc.b.name, func(t *testing.T) {
			c := e.p.wsDial(t, tc.sni)
			for i := range 5 {
				must(t, wsEcho(c, websocket.TextMessage, fmt.Appendf(nil, "hello %d to %s", i, tc.b.name)))
				must(t, wsEcho(c, websocket.BinaryMessage, []byte{0, 1, 2, 0xff, byte(i)}))
			}
			must(t, wsEcho(c, websocket.BinaryMessage, bigBody(1<<20)))
			must(t, wsEcho(c, websocket.TextMessage, []byte("after the big one")))

			rec := tc.b.last(t, "/ws")
			if rec.Host != tc.b.hostPort() {
				t.Errorf("upgrade request Host = %q; want %q", rec.Host, tc.b.hostPort())
			}
			if got := rec.Header.Get("X-Forwarded-Host"); got != tc.sni {
				t.Errorf("upgrade request X-Forwarded-Host = %q; want %q", got, tc.sni)
			}
			if got := rec.Header.Get("Upgrade"); got != "websocket" {
				t.Errorf("upgrade request Upgrade = %q; want websocket", got)
			}
			if rec.Method != http.MethodGet {
				t.Errorf("upgrade request method %s; want GET", rec.Method)
			}

			if err := c.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), deadline()); err != nil {
				t.Fatalf("sending close: %v", err)
			}
			err := wsExpectClosed(t, c, waitTimeout)
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				t.Errorf("after our close frame: %v; want the app's echoed close 1000", err)
			}
		})
	}
}

// TestWebSocketsHoldConnectionSlots: WebSockets, idle ones included (served
// without a goroutine of their own), count against --app-max-connections
// until they end: with three open and a limit of three, a fourth connection
// is refused; when one WebSocket closes, a new connection is accepted.
func TestWebSocketsHoldConnectionSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "--app-max-connections", "3")
	p := e.p
	conns := make([]*websocket.Conn, 3)
	for i := range conns {
		conns[i] = p.wsDial(t, hostWeb)
		must(t, wsEcho(conns[i], websocket.TextMessage, fmt.Appendf(nil, "hello %d", i)))
	}
	testutil.Eventually(t, waitTimeout, "all six directions idle", func() bool {
		v, _ := p.metricWhere(t, "applistener_websocket_directions_idle", nil)
		return v == 6
	})
	if tc, err := p.dialTLS(tlsConfig(hostWeb)); err == nil {
		_ = tc.Close()
		t.Fatal("a fourth connection was accepted with three WebSockets open and --app-max-connections 3")
	}
	if v, _ := p.metricWhere(t, "applistener_handshake_rejections_total", map[string]string{"reason": "max_connections"}); v < 1 {
		t.Errorf("max_connections rejections = %v; want >= 1", v)
	}
	// The WebSockets still work, and closing one frees its slot.
	must(t, wsEcho(conns[1], websocket.TextMessage, []byte("still here")))
	_ = conns[0].Close()
	testutil.Eventually(t, waitTimeout, "a new connection once a WebSocket closed", func() bool {
		tc, err := p.dialTLS(tlsConfig(hostWeb))
		if err != nil {
			return false
		}
		_ = tc.Close()
		return true
	})
}
