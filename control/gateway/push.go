package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/applistener/applistener/control/internal/ndjson"
)

// KeepaliveHeader is the response header of a push request that tells the
// granted keepalive interval (a Go duration).
const KeepaliveHeader = "X-Applistener-Keepalive"

// MaxWatchesPerSupervisor bounds the open watch streams of one supervisor
// id; more are refused with 429.
const MaxWatchesPerSupervisor = 64

// pushWriteTimeout bounds every write to a watch stream: a supervisor
// that does not read is disconnected.
const pushWriteTimeout = 10 * time.Second

// pushService is the configuration push as a component of the gateway, in
// the shape of discovery (discovery.go): it has its own lock and its own
// set of open push streams, is fed an immutable view of the gateway's
// state (documents, tokens, sessions, pool bindings) at each change
// (update), hands the changed documents to the streams, ends the streams
// whose session was superseded or withdrawn, whose token was revoked, or
// whose store went down, and holds each stream (serve). It never calls
// back into the gateway; what a stream needs of the gateway's sessions is
// handed to it with the stream (pushWatcher.renew).
type pushService struct {
	// sendTimeout bounds every write to a stream (pushWriteTimeout).
	sendTimeout time.Duration
	sessionTTL  time.Duration
	log         *slog.Logger
	m           *metrics // the gateway's: watchers, pushes, requests

	// mu guards the fields below it; the gateway feeds the view with its
	// own lock held, so a stream registered while the state changes gets
	// the change (addWatcher reads the view's document under mu).
	mu       sync.Mutex
	view     *pushView
	watchers map[*pushWatcher]struct{}
	closed   bool
}

// pushView is the gateway's state as the push streams need it: immutable,
// replaced whole at each change (the maps are never written once handed
// over).
type pushView struct {
	state    *stateSnapshot
	sessions map[string]sessionView
	pools    map[string]string
	// unusable says why the store cannot be vouched for ("" when it can).
	unusable string
}

// pushWatcher is one open push stream.
type pushWatcher struct {
	supervisor string
	session    string // the request's session id ("" for none)
	pool       bool   // opened with a pool token
	digest     [sha256.Size]byte
	// box hands the stream the latest document not yet written, and tells
	// it to end.
	box *ndjson.Mailbox
	// renew renews the stream's session in the gateway's store; it returns
	// why the session was superseded, or "" (it holds, or the renewal
	// failed otherwise).
	renew func(context.Context) (superseded string)
}

// newPushService returns the push with no stream, its store not yet
// usable (unusable says why) until the first update.
func newPushService(sessionTTL time.Duration, log *slog.Logger, m *metrics, unusable string) *pushService {
	return &pushService{
		sendTimeout: pushWriteTimeout,
		sessionTTL:  sessionTTL,
		log:         log,
		m:           m,
		view:        &pushView{unusable: unusable},
		watchers:    make(map[*pushWatcher]struct{}),
	}
}

// update replaces the view by v, hands the streams of the supervisors in
// docsChanged their document when it changed, and ends the streams of the
// supervisors in sessionsChanged whose session is no longer their current
// one. A view whose store is unusable ends
// every stream.
func (p *pushService) update(v *pushView, docsChanged, sessionsChanged map[string]struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.view
	p.view = v
	if v.unusable != "" {
		for w := range p.watchers {
			w.box.End("store unavailable")
		}
		return
	}
	if len(docsChanged) > 0 && old.state != nil {
		p.pushChangedLocked(old.state, v.state, docsChanged)
	}
	for sup := range sessionsChanged {
		p.endSupersededLocked(sup)
	}
}

// pushChangedLocked hands the changed documents of the supervisors in
// changed to their open streams. p.mu is held.
func (p *pushService) pushChangedLocked(old, next *stateSnapshot, changed map[string]struct{}) {
	for w := range p.watchers {
		if _, ok := changed[w.supervisor]; !ok || w.box.Ended() {
			continue
		}
		d := next.documentFor(w.supervisor, w.pool)
		if bytes.Equal(d.body, old.documentFor(w.supervisor, w.pool).body) {
			continue
		}
		w.box.Post(d.body)
	}
}

