package gateway

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/applistener/applistener/control/internal/ndjson"
)

// serveConfig serves GET /v1/supervisors/{id}/config: a poll (ETag,
// If-None-Match) or, with ?watch=1, a push stream. Both record the
// request's session (?session=).
func (g *Gateway) serveConfig(w http.ResponseWriter, r *http.Request) {
	watch, endpoint, ok := getOrWatch(w, r, g.m, endpointConfig, endpointWatch)
	if !ok {
		return
	}
	sup := r.PathValue("id")
	tok := g.authorize(w, r, endpoint, sup)
	if tok == nil {
		return
	}
	sid, order, ok := requestSession(r)
	if !ok {
		g.fail(w, endpoint, http.StatusBadRequest, "session must be 32 lower-case hexadecimal characters")
		return
	}
	var grant time.Duration
	if watch {
		if g.disablePush {
			g.fail(w, endpoint, http.StatusNotImplemented, "push is disabled on this gateway; poll instead")
			return
		}
		var err error
		if grant, err = g.keepaliveGrant(r.URL.Query().Get("keepalive")); err != nil {
			g.fail(w, endpoint, http.StatusBadRequest, err.Error())
			return
		}
	}
	if why := g.storeUnusable(); why != "" {
		g.unavailable(w, endpoint, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), etcdOpTimeout)
	out := g.touchSession(ctx, sup, sid, order, remoteIP(r))
	cancel()
	if out.code != 0 {
		g.failSession(w, endpoint, out)
		return
	}
	setSessionOrder(w, out)
	w.Header().Set(SessionTTLHeader, g.sessionTTL.String())
	if watch {
		source, order := remoteIP(r), out.order
		g.push.serve(w, r, &pushWatcher{
			supervisor: sup,
			session:    sid,
			pool:       tok.pool != "",
			digest:     tok.digest,
			box:        ndjson.NewMailbox(),
			renew: func(parent context.Context) string {
				ctx, cancel := context.WithTimeout(parent, etcdOpTimeout)
				defer cancel()
				if out := g.touchSession(ctx, sup, sid, order, source); out.code == http.StatusConflict {
					return out.why
				}
				return ""
			},
		}, grant)
		return
	}
	doc := g.state.Load().documentFor(sup, tok.pool != "")
	h := w.Header()
	h.Set("ETag", doc.etag)
	h.Set("Cache-Control", "no-store")
	if etagMatches(r.Header.Values("If-None-Match"), doc.etag) {
		w.WriteHeader(http.StatusNotModified)
		g.m.request(endpoint, http.StatusNotModified)
		return
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(doc.body)+1))
	w.WriteHeader(http.StatusOK)
	g.m.request(endpoint, http.StatusOK)
	_, _ = w.Write(doc.body)
	_, _ = w.Write(ndjson.Newline)
}

// etagMatches applies If-None-Match (weak comparison) to etag.
func etagMatches(values []string, etag string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			part = strings.TrimSpace(part)
			if part == "*" || strings.TrimPrefix(part, "W/") == etag {
				return true
			}
		}
	}
	return false
}
