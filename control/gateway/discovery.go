package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/routes"
)

// Discovery: the gateway publishes, per workspace, the installations that
// supervisors advertise (PUT /v1/supervisors/{id}/installations), as
// snapshots and NDJSON watch streams for independent proxies and
// controllers:
//
//	GET /v1/workspaces/{ws}/service-routes           one snapshot
//	GET /v1/workspaces/{ws}/service-routes?watch=1   the snapshot, then every change, and keepalives
//
// A route is published while (1) its advertised expires_at has not passed
// (a timer republishes at each expiry, so a watch gets a line even when
// nothing else happens), (2) the supervisor's current document still grants
// it: a valid instance with the route's workspace and sandbox, a service
// with its name, and the same generation as advertised (an advertisement
// without a generation is accepted only without a session), (3) the session
// that advertised it holds and is the supervisor's current one
// (sessions.go), or its record expired while every replica was down
// (recovery.go), (4) the token that advertised it is still in the tokens
// file and still grants the supervisor (a supervisor token for it, or the
// token of the pool it is bound to), and (5) its endpoint passes the
// endpoint policy (policy.go). All are re-checked whenever the set is
// published, so a document, session or tokens change removes routes at
// once, before any re-advertisement.
//
// One hostname is published once. When two supervisors advertise the same
// hostname and both are granted it, the incumbent wins: the advertisement
// whose installation (supervisor, installation_version, endpoint) the
// gateway has known the longest (the time is stored with the advertisement,
// so every replica picks the same one), ties broken by the smaller
// supervisor id.
// Renewals keep an installation's age, so the winner does not flap at every
// renewal (which "latest expires_at" would do, closing the consumers'
// connections each time); the other takes over when the incumbent is
// withdrawn, expires or loses its grant. Conflicts are logged and counted.
//
// Fail closed: discovery answers 503 instead of possibly stale data when
//   - the discovery maintenance loop (started by Run; it enforces expiry) is
//     not running or has not run for discoveryStaleAfter: the published set
//     could then hold expired routes;
//   - the workspace's snapshot cannot be built: it would be larger than
//     api.MaxDiscoverySnapshotBytes or fails to encode (a truncated set would
//     withdraw routes at the consumers);
//   - the store is not loaded, unreachable or without quorum (view.go); open
//     watches are ended then;
//   - for watches, the gateway is shutting down.
//
// A tokens or configuration file that fails to reload keeps its previous
// contents, as for the control protocol.

// Defaults and limits of discovery.
const (
	// DefaultDiscoveryMaxWatchersPerToken bounds the open watches of one
	// token; more are refused with 429.
	DefaultDiscoveryMaxWatchersPerToken = 16
	// DefaultDiscoverySendTimeout is how long a watcher may take to accept
	// a line before it is disconnected.
	DefaultDiscoverySendTimeout = 5 * time.Second
	// DefaultDiscoveryMaxWatchLifetime ends every watch stream (cleanly)
	// after this long; clients reconnect.
	DefaultDiscoveryMaxWatchLifetime = 10 * time.Minute
	// DefaultDiscoveryReauthPeriod is how often an open watch re-checks that
	// its token is still granted the workspace.
	DefaultDiscoveryReauthPeriod = 30 * time.Second
)

// discoveryStaleAfter is how long the discovery loop may stay silent
// before discovery answers 503; the loop runs at least every
// discoveryLoopPeriod.
const (
	discoveryStaleAfter = 5 * time.Second
	discoveryLoopPeriod = time.Second
)

// Values of the "reason" label of the watch disconnects metric.
const (
	reasonClientGone     = "client_gone"
	reasonSendTimeout    = "send_timeout"
	reasonWriteError     = "write_error"
	reasonLifetime       = "max_lifetime"
	reasonRevoked        = "grant_revoked"
	reasonClosing        = "gateway_closing"
	reasonUnusable       = "state_unusable"
	reasonSnapshotFailed = "snapshot_unavailable"
)

