package dispatch

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// The panic tests route two sandboxes: a panic injected (panicguard's
// test hook) into the victim's connection or stream must end that one
// only, while a connection of the bystander, opened before, keeps
// working; the process (the test) lives and applistener_panics_total
// rises.
const (
	panicVictimHost    = "team--victim--web." + h2Domain
	panicVictimWSHost  = "team--victim--ws." + h2Domain
	panicBystanderHost = "team--bystander--web." + h2Domain
)

// newPanicEnv is an h2Env whose table routes the victim (web, ws) and the
// bystander (web, another app), logging to the returned lines.
func newPanicEnv(t *testing.T) (*h2Env, *lineLog) {
	t.Helper()
	logs := &lineLog{}
	e := newH2Env(t, 0, Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	ws := newH2WSApp(t)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"p","instances":[
		{"workspace":"team","sandbox":"victim","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},
		 "services":[{"name":"web","port":%d,"revision":1},{"name":"ws","port":%d,"revision":1}]},
		{"workspace":"team","sandbox":"bystander","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},
		 "services":[{"name":"web","port":%d,"revision":1}]}]}`, e.web.port(), ws.port(), e.api.port()))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	e.table.Apply(doc)
	return e, logs
}

// injectPanic makes the entry point where panic for connections named
// host until disarm (or the test's end).
func injectPanic(t *testing.T, where, host string) (disarm func()) {
	t.Helper()
	var armed atomic.Bool
	armed.Store(true)
	restore := panicguard.SetTestHook(func(w, id string) {
		if armed.Load() && w == where && id == host {
			panic("injected panic at " + w)
		}
	})
	t.Cleanup(restore)
	return func() { armed.Store(false) }
}

// expectPanicLogged waits for the panic's log line: once, with the stack
// and the connection's SNI.
func expectPanicLogged(t *testing.T, logs *lineLog, where, sni string) {
	t.Helper()
	var found []string
	testutil.Eventually(t, 5*time.Second, "the panic's log line", func() bool {
		found = found[:0]
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, l := range logs.lines {
			if strings.Contains(l, `"panic recovered`) && strings.Contains(l, `"where":"`+where+`"`) {
				found = append(found, l)
			}
		}
		return len(found) > 0
	})
	l := found[0]
	for _, want := range []string{`"sni":"` + sni + `"`, `"stack":"goroutine `, `injected panic at ` + where, `"route":"team/victim/`} {
		if !strings.Contains(l, want) {
			t.Errorf("panic log line lacks %s: %s", want, l)
		}
	}
}

// expectPanicCount waits until applistener_panics_total{where} is want
// (the connection is closed before the panic is counted), then checks
// that it stays there.
func expectPanicCount(t *testing.T, where string, want float64) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "applistener_panics_total{where="+where+"} counted", func() bool {
		return panicguard.Count(where) >= want
	})
	if got := panicguard.Count(where); got != want {
		t.Fatalf("applistener_panics_total{where=%s} = %v; want %v", where, got, want)
	}
}

// bystanderH1 is a keep-alive HTTP/1.1 connection of the bystander that
// answered once; check asks again on the same connection.
func bystanderH1(t *testing.T, e *h2Env) (check func(what string)) {
	t.Helper()
	c := e.h1(panicBystanderHost)
	req := "GET /?n HTTP/1.1\r\nHost: " + panicBystanderHost + "\r\n\r\n"
	check = func(what string) {
		t.Helper()
		_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
		if status, _, body := c.do(t, req); status != 200 || body != "api n" {
			t.Fatalf("bystander %s: %d %q", what, status, body)
		}
	}
	check("before the panic")
	return check
}