// endSupersededLocked ends the streams of sup whose session is no longer
// its current one (superseded or withdrawn). Streams without a session,
// and streams whose session merely expired (they renew it), are left.
// p.mu is held.
func (p *pushService) endSupersededLocked(sup string) {
	cur, ok := p.view.sessions[sup]
	for w := range p.watchers {
		if w.supervisor != sup || w.session == "" || w.box.Ended() || !ok {
			continue
		}
		switch {
		case cur.rec.Session != w.session:
			w.box.End("session superseded")
		case !cur.holds():
			w.box.End("session withdrawn")
		}
	}
}

// revokeUngranted ends the streams whose token no longer grants their
// supervisor in the current view; it returns how many.
func (p *pushService) revokeUngranted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.view.state
	if st == nil {
		return 0
	}
	n := 0
	for w := range p.watchers {
		if t := st.lookupDigest(w.digest); !st.grantsSupervisor(t, w.supervisor, p.view.pools[w.supervisor]) {
			if w.box.End("token revoked") {
				n++
			}
		}
	}
	return n
}

// close ends every stream and refuses new ones, for shutdown; it reports
// whether it was the first call.
func (p *pushService) close() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.closed = true
	for w := range p.watchers {
		w.box.End("gateway closing")
	}
	return true
}

// watched returns the supervisors with an open stream.
func (p *pushService) watched() map[string]struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]struct{}, len(p.watchers))
	for w := range p.watchers {
		out[w.supervisor] = struct{}{}
	}
	return out
}

// open reports whether the gateway is not closing and the store is
// usable: a session may then be renewed.
func (p *pushService) open() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && p.view.unusable == ""
}

// serve holds one push stream until the client goes away, the token is
// revoked, the session is superseded or withdrawn, the store goes down,
// the gateway closes, or a write fails or times out. It writes a keepalive
// every grant and, in a goroutine of its own that a slow store cannot hold
// the keepalives up with, renews the session every grant or third of the
// session TTL, whichever is shorter.
func (p *pushService) serve(w http.ResponseWriter, r *http.Request, wt *pushWatcher, grant time.Duration) {
	sup := wt.supervisor
	first, code, why := p.addWatcher(wt)
	if code != 0 {
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "5")
		}
		failRequest(w, p.m, endpointWatch, code, why)
		return
	}
	defer p.removeWatcher(wt)
	p.m.watchers.Inc()
	defer p.m.watchers.Dec()

	w.Header().Set(KeepaliveHeader, grant.String())
	w.Header().Set("ETag", first.etag)
	stream := ndjson.Start(w, p.sendTimeout)
	p.m.request(endpointWatch, http.StatusOK)

	started := time.Now()
	log := p.log.With("supervisor", sup, "session", wt.session, "remote", r.RemoteAddr, "proto", r.Proto)
	log.Info("gateway watch opened", "keepalive", grant)
	end := func(reason string, err error) {
		attrs := []any{"reason", reason, "duration", time.Since(started).Round(time.Millisecond)}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		log.Info("gateway watch ended", attrs...)
		// The session holds for one TTL after its stream ends, unless the
		// stream ended because the session or the store is gone.
		if p.open() {
			wt.renew(context.Background())
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
		t := time.NewTicker(min(grant, p.sessionTTL/3))
		defer t.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-t.C:
				if why := wt.renew(renewCtx); why != "" {
					superseded <- why
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
			p.m.pushes.Inc()
		}
	}
}

// addWatcher registers w and returns the current document of its
// supervisor, or a status code and reason when the stream is refused.
func (p *pushService) addWatcher(w *pushWatcher) (document, int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return document{}, http.StatusServiceUnavailable, "the gateway is shutting down"
	}
	n := 0
	for o := range p.watchers {
		if o.supervisor == w.supervisor {
			n++
		}
	}
	if n >= MaxWatchesPerSupervisor {
		return document{}, http.StatusTooManyRequests,
			fmt.Sprintf("too many watch streams for this supervisor (limit %d)", MaxWatchesPerSupervisor)
	}
	if p.view.unusable != "" {
		return document{}, http.StatusServiceUnavailable, p.view.unusable
	}
	p.watchers[w] = struct{}{}
	return p.view.state.documentFor(w.supervisor, w.pool), 0, ""
}

// removeWatcher unregisters w and ends its mailbox.
func (p *pushService) removeWatcher(w *pushWatcher) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.watchers, w)
	w.box.End("")
}