// Request endpoints of discovery, values of the "endpoint" label.
const (
	endpointDiscovery      = "discovery"
	endpointDiscoveryWatch = "discovery_watch"
)

// discoveryConfig are the bounds of discovery watches.
type discoveryConfig struct {
	maxWatchersPerToken int
	sendTimeout         time.Duration
	maxLifetime         time.Duration
	reauthPeriod        time.Duration
}

// discoveryService is discovery as a component of the gateway, in the shape of
// etcd's v3rpc watch server: it has its own lock, configuration, metrics
// and published state, is fed an immutable view of the gateway's state
// (documents, tokens, sessions, advertisements, pool bindings) at each
// store change (update), and serves its own snapshot and watch requests
// (ServeHTTP). It never calls back into the gateway.
type discoveryService struct {
	cfg       discoveryConfig
	keepalive time.Duration
	policy    endpointPolicy
	log       *slog.Logger
	m         *discoveryMetrics
	requests  *metrics // the request counter shared with the gateway

	// beat is when the maintenance loop last ran (Unix nanoseconds), 0
	// when it is not running; wake (capacity 1) makes it look again.
	beat atomic.Int64
	// warmUntil is when a memory store's warmup ends (unix nanoseconds; 0:
	// none): discovery answers 503 until then (Config.DiscoveryWarmup).
	warmUntil atomic.Int64
	wake      chan struct{}

	// mu guards the fields below it.
	mu sync.Mutex
	// view is what is published from; replaced whole by update.
	view   *discoveryView
	closed bool
	// rev is the last revision handed out. It starts at the gateway's
	// start time in Unix milliseconds, so that revisions keep increasing
	// across restarts; revBase is that start value, the revision of a
	// workspace that never had routes.
	rev, revBase uint64
	published    map[string]*publishedSnapshot
	watchers     map[string]map[*discoveryWatcher]struct{} // by workspace
	perToken     map[[sha256.Size]byte]int
	nextExpiry   time.Time         // earliest future expires_at stored, zero when none
	conflicts    map[string]string // hostnames advertised by more than one granted supervisor → their workspace
	routes       int               // published routes, all workspaces
}

// discoveryView is the gateway's state as discovery publishes it:
// immutable, replaced whole at each change (the maps are never written
// once handed over).
type discoveryView struct {
	state         *stateSnapshot
	installations map[string]advertisement
	sessions      map[string]sessionView
	pools         map[string]string
	// recovered are advertisements published without a session record
	// after every replica was down (recovery.go), by supervisor.
	recovered map[string]recoveredAd
	// unusable says why the store cannot be vouched for ("" when it can).
	unusable string
}

// publishedSnapshot is the published set of one workspace. Immutable once
// stored.
type publishedSnapshot struct {
	revision  uint64
	routes    []api.ServiceRoute
	line      []byte    // the encoded snapshot and "\n"
	minExpiry time.Time // earliest expires_at, zero when no routes
	err       error     // the snapshot could not be built: 503
}

// discoveryWatcher is one open discovery watch.
type discoveryWatcher struct {
	workspace string
	digest    [sha256.Size]byte
	// box hands the stream the latest snapshot line not yet written, and
	// tells it to end.
	box *ndjson.Mailbox
}

type discoveryMetrics struct {
	watchers    prometheus.Gauge
	snapshots   *prometheus.CounterVec
	disconnects *prometheus.CounterVec
	routes      prometheus.Gauge
	conflicts   prometheus.Gauge
}

func newDiscoveryMetrics(reg prometheus.Registerer) *discoveryMetrics {
	m := &discoveryMetrics{
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_discovery_watchers", Help: "Open discovery watch streams.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_discovery_snapshots_total", Help: "Discovery snapshots served, by mode (get: a snapshot request, watch: a line of a watch stream).",
		}, []string{"mode"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_discovery_watch_disconnects_total", Help: "Discovery watch streams ended, by reason.",
		}, []string{"reason"}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_discovery_routes", Help: "Routes published by discovery, all workspaces.",
		}),
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_discovery_conflicts", Help: "Hostnames advertised by more than one granted supervisor (one is published).",
		}),
	}
	for _, r := range []string{reasonClientGone, reasonSendTimeout, reasonWriteError, reasonLifetime, reasonRevoked, reasonClosing, reasonUnusable, reasonSnapshotFailed} {
		m.disconnects.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.watchers, m.snapshots, m.disconnects, m.routes, m.conflicts)
	}
	return m
}

