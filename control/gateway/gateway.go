// Package gateway is the reference gateway, the other side of the control
// plane from the supervisor: it serves each supervisor its configuration
// document (a poll with ETag and If-None-Match, or an NDJSON push session:
// configendpoint.go, push.go), authenticates supervisors, pools, admins and
// workspace readers with bearer tokens from a file, holds supervisor
// sessions, stores the installations that supervisors advertise, and
// publishes them per workspace as discovery snapshots and watch streams
// (discovery.go).
//
// Its state (documents, advertisements, sessions, pool bindings) is in a
// store (store.go): in memory for one process, or in etcd, shared by every
// replica, which all follow it (view.go) and feed an immutable view of it
// to their two components, the push streams and discovery, each with a
// lock of its own; a replica that cannot vouch for its view of the store
// answers 503. Documents come from the write API (writeapi.go) and from an
// optional configuration file imported into the store.
//
// It never imports the supervisor side (control/supervisor); what both
// sides share is in control/api.
package gateway

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/wake"
)

// Defaults and limits of the reference gateway.
const (
	// DefaultKeepalive is the keepalive interval of a watch stream.
	DefaultKeepalive = 5 * time.Second
	// DefaultPoll is how often the gateway checks its files for a
	// change.
	DefaultPoll = 250 * time.Millisecond
	// MaxConfigBytes is the largest gateway configuration file.
	MaxConfigBytes = 64 << 20
	// MaxTokensBytes is the largest tokens file.
	MaxTokensBytes = 4 << 20
	// MaxInstallationsBytes is the largest installations body accepted.
	MaxInstallationsBytes = 4 << 20
	// MaxTokenLen is the longest bearer token.
	MaxTokenLen = 4096
)

