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
		SilentAfter float64          `json:"silent_after_seconds"`
		Instances   []map[string]any `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.SilentAfter != routes.DefaultSilentAfter.Seconds() {
		t.Errorf("silent_after_seconds %v, want the default", got.SilentAfter)
	}
	want := map[string]any{"workspace": "team", "sandbox": "demo", "bytes_in": 10.0, "bytes_out": 20.0, "requests": 1.0,
		"websocket_seconds": 1.5, "websockets_open": 0.0, "active_streams": 0.0, "last_activity": "2030-01-02T03:04:05Z", "installed": true,
		"last_request": nil, "last_websocket_frame": nil, "websockets_silent": 0.0}
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

// TestUsageHandlerActivity: the activity fields and ?silent_after=.
func TestUsageHandlerActivity(t *testing.T) {
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","services":[{"name":"web","port":8080}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(doc)
	inst := table.Lookup("team--demo--web.apps.test").Instance
	opened := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	inst.NoteRequest(opened)
	ws := inst.TrackWebSocket(opened)
	defer ws.Close()
	ws.Frame(opened.Add(30 * time.Minute))
	srv := httptest.NewServer(UsageHandler(table))
	defer srv.Close()
	get := func(query string) (int, Usage) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v1/usage" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var u Usage
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, u
	}
	code, u := get("")
	if code != http.StatusOK || len(u.Instances) != 1 {
		t.Fatalf("%d %+v", code, u)
	}
	in := u.Instances[0]
	if in.LastRequest == nil || !in.LastRequest.Equal(opened) || in.LastWebSocketFrame == nil ||
		!in.LastWebSocketFrame.Equal(opened.Add(30*time.Minute)) || in.WebSocketsSilent != 1 {
		t.Fatalf("activity %+v", in)
	}
	if code, u := get("?silent_after=45m"); code != http.StatusOK || u.SilentAfterSeconds != 2700 || u.Instances[0].WebSocketsSilent != 0 {
		t.Fatalf("silent_after=45m: %d %+v", code, u)
	}
	for _, q := range []string{"?silent_after=x", "?silent_after=0s", "?silent_after=25h"} {
		if code, _ := get(q); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
}