// newDiscovery returns discovery with nothing published, its store not
// yet usable (unusable says why) until the first update. It counts as
// maintained for discoveryStaleAfter before its loop runs, so that
// requests racing the gateway's start are answered.
func newDiscovery(cfg discoveryConfig, keepalive time.Duration, reg prometheus.Registerer, policy endpointPolicy,
	log *slog.Logger, requests *metrics, unusable string) *discoveryService {
	base := uint64(max(time.Now().UnixMilli(), 1))
	d := &discoveryService{
		cfg:       cfg,
		keepalive: keepalive,
		policy:    policy,
		log:       log,
		m:         newDiscoveryMetrics(reg),
		requests:  requests,
		wake:      make(chan struct{}, 1),
		view:      &discoveryView{unusable: unusable},
		rev:       base,
		revBase:   base,
		published: make(map[string]*publishedSnapshot),
		watchers:  make(map[string]map[*discoveryWatcher]struct{}),
		perToken:  make(map[[sha256.Size]byte]int),
		conflicts: make(map[string]string),
	}
	d.beat.Store(time.Now().UnixNano())
	return d
}

// update publishes from v: the workspaces in touched (every workspace when
// touched is nil) are recomputed. A view whose store is unusable ends every
// watch (discovery must never feed stale data).
func (d *discoveryService) update(v *discoveryView, touched map[string]struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.view = v
	d.endWarmupIfCompleteLocked(v) // warmup.go
	if v.unusable != "" {
		d.endAllLocked(reasonUnusable)
		return
	}
	if touched != nil && len(touched) == 0 {
		return
	}
	d.republishLocked(time.Now(), touched)
}

// revokeUngranted ends the watches whose token is no longer granted their
// workspace in the current view; it returns how many.
func (d *discoveryService) revokeUngranted() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, set := range d.watchers {
		for w := range set {
			if d.view.state == nil || !d.view.state.grantsWorkspace(w.digest, w.workspace) {
				if w.box.End(reasonRevoked) {
					n++
				}
			}
		}
	}
	return n
}

// close ends every watch and refuses new ones, for shutdown.
func (d *discoveryService) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.endAllLocked(reasonClosing)
}

// endAllLocked ends every watch for reason. d.mu is held.
func (d *discoveryService) endAllLocked(reason string) {
	for _, set := range d.watchers {
		for w := range set {
			w.box.End(reason)
		}
	}
}