// bystanderH2 is an HTTP/2 connection of the bystander that answered once.
func bystanderH2(t *testing.T, e *h2Env) (check func(what string)) {
	t.Helper()
	cc := e.dial(panicBystanderHost)
	check = func(what string) {
		t.Helper()
		resp, err := cc.RoundTrip(h2Req(t, "GET", panicBystanderHost, "/?n", nil))
		if err != nil {
			t.Fatalf("bystander %s: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "api n" {
			t.Fatalf("bystander %s: %d %q", what, resp.StatusCode, b)
		}
	}
	check("before the panic")
	return check
}

func TestPanicHTTP1ConnClosesOnlyItsConnection(t *testing.T) {
	h2Verify(t)
	e, logs := newPanicEnv(t)
	check1, check2 := bystanderH1(t, e), bystanderH2(t, e)
	before := panicguard.Count(panicguard.HTTP1Conn)
	disarm := injectPanic(t, panicguard.HTTP1Conn, panicVictimHost)

	c := e.h1(panicVictimHost)
	_, _ = io.WriteString(c.conn, "GET / HTTP/1.1\r\nHost: "+panicVictimHost+"\r\n\r\n")
	if resp, err := http.ReadResponse(c.br, nil); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("the victim's connection answered %d; want it closed", resp.StatusCode)
	}
	expectPanicCount(t, panicguard.HTTP1Conn, before+1)
	expectPanicLogged(t, logs, panicguard.HTTP1Conn, panicVictimHost)
	check1("after the panic")
	check2("after the panic")
	disarm()
	if status, _, body := e.h1(panicVictimHost).do(t, "GET /?x HTTP/1.1\r\nHost: "+panicVictimHost+"\r\n\r\n"); status != 200 || body != "web x" {
		t.Fatalf("a new victim connection after the panic: %d %q", status, body)
	}
}

func TestPanicH2StreamClosesOnlyItsStream(t *testing.T) {
	h2Verify(t)
	e, logs := newPanicEnv(t)
	check1, check2 := bystanderH1(t, e), bystanderH2(t, e)
	cc := e.dial(panicVictimHost)
	before := panicguard.Count(panicguard.H2Stream)
	disarm := injectPanic(t, panicguard.H2Stream, panicVictimHost)

	if resp, err := cc.RoundTrip(h2Req(t, "GET", panicVictimHost, "/", nil)); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("the victim's stream answered %d; want it reset", resp.StatusCode)
	}
	expectPanicCount(t, panicguard.H2Stream, before+1)
	expectPanicLogged(t, logs, panicguard.H2Stream, panicVictimHost)
	check1("after the panic")
	check2("after the panic")
	// Only the stream ended: the victim's connection serves the next one.
	disarm()
	resp, err := cc.RoundTrip(h2Req(t, "GET", panicVictimHost, "/?y", nil))
	if err != nil {
		t.Fatalf("the victim's connection after its stream's panic: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "web y" {
		t.Fatalf("the victim's connection after its stream's panic: %d %q", resp.StatusCode, b)
	}
}

// TestPanicH2ConnClosesOnlyItsConnection covers the engine's connection
// (reader) goroutine and its flusher.
func TestPanicH2ConnClosesOnlyItsConnection(t *testing.T) {
	for _, where := range []string{panicguard.H2Conn, panicguard.H2Flusher} {
		t.Run(where, func(t *testing.T) {
			h2Verify(t)
			e, logs := newPanicEnv(t)
			check1, check2 := bystanderH1(t, e), bystanderH2(t, e)
			before := panicguard.Count(where)
			injectPanic(t, where, panicVictimHost)

			tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{
				ServerName: panicVictimHost, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := h2NewClientConn(tc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cc.Close() })
			if resp, err := cc.RoundTrip(h2Req(t, "GET", panicVictimHost, "/", nil)); err == nil {
				_ = resp.Body.Close()
				t.Fatalf("the victim's connection answered %d; want it closed", resp.StatusCode)
			}
			expectPanicCount(t, where, before+1)
			expectPanicLogged(t, logs, where, panicVictimHost)
			check1("after the panic")
			check2("after the panic")
		})
	}
}

