package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// h2wsHost is the route of the WebSocket app in these tests.
const h2wsHost = "team--demo--ws." + h2Domain

// h2wsApp is a real gorilla/websocket app: /echo echoes every message
// (subprotocol "chat", permessage-deflate when offered) and reports the
// upgrade it saw and the close code it received; /forbidden answers 403;
// /plain answers 200 without switching; /badaccept switches with a wrong
// Sec-WebSocket-Accept.
type h2wsApp struct {
	ts       *httptest.Server
	upgrades chan *http.Request
	closes   chan int
	bigEcho  chan struct{} // the app starts echoing a message of 1 MiB or more
}

func newH2WSApp(t *testing.T) *h2wsApp {
	t.Helper()
	a := &h2wsApp{upgrades: make(chan *http.Request, 64), closes: make(chan int, 64), bigEcho: make(chan struct{}, 64)}
	up := websocket.Upgrader{Subprotocols: []string{"chat"}, EnableCompression: true,
		CheckOrigin: func(*http.Request) bool { return true }}
	a.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/forbidden":
			w.Header().Set("X-Why", "no")
			http.Error(w, "not for you", http.StatusForbidden)
			return
		case "/plain":
			_, _ = io.WriteString(w, "a page")
			return
		case "/badaccept":
			conn, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			_, _ = bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
				"Sec-WebSocket-Accept: " + wsAccept("someone else's key") + "\r\n\r\n")
			_ = bw.Flush()
			_ = conn.Close()
			return
		}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		a.upgrades <- r
		for {
			op, msg, err := c.ReadMessage()
			if err != nil {
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					a.closes <- ce.Code
				}
				return
			}
			if len(msg) >= 1<<20 {
				a.bigEcho <- struct{}{}
			}
			if err := c.WriteMessage(op, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(a.ts.Close)
	return a
}

func (a *h2wsApp) port() int { return a.ts.Listener.Addr().(*net.TCPAddr).Port }

// installWS routes h2wsHost to the app (withWS false: withdraws it), with
// the instance limits given as JSON ("" for none).
func (e *h2Env) installWS(a *h2wsApp, withWS bool, limits string) {
	e.t.Helper()
	services := fmt.Sprintf(`{"name":"api","port":%d,"revision":1}`, e.api.port())
	if withWS {
		services += fmt.Sprintf(`,{"name":"ws","port":%d,"revision":1}`, a.port())
	}
	if limits != "" {
		limits = `"limits":` + limits + `,`
	}
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",` +
		`"connector":{"type":"tcp","host":"127.0.0.1"},` + limits + `"services":[` + services + `]}]}`))
	if err != nil || len(doc.Rejected) > 0 {
		e.t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)
}

// dialH2 opens an HTTP/2 connection with SNI host for x/net's client, which
// can send an extended CONNECT (net/http's refuses the :protocol field).
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func (e *h2Env) dialH2(host string) *http2.ClientConn {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc) //nolint:staticcheck // SA1019: see above.
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// h2wsClient is a WebSocket over one HTTP/2 stream, framed by hand.
type h2wsClient struct {
	resp *http.Response
	w    *io.PipeWriter
	r    *bufio.Reader
}

// openWS sends an extended CONNECT for path on cc with extra header fields.
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func openWS(t *testing.T, cc *http2.ClientConn, path string, hdr http.Header) (*h2wsClient, error) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "https://"+h2wsHost+path, pr)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header[":protocol"] = []string{"websocket"}
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		_ = pw.Close()
		return nil, err
	}
	c := &h2wsClient{resp: resp, w: pw, r: bufio.NewReader(resp.Body)}
	t.Cleanup(c.close)
	return c, nil
}

func (c *h2wsClient) close() {
	_ = c.w.Close()
	_ = c.resp.Body.Close()
}

