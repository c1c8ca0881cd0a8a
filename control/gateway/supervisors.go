package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The supervisors of the write API, for admin tokens:
//
//	GET    /v1/supervisors        -> {"supervisors":[<supervisorInfo>, ...]}
//	GET    /v1/supervisors/{id}   -> <supervisorInfo>, 404 when unknown
//	DELETE /v1/supervisors/{id}   -> 204, 404 when the store holds nothing of it
//
// The list has every id the gateway knows: named by a supervisor token, or
// with a document, a session record, an advertisement or a pool binding in
// the store. DELETE forgets an id: its session is marked withdrawn (its
// push streams end on every replica, its later requests get 409 for one
// session TTL, after which a new session may open), its advertisement is
// removed (its routes are withdrawn from discovery), then its document and
// its pool binding. A supervisor token that names the id stays: the tokens
// file is the operator's.
//
// Unknown ids. A document for an id that no supervisor token names and
// that has no pool binding, session or advertisement is most likely a typo
// (a pool member that never connected is unknown too): the configuration
// file's import and the write API warn about it and count it
// (applistener_gateway_unknown_supervisors_total), and refuse it with
// Config.StrictSupervisors.

// Session states of supervisorInfo.
const (
	sessionActive    = "active"
	sessionWithdrawn = "withdrawn"
	sessionNone      = "none"
)

// supervisorInfo is one entry of GET /v1/supervisors.
type supervisorInfo struct {
	Supervisor string `json:"supervisor"`
	// LastSeen is the latest of its session's opening and its last
	// advertisement; absent when the store holds neither.
	LastSeen *time.Time `json:"last_seen,omitempty"`
	// Session is "active", "withdrawn" or "none" (no record: never, or
	// expired).
	Session   string `json:"session"`
	SessionID string `json:"session_id,omitempty"`
	// Instances counts the valid instances of its document; Document
	// tells whether it has one stored.
	Instances int  `json:"instances"`
	Document  bool `json:"document"`
	// Routes counts the valid routes of its advertisement.
	Routes int `json:"routes"`
	// Pool is the pool it is bound to, Token whether a supervisor token
	// names it.
	Pool  string `json:"pool,omitempty"`
	Token bool   `json:"token"`
}

// unknownMetric counts documents for unknown supervisor ids.
type unknownMetric = *prometheus.CounterVec

func newUnknownMetric(reg prometheus.Registerer) unknownMetric {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "applistener_gateway_unknown_supervisors_total",
		Help: "Documents given to a supervisor id the gateway does not know (no supervisor token, pool binding, session or advertisement), by source (config, write_api) and action (warned, refused).",
	}, []string{"source", "action"})
	for _, s := range []string{"config", "write_api"} {
		for _, a := range []string{"warned", "refused"} {
			c.WithLabelValues(s, a)
		}
	}
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

