package dispatch

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// usageOf returns the Usage entry of team/demo.
func usageOf(t *testing.T, table *routes.Table) routes.InstanceUsage {
	t.Helper()
	for _, u := range table.Usage() {
		if u.Workspace == "team" && u.Sandbox == "demo" {
			return u
		}
	}
	t.Fatalf("no usage for team/demo in %+v", table.Usage())
	return routes.InstanceUsage{}
}

// within reports whether got is within 0.1 % of want.
func within(got uint64, want int) bool {
	return math.Abs(float64(got)-float64(want)) <= 0.001*float64(want)
}

// TestUsageMatchesClientBytes: the per-instance usage counts (what
// /v1/usage reports) match what a client sent and received within 0.1 %,
// over HTTP/1.1, HTTP/2 and a WebSocket.
func TestUsageMatchesClientBytes(t *testing.T) {
	h2Verify(t)
	upload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			e := newH2Env(t, 0, Config{})
			var sent, received int
			switch proto {
			case "h1":
				c := e.h1(h2WebHost)
				st, _, body := c.do(t, fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", h2WebHost, len(upload), upload))
				if st != 200 {
					t.Fatalf("upload: %d", st)
				}
				sent, received = sent+len(upload), received+len(body)
				st, _, body = c.do(t, "GET /big HTTP/1.1\r\nHost: "+h2WebHost+"\r\n\r\n")
				if st != 200 || body != string(h2Big) {
					t.Fatalf("big: %d, %d bytes", st, len(body))
				}
				received += len(body)
			case "h2":
				cc := e.dial(h2WebHost)
				res := h2MustDo(t, cc, h2Req(t, "POST", h2WebHost, "/upload", bytes.NewReader(upload)), 200)
				sent, received = sent+len(upload), received+len(res.body)
				res = h2MustDo(t, cc, h2Req(t, "GET", h2WebHost, "/big", nil), 200)
				if res.body != string(h2Big) {
					t.Fatalf("big: %d bytes", len(res.body))
				}
				received += len(res.body)
			}
			var u routes.InstanceUsage
			waitUsage(t, e.table, func(got routes.InstanceUsage) bool {
				u = got
				return got.Requests == 2 && within(got.BytesIn, sent) && within(got.BytesOut, received)
			})
			if u.LastActivity == nil || time.Since(*u.LastActivity) > time.Minute || u.WebSocketSeconds != 0 || !u.Installed {
				t.Errorf("usage %+v", u)
			}
		})
	}
	t.Run("ws", func(t *testing.T) {
		e := newH2Env(t, 0, Config{})
		port := wsEchoApp(t)
		doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
			`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"ws","port":%d,"revision":1}]}]}`, port)))
		if err != nil || len(doc.Rejected) > 0 {
			t.Fatalf("document: %v %+v", err, doc)
		}
		e.table.Apply(doc)
		host := "team--demo--ws." + h2Domain
		// The client's own count: the plaintext bytes it writes and reads
		// on the connection once the upgrade is done (frames, headers
		// included).
		var cc *countingConn
		dialer := websocket.Dialer{
			HandshakeTimeout: 5 * time.Second,
			NetDialTLSContext: func(context.Context, string, string) (net.Conn, error) {
				tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
				if err != nil {
					return nil, err
				}
				cc = &countingConn{Conn: tc}
				return cc, nil
			},
		}
		start := time.Now()
		c, resp, err := dialer.Dial("wss://"+host+"/ws", nil)
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		_ = resp.Body.Close()
		defer func() { _ = c.Close() }()
		headOut, headIn := cc.written.Load(), cc.read.Load() // the upgrade
		msg := strings.Repeat("x", 64<<10)
		for range 16 {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if err := c.WriteMessage(websocket.BinaryMessage, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.ReadMessage()
			if err != nil || string(got) != msg {
				t.Fatalf("echo: %d bytes, %v", len(got), err)
			}
		}
		// While it is open, the usage shows it: one open WebSocket holding
		// a stream slot, its seconds growing.
		waitUsage(t, e.table, func(got routes.InstanceUsage) bool {
			return got.WebSocketsOpen == 1 && got.ActiveStreams == 1 && got.WebSocketSeconds > 0
		})
		_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				break
			}
		}
		_ = c.Close()
		sent, received := int(cc.written.Load()-headOut), int(cc.read.Load()-headIn)
		var u routes.InstanceUsage
		waitUsage(t, e.table, func(got routes.InstanceUsage) bool {
			u = got
			return got.WebSocketsOpen == 0 && got.ActiveStreams == 0 && got.WebSocketSeconds > 0
		})
		if !within(u.BytesIn, sent) || !within(u.BytesOut, received) {
			t.Errorf("usage in %d, out %d; the client sent %d and received %d", u.BytesIn, u.BytesOut, sent, received)
		}
		if lived := time.Since(start).Seconds(); u.WebSocketSeconds > lived {
			t.Errorf("websocket_seconds %v > the %v s the WebSocket lived", u.WebSocketSeconds, lived)
		}
	})
}

// waitUsage polls team/demo's usage until ok: requests and WebSockets are
// counted when they end, which can be just after the client has the last
// byte.
func waitUsage(t *testing.T, table *routes.Table, ok func(routes.InstanceUsage) bool) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "the usage counts", func() bool { return ok(usageOf(t, table)) })
	if u := usageOf(t, table); !ok(u) {
		t.Fatalf("usage %+v", u)
	}
}

// countingConn counts the bytes written and read through it.
type countingConn struct {
	net.Conn
	written, read atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}
