package supervisor

import (
	"encoding/json"
	"net/http"

	"github.com/applistener/applistener/routes"
)

// Usage is the body of GET /v1/usage.
type Usage struct {
	Instances []routes.InstanceUsage `json:"instances"`
}

// UsageHandler serves GET /v1/usage on the admin address: per instance,
// the bytes, requests, WebSocket-seconds and last activity since it was
// installed, for every installed instance and for the instances withdrawn
// less than the table's usage retention ago (routes.Table.Usage). It is
// not bounded by the metrics label cap.
func UsageHandler(t *routes.Table) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Usage{Instances: t.Usage()})
	})
}
