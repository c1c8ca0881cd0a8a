package edge

import (
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// routeFor is a route of the names under their hostname (readable or
// hashed, as routes.Hostname gives it).
func routeFor(ws, sb, name string, sup *fakeSupervisor, expires time.Time) api.ServiceRoute {
	return api.ServiceRoute{Hostname: routes.Hostname(ws, sb, name, "apps.test"), Workspace: ws, Sandbox: sb, Name: name,
		Supervisor: sup.name, InstallationVersion: 1, ExpiresAt: expires, Endpoint: sup.endpoint()}
}

// The edge routes a hashed hostname by SNI; it ignores a route whose
// hostname is not the one of its names (the readable-but-too-long name, or
// another workspace's hashed label in this workspace's feed).
func TestEdgeHashedHostnames(t *testing.T) {
	const uuid = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	ca := newCA(t)
	sup1 := newFakeSupervisor(t, ca, "sup-1")
	src := newFakeSource()
	f := newEdgeFixture(t, src, ca.Pool(), "team")
	exp := time.Now().Add(time.Minute)
	hashed := routeFor("team", uuid, "jupyter-lab-notebook", sup1, exp)
	if want := "h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq.apps.test"; hashed.Hostname != want {
		t.Fatalf("fixture hostname %s, want %s", hashed.Hostname, want)
	}
	tooLong := hashed
	tooLong.Hostname = "team--" + uuid + "--jupyter-lab-notebook.apps.test"
	foreign := routeFor("lab", uuid, "jupyter-lab-notebook", sup1, exp)
	foreign.Workspace = "team" // claims team, carries lab's hashed label
	src.send(t, "team", hashed, tooLong, foreign, routeFor("team", uuid, "web", sup1, exp))
	f.expectOwner(hashed.Hostname, sup1)
	f.expectOwner("team--"+uuid+"--web.apps.test", sup1)
	f.expectUnrecognized(tooLong.Hostname)
	f.expectUnrecognized(foreign.Hostname)
	if n := f.metric("applistener_edge_routes"); n != 2 {
		t.Errorf("edge routes %v, want 2", n)
	}
}