// send writes one masked frame.
func (c *h2wsClient) send(t *testing.T, op byte, payload []byte) {
	t.Helper()
	if _, err := c.w.Write(wsFrame(true, op, payload, true, 0)); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

// recv reads one frame from the app (unmasked), within 5 s.
func (c *h2wsClient) recv() (op byte, payload []byte, err error) {
	type frame struct {
		op  byte
		p   []byte
		err error
	}
	ch := make(chan frame, 1)
	go func() {
		var h [2]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			ch <- frame{err: err}
			return
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			_, err = io.ReadFull(c.r, b[:])
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			_, err = io.ReadFull(c.r, b[:])
			n = binary.BigEndian.Uint64(b[:])
		}
		if err == nil && h[1]&0x80 != 0 {
			err = errors.New("masked frame from the server side")
		}
		p := make([]byte, n)
		if err == nil {
			_, err = io.ReadFull(c.r, p)
		}
		ch <- frame{op: h[0] & 0x0f, p: p, err: err}
	}()
	select {
	case f := <-ch:
		return f.op, f.p, f.err
	case <-time.After(5 * time.Second):
		return 0, nil, errors.New("no frame within 5 s")
	}
}

// echo sends a message and checks that it comes back.
func (c *h2wsClient) echo(t *testing.T, op byte, msg []byte) {
	t.Helper()
	c.send(t, op, msg)
	gotOp, got, err := c.recv()
	if err != nil || gotOp != op || !bytes.Equal(got, msg) {
		t.Fatalf("echo of %d bytes: op %d, %d bytes, %v", len(msg), gotOp, len(got), err)
	}
}

// expectClose reads the next frame and checks that it is a close frame
// with code, then that the stream ends.
func (c *h2wsClient) expectClose(t *testing.T, code uint16) {
	t.Helper()
	op, p, err := c.recv()
	if err != nil || op != 8 || len(p) < 2 || binary.BigEndian.Uint16(p) != code {
		t.Fatalf("want a close frame %d; got op %d payload %q, %v", code, op, p, err)
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c.r)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end after the close frame")
	}
}

func recvInt(t *testing.T, ch chan int, what string) int {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("no %s within 5 s", what)
		return 0
	}
}

// rawSettings reads the first SETTINGS frame of a new HTTP/2 connection to
// host with a raw framer, and returns the framer for more.
func (e *h2Env) rawSettings(host string) (map[http2.SettingID]uint32, *http2.Framer, net.Conn) {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		e.t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		e.t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			e.t.Fatalf("reading SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			out := map[http2.SettingID]uint32{}
			_ = sf.ForeachSetting(func(s http2.Setting) error { out[s.ID] = s.Val; return nil })
			_ = fr.WriteSettingsAck()
			return out, fr, tc
		}
	}
}

