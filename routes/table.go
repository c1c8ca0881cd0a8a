package routes

import (
	"context"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/buckets"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/ocsf"
)

// Clock is the table's source of time; tests inject a fake one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the part of *time.Timer the table uses.
type Timer interface {
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// DefaultFreshness is how long a delivered route stays valid without renewal.
const DefaultFreshness = 30 * time.Second

// Instance is the per-sandbox-instance state shared by all of its routes:
// its stream limit and its count of active streams. One Instance exists per
// workspace/sandbox for as long as the instance has routes.
type Instance struct {
	Key         InstanceKey
	maxStreams  atomic.Int64
	active      atomic.Int64
	idleTimeout atomic.Int64 // nanoseconds; 0: the supervisor's default
	requests    atomic.Uint64
	limited     atomic.Uint64
	// Bytes relayed for the instance's requests and WebSockets, counted
	// when each ends (CountEnded).
	bytesToApp    atomic.Uint64
	bytesToClient atomic.Uint64
	wsNanos       atomic.Int64 // WebSocket lifetimes, counted when each ends
	lastActivity  atomic.Int64 // unix nanos of the last ended request or WebSocket
	// Open WebSockets (WebSocketOpened, not yet WebSocketClosed) and the
	// sum of their start times in unix nanos: their seconds so far are
	// wsOpen×now − wsStartSum, so that usage grows while they are open.
	wsOpen     atomic.Int64
	wsStartSum atomic.Int64
	// act is what /v1/usage reports of the instance's activity: its
	// last request, its WebSockets' last frame and their silence.
	act activity
	// Fair is the instance's flow in the listener's fair admission
	// (limits.weight, its queue and its wait counters).
	Fair fairshare.Flow
	// rates are the request and byte rate limits (ratelimit.go).
	rates instanceRates
}

// WebSocketOpened counts a WebSocket of the instance open since start, so
// that Usage reports its seconds while it is open; WebSocketClosed with
// the same start must follow when it ends (before CountEnded).
func (i *Instance) WebSocketOpened(start time.Time) {
	if i == nil {
		return
	}
	i.wsStartSum.Add(start.UnixNano())
	i.wsOpen.Add(1)
}

// WebSocketClosed undoes WebSocketOpened(start).
func (i *Instance) WebSocketClosed(start time.Time) {
	if i == nil {
		return
	}
	i.wsOpen.Add(-1)
	i.wsStartSum.Add(-start.UnixNano())
}

// openWebSocketNanos returns the number of open WebSockets and their
// lifetimes so far at now.
func (i *Instance) openWebSocketNanos(now time.Time) (open, nanos int64) {
	// Read the count last: a WebSocket opening between the loads adds its
	// start before its count, so the sum never lacks a counted start.
	sum := i.wsStartSum.Load()
	open = i.wsOpen.Load()
	nanos = open*now.UnixNano() - sum
	if open <= 0 || nanos < 0 {
		return max(open, 0), 0
	}
	return open, nanos
}

// IdleTimeout is the instance's idle timeout for client connections and
// WebSockets (0: the supervisor's default).
func (i *Instance) IdleTimeout() time.Duration { return time.Duration(i.idleTimeout.Load()) }

// CountRequest counts one request answered for the instance.
func (i *Instance) CountRequest() { i.requests.Add(1) }

// CountEnded counts one ended request or WebSocket of the instance: its
// body and stream bytes (toApp from the client, toClient from the app), the
// WebSocket's lifetime (0 for a request) and the time it ended.
func (i *Instance) CountEnded(toApp, toClient int64, ws time.Duration, end time.Time) {
	if i == nil {
		return
	}
	i.lastActivity.Store(end.UnixNano())
	if ws > 0 {
		i.wsNanos.Add(int64(ws))
	}
	if toApp > 0 {
		i.bytesToApp.Add(uint64(toApp))
	}
	if toClient > 0 {
		i.bytesToClient.Add(uint64(toClient))
	}
}

// Bytes returns the bytes counted by CountEnded so far.
func (i *Instance) Bytes() (toApp, toClient uint64) {
	return i.bytesToApp.Load(), i.bytesToClient.Load()
}

// Acquire takes one stream slot; it returns false when the instance is at
// its max_streams limit.
func (i *Instance) Acquire() bool {
	limit := i.maxStreams.Load()
	for {
		n := i.active.Load()
		if limit > 0 && n >= limit {
			i.limited.Add(1)
			return false
		}
		if i.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a slot taken by Acquire.
func (i *Instance) Release() { i.active.Add(-1) }

// Active returns the number of streams currently holding a slot.
func (i *Instance) Active() int64 { return i.active.Load() }

// MaxStreams returns the instance's current stream limit (0: none).
func (i *Instance) MaxStreams() int64 { return i.maxStreams.Load() }

// Route is one installed hostname. The identity fields never change while
// the route is installed; a change of target installs a new Route.
type Route struct {
	Host                string
	Workspace           string
	Sandbox             string
	Service             string // "" for the unnamed service
	Port                int
	Generation          string
	Connector           ConnectorSpec
	Protocol            string // "" (HTTP/1.1) or ProtocolH2C
	InstallationVersion uint64
	Instance            *Instance
	Lease               *Lease

	// Access is the service's access policy (Mode AccessPublic when the
	// document sets none). A change of policy is a change of target: the
	// route is reinstalled and its streams are revoked, so that they are
	// decided again under the new policy.
	Access AccessPolicy

	table *Table
	// sleeping is the instance's state: a sleeping instance's route is
	// installed and fresh but nothing is dialled (see WakePolicy). Going
	// to sleep reinstalls the route (its streams are revoked with
	// ErrSleeping); waking is in place (woken is closed), so that the
	// requests held on the sleeping route go on to the app.
	sleeping    atomic.Bool
	woken       chan struct{} // closed when a route installed sleeping wakes
	wake        atomic.Pointer[WakePolicy]
	declaration atomic.Int64
	startGrace  atomic.Int64 // 0: the supervisor's default; else 1 + nanoseconds
	dataMu      sync.Mutex
	data        any
}

// DeclarationRevision is the service's declaration revision from the last
// delivered document; it may change without reinstalling the route.
func (r *Route) DeclarationRevision() int64 { return r.declaration.Load() }

// StartGrace is how long a request waits for the service's app to start
// listening (start_grace_seconds from the last delivered document); ok is
// false when the document leaves it to the supervisor's default. Like the
// declaration revision it may change without reinstalling the route.
func (r *Route) StartGrace() (d time.Duration, ok bool) {
	n := r.startGrace.Load()
	if n == 0 {
		return 0, false
	}
	return time.Duration(n - 1), true
}

// Wake is the service's wake policy from the last delivered document, with
// its defaults filled in (On and HoldSeconds are set). Like the start grace
// it may change without reinstalling the route. Callers must not modify it.
func (r *Route) Wake() *WakePolicy {
	if p := r.wake.Load(); p != nil {
		return p
	}
	return defaultWake
}

// defaultWake is the wake policy of a route whose document sets none.
var defaultWake = wakeOf(&ServiceSpec{})

// setWake records svc's wake policy.
func (r *Route) setWake(svc *ServiceSpec) {
	if cur := r.wake.Load(); cur != nil && cur.Equal(svc.Wake) {
		return
	}
	r.wake.Store(wakeOf(svc))
}

// setStartGrace records svc's start_grace_seconds.
func (r *Route) setStartGrace(svc *ServiceSpec) {
	if svc.StartGraceSeconds == nil {
		r.startGrace.Store(0)
		return
	}
	r.startGrace.Store(1 + int64(time.Duration(*svc.StartGraceSeconds)*time.Second))
}

// Usable reports whether the route may carry new traffic: its lease is live
// and the table is fresh.
func (r *Route) Usable() bool {
	return r.Lease.Live() && r.table.Fresh()
}

// FreshUntil is when the route expires unless renewed.
func (r *Route) FreshUntil() time.Time { return time.Unix(0, r.table.freshUntil.Load()) }

// Data returns the data plane's per-route state, creating it with create on
// first use. create runs at most once per route.
func (r *Route) Data(create func() any) any {
	r.dataMu.Lock()
	defer r.dataMu.Unlock()
	if r.data == nil {
		r.data = create()
	}
	return r.data
}

func (r *Route) sameTarget(spec *InstanceSpec, svc *ServiceSpec) bool {
	return r.Port == svc.Port && r.Generation == spec.Generation && r.Connector == spec.Connector &&
		r.Protocol == svc.Protocol && r.Access.Equal(svc.Access)
}

// Sleeping reports whether the route's instance is sleeping: nothing may
// be dialled for it. A sleeping route wakes in place (Woken).
func (r *Route) Sleeping() bool { return r.sleeping.Load() }

// Woken returns a channel closed when the route, installed sleeping,
// wakes; nil (never ready) for a route installed active.
func (r *Route) Woken() <-chan struct{} { return r.woken }

// initSleeping sets the state of a new route.
func (r *Route) initSleeping(sleeping bool) {
	if sleeping {
		r.sleeping.Store(true)
		r.woken = make(chan struct{})
	}
}

// wakeLocked makes a sleeping route active in place; the table's lock is
// held.
func (r *Route) wakeLocked() {
	if r.sleeping.Swap(false) {
		close(r.woken)
	}
}

// Snapshot is an immutable view of the installed routes.
type Snapshot struct {
	byHost   map[string]*Route
	Revision string // the document revision it was built from
}

// Len returns the number of routes.
func (s *Snapshot) Len() int { return len(s.byHost) }

// All yields the routes in no particular order, without copying them:
// cheaper than Routes for a scan of a large table.
func (s *Snapshot) All() iter.Seq[*Route] {
	return func(yield func(*Route) bool) {
		for _, r := range s.byHost {
			if !yield(r) {
				return
			}
		}
	}
}

// Routes returns the routes sorted by hostname.
func (s *Snapshot) Routes() []*Route {
	out := make([]*Route, 0, len(s.byHost))
	for _, r := range s.byHost {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Route) int {
		switch {
		case a.Host < b.Host:
			return -1
		case a.Host > b.Host:
			return 1
		}
		return 0
	})
	return out
}

// Event describes one change to the table, for logs.
type Event struct {
	Kind    string // "installed", "changed", "woken", "withdrawn", "rejected", "expired", "stopped", "shutdown"
	Host    string
	Port    int
	Version uint64
	Streams int    // streams revoked
	Reason  string // for rejections
	// The route's owner.
	Workspace, Sandbox, Service string
}

// Options configure a Table.
type Options struct {
	Domain            string
	Freshness         time.Duration // DefaultFreshness when 0
	DefaultMaxStreams int           // limit for instances that set none; 0: unlimited
	// MaxInstanceLabels bounds the per-instance metric series: instances
	// beyond it are summed under workspace="_other" (default 1000).
	MaxInstanceLabels int
	Clock             Clock        // SystemClock when nil
	Logger            *slog.Logger // slog.Default() when nil
	// OCSF receives an Entity Management record per route change and per
	// renewal (ocsf.go); nil: none.
	OCSF       *ocsf.Emitter
	Registerer prometheus.Registerer
	// UsageRetention is how long Usage still reports a withdrawn instance
	// (DefaultUsageRetention when 0).
	UsageRetention time.Duration
	// AccessTokens says that the data plane enforces access mode token
	// (the listener has access keys). Without it Apply refuses every
	// instance with a service in mode token, rather than serve a
	// "private" preview publicly.
	AccessTokens bool
}

// Table is the route table. Lookups are lock-free loads of an immutable
// snapshot; changes are serialised by a mutex and never block lookups.
type Table struct {
	opts    Options
	clock   Clock
	log     *slog.Logger
	metrics *tableMetrics

	snap       atomic.Pointer[Snapshot]
	freshUntil atomic.Int64 // unix nanos
	accepted   atomic.Bool

	mu        sync.Mutex
	subs      []chan struct{}
	closed    bool
	version   uint64
	instances map[InstanceKey]*Instance
	// retired holds withdrawn instances for UsageRetention, so that
	// /v1/usage reports their final counts; a re-installed instance takes
	// its counters back.
	retired map[InstanceKey]retiredInstance
	lastDoc *Document
	timer   Timer
}

// NewTable returns an empty table.
func NewTable(opts Options) *Table {
	if opts.Freshness <= 0 {
		opts.Freshness = DefaultFreshness
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	t := &Table{
		opts:      opts,
		clock:     opts.Clock,
		log:       opts.Logger,
		metrics:   newTableMetrics(opts.Registerer),
		instances: make(map[InstanceKey]*Instance),
		retired:   make(map[InstanceKey]retiredInstance),
	}
	if t.opts.UsageRetention <= 0 {
		t.opts.UsageRetention = DefaultUsageRetention
	}
	if opts.MaxInstanceLabels <= 0 {
		t.opts.MaxInstanceLabels = 1000
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(newInstanceCollector(t))
	}
	t.snap.Store(&Snapshot{byHost: map[string]*Route{}})
	return t
}

// Subscribe returns a channel that receives a signal after every change or
// renewal of the table (signals coalesce: the channel holds at most one).
func (t *Table) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	t.mu.Lock()
	t.subs = append(t.subs, ch)
	t.mu.Unlock()
	return ch
}

// notify signals the subscribers; the caller holds t.mu.
func (t *Table) notifyLocked() {
	for _, ch := range t.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Domain returns the application domain the table builds hostnames under.
func (t *Table) Domain() string { return t.opts.Domain }

// Freshness returns the freshness window.
func (t *Table) Freshness() time.Duration { return t.opts.Freshness }

// Lookup returns the usable route for a normalized hostname, or nil. It does
// not allocate.
func (t *Table) Lookup(host string) *Route {
	r := t.snap.Load().byHost[host]
	if r != nil && !r.Lease.Live() {
		// A change raced this lookup: its replacement, if any, is already
		// in the newer snapshot (snapshots are stored before leases are
		// cancelled).
		r = t.snap.Load().byHost[host]
	}
	if r == nil || !r.Lease.Live() || !t.Fresh() {
		return nil
	}
	return r
}

// Snapshot returns the current snapshot (which may contain routes whose
// freshness has just passed and whose expiry timer has not yet run).
func (t *Table) Snapshot() *Snapshot { return t.snap.Load() }

// Fresh reports whether the installed routes are within their freshness window.
func (t *Table) Fresh() bool {
	return t.clock.Now().UnixNano() < t.freshUntil.Load()
}

// Accepted reports whether a configuration has ever been applied.
func (t *Table) Accepted() bool { return t.accepted.Load() }

// ApplyResult summarises one Apply.
type ApplyResult struct {
	Installed, Changed, Withdrawn, Rejected, Kept int
}

type revocation struct {
	route *Route
	cause error
	event int // index of its event in the same batch, -1 for none
}

// Apply makes doc the desired state: new or re-targeted services are
// installed with a new installation version, missing ones are withdrawn,
// rejected instances' routes are withdrawn, and every delivered route is
// renewed. Streams of revoked routes are closed before Apply returns.
// Without Options.AccessTokens, instances with a service in access mode
// token are first moved to doc.Rejected (RefuseTokenAccess), which the
// caller reports like any other rejection.
func (t *Table) Apply(doc *Document) ApplyResult {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ApplyResult{}
	}
	if !t.opts.AccessTokens {
		RefuseTokenAccess(doc, NoAccessKeysReason)
	}
	res, revs, events := t.applyLocked(doc)
	n := t.snap.Load().Len()
	t.mu.Unlock()
	t.finish(revs, events)
	t.ocsfTable("renewed", n, 0)
	return res
}

// NoAccessKeysReason is why a table without access keys refuses an
// instance with a service in access mode token.
const NoAccessKeysReason = "access mode token needs access keys: start the listener with --access-keys-file"

// RefuseTokenAccess moves every instance of doc that has a service in
// access mode token to doc.Rejected, with a one-line reason naming the
// service; it reports whether it moved any. The index of such an entry
// is not known here: it is -1.
func RefuseTokenAccess(doc *Document, reason string) bool {
	kept := doc.Instances[:0:0]
	moved := false
	for i := range doc.Instances {
		spec := &doc.Instances[i]
		name, private := "", false
		for j := range spec.Services {
			if !spec.Services[j].Access.IsPublic() {
				name, private = spec.Services[j].Name, true
				break
			}
		}
		if !private {
			kept = append(kept, *spec)
			continue
		}
		moved = true
		doc.Rejected = append(doc.Rejected, RejectedInstance{
			Index:     -1,
			Workspace: spec.Workspace,
			Sandbox:   spec.Sandbox,
			Reason:    "service " + strconv.Quote(name) + ": " + reason,
		})
	}
	if moved {
		doc.Instances = kept
	}
	return moved
}

// Renew renews the installed routes after a successful delivery that carried
// no new document (a 304, a keepalive). If routes expired since the last
// document, the last document is applied again.
func (t *Table) Renew() {
	t.mu.Lock()
	if t.closed || t.lastDoc == nil {
		t.mu.Unlock()
		return
	}
	if t.Fresh() {
		t.renewLocked()
		n := t.snap.Load().Len()
		t.mu.Unlock()
		t.ocsfTable("renewed", n, 0)
		return
	}
	_, revs, events := t.applyLocked(t.lastDoc)
	t.mu.Unlock()
	t.finish(revs, events)
}

// StopInstance revokes every stream of one instance (its connector is gone)
// and reinstalls its routes with new installation versions, so new requests
// see the connector's own error. It returns the number of streams closed.
func (t *Table) StopInstance(key InstanceKey) int {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0
	}
	old := t.snap.Load()
	next := make(map[string]*Route, len(old.byHost))
	var revs []revocation
	var events []Event
	for host, r := range old.byHost {
		if r.Instance.Key != key {
			next[host] = r
			continue
		}
		nr := t.newRoute(r)
		next[host] = nr
		revs = append(revs, revocation{r, ErrStopped, len(events)})
		events = append(events, routeEvent("stopped", r))
	}
	t.snap.Store(&Snapshot{byHost: next, Revision: old.Revision})
	t.notifyLocked()
	t.mu.Unlock()
	return t.finish(revs, events)
}

// Close stops the expiry timer and revokes every route with ErrShutdown.
func (t *Table) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	if t.timer != nil {
		t.timer.Stop()
	}
	old := t.snap.Load()
	t.snap.Store(&Snapshot{byHost: map[string]*Route{}})
	t.mu.Unlock()
	revs := make([]revocation, 0, len(old.byHost))
	for _, r := range old.byHost {
		revs = append(revs, revocation{r, ErrShutdown, -1})
	}
	n := t.finish(revs, nil)
	if len(revs) > 0 {
		t.log.Info("route table closed", "class_uid", 3004, "routes", len(revs), "streams_closed", n)
		t.ocsfTable("closed", len(revs), n)
	}
}

