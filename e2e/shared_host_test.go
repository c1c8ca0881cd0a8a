package e2e

// The shared multi-sandbox host: one supervisor (`applistener serve --mode
// shared`, in the root network namespace) in front of several sandbox
// instances, each with its own connector, limits and lifetime. The
// sandboxes are real network namespaces, each with its own app on
// 127.0.0.1:8080 (TestNSHelperBackend); the same port in two namespaces
// tells the instances apart, so only the netns connector can reach the
// right app. Every test starts its own supervisor and namespaces.

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// sharedEnv is a shared-mode supervisor in front of sandboxes a and b of
// workspace team, each a network namespace with its own app.
type sharedEnv struct {
	p              *proc
	netnsA, netnsB *netNamespace
	appA, appB     *namespaceApp
	hostA, hostB   string
	nameA, nameB   string // what each app answers
	limitsA        map[string]any
}

// newSharedEnv creates namespaces A and B, starts an app in each, and a
// shared-mode supervisor routing team--a--web to A and team--b--web to B
// through the netns connector. limitsA are A's limits (nil: none).
func newSharedEnv(t *testing.T, limitsA map[string]any, extra ...string) *sharedEnv {
	t.Helper()
	e := &sharedEnv{
		netnsA: newNetNamespace(t), netnsB: newNetNamespace(t),
		hostA: sandboxHost("a", "web"), hostB: sandboxHost("b", "web"),
		limitsA: limitsA,
	}
	e.nameA, e.nameB = "sandbox a in "+e.netnsA.name, "sandbox b in "+e.netnsB.name
	e.appA = e.netnsA.launch(t, e.nameA)
	e.appB = e.netnsB.launch(t, e.nameB)
	e.appA.waitReady(t)
	e.appB.waitReady(t)
	e.p = startProc(t, e.doc(true, true), append([]string{"--mode", "shared"}, extra...)...)
	return e
}

// doc routes the chosen sandboxes.
func (e *sharedEnv) doc(a, b bool) []byte {
	var insts []docEntry
	web := []service{{Name: "web", Port: namespaceAppPort, Revision: 1}}
	if a {
		insts = append(insts, docEntry{sandbox: "a", connector: e.netnsA.connector(), limits: e.limitsA, services: web})
	}
	if b {
		insts = append(insts, docEntry{sandbox: "b", connector: e.netnsB.connector(), services: web})
	}
	return routesDocument(insts...)
}

// TestSharedHostIsolation: each sandbox's hostname reaches only its own app,
// on fresh connections and on kept-alive ones, interleaved.
func TestSharedHostIsolation(t *testing.T) {
	t.Parallel()
	e := newSharedEnv(t, nil)
	p := e.p

	t.Run("Fresh", func(t *testing.T) {
		for i := range 4 {
			resp, body := p.freshGet(t, e.hostA, "/?fresh="+strconv.Itoa(i))
			expectApp(t, "fresh connection to A", resp, body, e.nameA)
			resp, body = p.freshGet(t, e.hostB, "/?fresh="+strconv.Itoa(i))
			expectApp(t, "fresh connection to B", resp, body, e.nameB)
		}
	})

	t.Run("KeepAlive", func(t *testing.T) {
		for _, tc := range []struct{ host, want string }{{e.hostA, e.nameA}, {e.hostB, e.nameB}} {
			c, dials := p.client(t, tc.host)
			for i := range 5 {
				resp, body := get(t, c, "https://"+tc.host+"/?keepalive="+strconv.Itoa(i))
				expectApp(t, "kept-alive connection to "+tc.host, resp, body, tc.want)
			}
			if n := dials.Load(); n != 1 {
				t.Errorf("%s: 5 requests used %d connections; want 1 (kept alive)", tc.host, n)
			}
		}
	})

	t.Run("Interleaved", func(t *testing.T) {
		ra, rb := p.raw(t, e.hostA), p.raw(t, e.hostB)
		for i := range 5 {
			resp, body := ra.roundTrip(t, "GET /?i="+strconv.Itoa(i)+" HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
			expectApp(t, "A's connection", resp, body, e.nameA)
			resp, body = rb.roundTrip(t, "GET /?i="+strconv.Itoa(i)+" HTTP/1.1\r\nHost: "+e.hostB+"\r\n\r\n")
			expectApp(t, "B's connection", resp, body, e.nameB)
		}
		// A's connection cannot be pointed at B: 421, and it still reaches A.
		resp, body := ra.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostB+"\r\n\r\n")
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("B's Host on A's connection: %d %q; want 421", resp.StatusCode, body)
		}
		resp, body = ra.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
		expectApp(t, "A's connection after the 421", resp, body, e.nameA)
	})

	t.Run("WebSocket", func(t *testing.T) {
		wa, wb := p.wsDial(t, e.hostA), p.wsDial(t, e.hostB)
		for i := range 3 {
			must(t, wsEcho(wa, websocket.TextMessage, fmt.Appendf(nil, "to a %d", i)))
			must(t, wsEcho(wb, websocket.TextMessage, fmt.Appendf(nil, "to b %d", i)))
		}
	})
}

