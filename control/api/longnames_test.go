package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

const (
	uuidSandbox = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	longService = "jupyter-lab-notebook" // team--<uuid>--jupyter-lab-notebook is 64 characters
)

// discLongRoute is a route of team/<uuid>/<name> under its hostname
// (hashed when the readable label does not fit).
func discLongRoute(ws, sb, name string) api.ServiceRoute {
	return api.ServiceRoute{Hostname: routes.Hostname(ws, sb, name, "apps.test"), Workspace: ws, Sandbox: sb, Name: name,
		Supervisor: "sup-1", InstallationVersion: 1, ExpiresAt: time.Now().Add(time.Minute).UTC(),
		Endpoint: api.RouteEndpoint{Host: "127.0.0.1", Port: 8443}}
}

func TestCheckRouteLongNames(t *testing.T) {
	hashed := discLongRoute("team", uuidSandbox, longService)
	if !routes.IsHashedLabel(strings.TrimSuffix(hashed.Hostname, ".apps.test")) {
		t.Fatalf("fixture %q is not hashed", hashed.Hostname)
	}
	mod := func(f func(r *api.ServiceRoute)) api.ServiceRoute {
		r := hashed
		f(&r)
		return r
	}
	tests := []struct {
		name    string
		r       api.ServiceRoute
		wantErr string // "" = valid
	}{
		{"hashed", hashed, ""},
		{"readable uuid", discLongRoute("team", uuidSandbox, "web"), ""},
		{"readable uuid unnamed", discLongRoute("team", uuidSandbox, ""), ""},
		{"63-character names", discLongRoute("team", strings.Repeat("s", 63), strings.Repeat("v", 63)), ""},
		{"readable but too long", mod(func(r *api.ServiceRoute) {
			r.Hostname = "team--" + uuidSandbox + "--" + longService + ".apps.test"
		}), "first label longer than 63"},
		{"hashed label of another sandbox", mod(func(r *api.ServiceRoute) {
			r.Sandbox = "1b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
		}), "does not name"},
		{"hashed label of another service", mod(func(r *api.ServiceRoute) { r.Name = "" }), "does not name"},
		{"hashed label of another workspace", mod(func(r *api.ServiceRoute) {
			r.Hostname = routes.Hostname("lab", uuidSandbox, longService, "apps.test")
		}), "does not name"},
		{"hashed although readable fits", mod(func(r *api.ServiceRoute) {
			r.Name = "web"
			r.Hostname = routes.HashedLabel("team", uuidSandbox, "web") + ".apps.test"
		}), "does not name"},
		{"sandbox too long", mod(func(r *api.ServiceRoute) {
			r.Sandbox = strings.Repeat("s", 64)
			r.Hostname = routes.Hostname(r.Workspace, r.Sandbox, r.Name, "apps.test")
		}), "sandbox: name"},
		{"upper-case hashed", mod(func(r *api.ServiceRoute) { r.Hostname = strings.ToUpper(r.Hostname) }), "normalized"},
	}
	for _, tt := range tests {
		err := api.CheckRoute(&tt.r, tt.r.Workspace)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: CheckRoute(%q) = %v", tt.name, tt.r.Hostname, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: CheckRoute(%q) = %v, want an error containing %q", tt.name, tt.r.Hostname, err, tt.wantErr)
		}
	}
}

// The discovery client keeps hashed routes of its workspace and drops those
// whose hashed label is another's.
func TestDiscoveryClientHashedRoutes(t *testing.T) {
	good := discLongRoute("team", uuidSandbox, longService)
	foreign := good
	foreign.Sandbox = "other"
	srv, _ := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", "5", good, foreign))
	})
	c := &api.DiscoveryClient{Gateway: srv.URL}
	defer c.CloseIdleConnections()
	s, err := c.Get(context.Background(), "team")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Routes) != 1 || s.Routes[0] != good || s.Lookup(good.Hostname) == nil {
		t.Fatalf("routes %+v, want only %+v", s.Routes, good)
	}
}
