package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

const (
	uuidSandbox = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	longService = "jupyter-lab-notebook" // team--<uuid>--jupyter-lab-notebook is 64 characters
)

// A UUID sandbox's routes are published: the long service under its hashed
// hostname beside the readable names, the short one readable. An
// advertisement of the readable-but-too-long hostname is rejected.
func TestDiscoveryHashedHostnames(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	writeFileAtomic(t, f.configPath, sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", uuidSandbox, []string{longService, "web"}}},
	}))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute)
	long := testRoute{ws: "team", sb: uuidSandbox, name: longService, version: 1, expires: exp}
	web := testRoute{ws: "team", sb: uuidSandbox, name: "web", version: 2, expires: exp}
	f.put("sup-1", routesTokSup1, long, web)
	hashed := "h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq.apps.test"
	s := f.snapshot("team", routesTokTeam)
	r := s.Lookup(hashed)
	if len(s.Routes) != 2 || r == nil || r.Workspace != "team" || r.Sandbox != uuidSandbox || r.Name != longService {
		t.Fatalf("snapshot %+v, want %s beside its readable names", s.Routes, hashed)
	}
	if s.Lookup("team--"+uuidSandbox+"--web.apps.test") == nil {
		t.Fatalf("snapshot %+v: the readable web route is missing", s.Routes)
	}
	// The readable-but-too-long name is not a hostname of the route.
	entry := long.entry()
	entry["hostname"] = "team--" + uuidSandbox + "--" + longService + ".apps.test"
	b, _ := json.Marshal(map[string]any{"installations": []any{entry, web.entry()}})
	if resp, body := f.do(http.MethodPut, "/v1/supervisors/sup-1/installations", routesTokSup1, bytes.NewReader(b)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	s = f.snapshot("team", routesTokTeam)
	if len(s.Routes) != 1 || s.Routes[0].Name != "web" {
		t.Fatalf("after the readable-but-too-long advertisement: %+v", s.Routes)
	}
	if n := f.metric("applistener_gateway_installations_rejected_total"); n != 1 {
		t.Errorf("rejected metric %v, want 1", n)
	}
	if !strings.Contains(f.logs.String(), "first label longer than 63") {
		t.Errorf("no log of the rejection reason")
	}
}

// A conflict on a hashed hostname is forgotten when its routes expire, also
// when only that workspace is republished (a GET before the loop runs).
func TestDiscoveryHashedConflictForgotten(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{noRun: true})
	writeFileAtomic(t, f.configPath, sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", uuidSandbox, []string{longService}}},
		"sup-2": {{"team", uuidSandbox, []string{longService}}},
	}))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(300 * time.Millisecond)
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: uuidSandbox, name: longService, version: 1, expires: exp, host: "10.0.0.1"})
	f.put("sup-2", routesTokSup2, testRoute{ws: "team", sb: uuidSandbox, name: longService, version: 1, expires: exp, host: "10.0.0.2"})
	if s := f.snapshot("team", routesTokTeam); len(s.Routes) != 1 || !routes.IsHashedLabel(strings.TrimSuffix(s.Routes[0].Hostname, ".apps.test")) {
		t.Fatalf("snapshot %+v", s.Routes)
	}
	if n := f.metric("applistener_gateway_discovery_conflicts"); n != 1 {
		t.Fatalf("conflicts gauge %v, want 1", n)
	}
	testutil.Eventually(t, 5*time.Second, "the routes to expire", func() bool {
		return len(f.snapshot("team", routesTokTeam).Routes) == 0
	})
	if n := f.metric("applistener_gateway_discovery_conflicts"); n != 0 {
		t.Errorf("conflicts gauge %v after the routes expired, want 0", n)
	}
}
