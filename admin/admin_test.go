package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ioTimeout bounds every wait in these tests (generous: the tests run with
// -race on small, busy machines).
const ioTimeout = 10 * time.Second

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testAdmin is a Server on 127.0.0.1:0 served in a goroutine.
type testAdmin struct {
	srv    *Server
	base   string // http://127.0.0.1:PORT
	client *http.Client
	tr     *http.Transport
	served chan error // Serve's result

	stopOnce sync.Once
}

// startAdmin serves New(127.0.0.1:0, ...) with the extra handlers added the
// way cmd adds them (Handle before Serve), and shuts it down when the test
// ends. setup runs on the server before Serve (EnablePprof).
func startAdmin(t *testing.T, gatherer prometheus.Gatherer, ready func() (bool, string),
	extra map[string]http.Handler, setup ...func(*Server)) *testAdmin {
	t.Helper()
	srv, err := New("127.0.0.1:0", gatherer, ready, discardLogger())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for pattern, h := range extra {
		srv.Handle(pattern, h)
	}
	for _, f := range setup {
		f(srv)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	a := &testAdmin{
		srv:    srv,
		base:   "http://" + srv.Addr().String(),
		client: &http.Client{Transport: tr, Timeout: ioTimeout},
		tr:     tr,
		served: make(chan error, 1),
	}
	go func() { a.served <- srv.Serve() }()
	t.Cleanup(func() {
		a.stop(t)
		tr.CloseIdleConnections()
	})
	return a
}

// stop shuts the server down (once) and checks that Serve returned nil.
func (a *testAdmin) stop(t *testing.T) {
	t.Helper()
	a.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		defer cancel()
		if err := a.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		select {
		case err := <-a.served:
			if err != nil {
				t.Errorf("Serve after Shutdown = %v, want nil", err)
			}
		case <-time.After(ioTimeout):
			t.Errorf("Serve did not return within %v of Shutdown", ioTimeout)
		}
	})
}

// response is what a request returned.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends method path and reads the whole response.
func (a *testAdmin) do(method, path string) (response, error) {
	req, err := http.NewRequest(method, a.base+path, nil)
	if err != nil {
		return response{}, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("reading the body of %s %s: %w", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(body)}, nil
}

func (a *testAdmin) get(t *testing.T, path string) response {
	t.Helper()
	r, err := a.do(http.MethodGet, path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return r
}

func alwaysReady() (bool, string) { return true, "" }

// readiness is a ready func the test flips.
type readiness struct {
	mu    sync.Mutex
	ok    bool
	why   string
	calls int
}

func (r *readiness) set(ok bool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ok, r.why = ok, why
}

func (r *readiness) ready() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return r.ok, r.why
}

func (r *readiness) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func wantTextPlain(t *testing.T, path string, r response) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
		t.Errorf("GET %s: Content-Type = %q, want text/plain; charset=utf-8", path, ct)
	}
}

func TestHealthzAnswersOK(t *testing.T) {
	testutil.VerifyNone(t)
	r := &readiness{} // not ready: /healthz does not depend on it
	a := startAdmin(t, prometheus.NewRegistry(), r.ready, nil)

	got := a.get(t, "/healthz")
	if got.status != http.StatusOK || got.body != "ok\n" {
		t.Fatalf("GET /healthz = %d %q, want 200 \"ok\\n\"", got.status, got.body)
	}
	wantTextPlain(t, "/healthz", got)
	if n := r.callCount(); n != 0 {
		t.Errorf("GET /healthz asked for readiness %d times, want 0", n)
	}
}