// TestH2WebSocketEcho: the server advertises ENABLE_CONNECT_PROTOCOL; an
// extended CONNECT becomes an HTTP/1.1 upgrade that the app accepts (its
// key made by the listener, the app's Host 127.0.0.1:PORT), the client
// gets 200 with the chosen subprotocol and extensions and no
// Sec-WebSocket-Accept; messages of every size echo (flow control beyond
// the initial windows); the idle app direction parks; a close frame from
// the client ends the stream; then one access-log line (protocol ws,
// transport h2), the usage and the metrics.
func TestH2WebSocketEcho(t *testing.T) {
	h2Verify(t)
	out := &lineLog{}
	reg := prometheus.NewRegistry()
	e := newH2Env(t, 0, Config{AccessLog: AccessLogJSON, AccessLogWriter: out, Registerer: reg})
	app := newH2WSApp(t)
	e.installWS(app, true, "")

	settings, _, _ := e.rawSettings(h2wsHost)
	if v, ok := settings[http2.SettingEnableConnectProtocol]; !ok || v != 1 {
		t.Fatalf("ENABLE_CONNECT_PROTOCOL = %d (sent %v); want 1", v, ok)
	}

	cc := e.dialH2(h2wsHost)
	c, err := openWS(t, cc, "/echo?token=secret", http.Header{"Sec-Websocket-Protocol": {"chat, other"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.resp.StatusCode != 200 {
		t.Fatalf("status %d; want 200", c.resp.StatusCode)
	}
	if got := c.resp.Header.Get("Sec-Websocket-Protocol"); got != "chat" {
		t.Errorf("Sec-WebSocket-Protocol = %q; want chat", got)
	}
	if got := c.resp.Header.Values("Sec-Websocket-Accept"); len(got) != 0 {
		t.Errorf("Sec-WebSocket-Accept relayed to the HTTP/2 client: %q", got)
	}
	var upgrade *http.Request
	select {
	case upgrade = <-app.upgrades:
	case <-time.After(5 * time.Second):
		t.Fatal("the app saw no upgrade")
	}
	if upgrade.Host != fmt.Sprintf("127.0.0.1:%d", app.port()) || upgrade.Method != "GET" || upgrade.URL.RequestURI() != "/echo?token=secret" {
		t.Errorf("app saw %s %s Host %s", upgrade.Method, upgrade.URL.RequestURI(), upgrade.Host)
	}
	if upgrade.Header.Get("X-Forwarded-Host") != h2wsHost || upgrade.Header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("forwarding fields: %v", upgrade.Header)
	}

	c.echo(t, websocket.TextMessage, []byte("hello over h2"))
	for _, n := range []int{0, 125, 126, 65535, 65536, 300 << 10} {
		c.echo(t, websocket.BinaryMessage, patterned(n))
	}
	c.send(t, websocket.PingMessage, []byte("ping"))
	if op, p, err := c.recv(); err != nil || op != websocket.PongMessage || string(p) != "ping" {
		t.Fatalf("pong: op %d %q %v", op, p, err)
	}
	// Idle: the app's direction waits in the idle poller.
	testutil.Eventually(t, 5*time.Second, "the app direction parked", func() bool { return e.srv.idle.waiters() == 1 })
	if ws := promtest.ToFloat64(e.srv.m.websocketsActive); ws != 1 {
		t.Errorf("websockets_active = %v while open; want 1", ws)
	}
	c.echo(t, websocket.TextMessage, []byte("after parking"))
	// While open, the usage shows it (auto-pause must not take the
	// sandbox for idle).
	waitUsage(t, e.table, func(u routes.InstanceUsage) bool {
		return u.WebSocketsOpen == 1 && u.ActiveStreams == 1 && u.WebSocketSeconds > 0
	})

	c.send(t, websocket.CloseMessage, []byte{0x03, 0xe8})
	c.expectClose(t, 1000)
	if code := recvInt(t, app.closes, "close code at the app"); code != 1000 {
		t.Errorf("app got close %d; want 1000", code)
	}

	rec := out.waitRecord(t, "protocol", "ws")
	checkRecord(t, rec, map[string]any{"transport": "h2", "method": "CONNECT", "path": "/echo", "status": 200.0,
		"service": "ws", "host": h2wsHost}, true)
	if strings.Contains(out.text(), "secret") {
		t.Errorf("query logged: %s", out.text())
	}
	in, outB := rec["bytes_in"].(float64), rec["bytes_out"].(float64)
	if in < 300<<10 || outB < 300<<10 {
		t.Errorf("bytes_in %v, bytes_out %v; want each above 300 KiB", in, outB)
	}
	testutil.Eventually(t, 5*time.Second, "usage counted", func() bool {
		u := usageOf(t, e.table)
		return u.WebSocketSeconds > 0 && u.WebSocketsOpen == 0 && u.BytesIn == uint64(in) && u.BytesOut == uint64(outB)
	})
	if n := histCount(t, reg, "applistener_request_duration_seconds", map[string]string{"protocol": "ws", "outcome": "ok"}); n != 1 {
		t.Errorf("request_duration_seconds{protocol=ws} count = %d, want 1", n)
	}
	testutil.Eventually(t, 5*time.Second, "the WebSocket released", func() bool {
		return promtest.ToFloat64(e.srv.m.websocketsActive) == 0 && promtest.ToFloat64(e.srv.m.streamsActive) == 0 &&
			e.table.Lookup(h2wsHost).Instance.Active() == 0 && e.srv.idle.waiters() == 0
	})
	// The connection still serves requests.
	req, _ := http.NewRequest("GET", "https://"+h2wsHost+"/", nil)
	if resp, err := cc.RoundTrip(req); err != nil {
		t.Fatalf("request after the WebSocket: %v", err)
	} else {
		_ = resp.Body.Close()
	}
}

// TestH2WebSocketExtensions: Sec-WebSocket-Extensions offered by the
// client reach the app, and the app's answer reaches the client.
func TestH2WebSocketExtensions(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	c, err := openWS(t, e.dialH2(h2wsHost), "/echo", http.Header{"Sec-Websocket-Extensions": {"permessage-deflate; client_max_window_bits"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.resp.Header.Get("Sec-Websocket-Extensions"); !strings.HasPrefix(got, "permessage-deflate") {
		t.Errorf("Sec-WebSocket-Extensions = %q; want the app's permessage-deflate", got)
	}
	c.send(t, websocket.CloseMessage, []byte{0x03, 0xe8})
	c.expectClose(t, 1000)
}

// TestH2WebSocketRevocation: withdrawing the route sends close 1008 to
// every HTTP/2 WebSocket of the connection and to their apps, ends the
// streams and closes the connection; a request in flight on it fails.
func TestH2WebSocketRevocation(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	cc := e.dialH2(h2wsHost)
	const n = 3
	cs := make([]*h2wsClient, n)
	for i := range cs {
		c, err := openWS(t, cc, "/echo", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.echo(t, websocket.TextMessage, []byte(fmt.Sprintf("ws %d", i)))
		cs[i] = c
	}
	// One of them is in the middle of a long message from the app when
	// the route goes: its close frame waits for the frame boundary.
	start := time.Now()
	e.installWS(app, false, "")
	for i, c := range cs {
		op, p, err := c.recv()
		if err != nil || op != 8 || binary.BigEndian.Uint16(p) != 1008 || !strings.Contains(string(p[2:]), "revoked") {
			t.Fatalf("ws %d: want close 1008; got op %d %q %v", i, op, p, err)
		}
	}
	for range n {
		if code := recvInt(t, app.closes, "close code at the app"); code != 1008 {
			t.Errorf("app got close %d; want 1008", code)
		}
	}
	testutil.Eventually(t, 5*time.Second, "the connection closed", func() bool { return e.srv.Connections() == 0 })
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("revocation took %v", d)
	}
	if ws := promtest.ToFloat64(e.srv.m.websocketsActive); ws != 0 {
		t.Errorf("websockets_active = %v after revocation", ws)
	}
	if _, err := openWS(t, cc, "/echo", nil); err == nil {
		t.Error("a WebSocket opened on the revoked connection")
	}
}

// TestH2WebSocketRevokedStalled: a revocation while the app is sending a
// large message to a client that does not read: the close frame cannot
// reach a frame boundary, the stream is reset after the grace and the
// connection closed.
func TestH2WebSocketRevokedStalled(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{WebSocketCloseGrace: 100 * time.Millisecond})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	cc := e.dialH2(h2wsHost)
	c, err := openWS(t, cc, "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	// 8 MiB echoed back to a client that reads nothing: the stream's
	// flow-control window stalls the app direction mid-frame.
	big := wsFrame(true, websocket.BinaryMessage, patterned(8<<20), true, 0)
	go func() { _, _ = c.w.Write(big) }()
	select {
	case <-app.bigEcho:
	case <-time.After(30 * time.Second):
		t.Fatal("the app did not start echoing the 8 MiB message")
	}
	testutil.Eventually(t, 10*time.Second, "the app direction copying the echo", func() bool {
		return e.srv.idle.waiters() == 0 && promtest.ToFloat64(e.srv.m.websocketsActive) == 1
	})
	t0 := time.Now()
	e.installWS(app, false, "")
	testutil.Eventually(t, 5*time.Second, "the stalled WebSocket and its connection ended", func() bool {
		return e.srv.Connections() == 0 && promtest.ToFloat64(e.srv.m.websocketsActive) == 0
	})
	t.Logf("ended after %v", time.Since(t0))
}

// TestH2WebSocketLimit: a WebSocket holds one of the instance's
// max_streams for its life; beyond the limit an extended CONNECT gets 503
// with Retry-After; the slot is free once the WebSocket ends.
func TestH2WebSocketLimit(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, `{"max_streams":1}`)
	cc := e.dialH2(h2wsHost)
	c, err := openWS(t, cc, "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.echo(t, websocket.TextMessage, []byte("one"))
	second, err := openWS(t, cc, "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(second.resp.Body)
	if second.resp.StatusCode != 503 || second.resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), reasonLimit) {
		t.Fatalf("second WebSocket: %d Retry-After %q %q; want 503", second.resp.StatusCode, second.resp.Header.Get("Retry-After"), body)
	}
	c.send(t, websocket.CloseMessage, []byte{0x03, 0xe8})
	c.expectClose(t, 1000)
	testutil.Eventually(t, 5*time.Second, "the slot released", func() bool { return e.table.Lookup(h2wsHost).Instance.Active() == 0 })
	third, err := openWS(t, cc, "/echo", nil)
	if err != nil || third.resp.StatusCode != 200 {
		t.Fatalf("after the first ended: %v %v", err, third)
	}
	third.echo(t, websocket.TextMessage, []byte("three"))
}

// TestH2WebSocketIdleTimeout: with limits.idle_timeout_seconds a silent
// HTTP/2 WebSocket is closed with 1001 on both sides.
func TestH2WebSocketIdleTimeout(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, `{"idle_timeout_seconds":1}`)
	c, err := openWS(t, e.dialH2(h2wsHost), "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.echo(t, websocket.TextMessage, []byte("then silence"))
	start := time.Now()
	c.expectClose(t, 1001)
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("closed after %v; want the 1 s idle timeout", d)
	}
	if code := recvInt(t, app.closes, "close code at the app"); code != 1001 {
		t.Errorf("app got close %d; want 1001", code)
	}
}

// TestH2WebSocketShutdown: at the end of the drain an HTTP/2 WebSocket
// gets close 1001.
func TestH2WebSocketShutdown(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	c, err := openWS(t, e.dialH2(h2wsHost), "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.echo(t, websocket.TextMessage, []byte("before the drain"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.srv.Shutdown(ctx) })
	c.expectClose(t, 1001)
	wg.Wait()
}

// TestH2WebSocketAppAnswers: an app that refuses the upgrade has its
// answer relayed; one that answers 200 without switching, or switches
// with a wrong Sec-WebSocket-Accept, gets the client a 502.
func TestH2WebSocketAppAnswers(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	cc := e.dialH2(h2wsHost)
	for _, tc := range []struct {
		path   string
		status int
		body   string
	}{
		{"/forbidden", 403, "not for you"},
		{"/plain", 502, reasonBadResponse},
		{"/badaccept", 502, reasonBadResponse},
	} {
		c, err := openWS(t, cc, tc.path, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		body, _ := io.ReadAll(c.resp.Body)
		if c.resp.StatusCode != tc.status || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s: %d %q; want %d with %q", tc.path, c.resp.StatusCode, body, tc.status, tc.body)
		}
		if tc.status == 403 && c.resp.Header.Get("X-Why") != "no" {
			t.Errorf("%s: the app's fields were not relayed: %v", tc.path, c.resp.Header)
		}
	}
	testutil.Eventually(t, 5*time.Second, "no slot held", func() bool { return e.table.Lookup(h2wsHost).Instance.Active() == 0 })
}

// TestH2WebSocketDisabled: with DisableHTTP2WebSockets (the
// --app-http2-websockets=false flag) the server does not advertise
// ENABLE_CONNECT_PROTOCOL, x/net's client refuses to send an extended
// CONNECT, one sent anyway with a raw framer is malformed (RFC 8441 §4:
// RST_STREAM PROTOCOL_ERROR; x/net's server answered 405) and never
// reaches the app, and WebSockets over HTTP/1.1 and plain HTTP/2 requests
// still work.
func TestH2WebSocketDisabled(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{DisableHTTP2WebSockets: true})
	app := newH2WSApp(t)
	e.installWS(app, true, "")

	settings, fr, _ := e.rawSettings(h2wsHost)
	if v := settings[http2.SettingEnableConnectProtocol]; v != 0 {
		t.Fatalf("ENABLE_CONNECT_PROTOCOL = %d; want 0 (settings %v)", v, settings)
	}
	if v := settings[http2.SettingMaxConcurrentStreams]; v != H2MaxConcurrentStreams {
		t.Errorf("MAX_CONCURRENT_STREAMS = %d after the rewrite; want %d", v, H2MaxConcurrentStreams)
	}
	writeExtendedConnect(t, fr, 1, "websocket")
	for done := false; !done; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			t.Fatalf("extended CONNECT answered %s; want RST_STREAM PROTOCOL_ERROR", f.PseudoValue("status"))
		case *http2.RSTStreamFrame:
			if f.StreamID != 1 || f.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("RST_STREAM %d %v; want stream 1 PROTOCOL_ERROR", f.StreamID, f.ErrCode)
			}
			done = true
		}
	}
	if n := len(app.upgrades); n != 0 {
		t.Fatalf("the app saw %d upgrades; want none", n)
	}

	if _, err := openWS(t, e.dialH2(h2wsHost), "/echo", nil); err == nil || !strings.Contains(err.Error(), "extended connect") {
		t.Fatalf("x/net client: %v; want it to refuse extended CONNECT", err)
	}
	// HTTP/1.1 WebSockets are unaffected.
	d := websocket.Dialer{
		TLSClientConfig:  &tls.Config{ServerName: h2wsHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}},
		HandshakeTimeout: 5 * time.Second,
		NetDial:          func(string, string) (net.Conn, error) { return net.Dial("tcp", e.ln.Addr().String()) },
	}
	ws, resp, err := d.Dial("wss://"+h2wsHost+"/echo", nil)
	if err != nil {
		t.Fatalf("HTTP/1.1 WebSocket: %v", err)
	}
	_ = resp.Body.Close()
	_ = ws.WriteMessage(websocket.TextMessage, []byte("h1"))
	if _, got, err := ws.ReadMessage(); err != nil || string(got) != "h1" {
		t.Fatalf("HTTP/1.1 echo %q %v", got, err)
	}
	_ = ws.Close()
	req, _ := http.NewRequest("GET", "https://"+h2wsHost+"/", nil)
	resp, err = e.dialH2(h2wsHost).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}

