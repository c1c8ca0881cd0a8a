package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestSoakFaults is the fault matrix of issue 25 (test 7), opt-in with
// SOAK=1 (make soak) for SOAK_DURATION (default 3m): real processes (a
// three-member etcd, two gateway replicas on it, two supervisors, the
// edge) while load flows over HTTP/1.1, HTTP/2 and WebSockets, directly
// and through the edge, and a cycle of faults repeats:
//
//   - one gateway replica killed (SIGKILL) for 5 s, then restarted;
//   - both replicas killed for 8 s (more than the session TTL, less than
//     the 15 s route freshness), then restarted;
//   - one etcd member killed for 5 s (quorum kept), then restarted;
//   - the gateway's answers to supervisor sup-1 made unparsable for 5 s
//     (a top-level field of a "newer gateway" in every document, by a
//     proxy between them; the push stream is cut at both ends of it);
//   - supervisor sup-2 restarted (SIGTERM, then a new process);
//   - the edge restarted (SIGTERM with its 1 s drain, then a new process
//     on the same address);
//   - app "app" (sup-1's second sandbox, not sup-1's main service: its
//     outage must not touch demo's traffic on the same supervisor)
//     stopped for 4 s and started again on the same port;
//   - route churn: sup-1's sandbox "churn" deleted and put back three
//     times through the gateway's write API while load flows.
//
// The contract: sup-1's routes are renewed within their freshness by
// every fault, so none of its requests fails and none of its WebSockets
// (direct and spliced by the edge) drops. Expected failures are counted
// apart, by cause, only inside the window of the fault that explains
// them (a request counts as expected when its attempt overlaps the
// window): sup-2's traffic while sup-2 restarts (and until the edge has
// its new endpoint); everything through the edge while the edge restarts
// (its drain does not outlive the process: spliced connections end with
// it) until 1 s after the new edge is ready (a dropped WebSocket is
// noticed at its next echo); "app"'s requests while its app is down, and
// only as 502 answers (the documented app_not_listening once
// --app-start-grace, 1 s here, has passed); "churn"'s requests from its
// DELETE until it is served again directly and through the edge after
// its PUT. It prints the requests, the errors by cause and the
// WebSockets dropped; any other failure is a violation and fails the
// test.
func TestSoakFaults(t *testing.T) {
	if os.Getenv("SOAK") != "1" {
		t.Skip("the fault soak is opt-in: run it with SOAK=1 (make soak); SOAK_DURATION sets its length (default 3m)")
	}
	dur := 3 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("SOAK_DURATION=%q: want a positive Go duration", s)
		}
		dur = d
	}
	const (
		fresh    = 15 * time.Second
		settle   = 3 * time.Second
		otherSup = "sup-2"
	)
	c := etcdStartCluster(t)
	g := c.startGateways(t, []gatewayToken{supervisorTokenOf("sup-1"), supervisorTokenOf(otherSup)}, "--keepalive", "2s", "--session-ttl", "6s")
	web, other := newSoakBackend(t, "web"), newSoakBackend(t, "other")
	app, churn := newSoakBackend(t, "app"), newSoakBackend(t, "churn")
	g.put(t, 0, "sup-1", newStoredInstance("demo", map[string]int{"web": web.port}))
	g.put(t, 0, "sup-1", newStoredInstance("app", map[string]int{"web": app.port}))
	churnInstance := newStoredInstance("churn", map[string]int{"web": churn.port})
	g.put(t, 0, "sup-1", churnInstance)
	g.put(t, 0, otherSup, newStoredInstance("other", map[string]int{"web": other.port}))
	otherHost := serviceHost("team", "other", "web")
	appHost, churnHost := serviceHost("team", "app", "web"), serviceHost("team", "churn", "web")

	// sup-1 reaches the replicas through proxies that can spoil its
	// documents.
	var spoil atomic.Bool
	var spoiled atomic.Int64 // unparsable deliveries sup-1 counted
	var proxies []*answerProxy
	var proxied []string
	for i := range 2 {
		p := newAnswerProxy(t, g.url(i), &spoil)
		proxies = append(proxies, p)
		proxied = append(proxied, p.srv.URL)
	}
	supA := g.startSupervisor(t, etcdSupervisorConfig{id: "sup-1", freshness: fresh, gateways: strings.Join(proxied, ","),
		extra: []string{"--app-start-grace", "1s"}}) // app's outage answers 502 before the clients' 5 s timeout
	var supB atomic.Pointer[etcdSupervisor]
	supB.Store(g.startSupervisor(t, etcdSupervisorConfig{id: otherSup, freshness: fresh}))
	edgeAddr := freeAddr(t) // a restarted edge takes the same address
	edge := startEdgeAt(t, g.urls(), edgeAddr)
	for _, h := range []string{demoHost, otherHost, appHost, churnHost} {
		deadline := time.Now().Add(waitTimeout)
		for {
			if _, err := edgeGet(edgeAddr, h); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no GET of %s through the edge before the soak", h)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	var tally soakTally
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var load sync.WaitGroup

	// sup-1: every request and WebSocket is under the contract.
	h1 := soakClient(supA.dial, demoHost, false)
	h2 := soakClient(supA.dial, demoHost, true)
	defer h1.CloseIdleConnections()
	defer h2.CloseIdleConnections()
	loop := func(probe string, every time.Duration, fn func() error) {
		load.Go(func() {
			for sleepCtx(ctx, every) {
				start := time.Now()
				err := fn()
				tally.record(ctx, probe, start, err)
			}
		})
	}
	loop("sup-1 HTTP/1.1", 20*time.Millisecond, func() error { return soakGet(h1, demoHost, "web") })
	loop("sup-1 HTTP/2", 20*time.Millisecond, func() error { return soakGet(h2, demoHost, "web") })
	loop("sup-1 via edge", 100*time.Millisecond, func() error { return soakEdgeGet(edgeAddr, demoHost, "web") })
	holdWS := func(probe string, dial func() (*websocket.Conn, error)) {
		load.Go(func() {
			var ws *websocket.Conn
			defer func() {
				if ws != nil {
					_ = ws.Close()
				}
			}()
			for n := 0; sleepCtx(ctx, 200*time.Millisecond); n++ {
				if ws == nil {
					var err error
					start := time.Now()
					if ws, err = dial(); err != nil {
						ws = nil
						tally.record(ctx, probe+" dial", start, err)
						continue
					}
				}
				start := time.Now()
				err := wsEcho(ws, websocket.TextMessage, fmt.Appendf(nil, "soak %d", n))
				tally.record(ctx, probe, start, err)
				if err != nil {
					_ = ws.Close()
					ws = nil
				}
			}
		})
	}
	holdWS("sup-1 WebSocket", func() (*websocket.Conn, error) { return supA.wsTryDial(demoHost) })
	holdWS("sup-1 WebSocket via edge", func() (*websocket.Conn, error) { return edgeWS(edgeAddr, demoHost) })

	// sup-2: expected to fail while it restarts.
	dialB := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, supB.Load().appAddr)
	}
	hB := soakClient(dialB, otherHost, false)
	defer hB.CloseIdleConnections()
	loop("sup-2 HTTP/1.1", 50*time.Millisecond, func() error { return soakGet(hB, otherHost, "other") })
	loop("sup-2 via edge", 200*time.Millisecond, func() error { return soakEdgeGet(edgeAddr, otherHost, "other") })
	holdWS("sup-2 WebSocket via edge", func() (*websocket.Conn, error) { return edgeWS(edgeAddr, otherHost) })

	// app and churn: sup-1's other sandboxes, under sup-1's contract but
	// for their own faults.
	hApp := soakClient(supA.dial, appHost, false)
	hChurn := soakClient(supA.dial, churnHost, true)
	defer hApp.CloseIdleConnections()
	defer hChurn.CloseIdleConnections()
	loop("app HTTP/1.1", 100*time.Millisecond, func() error { return soakGet(hApp, appHost, "app") })
	loop("app via edge", 200*time.Millisecond, func() error { return soakEdgeGet(edgeAddr, appHost, "app") })
	loop("churn HTTP/2", 100*time.Millisecond, func() error { return soakGet(hChurn, churnHost, "churn") })
	loop("churn via edge", 200*time.Millisecond, func() error { return soakEdgeGet(edgeAddr, churnHost, "churn") })

	// The fault cycle.
	faults := map[string]int{}
	etcdMember := 0
	fault := func(name string, f func()) bool {
		if !sleepCtx(ctx, settle) {
			return false
		}
		start := time.Now()
		f()
		faults[name]++
		t.Logf("%v: %s (%v)", start.Sub(begin).Round(time.Second), name, time.Since(start).Round(100*time.Millisecond))
		return true
	}
	for ctx.Err() == nil {
		ok := fault("edge restarted", func() {
			end := tally.expect("edge", "restarting", nil)
			edge.stop(t)
			edge = startEdgeAt(t, g.urls(), edgeAddr)
			sleepCtx(context.Background(), time.Second) // a dropped WebSocket is noticed at its next echo
			end()
		}) && fault("app stopped 4s", func() {
			end := tally.expect("app", "down", func(err error) bool { return strings.Contains(err.Error(), "502") })
			app.restart(t, func() { sleepCtx(context.Background(), 4*time.Second) })
			end()
		}) && fault("route churned 3×", func() {
			for range 3 {
				end := tally.expect("churn", "deleted, not yet served again", nil)
				g.del(t, 0, "sup-1", "churn")
				sleepCtx(context.Background(), time.Second)
				g.put(t, 0, "sup-1", churnInstance)
				served := func() error {
					if err := soakGet(hChurn, churnHost, "churn"); err != nil {
						return err
					}
					return soakEdgeGet(edgeAddr, churnHost, "churn")
				}
				deadline := time.Now().Add(waitTimeout)
				for err := served(); err != nil; err = served() {
					if time.Now().After(deadline) {
						t.Errorf("route churn: %s not served directly and through the edge %v after its PUT: %v", churnHost, waitTimeout, err)
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				end()
				sleepCtx(context.Background(), time.Second)
			}
		}) && fault("gateway replica 1 killed 5s", func() {
			g.kill(t, 0)
			sleepCtx(ctx, 5*time.Second)
			g.start(t, 0)
		}) && fault("both gateway replicas killed 8s", func() {
			g.kill(t, 0)
			g.kill(t, 1)
			sleepCtx(ctx, 8*time.Second)
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Go(func() { g.replicas[i].start(t) })
			}
			wg.Wait()
		}) && fault("etcd member killed 5s", func() {
			c.kill(t, etcdMember)
			sleepCtx(ctx, 5*time.Second)
			c.start(t, etcdMember)
			etcdMember = (etcdMember + 1) % 3
		}) && fault("sup-1's documents unparsable 5s", func() {
			unparsable := func() float64 {
				return metricAt(t, supA.adminAddr, "applistener_config_deliveries_total", map[string]string{"result": "unparsable"})
			}
			before := unparsable()
			spoil.Store(true)
			for _, p := range proxies {
				p.cut()
			}
			sleepCtx(ctx, 5*time.Second)
			if n := unparsable() - before; n == 0 && ctx.Err() == nil {
				t.Errorf("no unparsable delivery counted by sup-1 while its documents were spoiled: the fault did not happen")
			} else {
				spoiled.Add(int64(n))
			}
			spoil.Store(false)
			for _, p := range proxies {
				p.cut()
			}
		}) && fault("sup-2 restarted", func() {
			end := tally.expect(otherSup, "restarting", nil)
			old := supB.Load()
			old.stop(t)
			supB.Store(g.startSupervisor(t, etcdSupervisorConfig{id: otherSup, freshness: fresh}))
			// The edge takes the new endpoint from discovery.
			sleepCtx(context.Background(), 5*time.Second)
			end()
		})
		if !ok {
			break
		}
	}
	load.Wait()

	elapsed := time.Since(begin).Round(time.Second)
	var names []string
	for n := range faults {
		names = append(names, fmt.Sprintf("%s ×%d", n, faults[n]))
	}
	sort.Strings(names)
	t.Logf("fault soak %v; faults: %s; unparsable documents sup-1 refused: %d", elapsed, strings.Join(names, ", "), spoiled.Load())
	violations := tally.report(t)
	if tally.total("sup-1") == 0 || len(faults) == 0 {
		t.Errorf("the soak did not run: %d sup-1 requests, faults %v", tally.total("sup-1"), faults)
	}
	if violations > 0 {
		t.Errorf("%d contract violations (failed requests or dropped WebSockets while the routes were fresh); first: %s",
			violations, strings.Join(tally.samples(), "; "))
	}
}