// republishLocked recomputes the published snapshots of the workspaces
// in only (every workspace when only is nil), stores those that changed
// with a new revision, and hands them to their watchers. d.mu is held.
func (d *discoveryService) republishLocked(now time.Time, only map[string]struct{}) {
	v := d.view
	st := v.state
	if st == nil {
		return
	}
	type candidate struct {
		r     *advertisedRoute
		count int
	}
	tokens := st.tokenIndex()
	best := make(map[string]*candidate)
	var next time.Time
	for sup, adv := range v.installations {
		grants := st.grants[sup]
		if !v.holds(tokens, sup, &adv) {
			grants = nil
		}
		for i := range adv.routes {
			r := &adv.routes[i]
			if !now.Before(r.ExpiresAt) {
				continue
			}
			if next.IsZero() || r.ExpiresAt.Before(next) {
				next = r.ExpiresAt
			}
			if only != nil {
				if _, ok := only[r.Workspace]; !ok {
					continue
				}
			}
			gen, ok := grants[grantKey{r.Workspace, r.Sandbox, r.Name}]
			if !ok {
				continue
			}
			// The installed generation must be the document's: a route of a
			// recreated sandbox is not the old one. Only supervisors without
			// sessions (older ones) may leave it out.
			if r.generation != gen && (r.generation != "" || adv.session != "") {
				continue
			}
			if !d.policy.allows(adv.source, r.Endpoint.Host) {
				continue
			}
			c := best[r.Hostname]
			if c == nil {
				best[r.Hostname] = &candidate{r: r, count: 1}
				continue
			}
			c.count++
			if r.since.Before(c.r.since) || r.since.Equal(c.r.since) && r.Supervisor < c.r.Supervisor {
				c.r = r
			}
		}
	}
	d.nextExpiry = next

	byWS := make(map[string][]api.ServiceRoute)
	for host, c := range best {
		byWS[c.r.Workspace] = append(byWS[c.r.Workspace], c.r.ServiceRoute)
		_, known := d.conflicts[host]
		switch {
		case c.count > 1 && !known:
			d.conflicts[host] = c.r.Workspace
			d.log.Warn("discovery: hostname advertised by more than one granted supervisor; publishing the incumbent",
				"hostname", host, "supervisors", c.count, "published_supervisor", c.r.Supervisor)
		case c.count == 1 && known:
			delete(d.conflicts, host)
		}
	}
	for host, ws := range d.conflicts {
		if only != nil {
			if _, considered := only[ws]; !considered {
				continue
			}
		}
		if best[host] == nil {
			delete(d.conflicts, host)
		}
	}
	workspaces := only
	if workspaces == nil {
		workspaces = make(map[string]struct{}, len(byWS)+len(d.published))
		for ws := range byWS {
			workspaces[ws] = struct{}{}
		}
		for ws := range d.published {
			workspaces[ws] = struct{}{}
		}
	}
	for ws := range workspaces {
		rs := byWS[ws]
		slices.SortFunc(rs, func(a, b api.ServiceRoute) int { return strings.Compare(a.Hostname, b.Hostname) })
		old := d.published[ws]
		if old == nil && len(rs) == 0 {
			continue
		}
		if old != nil && old.err == nil && api.EqualRoutes(old.routes, rs) {
			continue
		}
		d.rev++
		p := d.encodeSnapshot(ws, d.rev, rs)
		if old != nil {
			d.routes -= len(old.routes)
		}
		d.routes += len(p.routes)
		d.published[ws] = p
		d.notifyLocked(ws, p)
	}
	d.m.routes.Set(float64(d.routes))
	d.m.conflicts.Set(float64(len(d.conflicts)))
	d.wakeLoop()
}

// holds reports whether supervisor sup's advertisement may be published as
// far as its session and credential go: its session is the supervisor's
// current one and holds, and the token that made it is still in the tokens
// file and still grants the supervisor (a rotated token needs a fresh
// advertisement).
func (v *discoveryView) holds(tokens map[[sha256.Size]byte]*tokenGrant, sup string, adv *advertisement) bool {
	s, ok := v.sessions[sup]
	if !ok {
		// Its session expired while every replica was down (recovery.go).
		if r, recovered := v.recovered[sup]; !recovered || r.Session != adv.session || r.ModRev != adv.modRev {
			return false
		}
	} else if !s.holds() || s.rec.Session != adv.session {
		return false
	}
	return v.state.grantsSupervisor(tokens[adv.digest], sup, v.pools[sup])
}