// TestSharedHostWithdraw: removing A from the routes file closes A's
// WebSockets and kept-alive connections; B's WebSocket keeps echoing on the
// same connection.
func TestSharedHostWithdraw(t *testing.T) {
	t.Parallel()
	e := newSharedEnv(t, nil)
	p := e.p

	wsA1, wsA2 := p.wsDial(t, e.hostA), p.wsDial(t, e.hostA)
	wsB := p.wsDial(t, e.hostB)
	for _, c := range []*websocket.Conn{wsA1, wsA2, wsB} {
		must(t, wsEcho(c, websocket.TextMessage, []byte("before")))
	}
	ka := p.raw(t, e.hostA)
	resp, body := ka.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
	expectApp(t, "A before the withdrawal", resp, body, e.nameA)

	start := time.Now()
	p.writeRoutes(t, e.doc(false, true))
	limit := start.Add(5 * time.Second)
	for i, c := range []*websocket.Conn{wsA1, wsA2} {
		err := wsExpectClosed(t, c, until(limit))
		t.Logf("A's WebSocket %d closed %v after the routes file was rewritten: %v", i+1, time.Since(start), err)
		expectCloseCode(t, fmt.Sprintf("A's WebSocket %d", i+1), err, websocket.ClosePolicyViolation)
	}
	ka.expectClosed(t, until(limit))

	// B: the same WebSocket, no reconnect.
	for i := range 5 {
		must(t, wsEcho(wsB, websocket.TextMessage, fmt.Appendf(nil, "after %d", i)))
		time.Sleep(20 * time.Millisecond)
	}
	resp, body = p.freshGet(t, e.hostB, "/")
	expectApp(t, "B after A's withdrawal", resp, body, e.nameB)
	p.handshakeRefused(t, tlsConfig(e.hostA))
	// The fresh request's slot is released just after its response is
	// written: poll until only the WebSocket holds one.
	testutil.Eventually(t, waitTimeout, "B's streams_active to be 1 (its WebSocket)", func() bool {
		v, _ := p.metricWhere(t, "applistener_instance_streams_active", instanceLabels("b"))
		return v == 1
	})
}

// sendSlow opens a connection to sni and sends GET /slow without waiting
// for the answer (the app answers only when the request ends).
func sendSlow(t *testing.T, p *proc, sni string) *rawConn {
	t.Helper()
	rc := p.raw(t, sni)
	_ = rc.SetWriteDeadline(time.Now().Add(waitTimeout))
	if _, err := rc.Write([]byte("GET /slow HTTP/1.1\r\nHost: " + sni + "\r\n\r\n")); err != nil {
		t.Fatalf("sending /slow to %s: %v", sni, err)
	}
	return rc
}