// soakTally counts the soak's requests and errors by probe and cause.
type soakTally struct {
	mu       sync.Mutex
	requests map[string]int
	errs     map[string]int // "probe: cause (expected: ...)" or "probe: cause"
	violated int
	first    []string
	windows  map[string][]*soakWindow // scope → the windows of its faults
}

// soakWindow is a span in which a fault explains errors of a scope's
// probes (those accept takes, or all when accept is nil).
type soakWindow struct {
	reason   string
	from, to time.Time // to is zero while the window is open
	accept   func(error) bool
}

// expect opens a window in which errors of scope's probes (see
// soakScopes) that accept takes (all, when nil) are expected, for reason;
// the returned func closes it.
func (s *soakTally) expect(scope, reason string, accept func(error) bool) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.windows == nil {
		s.windows = map[string][]*soakWindow{}
	}
	w := &soakWindow{reason: reason, from: time.Now(), accept: accept}
	s.windows[scope] = append(s.windows[scope], w)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.to = time.Now()
	}
}

// soakScopes are the scopes a probe's errors may be expected for: its
// first word (sup-1, sup-2, app, churn), and "edge" for the probes
// through the edge.
func soakScopes(probe string) []string {
	first, _, _ := strings.Cut(probe, " ")
	if strings.Contains(probe, "via edge") {
		return []string{first, "edge"}
	}
	return []string{first}
}

