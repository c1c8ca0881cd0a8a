package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// binarySettings reads the SETTINGS frame the built binary's listener
// sends on a new HTTP/2 connection, with a raw framer.
func binarySettings(t *testing.T, p *proc) map[http2.SettingID]uint32 {
	t.Helper()
	cfg := tlsConfig(hostWeb)
	cfg.NextProtos = []string{"h2"}
	tc, err := p.dialTLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Close() }()
	if got := tc.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Fatalf("negotiated %q; want h2", got)
	}
	_ = tc.SetDeadline(deadline())
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			out := map[http2.SettingID]uint32{}
			_ = sf.ForeachSetting(func(s http2.Setting) error { out[s.ID] = s.Val; return nil })
			return out
		}
	}
}

// TestH2ExtendedConnectInBinary: the built binary's HTTP/2 listener
// advertises SETTINGS_ENABLE_CONNECT_PROTOCOL = 1 (the engine does when
// HTTP/2 WebSockets are on; the child's environment has no GODEBUG of its
// own), and not at all (0) with --app-http2-websockets=false.
func TestH2ExtendedConnectInBinary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		flags []string
		want  uint32
	}{
		{"default", nil, 1},
		{"disabled", []string{"--app-http2-websockets=false"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.flags...)
			settings := binarySettings(t, e.p)
			if got := settings[http2.SettingEnableConnectProtocol]; got != tc.want {
				t.Fatalf("ENABLE_CONNECT_PROTOCOL = %d; want %d (settings %v)", got, tc.want, settings)
			}
		})
	}
}

// accessLines returns the JSON access-log lines of p's output whose field
// key is want.
func accessLines(t *testing.T, p *proc, key, want string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(p.output(), "\n") {
		if !strings.Contains(line, `"msg":"access"`) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access-log line %q: %v", line, err)
		}
		if m[key] == want {
			out = append(out, m)
		}
	}
	return out
}

// browserWSOpen opens a WebSocket from the page to path on its own origin,
// sends a message and returns the echo; the page records how the socket
// closes in window.wsClosed ("CODE REASON").
const browserWSOpen = `new Promise((resolve, reject) => {
	window.wsClosed = "";
	const ws = new WebSocket("wss://" + location.host + "/ws");
	window.ws = ws;
	ws.onopen = () => ws.send("hello from chromium");
	ws.onmessage = (ev) => resolve(ev.data);
	ws.onerror = () => reject(new Error("websocket error"));
	ws.onclose = (ev) => { window.wsClosed = ev.code + " " + ev.reason; };
})`

// TestBrowserWebSocketOverH2: real Chromium, on an HTTP/2 connection to
// the listener, opens a WebSocket that goes over that connection as an
// extended CONNECT (the access-log line of the WebSocket says protocol ws,
// transport h2, method CONNECT, and the browser held one connection), gets
// its echo, and is closed with 1008 when the route is withdrawn. With
// --app-http2-websockets=false the same page's WebSocket goes over
// HTTP/1.1 (transport h1) and still works.
func TestBrowserWebSocketOverH2(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "--access-log", "json")
	off := newEnv(t, "--access-log", "json", "--app-http2-websockets=false")
	b := newBrowser(t, testCAFile(t), domain)

	t.Run("ExtendedConnect", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(e.p.appAddr)
		resp := b.navigate(t, fmt.Sprintf("https://%s:%s/browser-ws", hostWeb, port))
		if resp == nil || resp.Protocol != "h2" {
			t.Fatalf("page response %+v; want it over h2", resp)
		}
		if got := b.eval(t, browserWSOpen); got != "hello from chromium" {
			t.Fatalf("echo %q", got)
		}
		rec := appRecorded(t, e.web, "/ws")
		if rec.Method != "GET" || rec.Host != e.web.hostPort() {
			t.Errorf("the app saw %s Host %s; want GET Host %s", rec.Method, rec.Host, e.web.hostPort())
		}
		// One client connection: the page's and the WebSocket's. Waited
		// for: another connection that has just closed (a readiness
		// probe, a browser's spare socket) leaves the gauge only once the
		// listener has seen its end; a WebSocket on a connection of its
		// own stays open and keeps the count at 2.
		testutil.Eventually(t, waitTimeout, "one client connection while the page and its WebSocket are open", func() bool {
			return e.p.metric(t, "applistener_client_connections_active") == 1
		})
		if n := e.p.metric(t, "applistener_websockets_active"); n != 1 {
			t.Errorf("websockets_active = %v; want 1", n)
		}

		e.p.writeRoutes(t, e.doc(false, true)) // web withdrawn
		var closed string
		testutil.Eventually(t, waitTimeout, "the page's WebSocket to close", func() bool {
			closed = b.eval(t, "window.wsClosed")
			return closed != ""
		})
		if !strings.HasPrefix(closed, "1008 route revoked") {
			t.Errorf("WebSocket closed with %q; want 1008 route revoked", closed)
		}
		testutil.Eventually(t, waitTimeout, "the WebSocket's access-log line", func() bool {
			return len(accessLines(t, e.p, "protocol", "ws")) > 0
		})
		lines := accessLines(t, e.p, "protocol", "ws")
		if len(lines) != 1 {
			t.Fatalf("%d WebSocket access-log lines: %v", len(lines), lines)
		}
		l := lines[0]
		if l["transport"] != "h2" || l["method"] != "CONNECT" || l["status"] != 200.0 || l["path"] != "/ws" {
			t.Errorf("access-log line %v; want transport h2, CONNECT /ws, status 200", l)
		}
	})

	t.Run("Disabled", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(off.p.appAddr)
		resp := b.navigate(t, fmt.Sprintf("https://%s:%s/browser-ws", hostWeb, port))
		if resp == nil || resp.Protocol != "h2" {
			t.Fatalf("page response %+v; want it over h2", resp)
		}
		if got := b.eval(t, browserWSOpen); got != "hello from chromium" {
			t.Fatalf("echo %q", got)
		}
		b.eval(t, "window.ws.close(1000)")
		testutil.Eventually(t, waitTimeout, "the WebSocket's access-log line", func() bool {
			return len(accessLines(t, off.p, "protocol", "ws")) > 0
		})
		l := accessLines(t, off.p, "protocol", "ws")[0]
		if l["transport"] != "h1" || l["method"] != "GET" || l["status"] != 101.0 {
			t.Errorf("access-log line %v; want transport h1, GET, status 101", l)
		}
	})
}
