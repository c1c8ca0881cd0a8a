package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
)

// The discovery client (package api) against this gateway.

// tokenFileOf writes token to a file and returns its path.
func tokenFileOf(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *routesFixture) discoveryClient(token string) *api.DiscoveryClient {
	c := &api.DiscoveryClient{Gateway: f.srv.URL, TokenFile: tokenFileOf(f.t, token), MaxBackoff: 200 * time.Millisecond,
		Logger: f.g.log}
	f.t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestDiscoveryClientGetAndWatch(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{maxLifetime: 300 * time.Millisecond, keepalive: 50 * time.Millisecond})
	exp := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 3, expires: exp, host: "10.42.1.27"})
	c := f.discoveryClient(routesTokTeam)
	s, err := c.Get(context.Background(), "team")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Routes) != 1 || s.Routes[0].Endpoint != (api.RouteEndpoint{Host: "10.42.1.27", Port: 8443}) || !s.Routes[0].ExpiresAt.Equal(exp) ||
		s.Routes[0].Supervisor != "sup-1" || s.Routes[0].InstallationVersion != 3 {
		t.Fatalf("Get: %+v", s)
	}
	if r := s.Lookup("team--demo--web.apps.test"); r == nil || r.Name != "web" {
		t.Errorf("Lookup: %+v", r)
	}
	if s.Lookup("team--demo.apps.test") != nil {
		t.Error("Lookup of an absent host")
	}

	col := controltest.NewCollector()
	cancel, result := controltest.RunWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.Add) })
	if s := col.Next(t, time.Second); len(s.Routes) != 1 {
		t.Fatalf("first: %+v", s)
	}
	f.put("sup-1", routesTokSup1)
	if s := col.Next(t, time.Second); len(s.Routes) != 0 {
		t.Fatalf("after withdrawal: %+v", s)
	}
	// The gateway ends the stream at its lifetime; the client reconnects
	// and gets the current set again.
	if s := col.Next(t, 2*time.Second); len(s.Routes) != 0 {
		t.Fatalf("after reconnecting: %+v", s)
	}
	if n := f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonLifetime); n < 1 {
		t.Errorf("lifetime disconnects %v", n)
	}
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v, want context.Canceled", err)
	}
}

func TestDiscoveryClientRefusals(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	c := f.discoveryClient(routesTokTeam)
	_, err := c.Get(context.Background(), "lab")
	var se *api.DiscoveryStatusError
	if !errors.As(err, &se) || se.Code != 403 || !api.IsDiscoveryRefusal(err) {
		t.Fatalf("Get of an ungranted workspace: %v", err)
	}
	start := time.Now()
	err = c.Watch(context.Background(), "lab", func(*api.RouteSnapshot) { t.Error("snapshot delivered") })
	if !api.IsDiscoveryRefusal(err) || time.Since(start) > time.Second {
		t.Fatalf("Watch of an ungranted workspace: %v after %v", err, time.Since(start))
	}
	bad := f.discoveryClient("unknown-token")
	if _, err := bad.Get(context.Background(), "team"); !errors.As(err, &se) || se.Code != 401 {
		t.Fatalf("unknown token: %v", err)
	}
	if _, err := (&api.DiscoveryClient{Gateway: "ftp://x"}).Get(context.Background(), "team"); err == nil {
		t.Error("bad gateway URL accepted")
	}
	if _, err := c.Get(context.Background(), "Bad--Name"); err == nil {
		t.Error("bad workspace accepted")
	}
	// The token file is re-read: rotating it fixes the refusal.
	if err := os.WriteFile(bad.TokenFile, []byte(routesTokTeam), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Get(context.Background(), "team"); err != nil {
		t.Fatalf("after rotating the token: %v", err)
	}
}