// TestSharedHostLimits: A has max_streams 2. With two slow requests in
// flight to A, a third gets 503 with Retry-After: 1 while B is served
// normally; the per-instance metrics show it.
func TestSharedHostLimits(t *testing.T) {
	t.Parallel()
	e := newSharedEnv(t, map[string]any{"max_streams": 2})
	p := e.p
	la, lb := instanceLabels("a"), instanceLabels("b")

	// Instances that have seen no traffic have no series yet.
	if v, ok := p.metricWhere(t, "applistener_instance_max_streams", la); ok {
		t.Errorf("applistener_instance_max_streams for a before any request = %v; want no series", v)
	}
	slow1, slow2 := sendSlow(t, p, e.hostA), sendSlow(t, p, e.hostA)
	testutil.Eventually(t, waitTimeout, "two streams in flight for a", func() bool {
		v, _ := p.metricWhere(t, "applistener_instance_streams_active", la)
		return v == 2
	})
	if v := p.metricMust(t, "applistener_instance_max_streams", la); v != 2 {
		t.Errorf("applistener_instance_max_streams for a = %v; want 2", v)
	}

	// The third request to A and one to B, at the same moment.
	var wg sync.WaitGroup
	var bResp *http.Response
	var bBody []byte
	var bErr error
	wg.Go(func() {
		c, err := p.dialTLS(tlsConfig(e.hostB))
		if err != nil {
			bErr = err
			return
		}
		defer func() { _ = c.Close() }()
		rc := &rawConn{Conn: c, br: bufio.NewReader(c)}
		bResp, bBody, bErr = rc.tryRoundTrip("GET / HTTP/1.1\r\nHost: " + e.hostB + "\r\n\r\n")
	})
	third := p.raw(t, e.hostA)
	resp, body := third.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
	wg.Wait()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("third request to A: %d %q; want 503", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("third request to A: Retry-After %q; want 1", ra)
	}
	if bErr != nil {
		t.Fatalf("request to B while A is at its limit: %v", bErr)
	}
	expectApp(t, "B while A is at its limit", bResp, bBody, e.nameB)

	if v := p.metricMust(t, "applistener_instance_limit_rejections_total", la); v < 1 {
		t.Errorf("applistener_instance_limit_rejections_total{sandbox=a} = %v; want ≥ 1", v)
	}
	if v := p.metricMust(t, "applistener_instance_limit_rejections_total", lb); v != 0 {
		t.Errorf("applistener_instance_limit_rejections_total{sandbox=b} = %v; want 0", v)
	}
	if v := p.metricMust(t, "applistener_instance_streams_active", la); v != 2 {
		t.Errorf("applistener_instance_streams_active{sandbox=a} = %v; want 2", v)
	}

	// A's limit is A's alone: B takes three slow requests at once.
	for range 3 {
		sendSlow(t, p, e.hostB)
	}
	testutil.Eventually(t, waitTimeout, "three streams in flight for b", func() bool {
		v, _ := p.metricWhere(t, "applistener_instance_streams_active", lb)
		return v == 3
	})

	t.Run("AbandonedRequestsReleaseSlots", func(t *testing.T) {
		// The clients of the two slow requests give up. Their streams must
		// end (and give back A's slots) long before the app's 60 s response
		// header timeout: an ingress stops waiting for a response nobody
		// will read.
		start := time.Now()
		_ = slow1.Close()
		_ = slow2.Close()
		ok := false
		for time.Since(start) < 5*time.Second {
			if v, _ := p.metricWhere(t, "applistener_instance_streams_active", la); v == 0 {
				ok = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !ok {
			v, _ := p.metricWhere(t, "applistener_instance_streams_active", la)
			t.Fatalf("5s after both clients of A's slow requests closed their connections, streams_active{sandbox=a} = %v; want 0 (the slots stay taken until the app answers or --app-response-header-timeout)", v)
		}
		t.Logf("A's slots were released %v after the clients left", time.Since(start))
		// The connection that got the 503 was kept; now it is served.
		resp, body := third.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
		expectApp(t, "A once its slots are free", resp, body, e.nameA)
	})
}

// TestSharedHostNamespaceGone deletes A's namespace while A has open
// streams: they are closed within 5 s (the monitor checks every second),
// new requests for A get 502, B is untouched, and the supervisor returns to
// its goroutine and file descriptor counts.
func TestSharedHostNamespaceGone(t *testing.T) {
	t.Parallel()
	e := newSharedEnv(t, nil)
	p := e.p

	wsB := p.wsDial(t, e.hostB)
	must(t, wsEcho(wsB, websocket.TextMessage, []byte("b before")))
	// The baseline: B's WebSocket open, nothing of A's.
	time.Sleep(200 * time.Millisecond)
	g0, fd0 := p.metric(t, "go_goroutines"), p.metric(t, "process_open_fds")

	wsA := p.wsDial(t, e.hostA)
	must(t, wsEcho(wsA, websocket.TextMessage, []byte("a before")))
	ka := p.raw(t, e.hostA)
	resp, body := ka.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
	expectApp(t, "A's kept-alive connection", resp, body, e.nameA)
	g1, fd1 := p.metric(t, "go_goroutines"), p.metric(t, "process_open_fds")
	t.Logf("supervisor: %v goroutines, %v fds before A's streams; %v and %v with them", g0, fd0, g1, fd1)

	start := time.Now()
	e.netnsA.del(t)
	limit := start.Add(5 * time.Second)
	err := wsExpectClosed(t, wsA, until(limit))
	t.Logf("A's WebSocket closed %v after ip netns del: %v", time.Since(start), err)
	ka.expectClosed(t, until(limit))
	t.Logf("A's kept-alive connection closed %v after ip netns del", time.Since(start))

	// New requests for A: 502, on fresh and on kept-alive connections.
	resp, body = p.freshGet(t, e.hostA, "/")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("fresh request for A after its namespace is gone: %d %q; want 502", resp.StatusCode, body)
	}
	again := p.raw(t, e.hostA)
	for i := range 2 {
		resp, body := again.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+e.hostA+"\r\n\r\n")
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("request %d for A after its namespace is gone: %d %q; want 502", i, resp.StatusCode, body)
		}
	}
	_ = again.Close()
	testutil.Eventually(t, waitTimeout, "A's streams_active to drop to 0", func() bool {
		v, _ := p.metricWhere(t, "applistener_instance_streams_active", instanceLabels("a"))
		return v == 0
	})

	// B is untouched: the same WebSocket, and new requests.
	for i := range 5 {
		must(t, wsEcho(wsB, websocket.TextMessage, fmt.Appendf(nil, "b after %d", i)))
	}
	resp, body = p.freshGet(t, e.hostB, "/")
	expectApp(t, "B after A's namespace is gone", resp, body, e.nameB)

	// No leaks in the supervisor once A's streams are closed.
	_ = wsA.Close()
	_ = ka.Close()
	const goroutineSlack, fdSlack = 3, 2
	var g2, fd2 float64
	deadline := time.Now().Add(waitTimeout)
	for {
		g2, fd2 = p.metric(t, "go_goroutines"), p.metric(t, "process_open_fds")
		if g2 <= g0+goroutineSlack && fd2 <= fd0+fdSlack {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("supervisor leaks after A's streams closed: %v goroutines (baseline %v, slack %d), %v fds (baseline %v, slack %d)",
				g2, g0, goroutineSlack, fd2, fd0, fdSlack)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("supervisor back to %v goroutines, %v fds", g2, fd2)
	must(t, wsEcho(wsB, websocket.TextMessage, []byte("b at the end")))
}

// newUnixBackend is a harness backend (recording, answering "hello from
// NAME", a WebSocket echo on /ws) listening on the Unix socket path.
func newUnixBackend(t *testing.T, name, path string) *backend {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serveHTTP))
	_ = b.srv.Listener.Close()
	b.srv.Listener = &countingListener{Listener: ln, b: b}
	b.srv.Start()
	t.Cleanup(b.close)
	return b
}