// knowsSupervisor reports whether the gateway knows sup: a supervisor token
// names it, or the store holds its pool binding, session or advertisement.
func (g *Gateway) knowsSupervisor(st *stateSnapshot, sup string) bool {
	if st.namesSupervisor(sup) {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	_, p := g.pools[sup]
	_, s := g.sessions[sup]
	_, a := g.installations[sup]
	return p || s || a
}

// unknownSupervisors returns, sorted, the ids among ids that the gateway
// does not know, warning about and counting each (source: "config" or
// "write_api"); refused tells whether StrictSupervisors refuses them.
func (g *Gateway) unknownSupervisors(source string, ids []string) (unknown []string, refused bool) {
	st := g.state.Load()
	for _, sup := range ids {
		if !g.knowsSupervisor(st, sup) {
			unknown = append(unknown, sup)
		}
	}
	slices.Sort(unknown)
	action := "warned"
	if g.strictSupervisors {
		action = "refused"
	}
	for _, sup := range unknown {
		g.unknown.WithLabelValues(source, action).Inc()
		g.log.Warn("document for an unknown supervisor id: no supervisor token names it and it never connected (a typo?)",
			"supervisor", sup, "source", source, "strict", g.strictSupervisors)
	}
	return unknown, g.strictSupervisors && len(unknown) > 0
}

// errUnknownSupervisors refuses a configuration file under
// StrictSupervisors.
type errUnknownSupervisors []string

func (e errUnknownSupervisors) Error() string {
	return fmt.Sprintf("unknown supervisor ids (no supervisor token names them, none connected; --strict-supervisors): %s",
		strings.Join(e, ", "))
}

// supervisorInfos returns what the gateway knows of every supervisor id (or
// of one, when only is not ""), sorted by id.
func (g *Gateway) supervisorInfos(only string) []supervisorInfo {
	st := g.state.Load()
	byID := make(map[string]*supervisorInfo)
	info := func(sup string) *supervisorInfo {
		if only != "" && sup != only {
			return nil
		}
		in := byID[sup]
		if in == nil {
			in = &supervisorInfo{Supervisor: sup, Session: sessionNone}
			byID[sup] = in
		}
		return in
	}
	seen := func(in *supervisorInfo, t time.Time) {
		if !t.IsZero() && (in.LastSeen == nil || t.After(*in.LastSeen)) {
			t := t.UTC()
			in.LastSeen = &t
		}
	}
	for i := range st.tokens {
		if sup := st.tokens[i].supervisor; sup != "" {
			if in := info(sup); in != nil {
				in.Token = true
			}
		}
	}
	for sup := range st.docs {
		if in := info(sup); in != nil {
			in.Document = true
			in.Instances = documentInstances(st, sup)
		}
	}
	g.mu.Lock()
	for sup, s := range g.sessions {
		if in := info(sup); in != nil {
			in.Session, in.SessionID = sessionActive, s.rec.Session
			if !s.holds() {
				in.Session = sessionWithdrawn
			}
			seen(in, s.rec.Since)
		}
	}
	for sup, adv := range g.installations {
		if in := info(sup); in != nil {
			in.Routes = len(adv.routes)
			seen(in, adv.received)
		}
	}
	for sup, pool := range g.pools {
		if in := info(sup); in != nil {
			in.Pool = pool
		}
	}
	g.mu.Unlock()
	out := make([]supervisorInfo, 0, len(byID))
	for _, in := range byID {
		out = append(out, *in)
	}
	slices.SortFunc(out, func(a, b supervisorInfo) int { return strings.Compare(a.Supervisor, b.Supervisor) })
	return out
}

// documentInstances counts the valid instances of sup's document: the
// instances its grants come from.
func documentInstances(st *stateSnapshot, sup string) int {
	set := make(map[[2]string]struct{})
	for k := range st.grants[sup] {
		set[[2]string{k.workspace, k.sandbox}] = struct{}{}
	}
	return len(set)
}

// serveSupervisors serves GET /v1/supervisors.
func (g *Gateway) serveSupervisors(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointSupervisors
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use GET")
		return
	}
	if !g.authorizeAdmin(w, r, endpoint, "") {
		return
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	g.writeJSON(w, endpoint, map[string][]supervisorInfo{"supervisors": g.supervisorInfos("")})
}

// serveSupervisor serves GET and DELETE of /v1/supervisors/{id}.
func (g *Gateway) serveSupervisor(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointSupervisors
	sup, ok := g.adminSupervisorRequest(w, r, endpoint, http.MethodGet, http.MethodDelete)
	if !ok {
		return
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	if r.Method == http.MethodGet {
		infos := g.supervisorInfos(sup)
		if len(infos) == 0 {
			g.fail(w, endpoint, http.StatusNotFound, "no such supervisor")
			return
		}
		g.writeJSON(w, endpoint, infos[0])
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 4*etcdOpTimeout)
	defer cancel()
	found, err := g.forgetSupervisor(ctx, sup)
	switch {
	case err != nil:
		g.log.Error("write API: supervisor not forgotten", "supervisor", sup, "err", err)
		g.unavailable(w, endpoint, "the store cannot be written")
		return
	case !found:
		g.fail(w, endpoint, http.StatusNotFound, "the store holds nothing of this supervisor")
		return
	}
	w.WriteHeader(http.StatusNoContent)
	g.m.request(endpoint, http.StatusNoContent)
	g.log.Info("write API: supervisor forgotten", "supervisor", sup, "remote", r.RemoteAddr)
}

// writeJSON answers 200 with v as one line of JSON.
func (g *Gateway) writeJSON(w http.ResponseWriter, endpoint string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		g.fail(w, endpoint, http.StatusInternalServerError, "cannot encode the answer")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	g.m.request(endpoint, http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}

// forgetSupervisor removes sup's document (pushed to its open streams as
// the empty document), ends its session (marked withdrawn, so that its
// streams end and it cannot take the record back for one TTL), and removes
// its advertisement and its pool binding. found is false when the store
// held none of them.
func (g *Gateway) forgetSupervisor(ctx context.Context, sup string) (found bool, err error) {
	for range writeAttempts {
		st := g.state.Load()
		g.mu.Lock()
		cur, hasSession := g.sessions[sup]
		adv, hasAdv := g.installations[sup]
		_, hasPool := g.pools[sup]
		g.mu.Unlock()
		doc, hasDoc := st.docs[sup]
		found = found || hasSession || hasAdv || hasPool || hasDoc
		retry := false
		// write applies one change and waits until the view has it, so
		// that the document's removal reaches the streams before their
		// session ends them.
		write := func(what string, put bool, key string, value []byte, o putOptions) error {
			var rev int64
			var ok bool
			var err error
			if put {
				rev, ok, err = g.store.put(ctx, key, value, o)
			} else {
				rev, ok, err = g.store.del(ctx, key, o.cond)
			}
			if err == nil {
				err = g.waitApplied(ctx, rev)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			retry = retry || !ok
			return nil
		}
		if hasDoc {
			if err := write("remove the document", false, keyDocs+sup, nil, putOptions{cond: doc.modRev}); err != nil {
				return found, err
			}
		}
		if hasSession && cur.holds() {
			rec := cur.rec
			rec.Withdrawn = true
			value, err := json.Marshal(rec)
			if err != nil {
				return found, fmt.Errorf("encode the session: %w", err)
			}
			if err := write("end the session", true, keySessions+sup, value, putOptions{ttl: g.sessionTTL, cond: cur.modRev}); err != nil {
				return found, err
			}
		}
		if hasAdv {
			if err := write("remove the advertisement", false, keyAds+sup, nil, putOptions{cond: adv.modRev}); err != nil {
				return found, err
			}
		}
		if hasPool {
			if err := write("remove the pool binding", false, keyPools+sup, nil, putOptions{cond: anyRevision}); err != nil {
				return found, err
			}
		}
		if !retry {
			return found, nil
		}
		// A record changed meanwhile (a request of the supervisor): the
		// view has it now; look again.
	}
	return found, fmt.Errorf("the records of supervisor %s keep changing", sup)
}

// checkFileSupervisorsLocked warns about the ids of the configuration file
// that the gateway does not know and, under StrictSupervisors, refuses the
// file (nothing of it is imported; it is looked at again when it or the
// tokens file changes). reloadMu is held.
func (g *Gateway) checkFileSupervisorsLocked() error {
	ids := make([]string, 0, len(g.fileDocs))
	for sup := range g.fileDocs {
		ids = append(ids, sup)
	}
	unknown, refused := g.unknownSupervisors("config", ids)
	g.importRefused = refused
	if !refused {
		return nil
	}
	g.importPending = false
	err := errUnknownSupervisors(unknown)
	g.log.Error("gateway config not imported; keeping the stored documents", "path", g.configPath, "err", err)
	return fmt.Errorf("config file %s: %w", g.configPath, err)
}

// UnknownSupervisorHeader is the response header of a write API PUT for a
// supervisor id the gateway does not know (the write is done): the CLI
// prints it as a warning.
const UnknownSupervisorHeader = "X-Applistener-Warning"

// admitSupervisor checks the id of a write API PUT: an unknown id is
// warned about (UnknownSupervisorHeader) or, under StrictSupervisors,
// refused with 404, answered here (false).
func (g *Gateway) admitSupervisor(w http.ResponseWriter, sup string) bool {
	unknown, refused := g.unknownSupervisors("write_api", []string{sup})
	switch {
	case refused:
		g.fail(w, endpointInstances, http.StatusNotFound,
			"unknown supervisor id: no supervisor token names it and it never connected (the gateway runs with --strict-supervisors)")
		return false
	case len(unknown) > 0:
		w.Header().Set(UnknownSupervisorHeader, "unknown supervisor id: no supervisor token names it and it never connected (a typo?)")
	}
	return true
}