// encodeSnapshot builds the published snapshot of ws.
func (d *discoveryService) encodeSnapshot(ws string, rev uint64, rs []api.ServiceRoute) *publishedSnapshot {
	if rs == nil {
		rs = []api.ServiceRoute{}
	}
	p := &publishedSnapshot{revision: rev, routes: rs}
	for _, r := range rs {
		if p.minExpiry.IsZero() || r.ExpiresAt.Before(p.minExpiry) {
			p.minExpiry = r.ExpiresAt
		}
	}
	body, err := json.Marshal(api.RouteSnapshot{Workspace: ws, Revision: strconv.FormatUint(rev, 10), Routes: rs})
	switch {
	case err != nil:
		p.err = fmt.Errorf("encode the snapshot: %w", err)
	case len(body)+1 > api.MaxDiscoverySnapshotBytes:
		p.err = fmt.Errorf("the snapshot is %d bytes, more than %d", len(body), api.MaxDiscoverySnapshotBytes)
	default:
		p.line = append(body, '\n')
		return p
	}
	d.log.Error("discovery snapshot unavailable; answering 503", "workspace", ws, "routes", len(rs), "err", p.err)
	return p
}

// notifyLocked hands p to the watchers of ws, or ends them when p could
// not be built. d.mu is held.
func (d *discoveryService) notifyLocked(ws string, p *publishedSnapshot) {
	for w := range d.watchers[ws] {
		if p.err != nil {
			w.box.End(reasonSnapshotFailed)
			continue
		}
		w.box.Post(p.line)
	}
}

// snapshotLocked returns the current snapshot of ws, republishing it first
// when one of its routes has expired (the loop may not have run yet). d.mu
// is held.
func (d *discoveryService) snapshotLocked(ws string, now time.Time) *publishedSnapshot {
	p := d.published[ws]
	if p != nil && !p.minExpiry.IsZero() && !now.Before(p.minExpiry) {
		d.republishLocked(now, map[string]struct{}{ws: {}})
		p = d.published[ws]
	}
	if p == nil {
		// Never published: the empty set at the base revision. Not stored,
		// so that unknown workspaces cost nothing.
		p = d.encodeSnapshot(ws, d.revBase, nil)
	}
	return p
}

// unusable returns why discovery cannot answer now, or "".
func (d *discoveryService) unusable(now time.Time) string {
	beat := d.beat.Load()
	d.mu.Lock()
	v := d.view
	d.mu.Unlock()
	switch {
	case v.unusable != "":
		return v.unusable
	case now.UnixNano() < d.warmUntil.Load():
		return fmt.Sprintf("the gateway started with an empty memory store: its supervisors' sessions may not be back yet (%v left)",
			time.Unix(0, d.warmUntil.Load()).Sub(now).Round(time.Second))
	case v.state == nil:
		return "the gateway has no state"
	case beat == 0:
		return "discovery is not running"
	case now.Sub(time.Unix(0, beat)) > discoveryStaleAfter:
		return "discovery state is not being maintained (expiry loop stalled)"
	}
	return ""
}

// run is the maintenance loop: it republishes when a stored route
// expires, and beats so that unusable knows it runs. The gateway's Run
// runs it.
func (d *discoveryService) run(ctx context.Context) {
	defer d.beat.Store(0)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		d.beat.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.wake:
		}
		now := time.Now()
		d.mu.Lock()
		if next := d.nextExpiry; !next.IsZero() && !now.Before(next) && d.view.unusable == "" {
			d.republishLocked(now, nil)
		}
		next := d.nextExpiry
		d.mu.Unlock()
		wait := discoveryLoopPeriod
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0))
		}
		t.Reset(wait)
	}
}

// wakeLoop makes the loop re-read nextExpiry (it may have moved earlier).
func (d *discoveryService) wakeLoop() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// authorizeWorkspace checks the bearer token for discovery of ws: 401
// without a known token, 400 for an invalid workspace name, 403 for a
// supervisor token or a workspace token not granted ws. On failure it
// answers the request and returns nil.
func (d *discoveryService) authorizeWorkspace(w http.ResponseWriter, r *http.Request, endpoint, ws string) *tokenGrant {
	token, ok := bearerToken(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		d.fail(w, endpoint, http.StatusUnauthorized, "missing bearer token")
		return nil
	}
	t := d.currentState().lookupDigest(sha256.Sum256([]byte(token)))
	if t == nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		d.fail(w, endpoint, http.StatusUnauthorized, "unknown token")
		d.log.Info("discovery request refused: unknown token", "remote", r.RemoteAddr)
		return nil
	}
	if len(t.workspaces) == 0 {
		d.fail(w, endpoint, http.StatusForbidden, "only a workspace token can read discovery")
		d.log.Warn("discovery request refused: not a workspace token", "token_supervisor", t.supervisor,
			"token_pool", t.pool, "token_admin", t.admin, "remote", r.RemoteAddr)
		return nil
	}
	if err := routes.ValidName(ws); err != nil {
		d.fail(w, endpoint, http.StatusBadRequest, "invalid workspace name")
		return nil
	}
	if !slices.Contains(t.workspaces, ws) {
		d.fail(w, endpoint, http.StatusForbidden, "the token is not granted this workspace")
		d.log.Warn("discovery request refused: workspace not granted", "workspace", ws, "remote", r.RemoteAddr)
		return nil
	}
	return t
}

