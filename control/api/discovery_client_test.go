package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// discTokenFile writes token to a file and returns its path.
func discTokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *discFixture) discoveryClient(token string) *DiscoveryClient {
	c := &DiscoveryClient{Gateway: f.srv.URL, TokenFile: discTokenFile(f.t, token), MaxBackoff: 200 * time.Millisecond,
		Logger: f.g.log}
	f.t.Cleanup(c.CloseIdleConnections)
	return c
}

// discCollector records the snapshots a watch delivers.
type discCollector struct {
	mu    sync.Mutex
	snaps []*RouteSnapshot
	ch    chan *RouteSnapshot
}

func newDiscCollector() *discCollector { return &discCollector{ch: make(chan *RouteSnapshot, 1024)} }

func (c *discCollector) add(s *RouteSnapshot) {
	c.mu.Lock()
	c.snaps = append(c.snaps, s)
	c.mu.Unlock()
	c.ch <- s
}

func (c *discCollector) next(t *testing.T, within time.Duration) *RouteSnapshot {
	t.Helper()
	select {
	case s := <-c.ch:
		return s
	case <-time.After(within):
		t.Fatalf("no snapshot within %v", within)
		return nil
	}
}

// runWatch runs watch in a goroutine until the test ends; the returned
// channel gets its result.
func runWatch(t *testing.T, watch func(ctx context.Context) error) (cancel func(), result chan error) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	result = make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		result <- watch(ctx)
	}()
	var once sync.Once
	cancel = func() {
		once.Do(func() {
			cancelCtx()
			<-done
		})
	}
	t.Cleanup(cancel)
	return cancel, result
}

func TestDiscoveryClientGetAndWatch(t *testing.T) {
	f := newDiscFixture(t, discOptions{maxLifetime: 300 * time.Millisecond, keepalive: 50 * time.Millisecond})
	exp := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	f.put("sup-1", discTokSup1, discRoute{ws: "team", sb: "demo", name: "web", version: 3, expires: exp, host: "10.42.1.27"})
	c := f.discoveryClient(discTokTeam)
	s, err := c.Get(context.Background(), "team")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Routes) != 1 || s.Routes[0].Endpoint != (RouteEndpoint{"10.42.1.27", 8443}) || !s.Routes[0].ExpiresAt.Equal(exp) ||
		s.Routes[0].Supervisor != "sup-1" || s.Routes[0].InstallationVersion != 3 {
		t.Fatalf("Get: %+v", s)
	}
	if r := s.Lookup("team--demo--web.apps.test"); r == nil || r.Name != "web" {
		t.Errorf("Lookup: %+v", r)
	}
	if s.Lookup("team--demo.apps.test") != nil {
		t.Error("Lookup of an absent host")
	}

	col := newDiscCollector()
	cancel, result := runWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.add) })
	if s := col.next(t, time.Second); len(s.Routes) != 1 {
		t.Fatalf("first: %+v", s)
	}
	f.put("sup-1", discTokSup1)
	if s := col.next(t, time.Second); len(s.Routes) != 0 {
		t.Fatalf("after withdrawal: %+v", s)
	}
	// The gateway ends the stream at its lifetime; the client reconnects
	// and gets the current set again.
	if s := col.next(t, 2*time.Second); len(s.Routes) != 0 {
		t.Fatalf("after reconnecting: %+v", s)
	}
	if n := f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", discEndLifetime); n < 1 {
		t.Errorf("lifetime disconnects %v", n)
	}
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v, want context.Canceled", err)
	}
}

func TestDiscoveryClientRefusals(t *testing.T) {
	f := newDiscFixture(t, discOptions{})
	c := f.discoveryClient(discTokTeam)
	_, err := c.Get(context.Background(), "lab")
	var se *DiscoveryStatusError
	if !errors.As(err, &se) || se.Code != 403 || !IsDiscoveryRefusal(err) {
		t.Fatalf("Get of an ungranted workspace: %v", err)
	}
	start := time.Now()
	err = c.Watch(context.Background(), "lab", func(*RouteSnapshot) { t.Error("snapshot delivered") })
	if !IsDiscoveryRefusal(err) || time.Since(start) > time.Second {
		t.Fatalf("Watch of an ungranted workspace: %v after %v", err, time.Since(start))
	}
	bad := f.discoveryClient("unknown-token")
	if _, err := bad.Get(context.Background(), "team"); !errors.As(err, &se) || se.Code != 401 {
		t.Fatalf("unknown token: %v", err)
	}
	if _, err := (&DiscoveryClient{Gateway: "ftp://x"}).Get(context.Background(), "team"); err == nil {
		t.Error("bad gateway URL accepted")
	}
	if _, err := c.Get(context.Background(), "Bad--Name"); err == nil {
		t.Error("bad workspace accepted")
	}
	// The token file is re-read: rotating it fixes the refusal.
	if err := os.WriteFile(bad.TokenFile, []byte(discTokTeam), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Get(context.Background(), "team"); err != nil {
		t.Fatalf("after rotating the token: %v", err)
	}
}

// discFakeGateway serves /v1/workspaces/{ws}/service-routes?watch=1 with
// handler, counting connections.
func discFakeGateway(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, n int)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler(w, r, int(n.Add(1)))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func discSnapshotLine(t *testing.T, ws, rev string, rs ...ServiceRoute) string {
	t.Helper()
	if rs == nil {
		rs = []ServiceRoute{}
	}
	b, err := json.Marshal(RouteSnapshot{Workspace: ws, Revision: rev, Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func discTestRoute(sb, name string, exp time.Time) ServiceRoute {
	host := "team--" + sb + ".apps.test"
	if name != "" {
		host = "team--" + sb + "--" + name + ".apps.test"
	}
	return ServiceRoute{Hostname: host, Workspace: "team", Sandbox: sb, Name: name, Supervisor: "sup-1",
		InstallationVersion: 1, ExpiresAt: exp.UTC(), Endpoint: RouteEndpoint{"127.0.0.1", 8443}}
}

// A stream that goes silent (not even keepalives) is dropped after the idle
// timeout and reopened.
func TestDiscoveryClientIdleTimeout(t *testing.T) {
	srv, conns := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", fmt.Sprint(n)))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // then silence
	})
	c := &DiscoveryClient{Gateway: srv.URL, StreamIdleTimeout: 150 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	defer c.CloseIdleConnections()
	col := newDiscCollector()
	cancel, _ := runWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.add) })
	start := time.Now()
	col.next(t, time.Second)
	if s := col.next(t, 2*time.Second); s.Revision != "2" {
		t.Fatalf("second stream: %+v", s)
	}
	t.Logf("silent stream replaced after %v (idle timeout 150ms)", time.Since(start).Round(time.Millisecond))
	cancel()
	if conns.Load() < 2 {
		t.Errorf("%d connections", conns.Load())
	}
}