func (t *Table) newRoute(from *Route) *Route {
	t.version++
	r := &Route{
		Host: from.Host, Workspace: from.Workspace, Sandbox: from.Sandbox, Service: from.Service,
		Port: from.Port, Generation: from.Generation, Connector: from.Connector, Protocol: from.Protocol,
		Access:              *from.Access.Clone(),
		InstallationVersion: t.version, Instance: from.Instance, Lease: NewLease(), table: t,
	}
	r.initSleeping(from.Sleeping())
	r.declaration.Store(from.declaration.Load())
	r.startGrace.Store(from.startGrace.Load())
	r.wake.Store(from.wake.Load())
	return r
}

func (t *Table) applyLocked(doc *Document) (ApplyResult, []revocation, []Event) {
	var res ApplyResult
	var revs []revocation
	var events []Event
	old := t.snap.Load()
	fresh := t.Fresh()
	next := make(map[string]*Route, max(len(old.byHost), len(doc.Instances)))
	seenInstances := make(map[InstanceKey]bool, len(doc.Instances))
	y := newYielder() // lookups take no lock: let them run during a large change
	defer y.close()
	for i := range doc.Instances {
		y.step()
		spec := &doc.Instances[i]
		key := spec.Key()
		seenInstances[key] = true
		inst := t.instances[key]
		if inst == nil {
			if r, ok := t.retired[key]; ok {
				inst = r.inst // back within the retention: counters continue
				delete(t.retired, key)
			} else {
				inst = &Instance{Key: key}
			}
			t.instances[key] = inst
		}
		limit := spec.Limits.MaxStreams
		if limit == 0 {
			limit = t.opts.DefaultMaxStreams
		}
		inst.maxStreams.Store(int64(limit))
		inst.idleTimeout.Store(int64(time.Duration(spec.Limits.IdleTimeoutSeconds) * time.Second))
		inst.Fair.SetWeight(spec.Limits.Weight) // in place, like the limits above
		inst.rates.setRates(&spec.Limits)       // in place, like the stream limit
		for j := range spec.Services {
			svc := &spec.Services[j]
			host := Hostname(spec.Workspace, spec.Sandbox, svc.Name, t.opts.Domain)
			prev := old.byHost[host]
			goesToSleep := prev != nil && spec.Sleeping() && !prev.Sleeping()
			if prev != nil && fresh && prev.Lease.Live() && prev.sameTarget(spec, svc) && !goesToSleep {
				prev.declaration.Store(svc.Revision)
				prev.setStartGrace(svc)
				prev.setWake(svc)
				if prev.Sleeping() && !spec.Sleeping() {
					prev.wakeLocked() // in place: the held requests go on
					events = append(events, routeEvent("woken", prev))
				}
				next[host] = prev
				res.Kept++
				continue
			}
			t.version++
			r := &Route{
				Host: host, Workspace: spec.Workspace, Sandbox: spec.Sandbox, Service: svc.Name,
				Port: svc.Port, Generation: spec.Generation, Connector: spec.Connector, Protocol: svc.Protocol,
				Access:              *svc.Access.orDefault().Clone(),
				InstallationVersion: t.version, Instance: inst, Lease: NewLease(), table: t,
			}
			r.initSleeping(spec.Sleeping())
			r.declaration.Store(svc.Revision)
			r.setStartGrace(svc)
			r.setWake(svc)
			next[host] = r
			switch {
			case prev == nil:
				res.Installed++
				events = append(events, routeEvent("installed", r))
			case !fresh || !prev.Lease.Live():
				// The old route had already gone stale (its expiry timer
				// had not run yet): it expired; this is a new installation.
				revs = append(revs, revocation{prev, ErrExpired, len(events)})
				events = append(events, routeEvent("expired", prev))
				res.Installed++
				events = append(events, routeEvent("installed", r))
			default:
				res.Changed++
				cause := ErrChanged
				if goesToSleep {
					cause = ErrSleeping
				}
				revs = append(revs, revocation{prev, cause, len(events)})
				events = append(events, routeEvent("changed", r))
			}
		}
	}
	rejected := make(map[InstanceKey]string, len(doc.Rejected))
	for _, rj := range doc.Rejected {
		rejected[InstanceKey{rj.Workspace, rj.Sandbox}] = rj.Reason
	}
	for host, r := range old.byHost {
		y.step()
		if _, ok := next[host]; ok {
			continue
		}
		cause, kind := ErrWithdrawn, "withdrawn"
		reason, isRejected := rejected[r.Instance.Key]
		if isRejected {
			cause, kind = ErrRejected, "rejected"
			res.Rejected++
		} else {
			res.Withdrawn++
		}
		revs = append(revs, revocation{r, cause, len(events)})
		ev := routeEvent(kind, r)
		ev.Reason = reason
		events = append(events, ev)
	}
	retiredSome := false
	for key := range t.instances {
		y.step()
		if !seenInstances[key] {
			t.retired[key] = retiredInstance{t.instances[key], t.clock.Now()}
			delete(t.instances, key)
			retiredSome = true
		}
	}
	if retiredSome {
		t.pruneRetiredLocked(t.clock.Now())
	}
	t.snap.Store(&Snapshot{byHost: next, Revision: doc.Revision})
	t.lastDoc = doc
	t.accepted.Store(true)
	t.renewLocked()
	return res, revs, events
}

