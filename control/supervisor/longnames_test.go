package supervisor

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// The advertised set carries a UUID sandbox's hashed hostname beside its
// readable names, and every entry passes the gateway's and the discovery
// client's check.
func TestInstallationsHashedHostname(t *testing.T) {
	const uuid = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	table := routes.NewTable(routes.Options{Domain: testDomain, Freshness: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc, err := routes.ParseDocument([]byte(`{"revision":"r1","instances":[{"workspace":"team","sandbox":"` + uuid + `",` +
		`"services":[{"name":"jupyter-lab-notebook","port":8888},{"name":"web","port":8080}]}]}`))
	if err != nil || len(doc.Rejected) != 0 {
		t.Fatalf("ParseDocument: %v %+v", err, doc)
	}
	table.Apply(doc)
	set := Installations(table, api.AdvertisedEndpoint{Host: "10.0.0.7", Port: 8443})
	want := map[string]string{
		"h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq." + testDomain: "jupyter-lab-notebook",
		"team--" + uuid + "--web." + testDomain:                                "web",
	}
	if len(set.Installations) != len(want) {
		t.Fatalf("installations %+v", set.Installations)
	}
	for _, a := range set.Installations {
		if want[a.Hostname] != a.Name || a.Workspace != "team" || a.Sandbox != uuid {
			t.Errorf("advertised %+v", a)
		}
		r := api.ServiceRoute{Hostname: a.Hostname, Workspace: a.Workspace, Sandbox: a.Sandbox, Name: a.Name,
			ExpiresAt: a.ExpiresAt, Endpoint: api.RouteEndpoint(a.Endpoint)}
		if err := api.CheckRoute(&r, "team"); err != nil {
			t.Errorf("CheckRoute(%s): %v", a.Hostname, err)
		}
		if strings.Contains(a.Hostname, "jupyter") {
			t.Errorf("hostname %s: the readable label does not fit and must not be used", a.Hostname)
		}
	}
}
