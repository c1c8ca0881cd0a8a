package dispatch

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
	"github.com/applistener/applistener/wake"
)

// The routes of the sleep tests: team/demo's web (wake on navigation),
// api (wake on any request) and priv (access mode token, wake on any);
// team/awake's web, always active.
const (
	slpWeb   = "team--demo--web." + h2Domain
	slpAPI   = "team--demo--api." + h2Domain
	slpPriv  = "team--demo--priv." + h2Domain
	slpAwake = "team--awake--web." + h2Domain
)

// sleepEnv is a listener with real TLS over a route table whose instance
// team/demo can be put to sleep, a Server with a wake coordinator, and a
// platform (the coordinator's Waker) that counts wakes and marks the
// instance active when the test lets it.
type sleepEnv struct {
	t      *testing.T
	ca     *tlsconf.Authority
	table  *routes.Table
	srv    *Server
	coord  *wake.Coordinator
	ln     net.Listener
	app    *accessApp
	wakes  atomic.Int64
	allow  chan struct{} // closed: the platform wakes the instance
	hold   int           // hold_seconds of the services
	wg     sync.WaitGroup
	keys   *accesstoken.KeySet
	k1     accesstoken.Key
	asleep atomic.Bool
}

// newSleepEnv starts the env; each of with changes the Server's Config.
func newSleepEnv(t *testing.T, hold int, opts wake.Options, with ...func(*Config)) *sleepEnv {
	t.Helper()
	h2Verify(t)
	e := &sleepEnv{t: t, hold: hold, allow: make(chan struct{})}
	e.k1 = accesstoken.Key{ID: "k1", Secret: []byte(strings.Repeat("1", 32))}
	ks, err := accesstoken.NewKeySet(e.k1)
	if err != nil {
		t.Fatal(err)
	}
	e.keys = ks
	ca, cert := wildcardAuthority(t, "sleep test CA")
	e.ca = ca
	e.app = newAccessApp(t, false)
	e.table = routes.NewTable(routes.Options{Domain: h2Domain, Logger: slog.New(slog.DiscardHandler), AccessTokens: true})
	e.apply(true)
	opts.Waker = wake.WakerFunc(func(ctx context.Context, k wake.Key) error {
		e.wakes.Add(1)
		e.wg.Go(func() {
			select {
			case <-e.allow:
				e.apply(false)
			case <-ctx.Done():
			}
		})
		return nil
	})
	opts.Logger = slog.New(slog.DiscardHandler)
	e.coord, err = wake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Logger: slog.New(slog.DiscardHandler), Wakes: e.coord, AccessKeys: func() *accesstoken.KeySet { return e.keys }}
	for _, f := range with {
		f(&cfg)
	}
	e.srv = New(cfg)
	e.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.wg.Go(func() { e.coord.FollowTable(ctx, e.table) })
	serveRoutesTLS(&e.wg, e.ln, cert, e.table, e.srv)
	t.Cleanup(func() {
		_ = e.ln.Close()
		cancel()
		e.coord.Close()
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.srv.Shutdown(sctx)
		scancel()
		e.table.Close()
		e.wg.Wait()
	})
	return e
}

// apply installs the routes with team/demo sleeping or active.
func (e *sleepEnv) apply(sleeping bool) {
	state := "active"
	if sleeping {
		state = "sleeping"
	}
	e.asleep.Store(sleeping)
	p := e.app.port()
	doc := fmt.Sprintf(`{"revision":"r","instances":[
	  {"workspace":"team","sandbox":"demo","generation":"1","state":%q,"services":[
	    {"name":"web","port":%d,"wake":{"on":"navigation","hold_seconds":%d}},
	    {"name":"api","port":%d,"wake":{"on":"any","hold_seconds":%d}},
	    {"name":"priv","port":%d,"access":{"mode":"token"},"wake":{"on":"any","hold_seconds":%d}}]},
	  {"workspace":"team","sandbox":"awake","generation":"1","services":[{"name":"web","port":%d}]}]}`,
		state, p, e.hold, p, e.hold, p, e.hold, p)
	d, err := routes.ParseDocument([]byte(doc))
	if err != nil || len(d.Rejected) > 0 {
		panic(fmt.Sprintf("document: %v %+v", err, d))
	}
	e.table.Apply(d)
}

// wakeUp lets the platform mark the instance active.
func (e *sleepEnv) wakeUp() { close(e.allow) }