// TestH2WebSocketProtocolFoldIsASCII: the :protocol of an extended
// CONNECT is an upgrade token, compared with ASCII case folding only
// (httpgrammar.EqualFold): "WebSocket" opens a WebSocket, while
// "web\u017focket" (U+017F, which strings.EqualFold folds onto 's') is
// answered 405 and never reaches the app.
func TestH2WebSocketProtocolFoldIsASCII(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{})
	app := newH2WSApp(t)
	e.installWS(app, true, "")
	_, fr, _ := e.rawSettings(h2wsHost)
	status := func(id uint32, protocol string) string {
		t.Helper()
		writeExtendedConnect(t, fr, id, protocol)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf(":protocol %q: waiting for the answer: %v", protocol, err)
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if f.StreamID == id {
					return f.PseudoValue("status")
				}
			case *http2.RSTStreamFrame:
				if f.StreamID == id {
					t.Fatalf(":protocol %q: RST_STREAM %v; want an answer", protocol, f.ErrCode)
				}
			}
		}
	}
	if got := status(1, "web\u017focket"); got != "405" {
		t.Fatalf(`:protocol "web\u017focket" answered %s; want 405`, got)
	}
	if n := len(app.upgrades); n != 0 {
		t.Fatalf("the app saw %d upgrades for a non-ASCII :protocol; want none", n)
	}
	if got := status(3, "WebSocket"); got != "200" {
		t.Fatalf(`:protocol "WebSocket" answered %s; want 200`, got)
	}
	select {
	case <-app.upgrades:
	case <-time.After(5 * time.Second):
		t.Fatal("the app saw no upgrade for :protocol WebSocket")
	}
}

// writeExtendedConnect sends, on stream id, an extended CONNECT for
// h2wsHost's /echo with the given :protocol.
func writeExtendedConnect(t *testing.T, fr *http2.Framer, id uint32, protocol string) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "CONNECT"}, {":protocol", protocol}, {":scheme", "https"},
		{":path", "/echo"}, {":authority", h2wsHost}, {"sec-websocket-version", "13"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
}