func (t *Table) renewLocked() {
	defer t.notifyLocked()
	deadline := t.clock.Now().Add(t.opts.Freshness)
	t.freshUntil.Store(deadline.UnixNano())
	t.metrics.renewals.Inc()
	if t.timer != nil {
		t.timer.Stop()
	}
	t.timer = t.clock.AfterFunc(t.opts.Freshness, t.expire)
}

// expire runs from the freshness timer.
func (t *Table) expire() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	now := t.clock.Now()
	if until := time.Unix(0, t.freshUntil.Load()); now.Before(until) {
		// Renewed meanwhile; a newer timer is pending.
		t.mu.Unlock()
		return
	}
	old := t.snap.Load()
	t.snap.Store(&Snapshot{byHost: map[string]*Route{}, Revision: old.Revision})
	t.notifyLocked()
	t.mu.Unlock()
	var revs []revocation
	var events []Event
	for _, r := range old.byHost {
		revs = append(revs, revocation{r, ErrExpired, len(events)})
		events = append(events, routeEvent("expired", r))
	}
	t.finish(revs, events)
}

// finish publishes metrics, cancels leases and logs events, outside the lock.
func (t *Table) finish(revs []revocation, events []Event) int {
	t.metrics.routes.Set(float64(t.snap.Load().Len()))
	total := 0
	start := time.Now()
	for _, rv := range revs {
		n := rv.route.Lease.Cancel(rv.cause)
		total += n
		t.metrics.revocations.WithLabelValues(CauseLabel(rv.cause)).Inc()
		if rv.event >= 0 {
			events[rv.event].Streams = n
		}
	}
	if len(revs) > 0 {
		t.metrics.revocationSeconds.Observe(time.Since(start).Seconds())
	}
	t.logEvents(events)
	t.ocsfEvents(events)
	return total
}