func TestPanicWebSocketClosesOnlyItsWebSocket(t *testing.T) {
	h2Verify(t)
	e, logs := newPanicEnv(t)
	check1, check2 := bystanderH1(t, e), bystanderH2(t, e)
	before := panicguard.Count(panicguard.WebSocket)
	injectPanic(t, panicguard.WebSocket, panicVictimWSHost)

	t.Run("http1", func(t *testing.T) {
		d := websocket.Dialer{
			TLSClientConfig:  &tls.Config{ServerName: panicVictimWSHost, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}},
			HandshakeTimeout: 5 * time.Second,
			NetDial:          func(string, string) (net.Conn, error) { return net.Dial("tcp", e.ln.Addr().String()) },
		}
		ws, resp, err := d.Dial("wss://"+panicVictimWSHost+"/echo", nil)
		if err != nil {
			t.Fatalf("HTTP/1.1 WebSocket: %v", err)
		}
		_ = resp.Body.Close()
		defer func() { _ = ws.Close() }()
		_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_ = ws.WriteMessage(websocket.TextMessage, []byte("hi"))
		if _, got, err := ws.ReadMessage(); err == nil {
			t.Fatalf("the victim's WebSocket echoed %q; want it closed", got)
		}
	})
	t.Run("http2", func(t *testing.T) {
		cc := e.dialH2(panicVictimWSHost)
		c, err := openWSHost(t, cc, panicVictimWSHost, "/echo")
		if err != nil {
			t.Fatal(err)
		}
		if c.resp.StatusCode != 200 {
			t.Fatalf("status %d", c.resp.StatusCode)
		}
		// The WebSocket may have ended already: the write may fail.
		_, _ = c.w.Write(wsFrame(true, 1, []byte("hi"), true, 0))
		if op, p, err := c.recv(); err == nil && op != 8 {
			t.Fatalf("the victim's WebSocket sent op %d %q; want it closed", op, p)
		}
	})
	// Both directions of each WebSocket start at the entry point.
	testutil.Eventually(t, 5*time.Second, "applistener_panics_total{where=websocket} counted", func() bool {
		return panicguard.Count(panicguard.WebSocket) >= before+2
	})
	expectPanicLogged(t, logs, panicguard.WebSocket, panicVictimWSHost)
	check1("after the panic")
	check2("after the panic")
}

// openWSHost is openWS for a host other than h2wsHost.
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func openWSHost(t *testing.T, cc *http2.ClientConn, host, path string) (*h2wsClient, error) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "https://"+host+path, pr)
	if err != nil {
		t.Fatal(err)
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

// A keep-alive connection that parked while idle is resumed by a new
// goroutine when its next request arrives: a panic there (the same entry
// point) closes that connection only.
func TestPanicResumedParkedHTTP1Conn(t *testing.T) {
	h2Verify(t)
	e, logs := newPanicEnv(t)
	check1 := bystanderH1(t, e)
	c := e.h1(panicVictimHost)
	if status, _, body := c.do(t, "GET /?a HTTP/1.1\r\nHost: "+panicVictimHost+"\r\n\r\n"); status != 200 || body != "web a" {
		t.Fatalf("victim before parking: %d %q", status, body)
	}
	// Both keep-alive connections (victim and bystander) park.
	testutil.Eventually(t, 5*time.Second, "the idle connections parked", func() bool { return e.srv.idleH1.waiters() == 2 })
	before := panicguard.Count(panicguard.HTTP1Conn)
	injectPanic(t, panicguard.HTTP1Conn, panicVictimHost)
	_, _ = io.WriteString(c.conn, "GET /?b HTTP/1.1\r\nHost: "+panicVictimHost+"\r\n\r\n")
	if resp, err := http.ReadResponse(c.br, nil); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("the resumed victim answered %d; want it closed", resp.StatusCode)
	}
	expectPanicCount(t, panicguard.HTTP1Conn, before+1)
	expectPanicLogged(t, logs, panicguard.HTTP1Conn, panicVictimHost)
	check1("resumed after the victim's panic")
}
