package gateway

import "net/http"

// Handler returns the gateway's HTTP handler:
//
//	GET /v1/supervisors/{id}/config            the document, ETag, 304 on If-None-Match
//	GET /v1/supervisors/{id}/config?watch=1    NDJSON: the document, then every change and keepalives
//	PUT /v1/supervisors/{id}/installations     the supervisor's installed routes (204)
//	DELETE /v1/supervisors/{id}/installations?session=  withdraw a session (204)
//	PUT, DELETE /v1/supervisors/{id}/instances/{ws}/{sb}  write API: one instance of the document
//	GET /v1/supervisors/{id}/instances          write API: the document
//	POST /v1/supervisors/{id}/instances/{ws}/{sb}/wake?session=  wake a sleeping instance (wake.go)
//	GET /v1/pools/{pool}/members                write API: the live sessions of a pool
//	GET /v1/supervisors                         write API: every known supervisor id (supervisors.go)
//	GET, DELETE /v1/supervisors/{id}            write API: one of them; forget it
//	GET /v1/workspaces/{ws}/service-routes          discovery: the published routes of ws
//	GET /v1/workspaces/{ws}/service-routes?watch=1  NDJSON: that snapshot, then every change and keepalives
//
// Every request needs "Authorization: Bearer <token>": a supervisor token
// for {id} (or a pool token), an admin token for the write API, or a
// workspace token granted {ws}. Errors have a one-line
// text/plain body.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/supervisors", g.serveSupervisors)
	mux.HandleFunc("/v1/supervisors/{id}", g.serveSupervisor)
	mux.HandleFunc("/v1/supervisors/{id}/config", g.serveConfig)
	mux.HandleFunc("/v1/supervisors/{id}/installations", g.serveInstallations)
	mux.HandleFunc("/v1/supervisors/{id}/instances", g.serveDocument)
	mux.HandleFunc("/v1/supervisors/{id}/instances/{ws}/{sb}", g.serveInstance)
	mux.HandleFunc("/v1/supervisors/{id}/instances/{ws}/{sb}/wake", g.serveWake)
	mux.HandleFunc("/v1/pools/{pool}/members", g.servePoolMembers)
	mux.Handle("/v1/workspaces/{ws}/service-routes", g.discovery)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		g.fail(w, endpointOther, http.StatusNotFound, "no such endpoint")
	})
	return mux
}
