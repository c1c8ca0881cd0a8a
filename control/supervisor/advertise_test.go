package supervisor

import (
	"log/slog"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// TestInstallationsProtocol: an h2c service is advertised with
// "protocol":"h2c", an HTTP/1.1 one without a protocol.
func TestInstallationsProtocol(t *testing.T) {
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo",
		"services":[{"name":"rpc","port":9000,"protocol":"h2c"},{"name":"web","port":8080,"protocol":"http1"}]}]}`))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	table.Apply(doc)
	set := Installations(table, api.AdvertisedEndpoint{Host: "10.0.0.1", Port: 8443})
	got := map[string]string{}
	for _, r := range set.Installations {
		got[r.Name] = r.Protocol
	}
	if len(got) != 2 || got["rpc"] != "h2c" || got["web"] != "" {
		t.Fatalf("advertised protocols %v, want rpc h2c and web none", got)
	}
}

// TestInstallationsAccess: a private service is advertised with
// "access":"token" (and nothing else of its policy), a public one
// without; the gateway publishes it the same way in discovery.
func TestInstallationsAccess(t *testing.T) {
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler), AccessTokens: true})
	defer table.Close()
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo",
		"services":[{"name":"web","port":8080,"access":{"mode":"token","login_url":"https://login.example.com/"}},{"name":"pub","port":8081}]}]}`))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	table.Apply(doc)
	set := Installations(table, api.AdvertisedEndpoint{Host: "10.0.0.1", Port: 8443})
	got := map[string]string{}
	for _, r := range set.Installations {
		got[r.Name] = r.Access
	}
	if len(got) != 2 || got["web"] != "token" || got["pub"] != "" {
		t.Fatalf("advertised access %v, want web token and pub none", got)
	}
	for _, r := range set.Installations {
		sr := api.ServiceRoute{Hostname: r.Hostname, Workspace: r.Workspace, Sandbox: r.Sandbox, Name: r.Name,
			ExpiresAt: r.ExpiresAt, Endpoint: api.RouteEndpoint(r.Endpoint), Access: r.Access}
		if err := api.CheckRoute(&sr, "team"); err != nil {
			t.Fatalf("CheckRoute: %v", err)
		}
	}
	bad := api.ServiceRoute{Hostname: "team--demo--web.apps.test", Workspace: "team", Sandbox: "demo", Name: "web",
		ExpiresAt: time.Now(), Endpoint: api.RouteEndpoint{Host: "10.0.0.1", Port: 8443}, Access: "secret"}
	if err := api.CheckRoute(&bad, "team"); err == nil {
		t.Fatal("CheckRoute accepted access \"secret\"")
	}
}
