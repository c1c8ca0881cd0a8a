package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/applistener/applistener/control/internal/ndjson"
)

// serveWatch holds one watch stream until the client goes away, the token
// is revoked, the session is superseded or withdrawn, the store goes down,
// the gateway closes, or a write fails or times out. It writes a keepalive
// every grant and, in a goroutine of its own that a slow store cannot hold
// the keepalives up with, renews the session every grant or third of the
// session TTL, whichever is shorter.
func (g *Gateway) serveWatch(w http.ResponseWriter, r *http.Request, wt *pushWatcher, grant time.Duration) {
	sup := wt.supervisor
	first, code, why := g.addWatcher(wt)
	if code != 0 {
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "5")
		}
		g.fail(w, endpointWatch, code, why)
		return
	}
	defer g.removeWatcher(wt)
	g.m.watchers.Inc()
	defer g.m.watchers.Dec()

	w.Header().Set(KeepaliveHeader, grant.String())
	w.Header().Set("ETag", first.etag)
	stream := ndjson.Start(w, g.writeTimeout)
	g.m.request(endpointWatch, http.StatusOK)

	started := time.Now()
	log := g.log.With("supervisor", sup, "session", wt.session, "remote", r.RemoteAddr, "proto", r.Proto)
	log.Info("gateway watch opened", "keepalive", grant)
	source := remoteIP(r)
	renew := func(parent context.Context) sessionOutcome {
		ctx, cancel := context.WithTimeout(parent, etcdOpTimeout)
		defer cancel()
		return g.touchSession(ctx, sup, wt.session, wt.order, source)
	}
	end := func(reason string, err error) {
		attrs := []any{"reason", reason, "duration", time.Since(started).Round(time.Millisecond)}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		log.Info("gateway watch ended", attrs...)
		// The session holds for one TTL after its stream ends, unless the
		// stream ended because the session or the store is gone.
		if g.storeUnusable() == "" && !g.isClosed() {
			renew(context.Background())
		}
	}

	if err := stream.Send(first.body, ndjson.Newline); err != nil {
		end("write failed", err)
		return
	}
	last := first.body
	// The session is renewed in a goroutine of its own, so that a slow
	// store never delays a keepalive: the supervisor's routes depend on
	// the keepalives, the session only on the store.
	superseded := make(chan string, 1)
	renewCtx, stopRenewing := context.WithCancel(r.Context())
	var renewing sync.WaitGroup
	renewing.Go(func() {
		t := time.NewTicker(min(grant, g.sessionTTL/3))
		defer t.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-t.C:
				if out := renew(renewCtx); out.code == http.StatusConflict {
					superseded <- out.why
					return
				}
			}
		}
	})
	defer func() {
		stopRenewing()
		renewing.Wait()
	}()
	ticker := time.NewTicker(grant)
	defer ticker.Stop()
	for {
		select {
		case <-r.Context().Done():
			end("client gone", nil)
			return
		case <-wt.box.Done():
			end(wt.box.Reason(), nil)
			return
		case why := <-superseded:
			end(why, nil)
			return
		case <-ticker.C:
			if err := stream.Send(ndjson.KeepaliveLine); err != nil {
				end("write failed", err)
				return
			}
		case <-wt.box.Posted():
			doc, open := wt.box.Take()
			if !open {
				end(wt.box.Reason(), nil)
				return
			}
			if doc == nil || bytes.Equal(doc, last) {
				continue
			}
			if err := stream.Send(doc, ndjson.Newline); err != nil {
				end("write failed", err)
				return
			}
			last = doc
			g.m.pushes.Inc()
		}
	}
}

// addWatcher registers w and returns the current document of its
// supervisor, or a status code and reason when the watch is refused.
func (g *Gateway) addWatcher(w *pushWatcher) (document, int, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return document{}, http.StatusServiceUnavailable, "the gateway is shutting down"
	}
	n := 0
	for o := range g.watchers {
		if o.supervisor == w.supervisor {
			n++
		}
	}
	if n >= MaxWatchesPerSupervisor {
		return document{}, http.StatusTooManyRequests,
			fmt.Sprintf("too many watch streams for this supervisor (limit %d)", MaxWatchesPerSupervisor)
	}
	if why := g.storeUnusable(); why != "" {
		return document{}, http.StatusServiceUnavailable, why
	}
	g.watchers[w] = struct{}{}
	return g.state.Load().documentFor(w.supervisor, w.pool), 0, ""
}

func (g *Gateway) removeWatcher(w *pushWatcher) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.watchers, w)
	w.box.End("")
}
