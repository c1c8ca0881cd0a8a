package supervisor

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/applistener/applistener/routes"
)

// Usage is the body of GET /v1/usage.
type Usage struct {
	// SilentAfterSeconds is the silence threshold of the instances'
	// websockets_silent (?silent_after=, routes.DefaultSilentAfter by
	// default).
	SilentAfterSeconds float64                `json:"silent_after_seconds"`
	Instances          []routes.InstanceUsage `json:"instances"`
}

// Bounds of GET /v1/usage?silent_after=.
const (
	minSilentAfter = time.Second
	maxSilentAfter = 24 * time.Hour
)

// UsageHandler serves GET /v1/usage on the admin address: per instance,
// the bytes, requests, WebSocket-seconds and last activity since it was
// installed, and what tells a person from a forgotten tab (the last
// request, the last WebSocket frame, the open WebSockets silent for
// ?silent_after=DURATION, 1s to 24h, default 5m), for every installed
// instance and for the instances withdrawn less than the table's usage
// retention ago (routes.Table.Usage). It is not bounded by the metrics
// label cap.
func UsageHandler(t *routes.Table) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		silentAfter := routes.DefaultSilentAfter
		if v := r.URL.Query().Get("silent_after"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < minSilentAfter || d > maxSilentAfter {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte("400 Bad Request: silent_after must be a duration from 1s to 24h (e.g. 10m)\n"))
				return
			}
			silentAfter = d
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Usage{SilentAfterSeconds: silentAfter.Seconds(), Instances: t.UsageWith(routes.UsageOptions{SilentAfter: silentAfter})})
	})
}