func (e *sleepEnv) client(h2 bool) *http.Client {
	e.t.Helper()
	tr := listenerTransport(e.t, e.ca, e.ln.Addr().String(), h2)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func (e *sleepEnv) do(c *http.Client, method, host string, hdr map[string]string) accessResp {
	e.t.Helper()
	req, err := http.NewRequest(method, "https://"+host+"/", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: body: %v", method, host, err)
	}
	return accessResp{status: resp.StatusCode, header: resp.Header, body: string(body), proto: resp.ProtoMajor}
}

func wantSleeping(t *testing.T, r accessResp, what string) {
	t.Helper()
	if r.status != 503 || r.body != sleepingBody || r.header.Get("Retry-After") == "" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %q Retry-After %q, want 503 %s with Retry-After", what, r.status, r.body, r.header.Get("Retry-After"), sleepingBody)
	}
}

var sse = map[string]string{"Accept": "text/event-stream", "Sec-Fetch-Mode": "cors"}

// Issue 27, test 1: 100 concurrent navigations (HTTP/1.1 and HTTP/2
// mixed) to a sleeping instance cause exactly one wake; all get the app's
// 200 once it is active.
func TestSleepHundredNavigations(t *testing.T) {
	e := newSleepEnv(t, 60, wake.Options{})
	h1, h2 := e.client(false), e.client(true)
	const n = 100
	results := make(chan accessResp, n)
	start := time.Now()
	for i := range n {
		c := h1
		if i%2 == 1 {
			c = h2
		}
		go func() {
			req, _ := http.NewRequest("GET", "https://"+slpWeb+"/", nil)
			for k, v := range navigate {
				req.Header.Set(k, v)
			}
			resp, err := c.Do(req)
			if err != nil {
				results <- accessResp{status: -1, body: err.Error()}
				return
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			results <- accessResp{status: resp.StatusCode, body: string(body), proto: resp.ProtoMajor}
		}()
	}
	testutil.Eventually(t, 20*time.Second, "100 navigations held", func() bool { return e.coord.Held() == n })
	if e.app.hits.Load() != 0 {
		t.Fatalf("the app was reached %d times while the instance slept", e.app.hits.Load())
	}
	woke := time.Now()
	e.wakeUp()
	protos := map[int]int{}
	for range n {
		r := <-results
		if r.status != 200 || !strings.Contains(r.body, `"Method":"GET"`) {
			t.Fatalf("a held navigation got %d %q", r.status, r.body)
		}
		protos[r.proto]++
	}
	t.Logf("100 navigations held %v, released %v after the instance became active", woke.Sub(start), time.Since(woke))
	if got := e.wakes.Load(); got != 1 {
		t.Fatalf("%d wake calls, want 1", got)
	}
	if protos[1] != n/2 || protos[2] != n/2 {
		t.Fatalf("protocols %v, want 50 of each", protos)
	}
}

// Issue 27, test 2 (shortened): WebSocket reconnects (both protocols), SSE
// reconnects and CORS preflights to a sleeping instance get 503
// {"state":"sleeping"} with Retry-After and cause no wake; nor does a fetch
// to a service that wakes on navigations only.
func TestSleepReconnectLoopsNeverWake(t *testing.T) {
	e := newSleepEnv(t, 30, wake.Options{})
	d := websocket.Dialer{
		TLSClientConfig: &tls.Config{RootCAs: e.ca.Pool(), ServerName: slpAPI, NextProtos: []string{"http/1.1"}},
		NetDialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.ln.Addr().String())
		},
		HandshakeTimeout: 5 * time.Second,
	}
	h1, h2 := e.client(false), e.client(true)
	deadline := time.Now().Add(2 * time.Second)
	rounds := 0
	for time.Now().Before(deadline) {
		rounds++
		_, resp, err := d.Dial("wss://"+slpAPI+"/ws", http.Header{"Accept": {"text/html"}, "Sec-Fetch-Mode": {"navigate"}})
		if err == nil || resp == nil || resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("h1 WebSocket to a sleeping instance: %v %v", resp, err)
		}
		cc := (&accessEnv{t: t, ca: e.ca, ln: e.ln}).dialH2Access(slpAPI)
		c, err := openAccessWS(t, cc, slpAPI, "/ws", nil)
		if err != nil || c.resp.StatusCode != 503 {
			t.Fatalf("h2 WebSocket to a sleeping instance: %v %v", c, err)
		}
		_ = cc.Close()
		for _, c := range []*http.Client{h1, h2} {
			wantSleeping(t, e.do(c, "GET", slpAPI, sse), "SSE")
			wantSleeping(t, e.do(c, "OPTIONS", slpAPI, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}), "preflight")
			wantSleeping(t, e.do(c, "GET", slpWeb, map[string]string{"Accept": "application/json", "Sec-Fetch-Mode": "cors"}), "fetch to a navigation-only service")
		}
		time.Sleep(250 * time.Millisecond) // the reconnect interval under test
	}
	if got := e.wakes.Load(); got != 0 {
		t.Fatalf("%d wake calls after %d reconnect rounds, want 0", got, rounds)
	}
	if e.app.hits.Load() != 0 {
		t.Fatalf("the app was reached %d times", e.app.hits.Load())
	}
}

