//go:build linux

package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// lateHost is the route of service "late" (installLate).
const lateHost = "team--demo--late." + h2Domain

// lateApp is a real HTTP/1.1 app that is still starting: its port is
// reserved from the start (a socket bound to 127.0.0.1:0) but it listens
// only when listen is called. Until then the kernel refuses connections to
// the port (ECONNREFUSED), exactly as for an app that has not bound yet.
type lateApp struct {
	t    *testing.T
	port int

	mu        sync.Mutex
	fd        int // the bound socket until listen
	srv       *http.Server
	served    chan struct{}
	requests  map[string]int // by path
	listening bool
}

func newLateApp(t *testing.T) *lateApp {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	a := &lateApp{t: t, port: sa.(*unix.SockaddrInet4).Port, fd: fd, requests: map[string]int{}}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.srv == nil {
			_ = unix.Close(a.fd)
			a.fd = -1
			return
		}
		_ = a.srv.Close()
		<-a.served
	})
	return a
}

// listen starts the app on its reserved port (callable from any goroutine).
func (a *lateApp) listen() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fd < 0 || a.srv != nil {
		return
	}
	if err := unix.Listen(a.fd, 128); err != nil {
		a.t.Errorf("late app: listen: %v", err)
		return
	}
	f := os.NewFile(uintptr(a.fd), "late-app")
	ln, err := net.FileListener(f) // a duplicate of the descriptor
	_ = f.Close()
	a.fd = -1
	if err != nil {
		a.t.Errorf("late app: %v", err)
		return
	}
	a.srv = &http.Server{Handler: http.HandlerFunc(a.serve)}
	a.served = make(chan struct{})
	a.listening = true
	go func() {
		defer close(a.served)
		_ = a.srv.Serve(ln)
	}()
}

func (a *lateApp) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	a.mu.Lock()
	a.requests[r.URL.Path]++
	a.mu.Unlock()
	_, _ = fmt.Fprintf(w, "late %s %d %s", r.Method, len(body), h2Sha(body))
}

func (a *lateApp) executions(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[path]
}

// install replaces the env's routes with one service, name, on port
// (fields: more of the service's JSON, such as start_grace_seconds), and
// returns its route.
func (e *h2Env) install(name string, port int, fields string, maxStreams int) *routes.Route {
	e.t.Helper()
	limits := ""
	if maxStreams > 0 {
		limits = fmt.Sprintf(`"limits":{"max_streams":%d},`, maxStreams)
	}
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"one","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		%s"services":[{"name":%q,"port":%d,"revision":1%s}]}]}`, limits, name, port, fields))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(doc.Rejected) > 0 {
		e.t.Fatalf("rejected: %+v", doc.Rejected)
	}
	e.table.Apply(doc)
	host := routes.Hostname("team", "demo", name, h2Domain)
	r := e.table.Lookup(host)
	if r == nil {
		e.t.Fatalf("%s not installed", host)
	}
	return r
}

// installLate installs service "late" (lateHost) on port.
func (e *h2Env) installLate(port int, fields string, maxStreams int) *routes.Route {
	e.t.Helper()
	return e.install("late", port, fields, maxStreams)
}

// pendingRequest is a request sent on its own client connection (HTTP/1.1)
// or stream (HTTP/2) whose answer arrives on done; abandon makes the client
// go away (HTTP/1.1: it closes its connection; HTTP/2: it resets the
// stream).
type pendingRequest struct {
	done    chan h2Result
	abandon func()
}

// send starts method path on host over proto ("h1" or "h2") with the
// given header fields and body.
func (e *h2Env) send(proto, host, method, path string, header map[string]string, body []byte) *pendingRequest {
	e.t.Helper()
	p := &pendingRequest{done: make(chan h2Result, 1)}
	if proto == "h1" {
		tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = tc.Close() })
		_ = tc.SetDeadline(time.Now().Add(time.Minute))
		p.abandon = func() { _ = tc.Close() }
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
		for k, v := range header {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
		if body != nil {
			fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
		}
		b.WriteString("\r\n")
		go func() {
			// The body goes out while the answer is awaited: the listener
			// streams it (over 64 KiB) once the app accepts.
			go func() { _, _ = tc.Write(append([]byte(b.String()), body...)) }()
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				p.done <- h2Result{err: err}
				return
			}
			rb, err := io.ReadAll(resp.Body)
			p.done <- h2Result{status: resp.StatusCode, header: resp.Header, body: string(rb), err: err, close: resp.Close}
		}()
		return p
	}
	cc := e.dial(host)
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	p.abandon = cancel
	var rb io.Reader
	if body != nil {
		rb = bytes.NewReader(body)
	}
	req := h2Req(e.t, method, host, path, rb).WithContext(ctx)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	go func() { p.done <- h2Do(cc, req) }()
	return p
}

