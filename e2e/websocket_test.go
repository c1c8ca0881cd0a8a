package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/gorilla/websocket"
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
				wsEcho(t, c, websocket.TextMessage, fmt.Appendf(nil, "hello %d to %s", i, tc.b.name))
				wsEcho(t, c, websocket.BinaryMessage, []byte{0, 1, 2, 0xff, byte(i)})
			}
			wsEcho(t, c, websocket.BinaryMessage, bigBody(1<<20))
			wsEcho(t, c, websocket.TextMessage, []byte("after the big one"))

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