// Routes that do not belong to the workspace, or whose hostname does not
// name them, are dropped by the client.
func TestDiscoveryClientDropsForeignRoutes(t *testing.T) {
	exp := time.Now().Add(time.Minute)
	good := discTestRoute("demo", "web", exp)
	foreign := discTestRoute("demo", "", exp)
	foreign.Workspace, foreign.Hostname = "lab", "lab--demo.apps.test"
	lying := discTestRoute("demo", "api", exp)
	lying.Hostname = "lab--demo--api.apps.test"
	badPort := discTestRoute("x", "", exp)
	badPort.Endpoint.Port = 0
	srv, _ := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", "5", good, foreign, lying, badPort))
	})
	c := &DiscoveryClient{Gateway: srv.URL}
	defer c.CloseIdleConnections()
	s, err := c.Get(context.Background(), "team")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Routes) != 1 || s.Routes[0].Hostname != good.Hostname {
		t.Fatalf("routes %+v", s.Routes)
	}
	if _, err := c.Get(context.Background(), "lab"); err == nil {
		t.Error("a snapshot of another workspace was accepted")
	}
}

// WatchUnexpired drops a route at its expires_at while the stream is
// silent (keepalives only).
func TestDiscoveryClientWatchUnexpired(t *testing.T) {
	exp := time.Now().Add(300 * time.Millisecond)
	a := discTestRoute("demo", "web", exp)
	b := discTestRoute("demo", "", time.Now().Add(time.Minute))
	srv, _ := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", "1", a, b))
		w.(http.Flusher).Flush()
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tk.C:
				_, _ = fmt.Fprint(w, `{"keepalive":true}`+"\n")
				w.(http.Flusher).Flush()
			}
		}
	})
	c := &DiscoveryClient{Gateway: srv.URL}
	defer c.CloseIdleConnections()
	col := newDiscCollector()
	cancel, _ := runWatch(t, func(ctx context.Context) error { return c.WatchUnexpired(ctx, "team", col.add) })
	first := col.next(t, time.Second)
	if got := len(first.Routes); got != 2 {
		t.Fatalf("first set: %+v", first.Routes)
	}
	second := col.next(t, 2*time.Second)
	late := time.Since(exp)
	if len(second.Routes) != 1 || second.Routes[0].Hostname != b.Hostname {
		t.Fatalf("after expiry: %+v", second.Routes)
	}
	t.Logf("local expiry dropped the route %v after expires_at", late.Round(time.Millisecond))
	if late < 0 || late > 500*time.Millisecond {
		t.Errorf("dropped %v after expires_at", late)
	}
	select {
	case s := <-col.ch:
		t.Errorf("unexpected extra set %+v", s)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
}

func TestDiscoveryClientRetriesUnavailable(t *testing.T) {
	srv, conns := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n < 3 {
			http.Error(w, "503 Service Unavailable: discovery is not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", "9"))
	})
	c := &DiscoveryClient{Gateway: srv.URL, MaxBackoff: 20 * time.Millisecond}
	defer c.CloseIdleConnections()
	col := newDiscCollector()
	cancel, _ := runWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.add) })
	if s := col.next(t, 2*time.Second); s.Revision != "9" {
		t.Fatalf("snapshot %+v", s)
	}
	cancel()
	if conns.Load() < 3 {
		t.Errorf("%d attempts", conns.Load())
	}
}

func TestRouteSnapshotUnexpired(t *testing.T) {
	now := time.Now()
	s := &RouteSnapshot{Workspace: "team", Revision: "3", Routes: []ServiceRoute{
		discTestRoute("a", "", now.Add(-time.Second)),
		discTestRoute("b", "", now),
		discTestRoute("c", "", now.Add(time.Second)),
	}}
	u := s.Unexpired(now)
	if len(u.Routes) != 1 || u.Routes[0].Sandbox != "c" || u.Revision != "3" || len(s.Routes) != 3 {
		t.Fatalf("Unexpired: %+v", u)
	}
	if !s.NextExpiry().Equal(now.Add(-time.Second).UTC()) || !(&RouteSnapshot{}).NextExpiry().IsZero() {
		t.Error("NextExpiry")
	}
	var nilSnap *RouteSnapshot
	if nilSnap.Unexpired(now) != nil || nilSnap.Lookup("x") != nil {
		t.Error("nil snapshot")
	}
	if !slices.Equal([]string{"team--c.apps.test"}, hostnames(u)) {
		t.Error("hostnames")
	}
	if e := (RouteEndpoint{"::1", 8443}).String(); e != "[::1]:8443" {
		t.Errorf("endpoint %s", e)
	}
}