func TestReadyzFollowsReadiness(t *testing.T) {
	testutil.VerifyNone(t)
	r := &readiness{}
	r.set(false, "no configuration accepted yet")
	a := startAdmin(t, prometheus.NewRegistry(), r.ready, nil)

	got := a.get(t, "/readyz")
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("GET /readyz while not ready: status %d, want 503", got.status)
	}
	if want := "not ready: no configuration accepted yet\n"; got.body != want {
		t.Fatalf("GET /readyz while not ready: body %q, want %q", got.body, want)
	}
	wantTextPlain(t, "/readyz", got)

	// Readiness is asked at every request, not cached.
	r.set(true, "")
	got = a.get(t, "/readyz")
	if got.status != http.StatusOK || got.body != "ready\n" {
		t.Fatalf("GET /readyz while ready = %d %q, want 200 \"ready\\n\"", got.status, got.body)
	}
	wantTextPlain(t, "/readyz", got)

	r.set(false, "configuration is stale (last accepted 2m ago)")
	got = a.get(t, "/readyz")
	if want := "not ready: configuration is stale (last accepted 2m ago)\n"; got.status != http.StatusServiceUnavailable || got.body != want {
		t.Fatalf("GET /readyz after readiness was lost = %d %q, want 503 %q", got.status, got.body, want)
	}
	if n := r.callCount(); n != 3 {
		t.Errorf("readiness asked %d times for 3 requests, want 3", n)
	}
}

func TestMetricsServesTheRegistryHandedIn(t *testing.T) {
	testutil.VerifyNone(t)
	reg := prometheus.NewRegistry()
	probes := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "admin_test_probes_total",
		Help: "Probes counted by the admin test.",
	})
	reg.MustRegister(probes)
	probes.Add(3)
	a := startAdmin(t, reg, alwaysReady, nil)

	got := a.get(t, "/metrics")
	if got.status != http.StatusOK {
		t.Fatalf("GET /metrics: status %d, want 200; body:\n%s", got.status, got.body)
	}
	if !strings.Contains(got.body, "\nadmin_test_probes_total 3\n") {
		t.Fatalf("GET /metrics does not report admin_test_probes_total 3; body:\n%s", got.body)
	}
	// The registry handed in, not the process-wide default one (which
	// carries the Go runtime collectors).
	if strings.Contains(got.body, "go_goroutines") {
		t.Errorf("GET /metrics serves go_goroutines, which only the default registry has; body:\n%s", got.body)
	}
	if ct := got.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: Content-Type = %q, want the Prometheus text format", ct)
	}

	// Values are gathered at every request.
	probes.Inc()
	if got := a.get(t, "/metrics"); !strings.Contains(got.body, "\nadmin_test_probes_total 4\n") {
		t.Fatalf("GET /metrics after one more probe does not report 4; body:\n%s", got.body)
	}
}

// The admin package does not serve /v1/installations itself: cmd adds it
// with Handle (control.InstallationsHandler). This checks that an endpoint
// added that way is served, next to the built-in ones.
func TestHandleAddsInstallationsEndpoint(t *testing.T) {
	testutil.VerifyNone(t)
	const body = `{"installations":[{"hostname":"team--demo--web.apps.test"}]}`
	plain := startAdmin(t, prometheus.NewRegistry(), alwaysReady, nil)
	if got := plain.get(t, "/v1/installations"); got.status != http.StatusNotFound {
		t.Fatalf("GET /v1/installations without Handle: status %d, want 404", got.status)
	}

	a := startAdmin(t, prometheus.NewRegistry(), alwaysReady, map[string]http.Handler{
		"GET /v1/installations": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}),
	})
	got := a.get(t, "/v1/installations")
	if got.status != http.StatusOK || got.body != body {
		t.Fatalf("GET /v1/installations = %d %q, want 200 %q", got.status, got.body, body)
	}
	if ct := got.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /v1/installations: Content-Type = %q, want application/json", ct)
	}
	r, err := a.do(http.MethodPut, "/v1/installations")
	if err != nil {
		t.Fatalf("PUT /v1/installations: %v", err)
	}
	if r.status != http.StatusMethodNotAllowed {
		t.Errorf("PUT /v1/installations: status %d, want 405 (the pattern is GET only)", r.status)
	}
	// The built-in endpoints are still there.
	if got := a.get(t, "/healthz"); got.status != http.StatusOK {
		t.Errorf("GET /healthz next to an added endpoint: status %d, want 200", got.status)
	}
}

