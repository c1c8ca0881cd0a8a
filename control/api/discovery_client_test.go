package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
)

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

func discSnapshotLine(t *testing.T, ws, rev string, rs ...api.ServiceRoute) string {
	t.Helper()
	if rs == nil {
		rs = []api.ServiceRoute{}
	}
	b, err := json.Marshal(api.RouteSnapshot{Workspace: ws, Revision: rev, Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func discTestRoute(sb, name string, exp time.Time) api.ServiceRoute {
	host := "team--" + sb + ".apps.test"
	if name != "" {
		host = "team--" + sb + "--" + name + ".apps.test"
	}
	return api.ServiceRoute{Hostname: host, Workspace: "team", Sandbox: sb, Name: name, Supervisor: "sup-1",
		InstallationVersion: 1, ExpiresAt: exp.UTC(), Endpoint: api.RouteEndpoint{Host: "127.0.0.1", Port: 8443}}
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
	c := &api.DiscoveryClient{Gateway: srv.URL, StreamIdleTimeout: 150 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	defer c.CloseIdleConnections()
	col := controltest.NewCollector()
	cancel, _ := controltest.RunWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.Add) })
	start := time.Now()
	col.Next(t, time.Second)
	if s := col.Next(t, 2*time.Second); s.Revision != "2" {
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
	c := &api.DiscoveryClient{Gateway: srv.URL}
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
	c := &api.DiscoveryClient{Gateway: srv.URL}
	defer c.CloseIdleConnections()
	col := controltest.NewCollector()
	cancel, _ := controltest.RunWatch(t, func(ctx context.Context) error { return c.WatchUnexpired(ctx, "team", col.Add) })
	first := col.Next(t, time.Second)
	if got := len(first.Routes); got != 2 {
		t.Fatalf("first set: %+v", first.Routes)
	}
	second := col.Next(t, 2*time.Second)
	late := time.Since(exp)
	if len(second.Routes) != 1 || second.Routes[0].Hostname != b.Hostname {
		t.Fatalf("after expiry: %+v", second.Routes)
	}
	t.Logf("local expiry dropped the route %v after expires_at", late.Round(time.Millisecond))
	if late < 0 || late > 500*time.Millisecond {
		t.Errorf("dropped %v after expires_at", late)
	}
	select {
	case s := <-col.C:
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
	c := &api.DiscoveryClient{Gateway: srv.URL, MaxBackoff: 20 * time.Millisecond}
	defer c.CloseIdleConnections()
	col := controltest.NewCollector()
	cancel, _ := controltest.RunWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.Add) })
	if s := col.Next(t, 2*time.Second); s.Revision != "9" {
		t.Fatalf("snapshot %+v", s)
	}
	cancel()
	if conns.Load() < 3 {
		t.Errorf("%d attempts", conns.Load())
	}
}

func TestRouteSnapshotUnexpired(t *testing.T) {
	now := time.Now()
	s := &api.RouteSnapshot{Workspace: "team", Revision: "3", Routes: []api.ServiceRoute{
		discTestRoute("a", "", now.Add(-time.Second)),
		discTestRoute("b", "", now),
		discTestRoute("c", "", now.Add(time.Second)),
	}}
	u := s.Unexpired(now)
	if len(u.Routes) != 1 || u.Routes[0].Sandbox != "c" || u.Revision != "3" || len(s.Routes) != 3 {
		t.Fatalf("Unexpired: %+v", u)
	}
	if !s.NextExpiry().Equal(now.Add(-time.Second).UTC()) || !(&api.RouteSnapshot{}).NextExpiry().IsZero() {
		t.Error("NextExpiry")
	}
	var nilSnap *api.RouteSnapshot
	if nilSnap.Unexpired(now) != nil || nilSnap.Lookup("x") != nil {
		t.Error("nil snapshot")
	}
	if !slices.Equal([]string{"team--c.apps.test"}, controltest.Hostnames(u)) {
		t.Error("hostnames")
	}
	if e := (api.RouteEndpoint{Host: "::1", Port: 8443}).String(); e != "[::1]:8443" {
		t.Errorf("endpoint %s", e)
	}
}