// stateless reports whether no view with state was fed yet.
func (d *discoveryService) stateless() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.view.state == nil
}

// currentState returns the documents and tokens of the current view.
func (d *discoveryService) currentState() *stateSnapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.view.state == nil {
		return &stateSnapshot{}
	}
	return d.view.state
}

// fail answers code with a one-line plain-text body and counts it.
func (d *discoveryService) fail(w http.ResponseWriter, endpoint string, code int, reason string) {
	failRequest(w, d.requests, endpoint, code, reason)
}

// ServeHTTP serves GET /v1/workspaces/{ws}/service-routes: one snapshot,
// or with ?watch=1 a watch stream.
func (d *discoveryService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	watch, endpoint, ok := getOrWatch(w, r, d.requests, endpointDiscovery, endpointDiscoveryWatch)
	if !ok {
		return
	}
	ws := r.PathValue("ws")
	if d.stateless() {
		// No tokens yet either: a replica that is still loading answers
		// 503, never 401 (the token may well be valid) nor a set.
		w.Header().Set("Retry-After", "1")
		d.fail(w, endpoint, http.StatusServiceUnavailable, "the gateway has no state yet")
		return
	}
	tok := d.authorizeWorkspace(w, r, endpoint, ws)
	if tok == nil {
		return
	}
	if why := d.unusable(time.Now()); why != "" {
		w.Header().Set("Retry-After", "1")
		d.fail(w, endpoint, http.StatusServiceUnavailable, why)
		return
	}
	if watch {
		d.serveWatch(w, r, ws, tok.digest)
		return
	}
	d.mu.Lock()
	p := d.snapshotLocked(ws, time.Now())
	d.mu.Unlock()
	if p.err != nil {
		w.Header().Set("Retry-After", "5")
		d.fail(w, endpoint, http.StatusServiceUnavailable, "the snapshot of this workspace is unavailable")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(p.line)))
	w.WriteHeader(http.StatusOK)
	d.requests.request(endpoint, http.StatusOK)
	d.m.snapshots.WithLabelValues("get").Inc()
	_, _ = w.Write(p.line)
}

// addWatcher registers w and returns the current snapshot of its
// workspace, or a status code and reason when the watch is refused.
func (d *discoveryService) addWatcher(w *discoveryWatcher) (*publishedSnapshot, int, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, http.StatusServiceUnavailable, "the gateway is shutting down"
	}
	if d.view.unusable != "" {
		return nil, http.StatusServiceUnavailable, d.view.unusable
	}
	if d.perToken[w.digest] >= d.cfg.maxWatchersPerToken {
		return nil, http.StatusTooManyRequests,
			fmt.Sprintf("too many watch streams for this token (limit %d)", d.cfg.maxWatchersPerToken)
	}
	p := d.snapshotLocked(w.workspace, time.Now())
	if p.err != nil {
		return nil, http.StatusServiceUnavailable, "the snapshot of this workspace is unavailable"
	}
	set := d.watchers[w.workspace]
	if set == nil {
		set = make(map[*discoveryWatcher]struct{})
		d.watchers[w.workspace] = set
	}
	set[w] = struct{}{}
	d.perToken[w.digest]++
	return p, 0, ""
}