// wait returns the answer, failing the test if none comes within a minute.
func (p *pendingRequest) wait(t *testing.T) h2Result {
	t.Helper()
	select {
	case res := <-p.done:
		return res
	case <-time.After(time.Minute):
		t.Fatal("no answer within a minute")
		return h2Result{}
	}
}

func startWaits(s *Server, outcome string) float64 {
	return promtest.ToFloat64(s.m.startWaits.WithLabelValues(outcome))
}

// waitForWaiting waits until n requests wait for their app to listen.
func waitForWaiting(t *testing.T, s *Server, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d requests waiting for the app", n), func() bool {
		return promtest.ToFloat64(s.m.startWaiting) == float64(n)
	})
}

// TestAppStartLateListen: the app binds its port 2 s after the request
// arrived (the default start grace is 5 s): the request, a POST whose
// 100 KiB body is streamed, gets the app's 200, over HTTP/1.1 and HTTP/2,
// and the app executes it once.
func TestAppStartLateListen(t *testing.T) {
	h2Verify(t)
	body := bytes.Repeat([]byte("0123456789abcdef"), (100<<10)/16)
	want := fmt.Sprintf("late POST %d %s", len(body), h2Sha(body))
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			e := newH2Env(t, 0, Config{})
			app := newLateApp(t)
			e.installLate(app.port, "", 0)
			p := e.send(proto, lateHost, "POST", "/upload", nil, body)
			waitForWaiting(t, e.srv, 1)
			late := time.AfterFunc(2*time.Second, app.listen) // the app starts listening
			defer late.Stop()
			res := p.wait(t)
			if res.err != nil || res.status != 200 || res.body != want {
				t.Fatalf("answer %d %q (%v); want 200 %q", res.status, res.body, res.err, want)
			}
			if n := app.executions("/upload"); n != 1 {
				t.Errorf("the app executed the request %d times; want 1", n)
			}
			if r, to := startWaits(e.srv, startReady), startWaits(e.srv, startTimeout); r != 1 || to != 0 {
				t.Errorf("applistener_app_start_waits_total ready %v, timeout %v; want 1, 0", r, to)
			}
			if n := promtest.ToFloat64(e.srv.m.dials.WithLabelValues("error")); n < 2 {
				t.Errorf("%v refused dials; want the app redialled", n)
			}
		})
	}
}