// Config configures a Gateway.
type Config struct {
	// ConfigPath is the configuration file:
	// {"supervisors": {"<id>": <configuration document>, ...}}, imported
	// into the store at start and whenever it changes (the supervisors it
	// names get its documents; others are untouched). Required with the
	// memory store, optional with etcd.
	ConfigPath string
	// TokensPath is the tokens file:
	// {"tokens": [{"token":"t1","supervisor":"sup-1"}, {"token":"t2","workspaces":["team"]},
	// {"token":"ta","admin":true}, {"token":"tp","pool":"hosts"}]}.
	TokensPath string
	// Etcd, when not nil, keeps the gateway's state in etcd (shared by
	// replicas); nil keeps it in memory.
	Etcd *EtcdConfig
	// SessionTTL is how long a supervisor session holds after its last
	// request (DefaultSessionTTL when not positive).
	SessionTTL time.Duration
	// Keepalive is the longest (and default) keepalive interval of a push
	// stream (DefaultKeepalive when not positive).
	Keepalive time.Duration
	// DiscoveryWarmup applies to the memory store only: for this long after
	// Run starts, discovery answers 503, because a gateway that (re)starts
	// with an empty memory store cannot know the routes its supervisors
	// still hold until their sessions come back; a 200 then would withdraw
	// valid routes at every consumer (DESIGN, "Faults"). Zero: no warmup.
	// The command's default is DefaultDiscoveryWarmup(session TTL).
	DiscoveryWarmup time.Duration
	// KeepaliveMin is the shortest keepalive interval granted
	// (DefaultKeepaliveMin when not positive).
	KeepaliveMin time.Duration
	// EndpointPolicy is "any" (default), "source" or "cidr:PREFIX,...":
	// which advertised endpoints may be published (policy.go).
	EndpointPolicy string
	// Poll is how often both files are checked for a change by their stat
	// identity (mtime, size, device, inode); DefaultPoll when not
	// positive.
	Poll time.Duration
	// DisablePush answers ?watch=1 with 501 so that supervisors poll.
	DisablePush bool
	// DiscoveryMaxWatchersPerToken bounds the open discovery watches of one
	// token; more are refused with 429
	// (DefaultDiscoveryMaxWatchersPerToken when not positive).
	DiscoveryMaxWatchersPerToken int
	// DiscoverySendTimeout disconnects a discovery watcher that does not
	// take a line within it (DefaultDiscoverySendTimeout when not positive).
	DiscoverySendTimeout time.Duration
	// DiscoveryMaxWatchLifetime ends every discovery watch cleanly after
	// this long, minus up to 10 % jitter; clients reconnect
	// (DefaultDiscoveryMaxWatchLifetime when not positive).
	DiscoveryMaxWatchLifetime time.Duration
	// DiscoveryReauthPeriod is how often an open discovery watch re-checks
	// its token's grant; a tokens reload re-checks at once too
	// (DefaultDiscoveryReauthPeriod when not positive).
	DiscoveryReauthPeriod time.Duration
	// IdleGrace is how long a supervisor id with no session, no
	// advertisement and no push stream keeps its empty document and its
	// pool binding before they are removed (gc.go; DefaultIdleGrace when
	// not positive).
	IdleGrace time.Duration
	// StrictSupervisors refuses a configuration file that gives a
	// document to a supervisor id the gateway does not know, and write
	// API edits of such a document (supervisors.go); without it they are
	// warned about and counted.
	StrictSupervisors bool
	// WakeHook, when set, is the platform's wake hook: supervisors' wake
	// requests (POST .../instances/{ws}/{sb}/wake) are forwarded to it
	// (package wake). Its URL is required; Supervisor is set per request.
	WakeHook *wake.HookOptions
	// Logger receives the gateway's logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Gateway is the reference implementation of the gateway side of the
// control protocol. It serves each supervisor's configuration document
// (poll with ETag/If-None-Match, or an NDJSON watch stream that gets every
// change at once), authenticates with bearer tokens from a file, holds
// sessions, stores the installations that supervisors advertise and
// publishes them to workspace tokens (discovery, see discovery.go). Its
// state is in a store (memory or etcd). Create it with New; Run must be
// running for discovery (and, with etcd, for anything) to answer.
type Gateway struct {
	configPath   string
	tokensPath   string
	keepalive    time.Duration
	keepaliveMin time.Duration
	sessionTTL   time.Duration
	// discoveryWarmup is Config.DiscoveryWarmup.
	discoveryWarmup time.Duration
	poll            time.Duration
	disablePush     bool
	policy          endpointPolicy
	log             *slog.Logger
	m               *metrics
	// discovery publishes the advertisements; it is fed a view of the
	// state at each change (feedDiscoveryLocked).
	discovery *discoveryService
	// push holds the configuration push streams; it is fed a view of the
	// state at each change (feedPushLocked).
	push *pushService
	// idle removes what idle supervisor ids leave in the store (gc.go).
	idle *idleCollector
	// strictSupervisors is Config.StrictSupervisors; unknown counts the
	// documents of unknown supervisor ids (supervisors.go).
	strictSupervisors bool
	unknown           unknownMetric
	// wake relays supervisors' wake requests to the platform's hook
	// (coalesced per instance, refusals cached); nil without a hook.
	wake *wake.Coordinator

	store     store
	storeKind string // "memory" or "etcd"
	// storeUp is true while the view is loaded and the store reachable;
	// storeWhy says why not.
	storeUp  atomic.Bool
	storeWhy atomic.Pointer[string]
	// running is true while Run runs; Run closes the store when it ends,
	// Close when Run never ran.
	running   atomic.Bool
	closeOnce sync.Once

	// applied is the store revision the view has (waitApplied).
	applied *appliedRevision

	// state is the current documents and tokens: immutable, replaced whole,
	// stored with mu held, loaded without it.
	state atomic.Pointer[stateSnapshot]

	// reloadMu serializes reloads and guards the fields below it.
	reloadMu   sync.Mutex
	configSeen pollfile.Identity
	tokensSeen pollfile.Identity
	// fileDocs are the documents of the configuration file as last read,
	// still to be imported when importPending; fileIDs are the supervisors
	// the last import wrote (an id that leaves the file is deleted).
	fileDocs      map[string]document
	fileIDs       map[string]struct{}
	importPending bool
	// importRefused is true while StrictSupervisors refused the file's
	// last import: a tokens reload (which may name its ids) retries it.
	importRefused bool

	// mu guards the fields below it, and is held while state is replaced
	// and the components (discovery, push) are fed, so that they see every
	// change in order.
	mu sync.Mutex
	// installations are the latest advertisements by supervisor id,
	// sessions the current sessions and pools the pool bindings: the view
	// of the store. Each map is replaced, never written, once discovery
	// or the push streams were handed it (copy on write).
	installations map[string]advertisement
	sessions      map[string]sessionView
	pools         map[string]string
	// recovered are the advertisements published without a session after
	// every replica was down (recovery.go), copy on write as well.
	recovered map[string]recoveredAd
	// policyWarned are the (supervisor, endpoint) pairs already warned
	// about.
	policyWarned map[string]struct{}
}

// New reads the files and sets up the store. A file that cannot be read
// or parsed is an error: there is no previous state to keep. With the
// memory store the configuration file is imported at once; with etcd,
// nothing is contacted before Run, which loads the store and then imports
// the file.
func New(cfg Config) (*Gateway, error) {
	if cfg.TokensPath == "" {
		return nil, errors.New("gateway: TokensPath is required")
	}
	if cfg.ConfigPath == "" && cfg.Etcd == nil {
		return nil, errors.New("gateway: ConfigPath is required with the memory store")
	}
	policy, err := parseEndpointPolicy(cfg.EndpointPolicy)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{
		configPath:        cfg.ConfigPath,
		tokensPath:        cfg.TokensPath,
		keepalive:         cmp.Or(max(cfg.Keepalive, 0), DefaultKeepalive),
		keepaliveMin:      cmp.Or(max(cfg.KeepaliveMin, 0), DefaultKeepaliveMin),
		sessionTTL:        cmp.Or(max(cfg.SessionTTL, 0), DefaultSessionTTL),
		discoveryWarmup:   max(cfg.DiscoveryWarmup, 0),
		poll:              cmp.Or(max(cfg.Poll, 0), DefaultPoll),
		disablePush:       cfg.DisablePush,
		policy:            policy,
		log:               cfg.Logger,
		m:                 newMetrics(cfg.Registerer),
		installations:     make(map[string]advertisement),
		sessions:          make(map[string]sessionView),
		pools:             make(map[string]string),
		applied:           newAppliedRevision(),
		policyWarned:      make(map[string]struct{}),
		fileIDs:           make(map[string]struct{}),
		idle:              newIdleCollector(cmp.Or(max(cfg.IdleGrace, 0), DefaultIdleGrace), cfg.Registerer),
		strictSupervisors: cfg.StrictSupervisors,
		unknown:           newUnknownMetric(cfg.Registerer),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.discovery = newDiscovery(discoveryConfigFrom(cfg), g.keepalive, cfg.Registerer, policy, g.log, g.m,
		"the gateway's store is not loaded yet")
	g.push = newPushService(g.sessionTTL, g.log, g.m, "the gateway's store is not loaded yet")
	if cfg.WakeHook != nil {
		hook, err := wake.NewHook(*cfg.WakeHook)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.wake, err = wake.New(wake.Options{Waker: hook, Registerer: cfg.Registerer, Logger: g.log})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	var tokens []tokenGrant
	if g.configPath != "" {
		g.configSeen, g.fileDocs, err = loadConfigFile(g.configPath)
		if err != nil {
			g.m.reloads.WithLabelValues("config", "failed").Inc()
			logConfigProblems(g.log, g.configPath, err)
			return nil, err
		}
		g.m.reloads.WithLabelValues("config", "ok").Inc()
		g.importPending = true
	}
	g.tokensSeen, tokens, err = loadTokens(g.tokensPath)
	if err != nil {
		g.m.reloads.WithLabelValues("tokens", "failed").Inc()
		return nil, err
	}
	g.m.reloads.WithLabelValues("tokens", "ok").Inc()
	g.state.Store(&stateSnapshot{docs: map[string]document{}, tokens: tokens, grants: map[string]map[grantKey]string{}})

	if cfg.Etcd != nil {
		es, err := newEtcdStore(*cfg.Etcd, g.log)
		if err != nil {
			return nil, err
		}
		g.store, g.storeKind = es, "etcd"
		why := "the gateway's store is not loaded yet"
		g.storeWhy.Store(&why)
	} else {
		ms := newMemoryStore()
		g.store, g.storeKind = ms, "memory"
		ms.attach(g)
		if g.discoveryWarmup > 0 {
			// Armed before anything can serve discovery: a request that
			// came between the listener opening and Run starting would
			// otherwise get the empty set as the whole truth.
			g.discovery.warmUntil.Store(time.Now().Add(g.discoveryWarmup).UnixNano())
		}
		g.reloadMu.Lock()
		err := g.importConfigLocked(context.Background())
		g.reloadMu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	g.log.Info("gateway files loaded", "config", g.configPath, "supervisors", len(g.fileDocs),
		"tokens_file", g.tokensPath, "tokens", len(tokens), "store", g.storeKind,
		"session_ttl", g.sessionTTL, "endpoint_policy", g.policy.String())
	return g, nil
}

// Run follows the store, checks both files every Poll and reloads the one
// whose stat identity changed (importing the configuration file into the
// store), until ctx ends. A failed reload is logged once and not retried
// until the file changes again (a missing file counts as one change); an
// import that the store refused is retried at every Poll. It also runs the
// discovery loop (expiry of advertised routes); discovery answers 503 when
// Run is not running. When Run returns, the store is closed.
func (g *Gateway) Run(ctx context.Context) {
	if g.discovery.warmUntil.Load() > 0 {
		// (Armed by New; it may have ended early already.)
		g.log.Info("discovery answers 503 until the supervisors' sessions can have come back (memory store)",
			"warmup", g.discoveryWarmup)
	}
	g.running.Store(true)
	var wg sync.WaitGroup
	defer g.closeStore()
	defer wg.Wait()
	wg.Go(func() { g.discovery.run(ctx) })
	wg.Go(func() { g.store.run(ctx, g) })
	wg.Go(func() { g.collectIdle(ctx) })
	ticker := time.NewTicker(g.poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		g.reloadChanged(ctx)
	}
}

// closeStore closes the store once.
func (g *Gateway) closeStore() {
	g.closeOnce.Do(func() {
		if err := g.store.close(); err != nil {
			g.log.Warn("gateway store not closed cleanly", "err", err)
		}
	})
}

// reloadChanged reloads each file whose identity differs from the one seen
// at its last read, and retries a pending import.
func (g *Gateway) reloadChanged(ctx context.Context) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	// Tokens first: a supervisor added to both files at once is known
	// when its document is imported.
	if id, err := pollfile.Stat(g.tokensPath); err != nil || id != g.tokensSeen {
		if err == nil || g.tokensSeen.Valid() {
			_ = g.reloadTokensLocked()
		}
	}
	if g.configPath != "" {
		if id, err := pollfile.Stat(g.configPath); err != nil || id != g.configSeen {
			if err == nil || g.configSeen.Valid() {
				_ = g.reloadConfigLocked(ctx)
			}
		}
	}
	if g.importPending && g.storeUnusable() == "" {
		_ = g.importConfigLocked(ctx)
	}
}

// Reload re-reads both files now. A file that fails keeps its previous
// contents; the errors are returned joined.
func (g *Gateway) Reload() error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	terr := g.reloadTokensLocked()
	var cerr error
	if g.configPath != "" {
		cerr = g.reloadConfigLocked(context.Background())
	}
	return errors.Join(cerr, terr)
}

// reloadConfigLocked re-reads the configuration file and imports it into
// the store. reloadMu is held.
func (g *Gateway) reloadConfigLocked(ctx context.Context) error {
	id, docs, err := loadConfigFile(g.configPath)
	g.configSeen = id
	if err != nil {
		g.m.reloads.WithLabelValues("config", "failed").Inc()
		g.log.Error("gateway config not reloaded; keeping the previous one", "path", g.configPath, "err", err)
		logConfigProblems(g.log, g.configPath, err)
		return err
	}
	g.m.reloads.WithLabelValues("config", "ok").Inc()
	g.fileDocs, g.importPending = docs, true
	if why := g.storeUnusable(); why != "" {
		g.log.Warn("gateway config read; it is imported once the store is back", "path", g.configPath, "err", why)
		return nil
	}
	return g.importConfigLocked(ctx)
}

// importConfigLocked writes the documents of the configuration file that
// differ from the stored ones, and deletes the documents of supervisors
// that the file named at its last import and no longer does. Supervisors
// it never named are untouched. reloadMu is held.
func (g *Gateway) importConfigLocked(ctx context.Context) error {
	if g.configPath == "" {
		g.importPending = false
		return nil
	}
	if err := g.checkFileSupervisorsLocked(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 4*etcdOpTimeout)
	defer cancel()
	st := g.state.Load()
	changed := 0
	var last int64
	for sup, d := range g.fileDocs {
		if cur, ok := st.docs[sup]; ok && bytes.Equal(cur.body, d.body) {
			continue
		}
		rev, _, err := g.store.put(ctx, keyDocs+sup, d.body, putOptions{cond: anyRevision})
		if errors.Is(err, errValueTooLarge) {
			// Retrying cannot help: skip it, keep the stored one.
			g.log.Error("gateway config: a document is too large for the store; keeping the stored one",
				"path", g.configPath, "supervisor", sup, "err", err)
			continue
		}
		if err != nil {
			g.log.Error("gateway config not imported into the store; retrying", "path", g.configPath, "err", err)
			return fmt.Errorf("import the configuration file: %w", err)
		}
		last = max(last, rev)
		changed++
	}
	for sup := range g.fileIDs {
		if _, named := g.fileDocs[sup]; named {
			continue
		}
		if _, stored := st.docs[sup]; !stored {
			continue
		}
		rev, _, err := g.store.del(ctx, keyDocs+sup, anyRevision)
		if err != nil {
			g.log.Error("gateway config not imported into the store; retrying", "path", g.configPath, "err", err)
			return fmt.Errorf("import the configuration file: %w", err)
		}
		last = max(last, rev)
		changed++
	}
	if last > 0 {
		if err := g.waitApplied(ctx, last); err != nil {
			return fmt.Errorf("import the configuration file: %w", err)
		}
	}
	g.fileIDs = make(map[string]struct{}, len(g.fileDocs))
	for sup := range g.fileDocs {
		g.fileIDs[sup] = struct{}{}
	}
	g.importPending = false
	g.log.Info("gateway config imported into the store", "path", g.configPath, "supervisors", len(g.fileDocs),
		"changed", changed, "store", g.storeKind)
	return nil
}

// reloadTokensLocked re-reads the tokens file, ends the watch streams whose
// token no longer grants their supervisor or workspace, and republishes
// (advertisements made with a removed token are no longer published).
// reloadMu is held.
func (g *Gateway) reloadTokensLocked() error {
	id, tokens, err := loadTokens(g.tokensPath)
	g.tokensSeen = id
	if err != nil {
		g.m.reloads.WithLabelValues("tokens", "failed").Inc()
		g.log.Error("gateway tokens not reloaded; keeping the previous ones", "path", g.tokensPath, "err", err)
		return err
	}
	g.m.reloads.WithLabelValues("tokens", "ok").Inc()
	if g.importRefused {
		g.importPending = true // the new tokens may name its ids
	}

	g.mu.Lock()
	old := g.state.Load()
	next := &stateSnapshot{docs: old.docs, tokens: tokens, grants: old.grants}
	g.state.Store(next)
	// A supervisor may have lost its last token: republish.
	g.feedDiscoveryLocked(nil)
	g.feedPushLocked(nil, nil)
	revoked := g.discovery.revokeUngranted() + g.push.revokeUngranted()
	g.mu.Unlock()
	g.log.Info("gateway tokens reloaded", "path", g.tokensPath, "tokens", len(tokens), "watches_revoked", revoked)
	return nil
}

// Close ends every open watch stream and refuses new ones (503), for
// shutdown; it closes the store when Run never ran (else Run does when it
// returns). It may be called more than once.
func (g *Gateway) Close() {
	if !g.running.Load() {
		defer g.closeStore()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.push.close() {
		return
	}
	g.discovery.close()
	if g.wake != nil {
		g.wake.Close()
	}
}

// Ready reports whether the gateway can answer (its store is loaded and
// reachable), with the reason when not: the readiness of /readyz.
func (g *Gateway) Ready() (bool, string) {
	if why := g.storeUnusable(); why != "" {
		return false, why
	}
	return true, ""
}

// fail answers code with a one-line plain-text body "CODE Status: reason".
func (g *Gateway) fail(w http.ResponseWriter, endpoint string, code int, reason string) {
	failRequest(w, g.m, endpoint, code, reason)
}

// discoveryConfigFrom applies the defaults to cfg's discovery bounds.
func discoveryConfigFrom(cfg Config) discoveryConfig {
	return discoveryConfig{
		maxWatchersPerToken: cmp.Or(max(cfg.DiscoveryMaxWatchersPerToken, 0), DefaultDiscoveryMaxWatchersPerToken),
		sendTimeout:         cmp.Or(max(cfg.DiscoverySendTimeout, 0), DefaultDiscoverySendTimeout),
		maxLifetime:         cmp.Or(max(cfg.DiscoveryMaxWatchLifetime, 0), DefaultDiscoveryMaxWatchLifetime),
		reauthPeriod:        cmp.Or(max(cfg.DiscoveryReauthPeriod, 0), DefaultDiscoveryReauthPeriod),
	}
}
