package gateway

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// gatewayWatcher is one open watch stream. pending, ended and reason are
// guarded by Gateway.mu.
type gatewayWatcher struct {
	supervisor string
	digest     [sha256.Size]byte
	notify     chan struct{} // capacity 1: "pending has a document"
	done       chan struct{} // closed when the stream must end
	pending    []byte        // the latest document not yet written, or nil
	ended      bool
	reason     string
}

// endWatcherLocked tells w to end; it reports whether w was still open.
// g.mu is held.
func (g *Gateway) endWatcherLocked(w *gatewayWatcher, reason string) bool {
	if w.ended {
		return false
	}
	w.ended, w.reason, w.pending = true, reason, nil
	close(w.done)
	return true
}

func (g *Gateway) serveConfig(w http.ResponseWriter, r *http.Request) {
	watch, endpoint, ok := g.getOrWatch(w, r, gwEndpointConfig, gwEndpointWatch)
	if !ok {
		return
	}
	sup := r.PathValue("id")
	tok := g.authorize(w, r, endpoint, sup)
	if tok == nil {
		return
	}
	if watch {
		g.serveWatch(w, r, sup, tok.digest)
		return
	}
	doc := g.state.Load().document(sup)
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
	_, _ = w.Write(gatewayNewline)
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

// serveWatch holds one watch stream until the client goes away, the token
// is revoked, the gateway closes, or a write fails or times out.
func (g *Gateway) serveWatch(w http.ResponseWriter, r *http.Request, sup string, digest [sha256.Size]byte) {
	if g.disablePush {
		g.fail(w, gwEndpointWatch, http.StatusNotImplemented, "push is disabled on this gateway; poll instead")
		return
	}
	wt := &gatewayWatcher{
		supervisor: sup,
		digest:     digest,
		notify:     make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	first, code, why := g.addWatcher(wt)
	if code != 0 {
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "5")
		}
		g.fail(w, gwEndpointWatch, code, why)
		return
	}
	defer g.removeWatcher(wt)
	g.m.watchers.Inc()
	defer g.m.watchers.Dec()

	rc := g.startStream(w, gwEndpointWatch, first.etag)

	started := time.Now()
	log := g.log.With("supervisor", sup, "remote", r.RemoteAddr, "proto", r.Proto)
	log.Info("gateway watch opened")
	write := func(parts ...[]byte) error {
		if err := rc.SetWriteDeadline(time.Now().Add(g.writeTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return fmt.Errorf("set write deadline: %w", err)
		}
		for _, p := range parts {
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
		if err := rc.Flush(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
		// Clear the deadline: over HTTP/2 a pending one resets an idle stream.
		_ = rc.SetWriteDeadline(time.Time{})
		return nil
	}
	end := func(reason string, err error) {
		attrs := []any{"reason", reason, "duration", time.Since(started).Round(time.Millisecond)}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		log.Info("gateway watch ended", attrs...)
	}

	if err := write(first.body, gatewayNewline); err != nil {
		end("write failed", err)
		return
	}
	last := first.body
	ticker := time.NewTicker(g.keepalive)
	defer ticker.Stop()
	for {
		select {
		case <-r.Context().Done():
			end("client gone", nil)
			return
		case <-wt.done:
			end(g.watcherReason(wt), nil)
			return
		case <-ticker.C:
			if err := write(gatewayKeepaliveLine); err != nil {
				end("write failed", err)
				return
			}
		case <-wt.notify:
			doc, open := g.takePending(wt)
			if !open {
				end(g.watcherReason(wt), nil)
				return
			}
			if doc == nil || bytes.Equal(doc, last) {
				continue
			}
			if err := write(doc, gatewayNewline); err != nil {
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
func (g *Gateway) addWatcher(w *gatewayWatcher) (gatewayDocument, int, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return gatewayDocument{}, http.StatusServiceUnavailable, "the gateway is shutting down"
	}
	n := 0
	for o := range g.watchers {
		if o.supervisor == w.supervisor {
			n++
		}
	}
	if n >= MaxWatchesPerSupervisor {
		return gatewayDocument{}, http.StatusTooManyRequests,
			fmt.Sprintf("too many watch streams for this supervisor (limit %d)", MaxWatchesPerSupervisor)
	}
	g.watchers[w] = struct{}{}
	return g.state.Load().document(w.supervisor), 0, ""
}

func (g *Gateway) removeWatcher(w *gatewayWatcher) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.watchers, w)
	if !w.ended {
		w.ended = true
		close(w.done)
	}
}

// takePending returns and clears w's pending document; open is false when
// w has been told to end.
func (g *Gateway) takePending(w *gatewayWatcher) (doc []byte, open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	doc, w.pending = w.pending, nil
	return doc, !w.ended
}

func (g *Gateway) watcherReason(w *gatewayWatcher) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return w.reason
}

// startStream answers 200 with the headers of a streamed NDJSON watch (no
// caching, no buffering by proxies in between, etag when not empty) and
// returns the controller that flushes it.
func (g *Gateway) startStream(w http.ResponseWriter, endpoint, etag string) *http.ResponseController {
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	if etag != "" {
		h.Set("ETag", etag)
	}
	w.WriteHeader(http.StatusOK)
	g.m.request(endpoint, http.StatusOK)
	return http.NewResponseController(w)
}