// Issue 27, test 3: a wake longer than hold_seconds: a fetch gets 503
// {"state":"starting"} at the deadline, a navigation the starting page;
// after the wake the next navigation gets the app. Both protocols.
func TestSleepHoldDeadline(t *testing.T) {
	e := newSleepEnv(t, 1, wake.Options{})
	forBoth(t, func(t *testing.T, h2 bool) {
		c := e.client(h2)
		start := time.Now()
		r := e.do(c, "GET", slpAPI, map[string]string{"Accept": "application/json", "Sec-Fetch-Mode": "cors"})
		if r.status != 503 || r.body != `{"state":"starting","retry_after":2}` || r.header.Get("Retry-After") != "2" || time.Since(start) < time.Second {
			t.Fatalf("fetch past the hold: %d %q after %v", r.status, r.body, time.Since(start))
		}
		wantProto(t, r, h2)
		r = e.do(c, "GET", slpWeb, navigate)
		if r.status != 503 || !strings.Contains(r.body, `<meta http-equiv="refresh" content="2">`) || !strings.Contains(r.header.Get("Content-Type"), "text/html") {
			t.Fatalf("navigation past the hold: %d %q", r.status, r.body)
		}
	})
	if got := e.wakes.Load(); got != 1 {
		t.Fatalf("%d wake calls, want 1 (the later requests joined the wake in progress)", got)
	}
	e.wakeUp()
	testutil.Eventually(t, 10*time.Second, "the instance active", func() bool { return !e.table.Lookup(slpWeb).Sleeping() })
	forBoth(t, func(t *testing.T, h2 bool) {
		seen(t, e.do(e.client(h2), "GET", slpWeb, navigate))
	})
}

// Issue 27, test 4: past the per-instance bound a request gets 503 with
// Retry-After at once; another instance on the host is unaffected.
func TestSleepOverflow(t *testing.T) {
	e := newSleepEnv(t, 60, wake.Options{MaxHeldPerInstance: 2})
	h1 := e.client(false)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { seen(t, e.do(e.client(false), "GET", slpWeb, navigate)) })
	}
	testutil.Eventually(t, 10*time.Second, "2 held", func() bool { return e.coord.Held() == 2 })
	forBoth(t, func(t *testing.T, h2 bool) {
		start := time.Now()
		wantSleeping(t, e.do(e.client(h2), "GET", slpWeb, navigate), "over the bound")
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the overflow answer took %v", d)
		}
	})
	seen(t, e.do(h1, "GET", slpAwake, navigate))
	e.wakeUp()
	wg.Wait()
}