// TestSharedHostUnix: the unix connector carries HTTP (fresh and kept-alive)
// and WebSocket traffic to a per-instance socket, {port} picking the
// socket; withdrawing the instance closes its WebSocket.
func TestSharedHostUnix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	app := newUnixBackend(t, "unix-app", filepath.Join(dir, "8080.sock"))
	other := newBackend(t, "tcp-app")
	unixInst := docEntry{
		sandbox:   "u",
		connector: map[string]any{"type": "unix", "path": filepath.Join(dir, "{port}.sock")},
		services: []service{
			{Name: "web", Port: 8080, Revision: 1},
			{Name: "down", Port: 8081, Revision: 1}, // no socket
		},
	}
	tcpInst := docEntry{
		sandbox:   "t",
		connector: map[string]any{"type": "tcp", "host": "127.0.0.1"},
		services:  []service{{Name: "web", Port: other.port, Revision: 1}},
	}
	p := startProc(t, routesDocument(unixInst, tcpInst), "--mode", "shared")
	host, down, tcpHost := sandboxHost("u", "web"), sandboxHost("u", "down"), sandboxHost("t", "web")
	const want = "hello from unix-app\n"

	for i := range 3 {
		resp, body := p.freshGet(t, host, "/fresh?i="+strconv.Itoa(i))
		expectApp(t, "fresh request over the unix connector", resp, body, want)
	}
	c, dials := p.client(t, host)
	for i := range 5 {
		resp, body := get(t, c, "https://"+host+"/keepalive?i="+strconv.Itoa(i))
		expectApp(t, "kept-alive request over the unix connector", resp, body, want)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("5 kept-alive requests used %d client connections; want 1", n)
	}
	rec := app.last(t, "/keepalive?i=4")
	if rec.Host != "127.0.0.1:8080" {
		t.Errorf("the app saw Host %q; want 127.0.0.1:8080", rec.Host)
	}
	if got := rec.Header.Get("X-Forwarded-Host"); got != host {
		t.Errorf("the app saw X-Forwarded-Host %q; want %q", got, host)
	}
	if n := app.accepted.Load(); n > 4 {
		t.Errorf("the app accepted %d connections for 8 requests; want the proxy to reuse them", n)
	}

	ws := p.wsDial(t, host)
	for i := range 3 {
		must(t, wsEcho(ws, websocket.TextMessage, fmt.Appendf(nil, "unix %d", i)))
	}
	must(t, wsEcho(ws, websocket.BinaryMessage, bigBody(1<<20)))
	rec = app.last(t, "/ws")
	if rec.Host != "127.0.0.1:8080" || rec.Header.Get("Upgrade") != "websocket" {
		t.Errorf("upgrade request: Host %q, Upgrade %q; want 127.0.0.1:8080, websocket", rec.Host, rec.Header.Get("Upgrade"))
	}

	// A port without a socket: 502.
	resp, body := p.freshGet(t, down, "/")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("service without a socket: %d %q; want 502", resp.StatusCode, body)
	}

	// Withdrawing the unix instance closes its WebSocket; the tcp instance
	// is untouched.
	wsT := p.wsDial(t, tcpHost)
	must(t, wsEcho(wsT, websocket.TextMessage, []byte("tcp before")))
	p.writeRoutes(t, routesDocument(tcpInst))
	err := wsExpectClosed(t, ws, 5*time.Second)
	expectCloseCode(t, "the unix instance's WebSocket", err, websocket.ClosePolicyViolation)
	must(t, wsEcho(wsT, websocket.TextMessage, []byte("tcp after")))
	testutil.Eventually(t, waitTimeout, "the unix app's connections to close", func() bool {
		return app.open.Load() == 0
	})
}

