package gateway

import (
	"fmt"
	"net/http"
)

// failRequest answers code with a one-line plain-text body
// "CODE Status: reason" and counts the request under endpoint.
func failRequest(w http.ResponseWriter, m *metrics, endpoint string, code int, reason string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), reason)
	m.request(endpoint, code)
}

// getOrWatch checks that r is a GET and reads its watch parameter; it
// answers the request itself (405, 400) and returns ok=false when not.
func getOrWatch(w http.ResponseWriter, r *http.Request, m *metrics, getEndpoint, watchEndpoint string) (watch bool, endpoint string, ok bool) {
	endpoint = getEndpoint
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		failRequest(w, m, endpoint, http.StatusMethodNotAllowed, "use GET")
		return false, endpoint, false
	}
	switch r.URL.Query().Get("watch") {
	case "", "0", "false":
		return false, endpoint, true
	case "1", "true":
		return true, watchEndpoint, true
	}
	failRequest(w, m, endpoint, http.StatusBadRequest, "watch must be 1 or 0")
	return false, endpoint, false
}
