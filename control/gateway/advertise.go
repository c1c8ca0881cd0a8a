package gateway

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/applistener/applistener/control/api"
)

// serveInstallations serves PUT (an advertisement) and DELETE (a
// withdrawal) of /v1/supervisors/{id}/installations.
func (g *Gateway) serveInstallations(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut:
		g.serveAdvertise(w, r)
	case http.MethodDelete:
		g.serveWithdraw(w, r)
	default:
		w.Header().Set("Allow", "PUT, DELETE")
		g.fail(w, endpointInstallations, http.StatusMethodNotAllowed, "use PUT or DELETE")
	}
}

// serveAdvertise stores an advertisement: the supervisor's complete set of
// installed routes, bound to its session and to the token that sent it.
func (g *Gateway) serveAdvertise(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointInstallations
	sup := r.PathValue("id")
	tok := g.authorize(w, r, endpoint, sup)
	if tok == nil {
		return
	}
	if r.ContentLength > MaxInstallationsBytes {
		// Refuse before reading: a client that sent "Expect: 100-continue"
		// does not send the body at all.
		g.fail(w, endpoint, http.StatusRequestEntityTooLarge,
			fmt.Sprintf("installations body larger than %d bytes", MaxInstallationsBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxInstallationsBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			g.fail(w, endpoint, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("installations body larger than %d bytes", MaxInstallationsBytes))
			return
		}
		g.fail(w, endpoint, http.StatusBadRequest, "cannot read the request body")
		return
	}
	adv, sid, err := parseInstallations(body)
	if err != nil {
		g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
		return
	}
	qsid, order, ok := requestSession(r)
	switch {
	case !ok || !validSessionID(sid):
		g.fail(w, endpoint, http.StatusBadRequest, "session must be 32 lower-case hexadecimal characters")
		return
	case qsid != "" && sid != "" && qsid != sid:
		g.fail(w, endpoint, http.StatusBadRequest, "the session of the query and of the body differ")
		return
	case sid == "":
		sid = qsid
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), etcdOpTimeout)
	defer cancel()
	source := remoteIP(r)
	out := g.touchSession(ctx, sup, sid, order, source)
	if out.code != 0 {
		g.failSession(w, endpoint, out)
		return
	}
	if !out.current {
		g.fail(w, endpoint, http.StatusConflict, "a session of this supervisor holds; an advertisement without it is refused")
		return
	}

	now := time.Now().UTC()
	routes, rejected := parseAdvertisedRoutes(sup, adv.installations, now)
	rec := advertisementRecord{
		Session:  sid,
		Token:    hex.EncodeToString(tok.digest[:]),
		Source:   source,
		Received: now,
		Since:    make(map[string]int64, len(routes)),
		Body:     adv.body,
	}
	type instKey struct {
		host    string
		version uint64
		ep      api.RouteEndpoint
	}
	g.mu.Lock()
	prev := g.installations[sup]
	g.logRejectedInstallations(sup, rejected, prev.rejected)
	known := make(map[instKey]time.Time, len(prev.routes))
	for _, r := range prev.routes {
		known[instKey{r.Hostname, r.InstallationVersion, r.Endpoint}] = r.since
	}
	var last time.Time
	for _, rt := range routes {
		since := now
		if s, ok := known[instKey{rt.Hostname, rt.InstallationVersion, rt.Endpoint}]; ok {
			since = s
		}
		rec.Since[rt.Hostname] = since.UnixNano()
		last = latest(last, rt.ExpiresAt)
		if !g.policy.allows(source, rt.Endpoint.Host) {
			g.refuseEndpointLocked(sup, source, rt.Endpoint)
		}
	}
	g.mu.Unlock()
	// The record lives as long as its longest route; an empty set for one
	// session TTL.
	ttl := g.sessionTTL
	if !last.IsZero() {
		ttl = max(last.Sub(now), time.Second)
	}
	value, err := json.Marshal(rec)
	if err != nil {
		g.fail(w, endpoint, http.StatusInternalServerError, "cannot encode the advertisement")
		return
	}
	rev, _, err := g.store.put(ctx, keyAds+sup, value, putOptions{ttl: ttl})
	if err == nil {
		err = g.waitApplied(ctx, rev)
	}
	if errors.Is(err, errValueTooLarge) {
		g.fail(w, endpoint, http.StatusRequestEntityTooLarge, api.OneLineReason(err.Error()))
		return
	}
	if err != nil {
		g.log.Error("advertisement not stored", "supervisor", sup, "err", err)
		g.unavailable(w, endpoint, "the store cannot be written")
		return
	}
	setSessionOrder(w, out)
	w.WriteHeader(http.StatusNoContent)
	g.m.request(endpoint, http.StatusNoContent)
	g.log.Debug("gateway installations stored", "supervisor", sup, "installations", len(adv.installations), "session", sid)
}