func (d *discoveryService) removeWatcher(w *discoveryWatcher) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if set := d.watchers[w.workspace]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(d.watchers, w.workspace)
		}
	}
	if d.perToken[w.digest]--; d.perToken[w.digest] <= 0 {
		delete(d.perToken, w.digest)
	}
	w.box.End("")
}

// stillGranted re-checks a watch's token and the state of discovery; it
// returns the reason to end the watch, or "".
func (d *discoveryService) stillGranted(w *discoveryWatcher) string {
	if !d.currentState().grantsWorkspace(w.digest, w.workspace) {
		return reasonRevoked
	}
	if d.unusable(time.Now()) != "" {
		return reasonUnusable
	}
	return ""
}

// serveWatch holds one watch stream until the client goes away,
// the grant is revoked, the lifetime ends, the gateway closes, or a write
// fails or is not taken within the send timeout. The watcher holds only the
// latest snapshot not yet written, never a queue.
func (d *discoveryService) serveWatch(w http.ResponseWriter, r *http.Request, ws string, digest [sha256.Size]byte) {
	const endpoint = endpointDiscoveryWatch
	wt := &discoveryWatcher{
		workspace: ws,
		digest:    digest,
		box:       ndjson.NewMailbox(),
	}
	first, code, why := d.addWatcher(wt)
	if code != 0 {
		w.Header().Set("Retry-After", "5")
		d.fail(w, endpoint, code, why)
		return
	}
	defer d.removeWatcher(wt)
	d.m.watchers.Inc()
	defer d.m.watchers.Dec()

	stream := ndjson.Start(w, d.cfg.sendTimeout)
	d.requests.request(endpoint, http.StatusOK)

	started := time.Now()
	log := d.log.With("workspace", ws, "remote", r.RemoteAddr, "proto", r.Proto)
	log.Info("discovery watch opened")
	end := func(reason string, err error) {
		d.m.disconnects.WithLabelValues(reason).Inc()
		attrs := []any{"reason", reason, "duration", time.Since(started).Round(time.Millisecond)}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		log.Info("discovery watch ended", attrs...)
	}
	writeFailed := func(err error) {
		if stream.TimedOut(err) {
			end(reasonSendTimeout, err)
			return
		}
		end(reasonWriteError, err)
	}

	if err := stream.Send(first.line); err != nil {
		writeFailed(err)
		return
	}
	d.m.snapshots.WithLabelValues("watch").Inc()
	last := first.line
	// Lifetimes are spread over the last 10 % so that watches opened
	// together do not all reconnect together.
	life := d.cfg.maxLifetime
	life -= rand.N(life/10 + 1)
	lifetime := time.NewTimer(life)
	defer lifetime.Stop()
	reauth := time.NewTicker(d.cfg.reauthPeriod)
	defer reauth.Stop()
	keepalive := time.NewTicker(d.keepalive)
	defer keepalive.Stop()
	for {
		select {
		case <-r.Context().Done():
			end(reasonClientGone, nil)
			return
		case <-wt.box.Done():
			end(wt.box.Reason(), nil)
			return
		case <-lifetime.C:
			end(reasonLifetime, nil)
			return
		case <-reauth.C:
			if reason := d.stillGranted(wt); reason != "" {
				end(reason, nil)
				return
			}
		case <-keepalive.C:
			if err := stream.Send(ndjson.KeepaliveLine); err != nil {
				writeFailed(err)
				return
			}
		case <-wt.box.Posted():
			line, open := wt.box.Take()
			if !open {
				end(wt.box.Reason(), nil)
				return
			}
			// Published lines are distinct allocations: the same
			// pointer is the same snapshot.
			if len(line) == 0 || &line[0] == &last[0] {
				continue
			}
			if err := stream.Send(line); err != nil {
				writeFailed(err)
				return
			}
			last = line
			d.m.snapshots.WithLabelValues("watch").Inc()
		}
	}
}