// TestSharedHostIdleTimeout: instance a has limits.idle_timeout_seconds 1,
// instance b none. An idle WebSocket of a is closed with 1001 after about
// a second while an active one stays open; an idle kept-alive connection of
// a is closed by the listener; b's idle streams stay open.
func TestSharedHostIdleTimeout(t *testing.T) {
	t.Parallel()
	appA, appB := newBackend(t, "idle-a"), newBackend(t, "idle-b")
	tcp := map[string]any{"type": "tcp", "host": "127.0.0.1"}
	p := startProc(t, routesDocument(
		docEntry{sandbox: "a", connector: tcp, limits: map[string]any{"idle_timeout_seconds": 1},
			services: []service{{Name: "web", Port: appA.port, Revision: 1}}},
		docEntry{sandbox: "b", connector: tcp,
			services: []service{{Name: "web", Port: appB.port, Revision: 1}}},
	), "--mode", "shared")
	hostA, hostB := sandboxHost("a", "web"), sandboxHost("b", "web")
	const timeout = time.Second
	const margin = 1500 * time.Millisecond // CI is a noisy 2-core machine

	idle := p.wsDial(t, hostA)
	active := p.wsDial(t, hostA)
	idleB := p.wsDial(t, hostB)
	must(t, wsEcho(idleB, websocket.TextMessage, []byte("b")))
	kaA, kaB := p.raw(t, hostA), p.raw(t, hostB)
	if resp, body := kaB.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+hostB+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("b: %d %q", resp.StatusCode, body)
	}

	// The active WebSocket sends every 200 ms for 3 s.
	activeErr := make(chan error, 1)
	go func() {
		end := time.Now().Add(3 * time.Second)
		for i := 0; time.Now().Before(end); i++ {
			if err := wsEcho(active, websocket.TextMessage, []byte("tick "+strconv.Itoa(i))); err != nil {
				activeErr <- err
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		activeErr <- nil
	}()

	must(t, wsEcho(idle, websocket.TextMessage, []byte("last words")))
	idleSince := time.Now()
	if resp, body := kaA.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+hostA+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a: %d %q", resp.StatusCode, body)
	}
	kaSince := time.Now()

	err := wsExpectClosed(t, idle, timeout+margin)
	idleFor := time.Since(idleSince)
	t.Logf("a's idle WebSocket closed after %v idle: %v", idleFor, err)
	expectCloseCode(t, "a's idle WebSocket", err, websocket.CloseGoingAway)
	if idleFor < timeout-100*time.Millisecond {
		t.Errorf("a's idle WebSocket closed after %v; want no earlier than the 1 s idle timeout", idleFor)
	}

	kaA.expectClosed(t, until(kaSince.Add(timeout+margin)))
	kaFor := time.Since(kaSince)
	t.Logf("a's idle kept-alive connection closed after %v", kaFor)
	if kaFor < timeout-100*time.Millisecond {
		t.Errorf("a's kept-alive connection closed after %v; want no earlier than the 1 s idle timeout", kaFor)
	}

	if err := <-activeErr; err != nil {
		t.Errorf("a's active WebSocket (a message every 200 ms) failed within 3 s: %v", err)
	}
	must(t, wsEcho(active, websocket.TextMessage, []byte("still here")))

	// b has no idle timeout: its streams, idle for over 3 s, are open.
	must(t, wsEcho(idleB, websocket.TextMessage, []byte("b after 3s idle")))
	if resp, body := kaB.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+hostB+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("b's kept-alive connection after 3 s idle: %d %q", resp.StatusCode, body)
	}
}