// maxEventLines is how many route events one change logs one by one; a
// larger change (a 10,000-route replacement) logs one summary line at INFO
// and the individual events at DEBUG, so that it neither floods the bounded
// log writer nor spends the data plane's CPU on formatting.
const maxEventLines = 64

func (t *Table) logEvents(events []Event) {
	if len(events) <= maxEventLines {
		for _, e := range events {
			t.logEvent(e, false)
		}
		return
	}
	counts := map[string]int{}
	streams := 0
	for _, e := range events {
		counts[e.Kind]++
		streams += e.Streams
	}
	t.log.LogAttrs(context.Background(), slog.LevelInfo, "routes changed",
		slog.Int("class_uid", 3004), slog.Int("events", len(events)),
		slog.Int("installed", counts["installed"]), slog.Int("changed", counts["changed"]),
		slog.Int("withdrawn", counts["withdrawn"]), slog.Int("rejected", counts["rejected"]),
		slog.Int("expired", counts["expired"]), slog.Int("stopped", counts["stopped"]),
		slog.Int("streams_closed", streams))
	if t.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, e := range events {
			t.logEvent(e, true)
		}
	}
}

func (t *Table) logEvent(e Event, debug bool) {
	level := slog.LevelInfo
	msg := "route " + e.Kind
	switch {
	case debug:
		level = slog.LevelDebug
	case e.Kind == "rejected" || e.Kind == "expired" || e.Kind == "stopped":
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.Int("class_uid", 3004),
		slog.String("activity", activityName(e.Kind)),
		slog.String("host", e.Host),
		slog.Int("port", e.Port),
		slog.Uint64("installation_version", e.Version),
	}
	if e.Streams > 0 {
		attrs = append(attrs, slog.Int("streams_closed", e.Streams))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", e.Reason))
	}
	t.log.LogAttrs(context.Background(), level, msg, attrs...)
}

func activityName(kind string) string {
	switch kind {
	case "installed":
		return "created"
	case "changed", "woken":
		return "updated"
	}
	return "deleted"
}

type tableMetrics struct {
	routes            prometheus.Gauge
	renewals          prometheus.Counter
	revocations       *prometheus.CounterVec
	revocationSeconds prometheus.Histogram
}

func newTableMetrics(reg prometheus.Registerer) *tableMetrics {
	m := &tableMetrics{
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_routes", Help: "Installed routes.",
		}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_route_renewals_total", Help: "Freshness renewals of the route table.",
		}),
		revocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_route_revocations_total", Help: "Routes revoked, by cause.",
		}, []string{"cause"}),
		revocationSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "applistener_revocation_close_seconds",
			Help:    "Time from a route change to the last of its revoked streams being closed.",
			Buckets: buckets.Revocation,
		}),
	}
	if reg != nil {
		reg.MustRegister(m.routes, m.renewals, m.revocations, m.revocationSeconds)
	}
	return m
}