// serveWithdraw removes the advertisement of a session and ends the
// session: DELETE /v1/supervisors/{id}/installations?session=<sid>, 204
// also when nothing was stored.
func (g *Gateway) serveWithdraw(w http.ResponseWriter, r *http.Request) {
	const endpoint = endpointWithdraw
	sup := r.PathValue("id")
	if g.authorize(w, r, endpoint, sup) == nil {
		return
	}
	sid, _, ok := requestSession(r)
	if !ok {
		g.fail(w, endpoint, http.StatusBadRequest, "session must be 32 lower-case hexadecimal characters")
		return
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), etcdOpTimeout)
	defer cancel()
	if err := g.withdrawSession(ctx, sup, sid); err != nil {
		g.log.Error("withdrawal not stored", "supervisor", sup, "session", sid, "err", err)
		g.unavailable(w, endpoint, "the store cannot be written")
		return
	}
	w.WriteHeader(http.StatusNoContent)
	g.m.request(endpoint, http.StatusNoContent)
	g.log.Info("session withdrawn", "supervisor", sup, "session", sid, "remote", r.RemoteAddr)
}

// failSession answers a request refused by touchSession.
func (g *Gateway) failSession(w http.ResponseWriter, endpoint string, out sessionOutcome) {
	if out.code == http.StatusServiceUnavailable {
		g.unavailable(w, endpoint, out.why)
		return
	}
	g.fail(w, endpoint, out.code, out.why)
}

// remoteIP returns the IP address of the request's peer (X-Forwarded-For
// is not trusted), or "" when it cannot be parsed.
func remoteIP(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return ap.Addr().Unmap().String()
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// parseInstallations checks an installations body: a JSON object with an
// "installations" array of objects and an optional "session" string. Other
// top-level fields are kept.
func parseInstallations(body []byte) (advertisement, string, error) {
	if !utf8.Valid(body) {
		return advertisement{}, "", errors.New("installations: body is not valid UTF-8")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil {
		return advertisement{}, "", fmt.Errorf("installations: not valid JSON: %w", err)
	}
	if compact.Len() == 0 || compact.Bytes()[0] != '{' {
		return advertisement{}, "", errors.New("installations: body must be a JSON object")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(compact.Bytes(), &top); err != nil {
		return advertisement{}, "", fmt.Errorf("installations: %w", err)
	}
	raw, ok := top["installations"]
	if !ok || len(raw) == 0 || raw[0] != '[' {
		return advertisement{}, "", errors.New(`installations: body must have an "installations" array`)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return advertisement{}, "", fmt.Errorf("installations: %w", err)
	}
	for i, e := range entries {
		if len(e) == 0 || e[0] != '{' {
			return advertisement{}, "", fmt.Errorf("installations[%d]: must be a JSON object", i)
		}
	}
	var sid string
	if raw, ok := top["session"]; ok {
		if err := json.Unmarshal(raw, &sid); err != nil {
			return advertisement{}, "", errors.New(`installations: "session" must be a string`)
		}
	}
	return advertisement{body: compact.Bytes(), installations: entries}, sid, nil
}

// logRejectedInstallations logs the entries of sup's advertisement that
// were not published, when the set of reasons differs from the last one.
func (g *Gateway) logRejectedInstallations(sup string, rejected []string, prev string) string {
	summary := strings.Join(rejected, "; ")
	if len(rejected) > 0 {
		g.m.rejected.Add(float64(len(rejected)))
	}
	if summary != prev && len(rejected) > 0 {
		g.log.Warn("advertised installations not published: invalid entries", "supervisor", sup,
			"rejected", len(rejected), "reasons", api.OneLineReason(summary))
	}
	return summary
}