// explained returns the reason of a window of probe's scopes that
// overlaps the attempt [start, now] and accepts err ("" when none).
func (s *soakTally) explained(probe string, start time.Time, err error) string {
	now := time.Now()
	for _, scope := range soakScopes(probe) {
		for _, w := range s.windows[scope] {
			if w.from.After(now) || (!w.to.IsZero() && w.to.Before(start)) {
				continue
			}
			if w.accept == nil || w.accept(err) {
				return scope + " " + w.reason
			}
		}
	}
	return ""
}

// record counts one attempt of probe ("sup-N ...") begun at start and its
// error; errors after the soak's end (ctx done) are not counted.
func (s *soakTally) record(ctx context.Context, probe string, start time.Time, err error) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.requests == nil {
		s.requests, s.errs = map[string]int{}, map[string]int{}
	}
	s.requests[probe]++
	if err == nil {
		return
	}
	key := probe + ": " + soakCause(err)
	if why := s.explained(probe, start, err); why != "" {
		s.errs[key+" (expected: "+why+")"]++
		return
	}
	s.errs[key]++
	s.violated++
	if len(s.first) < 10 {
		s.first = append(s.first, fmt.Sprintf("%s at %s: %v", probe, time.Now().Format("15:04:05.000"), err))
	}
}