// Issue 27, test 5: a request the access policy denies gets its 401 and
// wakes nothing; an authorised one wakes the instance.
func TestSleepAccessDeniedNeverWakes(t *testing.T) {
	e := newSleepEnv(t, 30, wake.Options{})
	forBoth(t, func(t *testing.T, h2 bool) {
		if r := e.do(e.client(h2), "GET", slpPriv, navigate); r.status != 401 {
			t.Fatalf("without a credential: %d %q", r.status, r.body)
		}
		if r := e.do(e.client(h2), "GET", slpPriv, map[string]string{"X-Applistener-Token": "v1.k1.bad.sig"}); r.status != 401 {
			t.Fatalf("with a bad credential: %d", r.status)
		}
	})
	if got := e.wakes.Load(); got != 0 {
		t.Fatalf("%d wake calls for denied requests, want 0", got)
	}
	now := time.Now()
	tok, err := e.keys.Mint("k1", accesstoken.Claims{Workspace: "team", Sandbox: "demo", Service: "priv", IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	e.wakeUp()
	seen(t, e.do(e.client(true), "GET", slpPriv, map[string]string{"X-Applistener-Token": tok, "Accept": "application/json"}))
	if got := e.wakes.Load(); got != 1 {
		t.Fatalf("%d wake calls, want 1", got)
	}
}

// Issue 27, test 6: putting an instance to sleep closes its WebSockets
// with 1001 on both protocols; once woken, new ones are served.
func TestSleepClosesWebSockets(t *testing.T) {
	e := newSleepEnv(t, 30, wake.Options{})
	e.wakeUp()
	e.apply(false)
	d := websocket.Dialer{
		TLSClientConfig: &tls.Config{RootCAs: e.ca.Pool(), ServerName: slpAPI, NextProtos: []string{"http/1.1"}},
		NetDialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.ln.Addr().String())
		},
		HandshakeTimeout: 5 * time.Second,
	}
	open := func() (*websocket.Conn, *h2wsClient) {
		t.Helper()
		ws1, resp, err := d.Dial("wss://"+slpAPI+"/ws", nil)
		if err != nil {
			t.Fatalf("h1 WebSocket: %v %v", resp, err)
		}
		t.Cleanup(func() { _ = ws1.Close() })
		<-e.app.upgrades
		cc := (&accessEnv{t: t, ca: e.ca, ln: e.ln}).dialH2Access(slpAPI)
		ws2, err := openAccessWS(t, cc, slpAPI, "/ws", nil)
		if err != nil || ws2.resp.StatusCode != 200 {
			t.Fatalf("h2 WebSocket: %v %v", ws2, err)
		}
		<-e.app.upgrades
		ws2.echo(t, websocket.TextMessage, []byte("hello"))
		return ws1, ws2
	}
	ws1, ws2 := open()
	e.apply(true)
	_ = ws1.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err := ws1.ReadMessage()
	var ce *websocket.CloseError
	if !asCloseError(err, &ce) || ce.Code != 1001 || ce.Text != "going away: sandbox sleeping" {
		t.Fatalf("h1 WebSocket after sleep: %v, want close 1001", err)
	}
	op, p, err := ws2.recv()
	if err != nil || op != 8 || len(p) < 2 || binary.BigEndian.Uint16(p) != 1001 || string(p[2:]) != "going away: sandbox sleeping" {
		t.Fatalf("h2 WebSocket after sleep: op %d %q %v, want close 1001", op, p, err)
	}
	e.apply(false)
	ws1, ws2 = open()
	if err := ws1.WriteMessage(websocket.TextMessage, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws1.ReadMessage(); err != nil || string(msg) != "again" {
		t.Fatalf("h1 echo after waking: %q %v", msg, err)
	}
	ws2.echo(t, websocket.TextMessage, []byte("again over h2"))
}

func asCloseError(err error, ce **websocket.CloseError) bool { return errors.As(err, ce) }

// Without a coordinator, every request for a sleeping instance is answered
// 503 sleeping and nothing is dialled.
func TestSleepWithoutCoordinator(t *testing.T) {
	e := newSleepEnv(t, 30, wake.Options{})
	e.srv.cfg.Wakes = nil
	forBoth(t, func(t *testing.T, h2 bool) {
		wantSleeping(t, e.do(e.client(h2), "GET", slpWeb, navigate), "navigation without a coordinator")
	})
	if e.app.hits.Load() != 0 || e.wakes.Load() != 0 {
		t.Fatalf("app hits %d, wakes %d", e.app.hits.Load(), e.wakes.Load())
	}
}

// A held request ends with its route: withdrawn, the request's client
// connection is closed and its place given up at once (not at the end of
// the hold); and Shutdown answers the held requests 503 at once.
func TestSleepHoldEndsWithRouteAndShutdown(t *testing.T) {
	e := newSleepEnv(t, 60, wake.Options{})
	errs := make(chan error, 1)
	go func() {
		resp, err := e.client(false).Get("https://" + slpAPI + "/")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode != 503 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		errs <- err
	}()
	testutil.Eventually(t, 10*time.Second, "held", func() bool { return e.coord.Held() == 1 })
	d, err := routes.ParseDocument([]byte(`{"instances":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.table.Apply(d)
	testutil.Eventually(t, 10*time.Second, "the held request gone with its route", func() bool { return e.coord.Held() == 0 })
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the held request ended %v after its route was withdrawn; want at once, not at the end of its 60 s hold", d)
	}
	// The client gets the closed connection, or a 503 when the release
	// (the instance left the table) won the race with the revocation.
	select {
	case err := <-errs:
		if err != nil && strings.HasPrefix(err.Error(), "status") {
			t.Fatalf("the client of the withdrawn route got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client of the withdrawn route got no end")
	}

	e.apply(true)
	results := make(chan accessResp, 2)
	for _, h2 := range []bool{false, true} {
		c := e.client(h2)
		go func() {
			req, _ := http.NewRequest("GET", "https://"+slpAPI+"/", nil)
			resp, err := c.Do(req)
			if err != nil {
				results <- accessResp{status: -1, body: err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			results <- accessResp{status: resp.StatusCode, body: string(b), header: resp.Header}
		}()
	}
	testutil.Eventually(t, 10*time.Second, "two held", func() bool { return e.coord.Held() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start = time.Now()
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx) }()
	for range 2 {
		r := <-results
		wantSleeping(t, r, "held at shutdown")
	}
	if err := <-shut; err != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("Shutdown: %v after %v", err, time.Since(start))
	}
}
