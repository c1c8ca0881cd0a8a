package dispatch

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// usageWith returns team/demo's usage with the silence threshold silent.
func usageWith(t *testing.T, table *routes.Table, silent time.Duration) routes.InstanceUsage {
	t.Helper()
	for _, u := range table.UsageWith(routes.UsageOptions{SilentAfter: silent}) {
		if u.Workspace == "team" && u.Sandbox == "demo" {
			return u
		}
	}
	t.Fatal("no usage for team/demo")
	return routes.InstanceUsage{}
}

// notBefore reports whether at is set and not before t (wall clock).
func notBefore(at *time.Time, t time.Time) bool {
	return at != nil && !at.Before(t.Round(0))
}

// TestUsageLastRequest: every request moves the instance's last_request
// (what /v1/usage reports) to its arrival, on HTTP/1.1 and HTTP/2.
func TestUsageLastRequest(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			e := newH2Env(t, 0, Config{})
			if u := usageOf(t, e.table); u.LastRequest != nil {
				t.Fatalf("last_request %v before any request", u.LastRequest)
			}
			var get func()
			switch proto {
			case "h1":
				c := e.h1(h2WebHost)
				get = func() {
					if st, _, _ := c.do(t, "GET / HTTP/1.1\r\nHost: "+h2WebHost+"\r\n\r\n"); st != 200 {
						t.Fatalf("status %d", st)
					}
				}
			case "h2":
				cc := e.dial(h2WebHost)
				get = func() { h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/", nil), 200) }
			}
			for range 2 {
				before := time.Now()
				get()
				if u := usageOf(t, e.table); !notBefore(u.LastRequest, before) || u.LastRequest.After(time.Now()) {
					t.Fatalf("last_request %v; the request was sent at %v", u.LastRequest, before)
				}
			}
		})
	}
}

// TestUsageWebSocketSilence: an open WebSocket that carries no frame for
// the threshold counts in websockets_silent, and a frame (echoed: one each
// way) takes it out and moves last_websocket_frame; on HTTP/1.1 and over
// HTTP/2 (RFC 8441).
func TestUsageWebSocketSilence(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			e := newH2Env(t, 0, Config{})
			app := newH2WSApp(t)
			e.installWS(app, true, "")
			testWebSocketSilence(t, e, proto, "/echo", nil)
		})
	}
}

// TestUsageWebSocketSilenceAppFrame: a frame from the app alone (the
// client sends nothing) takes a silent WebSocket out of
// websockets_silent, on HTTP/1.1 and over HTTP/2.
func TestUsageWebSocketSilenceAppFrame(t *testing.T) {
	h2Verify(t)
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			e := newH2Env(t, 0, Config{})
			push := make(chan struct{})
			up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err := up.Upgrade(w, r, nil)
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				ended := make(chan struct{})
				go func() { // reads until the client goes
					defer close(ended)
					for {
						if _, _, err := c.ReadMessage(); err != nil {
							return
						}
					}
				}()
				for {
					select {
					case <-push:
						if err := c.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
							return
						}
					case <-ended:
						return
					}
				}
			}))
			t.Cleanup(ts.Close)
			e.installWS(&h2wsApp{ts: ts}, true, "")
			testWebSocketSilence(t, e, proto, "/push", push)
		})
	}
}

// testWebSocketSilence opens a WebSocket to path over proto and checks
// websockets_silent and last_websocket_frame. With push nil, a frame is
// a message the app echoes; otherwise a send on push makes the app send
// one by itself, which the client reads.
func testWebSocketSilence(t *testing.T, e *h2Env, proto, path string, push chan<- struct{}) {
	const threshold = time.Second
	var echo func()
	var closeWS func()
	switch proto {
	case "h1":
		dialer := websocket.Dialer{
			HandshakeTimeout: 5 * time.Second,
			NetDialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				d := tls.Dialer{Config: &tls.Config{ServerName: h2wsHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}}}
				return d.DialContext(ctx, "tcp", e.ln.Addr().String())
			},
		}
		c, resp, err := dialer.Dial("wss://"+h2wsHost+path, nil)
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		_ = resp.Body.Close()
		echo = func() {
			t.Helper()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if push != nil {
				push <- struct{}{}
			} else if err := c.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
				t.Fatal(err)
			}
			if _, got, err := c.ReadMessage(); err != nil || string(got) != "hello" {
				t.Fatalf("echo: %q, %v", got, err)
			}
		}
		closeWS = func() { _ = c.Close() }
	case "h2":
		c, err := openWS(t, e.dialH2(h2wsHost), path, nil)
		if err != nil || c.resp.StatusCode != http.StatusOK {
			t.Fatalf("extended CONNECT: %v %v", c, err)
		}
		echo = func() {
			t.Helper()
			if push == nil {
				c.echo(t, 1, []byte("hello"))
				return
			}
			push <- struct{}{}
			if op, got, err := c.recv(); err != nil || op != 1 || string(got) != "hello" {
				t.Fatalf("pushed: op %d %q, %v", op, got, err)
			}
		}
		closeWS = c.close
	}
	before := time.Now()
	echo()
	u := usageWith(t, e.table, threshold)
	if u.WebSocketsOpen != 1 || !notBefore(u.LastWebSocketFrame, before) || u.WebSocketsSilent != 0 {
		t.Fatalf("after a frame: open %d, last frame %v (sent at %v), silent %d", u.WebSocketsOpen, u.LastWebSocketFrame, before, u.WebSocketsSilent)
	}
	// Quiet for the threshold: counted silent.
	testutil.Eventually(t, 10*time.Second, "the WebSocket counted silent", func() bool {
		return usageWith(t, e.table, threshold).WebSocketsSilent == 1
	})
	// Its last frame is now at least threshold old. A frame at t0
	// takes it out: with a threshold a little longer than what
	// passed since t0, a WebSocket whose last frame is older than
	// t0 would still count (its last frame is a threshold before
	// t0), one with a frame since t0 does not.
	t0 := time.Now()
	echo()
	silent := time.Since(t0) + threshold/2
	if u := usageWith(t, e.table, silent); u.WebSocketsSilent != 0 || !notBefore(u.LastWebSocketFrame, t0) {
		t.Fatalf("after a new frame: silent %d, last frame %v (sent at %v)", u.WebSocketsSilent, u.LastWebSocketFrame, t0)
	}
	// Closed: no longer open nor silent; its last frame stays.
	closeWS()
	waitUsage(t, e.table, func(u routes.InstanceUsage) bool {
		return u.WebSocketsOpen == 0 && u.WebSocketsSilent == 0 && notBefore(u.LastWebSocketFrame, t0)
	})
}

// TestActivityNoAllocations: what the request path and the WebSocket
// splice add for the activity fields allocates nothing: admitting a
// request (counted, its arrival noted) and noting a read of a tracked
// WebSocket.
func TestActivityNoAllocations(t *testing.T) {
	inst := &routes.Instance{}
	var r accessRecord
	r.begin(protoH1)
	if n := testing.AllocsPerRun(1000, func() { r.admitted(inst) }); n != 0 {
		t.Errorf("admitted: %v allocations, want 0", n)
	}
	ws := inst.TrackWebSocket(time.Now())
	defer ws.Close()
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() { ws.Frame(now) }); n != 0 {
		t.Errorf("a frame: %v allocations, want 0", n)
	}
}