// TestAppStartGraceExpires: an app that never listens. After the
// service's start grace (start_grace_seconds 1, which overrides the
// server's minute) each request is answered 502 with Retry-After: an HTML
// page that refreshes itself for navigations (Sec-Fetch-Mode: navigate, or
// Accept naming text/html), JSON {"error":"app_not_listening","port":N}
// otherwise; over HTTP/1.1 and HTTP/2.
func TestAppStartGraceExpires(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: time.Minute})
	app := newLateApp(t)
	e.installLate(app.port, `,"start_grace_seconds":1`, 0)
	cases := []struct {
		name   string
		header map[string]string
		html   bool
	}{
		{"navigate", map[string]string{"Sec-Fetch-Mode": "navigate", "Accept": "*/*"}, true},
		{"accept-html", map[string]string{"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}, true},
		{"fetch", map[string]string{"Sec-Fetch-Mode": "cors", "Accept": "application/json"}, false},
		{"api", nil, false},
	}
	type sent struct {
		proto, name string
		html        bool
		p           *pendingRequest
	}
	var all []sent
	for _, proto := range []string{"h1", "h2"} {
		for _, c := range cases {
			all = append(all, sent{proto, c.name, c.html, e.send(proto, lateHost, "GET", "/"+c.name, c.header, nil)})
		}
	}
	wantJSON := fmt.Sprintf(`{"error":"app_not_listening","port":%d}`+"\n", app.port)
	for _, s := range all {
		res := s.p.wait(t)
		what := s.proto + "/" + s.name
		if res.err != nil || res.status != 502 {
			t.Errorf("%s: %d (%v); want 502", what, res.status, res.err)
			continue
		}
		if ra := res.header.Get("Retry-After"); ra != "2" {
			t.Errorf("%s: Retry-After %q; want 2", what, ra)
		}
		if cc := res.header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s: Cache-Control %q; want no-store", what, cc)
		}
		ct := res.header.Get("Content-Type")
		switch {
		case s.html:
			if ct != "text/html; charset=utf-8" {
				t.Errorf("%s: Content-Type %q; want HTML", what, ct)
			}
			for _, frag := range []string{`<meta http-equiv="refresh" content="2">`, fmt.Sprintf("Nothing is listening on port %d yet", app.port)} {
				if !strings.Contains(res.body, frag) {
					t.Errorf("%s: HTML body %q lacks %q", what, res.body, frag)
				}
			}
		default:
			if ct != "application/json" || res.body != wantJSON {
				t.Errorf("%s: %q %q; want application/json %q", what, ct, res.body, wantJSON)
			}
		}
	}
	if n := startWaits(e.srv, startTimeout); n != float64(len(all)) {
		t.Errorf("applistener_app_start_waits_total{outcome=timeout} = %v; want %d", n, len(all))
	}
	if n := promtest.ToFloat64(e.srv.m.denials.WithLabelValues("502")); n != float64(len(all)) {
		t.Errorf("502 denials %v; want %d", n, len(all))
	}
}

// TestAppStartWaitBounded: a request waiting for its app holds one of the
// instance's max_streams (a second request is refused with 503), and a
// client that goes away during the wait (HTTP/1.1: closes its connection;
// HTTP/2: resets the stream) frees it at once, long before the grace (a
// minute) ends.
func TestAppStartWaitBounded(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: time.Minute})
	app := newLateApp(t)
	route := e.installLate(app.port, "", 1)
	for i, proto := range []string{"h1", "h2"} {
		p := e.send(proto, lateHost, "GET", "/held", nil, nil)
		waitForWaiting(t, e.srv, 1)
		if n := route.Instance.Active(); n != 1 {
			t.Fatalf("%s: %d streams active; want the waiting request's 1", proto, n)
		}
		for _, other := range []string{"h1", "h2"} {
			res := e.send(other, lateHost, "GET", "/second", nil, nil).wait(t)
			if res.err != nil || res.status != 503 || res.header.Get("Retry-After") != "1" {
				t.Errorf("%s: a second request over %s while one waits: %d %q (%v); want 503 (max_streams 1)", proto, other, res.status, res.body, res.err)
			}
		}
		p.abandon()
		testutil.Eventually(t, 10*time.Second, proto+": the abandoned request's stream slot freed", func() bool {
			return route.Instance.Active() == 0 && promtest.ToFloat64(e.srv.m.startWaiting) == 0 &&
				promtest.ToFloat64(e.srv.m.streamsActive) == 0
		})
		if n := startWaits(e.srv, startClientGone); n != float64(i+1) {
			t.Errorf("%s: applistener_app_start_waits_total{outcome=client_gone} = %v; want %d", proto, n, i+1)
		}
	}
}

// TestAppStartWaitRevoked: withdrawing the route ends the wait of its
// requests at once (the grace is a minute), over HTTP/1.1 and HTTP/2.
func TestAppStartWaitRevoked(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: time.Minute})
	app := newLateApp(t)
	route := e.installLate(app.port, "", 0)
	h1 := e.send("h1", lateHost, "GET", "/h1", nil, nil)
	h2 := e.send("h2", lateHost, "GET", "/h2", nil, nil)
	waitForWaiting(t, e.srv, 2)

	// Withdraw the service (another one stays).
	other := newLateApp(t)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"w","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"services":[{"name":"other","port":%d,"revision":1}]}]}`, other.port))
	if err != nil {
		t.Fatal(err)
	}
	e.table.Apply(doc)
	for proto, p := range map[string]*pendingRequest{"h1": h1, "h2": h2} {
		if res := p.wait(t); res.err == nil && res.status != 503 {
			t.Errorf("%s: answer %d %q after the route was withdrawn; want 503 or the connection closed", proto, res.status, res.body)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the waits to end", func() bool {
		return promtest.ToFloat64(e.srv.m.startWaiting) == 0 && route.Instance.Active() == 0
	})
	if n := startWaits(e.srv, startRevoked); n != 2 {
		t.Errorf("applistener_app_start_waits_total{outcome=revoked} = %v; want 2", n)
	}
}