func (s *soakTally) total(prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for p, c := range s.requests {
		if strings.HasPrefix(p, prefix) {
			n += c
		}
	}
	return n
}

func (s *soakTally) samples() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.first...)
}

// report logs the counts and returns the violations.
func (s *soakTally) report(t *testing.T) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.requests {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("FIGURE soak %-28s %7d attempts", k, s.requests[k])
	}
	keys = keys[:0]
	for k := range s.errs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("FIGURE soak error %s: %d", k, s.errs[k])
	}
	t.Logf("FIGURE soak contract violations: %d", s.violated)
	return s.violated
}

// soakCause is a short class of err for the counts by cause.
func soakCause(err error) string {
	msg := err.Error()
	for _, c := range []string{"app_not_listening", "connection refused", "connection reset", "unrecognized name", "EOF", "timeout", "deadline exceeded", "broken pipe", "close 1008", "close 1001", "close 1006", "bad handshake", "502", "503", "421"} {
		if strings.Contains(msg, c) {
			return c
		}
	}
	if len(msg) > 60 {
		msg = msg[:60]
	}
	return msg
}

// soakClient is an HTTP client of one host over dial: keep-alive HTTP/1.1,
// or HTTP/2 when h2.
func soakClient(dial func(ctx context.Context, network, addr string) (net.Conn, error), host string, h2 bool) *http.Client {
	tr := &http.Transport{DialContext: dial, TLSClientConfig: tlsConfig(host).Clone(), ForceAttemptHTTP2: h2, MaxIdleConnsPerHost: 4}
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func soakGet(c *http.Client, host, name string) error {
	resp, err := c.Get("https://" + host + "/soak")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != "hello from "+name+"\n" {
		return fmt.Errorf("%d %q", resp.StatusCode, body)
	}
	return nil
}

func soakEdgeGet(edgeAddr, host, name string) error {
	body, err := edgeGet(edgeAddr, host)
	if err == nil && strings.TrimSpace(body) != "hello from "+name {
		err = fmt.Errorf("through the edge: %q", body)
	}
	return err
}

// answerProxy is a reverse proxy in front of one gateway replica for a
// supervisor. While spoil is set, every configuration document it relays
// (a poll's answer, each line of a push stream) carries a top-level field
// that the supervisor does not know, as from a newer gateway: it cannot
// parse it, so it must renew nothing. cut ends the streams it relays.
type answerProxy struct {
	srv   *httptest.Server
	spoil *atomic.Bool

	mu      sync.Mutex
	streams map[io.Closer]struct{}
}

func newAnswerProxy(t testing.TB, upstream string, spoil *atomic.Bool) *answerProxy {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	p := &answerProxy{spoil: spoil, streams: map[io.Closer]struct{}{}}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0), // a replica down is a fault of the soak: 502, not a log line
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode != http.StatusOK || !strings.HasSuffix(resp.Request.URL.Path, "/config") {
				return nil
			}
			resp.Body = p.track(resp.Body, p.spoil.Load())
			resp.Header.Del("Content-Length")
			resp.ContentLength = -1
			return nil
		},
	}
	p.srv = httptest.NewServer(rp)
	t.Cleanup(func() {
		p.cut()
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

// cut closes every configuration answer being relayed: the supervisor's
// push stream ends and it opens a new one (or polls).
func (p *answerProxy) cut() {
	p.mu.Lock()
	var open []io.Closer
	for c := range p.streams {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		_ = c.Close()
	}
}

// track wraps a configuration answer: it is closed by cut, and its
// documents are spoiled when spoil was set at its start.
func (p *answerProxy) track(body io.ReadCloser, spoil bool) io.ReadCloser {
	pr, pw := io.Pipe()
	tb := &trackedBody{PipeReader: pr, upstream: body, p: p}
	p.mu.Lock()
	p.streams[tb] = struct{}{}
	p.mu.Unlock()
	go func() {
		br := bufio.NewReaderSize(body, 64<<10)
		var err error
		for err == nil {
			var line []byte
			line, err = br.ReadBytes('\n')
			if spoil && len(bytes.TrimSpace(line)) > 0 && line[0] == '{' {
				line = append([]byte(`{"soak_newer_gateway_field":true,`), line[1:]...)
			}
			if len(line) > 0 {
				if _, werr := pw.Write(line); werr != nil {
					err = werr
				}
			}
		}
		_ = body.Close()
		if err == io.EOF {
			err = nil
		}
		_ = pw.CloseWithError(err)
	}()
	return tb
}

type trackedBody struct {
	*io.PipeReader
	upstream io.Closer
	p        *answerProxy
	once     sync.Once
}

func (b *trackedBody) Close() error {
	b.once.Do(func() {
		_ = b.upstream.Close()
		_ = b.PipeReader.Close()
		b.p.mu.Lock()
		delete(b.p.streams, b)
		b.p.mu.Unlock()
	})
	return nil
}

// startEdgeAt starts `applistener edge` for workspace team on addr (a
// restart takes the address of the edge it replaces) reading discovery
// from gateways, with a 1 s drain, and waits until it has a snapshot.
func startEdgeAt(t testing.TB, gateways, addr string) *proc {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, tokenFile, []byte(teamToken+"\n"))
	p := &proc{appAddr: addr}
	p.process = launch(t, launchSpec{
		name: "edge",
		args: func() []string {
			p.adminAddr = freeAddr(t)
			return []string{"edge", "--address", addr, "--gateway", gateways, "--gateway-token-file", tokenFile,
				"--workspace", "team", "--admin-address", p.adminAddr, "--gateway-stream-timeout", "2s",
				"--drain-timeout", "1s", "--log-format", "json"}
		},
		env: childEnv(),
		ready: func(run *process) bool {
			p.process = run
			return p.readyz() == http.StatusOK
		},
		retryPortRace: true, // the admin address may be taken; addr is the edge's own
	})
	return p
}

// restart stops the backend (its listener closed, its connections ended),
// runs down, and serves again on the same port.
func (b *soakBackend) restart(t testing.TB, down func()) {
	t.Helper()
	b.srv.Close()
	down()
	addr := fmt.Sprintf("127.0.0.1:%d", b.port)
	deadline := time.Now().Add(waitTimeout)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
			_ = srv.Listener.Close()
			srv.Listener = ln
			srv.Start()
			b.srv = srv
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("app %s: listen again on %s: %v", b.name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
