package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/routes"
)

// The write API, for admin tokens:
//
//	PUT    /v1/supervisors/{id}/instances/{ws}/{sb}  body: one instance entry -> 200 {"revision":"..."}
//	DELETE /v1/supervisors/{id}/instances/{ws}/{sb}  -> 204, 404 when absent
//	GET    /v1/supervisors/{id}/instances            -> the document
//	GET    /v1/pools/{pool}/members                  -> {"members":[{"supervisor","session","since","source"}]}
//	GET    /v1/supervisors, GET/DELETE /v1/supervisors/{id}  -> the known supervisor ids; forget one (supervisors.go)
//
// An instance entry is validated exactly as the supervisor validates an
// entry of its document (routes.ParseDocument). Each write gives the
// document a new revision and is pushed at once to the supervisor's open
// push streams on every replica (through the store). Writes are
// compare-and-swap on the document's store revision, so concurrent writes
// to one document never lose each other. The pool members endpoint also
// answers that pool's own token.

// maxInstanceBytes bounds an instance entry of the write API.
const maxInstanceBytes = 1 << 20

// writeAttempts bounds the compare-and-swap retries of one write.
const writeAttempts = 8

// instanceKeyOf is the workspace and sandbox of an entry.
type instanceKeyOf struct {
	Workspace string `json:"workspace"`
	Sandbox   string `json:"sandbox"`
}

// storedDocument is a document as the write API edits it: its revision and
// its entries, each kept as written.
type storedDocument struct {
	Revision  string            `json:"revision"`
	Instances []json.RawMessage `json:"instances"`
}

// poolMember is one entry of GET /v1/pools/{pool}/members.
type poolMember struct {
	Supervisor string    `json:"supervisor"`
	Session    string    `json:"session"`
	Since      time.Time `json:"since"`
	Source     string    `json:"source"`
}

// authorizeAdmin checks for an admin token (or, when pool is not "", that
// pool's token). On failure it answers the request and returns false.
func (g *Gateway) authorizeAdmin(w http.ResponseWriter, r *http.Request, endpoint, pool string) bool {
	token, ok := bearerToken(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "missing bearer token")
		return false
	}
	t := g.state.Load().lookupDigest(sha256.Sum256([]byte(token)))
	if t == nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "unknown token")
		g.log.Info("write API request refused: unknown token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return false
	}
	if !t.admin && (pool == "" || t.pool != pool) {
		g.fail(w, endpoint, http.StatusForbidden, "an admin token is required")
		g.log.Warn("write API request refused: not an admin token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return false
	}
	return true
}

// adminSupervisorRequest admits a write API request on
// /v1/supervisors/{id}/...: its method is one of methods (405 with Allow
// otherwise), it carries the admin token, and {id} is a valid supervisor
// id (400 otherwise). It answers the refusal itself and returns the id and
// whether the request may go on.
func (g *Gateway) adminSupervisorRequest(w http.ResponseWriter, r *http.Request, endpoint string, methods ...string) (string, bool) {
	if !slices.Contains(methods, r.Method) {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use "+strings.Join(methods, " or "))
		return "", false
	}
	if !g.authorizeAdmin(w, r, endpoint, "") {
		return "", false
	}
	sup := r.PathValue("id")
	if err := validSupervisorID(sup); err != nil {
		g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
		return "", false
	}
	return sup, true
}

// serveDocument serves GET /v1/supervisors/{id}/instances.
func (g *Gateway) serveDocument(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointInstances
	sup, ok := g.adminSupervisorRequest(w, r, endpoint, http.MethodGet)
	if !ok {
		return
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	doc := g.state.Load().documentFor(sup, true)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("ETag", doc.etag)
	h.Set("Content-Length", strconv.Itoa(len(doc.body)+1))
	w.WriteHeader(http.StatusOK)
	g.m.request(endpoint, http.StatusOK)
	_, _ = w.Write(doc.body)
	_, _ = w.Write(ndjson.Newline)
}

// serveInstance serves PUT and DELETE of
// /v1/supervisors/{id}/instances/{ws}/{sb}.
func (g *Gateway) serveInstance(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointInstances
	sup, ok := g.adminSupervisorRequest(w, r, endpoint, http.MethodPut, http.MethodDelete)
	if !ok {
		return
	}
	ws, sb := r.PathValue("ws"), r.PathValue("sb")
	for _, n := range []string{ws, sb} {
		if err := routes.ValidName(n); err != nil {
			g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
			return
		}
	}
	var entry []byte
	if r.Method == http.MethodPut {
		var code int
		var why string
		if entry, code, why = readInstance(w, r, ws, sb); code != 0 {
			g.fail(w, endpoint, code, why)
			return
		}
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	if r.Method == http.MethodPut && !g.admitSupervisor(w, sup) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*etcdOpTimeout)
	defer cancel()
	rev, found, err := g.editDocument(ctx, sup, ws, sb, entry)
	switch {
	case errors.Is(err, errDocumentTooLarge), errors.Is(err, errValueTooLarge):
		g.fail(w, endpoint, http.StatusRequestEntityTooLarge, api.OneLineReason(err.Error()))
		return
	case err != nil:
		g.log.Error("write API: document not stored", "supervisor", sup, "instance", ws+"/"+sb, "err", err)
		g.unavailable(w, endpoint, "the store cannot be written")
		return
	case r.Method == http.MethodDelete && !found:
		g.fail(w, endpoint, http.StatusNotFound, "no such instance in this supervisor's document")
		return
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
		g.m.request(endpoint, http.StatusNoContent)
	default:
		body, _ := json.Marshal(map[string]string{"revision": rev})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		g.m.request(endpoint, http.StatusOK)
		_, _ = w.Write(append(body, '\n'))
	}
	g.log.Info("write API: document changed", "supervisor", sup, "instance", ws+"/"+sb,
		"method", r.Method, "revision", rev, "remote", r.RemoteAddr)
}

// readInstance reads and validates the instance entry of a PUT: one JSON
// object that routes.ParseDocument accepts as an entry, naming workspace ws
// and sandbox sb. It returns the entry compacted, or a status and reason.
func readInstance(w http.ResponseWriter, r *http.Request, ws, sb string) ([]byte, int, string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInstanceBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("instance entry larger than %d bytes", maxInstanceBytes)
		}
		return nil, http.StatusBadRequest, "cannot read the request body"
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil || compact.Len() == 0 || compact.Bytes()[0] != '{' {
		return nil, http.StatusBadRequest, "the body must be one JSON object: an instance entry of the configuration document"
	}
	entry := compact.Bytes()
	doc, err := routes.ParseDocument([]byte(`{"instances":[` + string(entry) + `]}`))
	if err != nil {
		return nil, http.StatusBadRequest, api.OneLineReason(err.Error())
	}
	if len(doc.Rejected) > 0 {
		return nil, http.StatusBadRequest, api.OneLineReason(doc.Rejected[0].Reason)
	}
	if len(doc.Instances) != 1 {
		return nil, http.StatusBadRequest, "the body must be one instance entry"
	}
	if in := doc.Instances[0]; in.Workspace != ws || in.Sandbox != sb {
		return nil, http.StatusBadRequest, fmt.Sprintf("the entry names %s/%s, the path %s/%s", in.Workspace, in.Sandbox, ws, sb)
	}
	return entry, 0, ""
}