// TestPprofOffByDefault: without EnablePprof there are no profiles.
func TestPprofOffByDefault(t *testing.T) {
	testutil.VerifyNone(t)
	a := startAdmin(t, prometheus.NewRegistry(), alwaysReady, nil)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine"} {
		if got := a.get(t, path); got.status != http.StatusNotFound {
			t.Errorf("GET %s without EnablePprof: status %d, want 404", path, got.status)
		}
	}
}

func TestPprofIndex(t *testing.T) {
	testutil.VerifyNone(t)
	a := startAdmin(t, prometheus.NewRegistry(), alwaysReady, nil, (*Server).EnablePprof)
	got := a.get(t, "/debug/pprof/")
	if got.status != http.StatusOK || !strings.Contains(got.body, "goroutine") {
		t.Fatalf("GET /debug/pprof/ = %d, want 200 listing the goroutine profile; body:\n%s", got.status, got.body)
	}
	if got := a.get(t, "/no-such-endpoint"); got.status != http.StatusNotFound {
		t.Errorf("GET /no-such-endpoint: status %d, want 404", got.status)
	}
}

func TestNewReportsBindError(t *testing.T) {
	testutil.VerifyNone(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()
	srv, err := New(busy.Addr().String(), prometheus.NewRegistry(), alwaysReady, discardLogger())
	if err == nil {
		_ = srv.ln.Close()
		t.Fatalf("New on %s, which is in use, succeeded", busy.Addr())
	}
	if !strings.Contains(err.Error(), "admin listener") {
		t.Errorf("New on a busy address: error %q does not name the admin listener", err)
	}
}

func TestShutdownStopsServing(t *testing.T) {
	testutil.VerifyNone(t)
	a := startAdmin(t, prometheus.NewRegistry(), alwaysReady, nil)
	addr := a.srv.Addr().String()

	// A kept-alive connection left idle: Shutdown must close it too (its
	// server goroutine would otherwise outlive the test).
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	keepAlive := &http.Client{Transport: tr, Timeout: ioTimeout}
	resp, err := keepAlive.Get(a.base + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()

	a.stop(t) // Shutdown returns nil and Serve returns nil

	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err == nil {
		_ = c.Close()
		t.Fatalf("connected to %s after Shutdown", addr)
	}
}

func TestShutdownWaitsForRequestInFlight(t *testing.T) {
	testutil.VerifyNone(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	a := startAdmin(t, prometheus.NewRegistry(), alwaysReady, map[string]http.Handler{
		"GET /slow": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			close(entered)
			<-release
			_, _ = io.WriteString(w, "done")
		}),
	})
	t.Cleanup(unblock) // registered after startAdmin: runs before its shutdown
	type result struct {
		r   response
		err error
	}
	results := make(chan result, 1)
	go func() {
		r, err := a.do(http.MethodGet, "/slow")
		results <- result{r, err}
	}()
	select {
	case <-entered:
	case <-time.After(ioTimeout):
		t.Fatal("GET /slow never reached its handler")
	}

	// While the handler runs, Shutdown cannot complete.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := a.srv.Shutdown(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a request in flight = %v, want context.DeadlineExceeded", err)
	}
	select {
	case err := <-a.served:
		if err != nil {
			t.Fatalf("Serve after Shutdown = %v, want nil", err)
		}
		a.served <- nil // for stop
	case <-time.After(ioTimeout):
		t.Fatal("Serve did not return after Shutdown closed its listener")
	}

	// The request in flight still completes.
	unblock()
	select {
	case res := <-results:
		if res.err != nil {
			t.Fatalf("GET /slow across Shutdown: %v", res.err)
		}
		if res.r.status != http.StatusOK || res.r.body != "done" {
			t.Fatalf("GET /slow across Shutdown = %d %q, want 200 \"done\"", res.r.status, res.r.body)
		}
	case <-time.After(ioTimeout):
		t.Fatal("GET /slow did not complete after its handler was released")
	}
	a.stop(t) // with nothing in flight, Shutdown now completes
}
