package supervisor

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
)

// TestUsageHandler: GET /v1/usage is {"instances":[...]} with the fields
// the README documents.
func TestUsageHandler(t *testing.T) {
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(doc)
	inst := table.Lookup("team--demo--web.apps.test").Instance
	inst.CountRequest()
	end := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	inst.CountEnded(10, 20, 1500*time.Millisecond, end)
	srv := httptest.NewServer(UsageHandler(table))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var got struct {
		Instances []map[string]any `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"workspace": "team", "sandbox": "demo", "bytes_in": 10.0, "bytes_out": 20.0, "requests": 1.0,
		"websocket_seconds": 1.5, "websockets_open": 0.0, "active_streams": 0.0, "last_activity": "2030-01-02T03:04:05Z", "installed": true}
	if len(got.Instances) != 1 {
		t.Fatalf("instances %v", got.Instances)
	}
	for k, v := range want {
		if got.Instances[0][k] != v {
			t.Errorf("%s = %v, want %v", k, got.Instances[0][k], v)
		}
	}
	if len(got.Instances[0]) != len(want) {
		t.Errorf("fields %v; want exactly %v", got.Instances[0], want)
	}
}