// errDocumentTooLarge refuses a write that would make a document larger
// than a supervisor accepts.
var errDocumentTooLarge = fmt.Errorf("the document would be larger than a supervisor accepts (%d bytes)", routes.MaxDocumentBytes-1)

// editDocument replaces (entry not nil) or removes (nil) the entry of
// ws/sb in supervisor sup's document, with a new revision, and waits until
// the view has it. found tells whether the entry existed; a removal of a
// missing entry writes nothing.
func (g *Gateway) editDocument(ctx context.Context, sup, ws, sb string, entry []byte) (rev string, found bool, err error) {
	for range writeAttempts {
		cur, stored := g.state.Load().docs[sup]
		var doc storedDocument
		if stored {
			if err := json.Unmarshal(cur.body, &doc); err != nil {
				// A stored document that does not parse applies nothing at
				// the supervisor: the write starts a new one.
				g.log.Warn("write API: the stored document does not parse; starting a new one", "supervisor", sup, "err", err)
				doc = storedDocument{}
			}
		}
		found = false
		out := make([]json.RawMessage, 0, len(doc.Instances)+1)
		for _, raw := range doc.Instances {
			var k instanceKeyOf
			if json.Unmarshal(raw, &k) == nil && k.Workspace == ws && k.Sandbox == sb {
				found = true
				continue
			}
			out = append(out, raw)
		}
		if entry == nil && !found {
			return doc.Revision, false, nil
		}
		if entry != nil {
			out = append(out, entry)
		}
		slices.SortStableFunc(out, func(a, b json.RawMessage) int {
			var ka, kb instanceKeyOf
			_ = json.Unmarshal(a, &ka)
			_ = json.Unmarshal(b, &kb)
			return strings.Compare(ka.Workspace+"/"+ka.Sandbox, kb.Workspace+"/"+kb.Sandbox)
		})
		next := storedDocument{Revision: nextRevision(doc.Revision), Instances: out}
		body, err := json.Marshal(next)
		if err != nil {
			return "", found, fmt.Errorf("encode the document: %w", err)
		}
		if len(body)+1 > routes.MaxDocumentBytes {
			return "", found, errDocumentTooLarge
		}
		cond := mustNotExist
		if stored {
			cond = cur.modRev
		}
		srev, ok, err := g.store.put(ctx, keyDocs+sup, body, putOptions{cond: cond})
		if err == nil {
			err = g.waitApplied(ctx, srev)
		}
		if err != nil {
			return "", found, err
		}
		if ok {
			return next.Revision, found, nil
		}
		// Another write came first; the view has it now: edit again.
	}
	return "", found, errors.New("the document keeps changing")
}

// nextRevision returns a revision for a document written by the write API:
// the time in microseconds, as a decimal, greater than prev when prev is
// one.
func nextRevision(prev string) string {
	n := uint64(time.Now().UnixMicro())
	if p, err := strconv.ParseUint(prev, 10, 64); err == nil && p >= n {
		n = p + 1
	}
	return strconv.FormatUint(n, 10)
}

// servePoolMembers serves GET /v1/pools/{pool}/members: the supervisors
// bound to the pool whose session holds.
func (g *Gateway) servePoolMembers(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointPoolMembers
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use GET")
		return
	}
	pool := r.PathValue("pool")
	if !g.authorizeAdmin(w, r, endpoint, pool) {
		return
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	members := []poolMember{}
	g.mu.Lock()
	for sup, p := range g.pools {
		if s, ok := g.sessions[sup]; ok && p == pool && s.holds() {
			members = append(members, poolMember{Supervisor: sup, Session: s.rec.Session, Since: s.rec.Since, Source: s.rec.Source})
		}
	}
	g.mu.Unlock()
	slices.SortFunc(members, func(a, b poolMember) int { return strings.Compare(a.Supervisor, b.Supervisor) })
	body, err := json.Marshal(map[string][]poolMember{"members": members})
	if err != nil {
		g.fail(w, endpoint, http.StatusInternalServerError, "cannot encode the members")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	g.m.request(endpoint, http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}