// TestAppStartWaitShutdown: a server shutting down answers the requests
// that wait for their app at once (502 not listening, the connection
// closing) rather than holding its drain, over HTTP/1.1 and HTTP/2.
func TestAppStartWaitShutdown(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: time.Minute})
	app := newLateApp(t)
	e.installLate(app.port, "", 0)
	h1 := e.send("h1", lateHost, "GET", "/h1", nil, nil)
	h2 := e.send("h2", lateHost, "GET", "/h2", nil, nil)
	waitForWaiting(t, e.srv, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx) }()
	for proto, p := range map[string]*pendingRequest{"h1": h1, "h2": h2} {
		res := p.wait(t)
		if res.err != nil || res.status != 502 || !strings.Contains(res.body, "app_not_listening") {
			t.Errorf("%s: answer %d %q (%v) during shutdown; want 502 app_not_listening", proto, res.status, res.body, res.err)
		}
		if proto == "h1" && !res.close {
			t.Errorf("h1: answer during shutdown without Connection: close (%v)", res.header)
		}
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v; want the drain to end before its deadline", err)
	}
	if n := startWaits(e.srv, startShutdown); n != 2 {
		t.Errorf("applistener_app_start_waits_total{outcome=shutdown} = %v; want 2", n)
	}
}

// TestAppStartNoGrace: with no grace (start_grace_seconds 0) a refused
// dial is answered at once, and counted as no wait.
func TestAppStartNoGrace(t *testing.T) {
	h2Verify(t)
	e := newH2Env(t, 0, Config{AppStartGrace: time.Minute})
	app := newLateApp(t)
	e.installLate(app.port, `,"start_grace_seconds":0`, 0)
	for _, proto := range []string{"h1", "h2"} {
		res := e.send(proto, lateHost, "GET", "/", nil, nil).wait(t)
		if res.status != 502 || !strings.Contains(res.body, "app_not_listening") {
			t.Errorf("%s: %d %q (%v); want 502 app_not_listening", proto, res.status, res.body, res.err)
		}
	}
	for _, o := range startOutcomes {
		if n := startWaits(e.srv, o); n != 0 {
			t.Errorf("outcome %s counted %v; want no wait", o, n)
		}
	}
	if n := promtest.ToFloat64(e.srv.m.dials.WithLabelValues("error")); n != 2 {
		t.Errorf("%v dials; want one per request", n)
	}
}

// TestRefusedByApp: what counts as an app not listening yet.
func TestRefusedByApp(t *testing.T) {
	ctx := context.Background()
	app := newLateApp(t)
	_, err := connector.TCP{Host: "127.0.0.1"}.Dial(ctx, app.port)
	if err == nil || !refusedByApp(err) {
		t.Errorf("tcp to a port nobody listens on: %v; want refused by the app", err)
	}
	dir := t.TempDir()
	_, err = connector.Unix{PathTemplate: filepath.Join(dir, "{port}.sock")}.Dial(ctx, 8080)
	if err == nil || !refusedByApp(err) {
		t.Errorf("unix socket not created yet: %v; want refused by the app", err)
	}
	_, err = connector.Unix{PathTemplate: filepath.Join(dir, "gone", "{port}.sock")}.Dial(ctx, 8080)
	if err == nil || refusedByApp(err) {
		t.Errorf("unix socket directory gone: %v; want not an app starting (instance unavailable)", err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-dctx.Done()
	_, err = connector.TCP{Host: "127.0.0.1"}.Dial(dctx, app.port)
	if err == nil || refusedByApp(err) {
		t.Errorf("dial timeout: %v; want not refused", err)
	}
}
