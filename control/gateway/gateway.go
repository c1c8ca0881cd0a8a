// Package gateway is the reference gateway, the other side of the control
// plane from the supervisor: it serves each supervisor its configuration
// document from a file (a poll with ETag and If-None-Match, or an NDJSON
// push session), authenticates supervisors and workspace readers with
// bearer tokens from a second file, stores the installations that
// supervisors advertise, and publishes them per workspace as discovery
// snapshots and watch streams (discovery.go). It never imports the
// supervisor side (control/supervisor); what both sides share is in
// control/api.
package gateway

import (
	"bytes"
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
	// MaxSupervisorIDLen is the longest supervisor id.
	MaxSupervisorIDLen = 253
	// MaxTokenLen is the longest bearer token.
	MaxTokenLen = 4096
	// MaxWatchesPerSupervisor bounds the open watch streams of one
	// supervisor id; more are refused with 429.
	MaxWatchesPerSupervisor = 64
)

// gatewayWriteTimeout bounds every write to a watch stream: a supervisor
// that does not read is disconnected.
const gatewayWriteTimeout = 10 * time.Second

// emptyGatewayDocument is served to a supervisor that has a token but no
// section in the configuration: no section means no routes.
const emptyGatewayDocument = `{"revision":"","instances":[]}`

var (
	gatewayKeepaliveLine = []byte(`{"keepalive":true}` + "\n")
	gatewayNewline       = []byte("\n")
)

// Config configures a Gateway.
type Config struct {
	// ConfigPath is the configuration file:
	// {"supervisors": {"<id>": <configuration document>, ...}}.
	ConfigPath string
	// TokensPath is the tokens file:
	// {"tokens": [{"token":"t1","supervisor":"sup-1"}, {"token":"t2","workspaces":["team"]}]}.
	TokensPath string
	// Keepalive is the interval of {"keepalive":true} lines on a watch
	// stream (DefaultKeepalive when not positive).
	Keepalive time.Duration
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
	// Logger receives the gateway's logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Gateway is the reference implementation of the gateway side of the
// control protocol. It serves each supervisor's configuration document from
// a file (poll with ETag/If-None-Match, or an NDJSON watch stream that gets
// every change at once), authenticates supervisors with bearer tokens from a
// second file, re-reads both files when they change, and stores the
// installations that supervisors advertise and publishes them to workspace
// tokens (discovery, see discovery.go). Create it with New; Run must
// be running for discovery to answer.
type Gateway struct {
	configPath   string
	tokensPath   string
	keepalive    time.Duration
	poll         time.Duration
	disablePush  bool
	writeTimeout time.Duration
	log          *slog.Logger
	m            *gatewayMetrics
	dm           *discoveryMetrics
	dcfg         discoveryConfig

	// discBeat is when the discovery loop last ran (Unix nanoseconds), 0
	// when it is not running; discWake (capacity 1) makes it look again.
	discBeat atomic.Int64
	discWake chan struct{}

	// state is the current configuration and tokens: immutable, replaced
	// whole, stored with mu held, loaded without it.
	state atomic.Pointer[gatewayState]

	// reloadMu serializes reloads and guards the fields below it.
	reloadMu   sync.Mutex
	configSeen pollfile.Identity
	tokensSeen pollfile.Identity

	// mu guards the fields below it, and is held while state is replaced
	// so that a watcher never misses a change.
	mu       sync.Mutex
	watchers map[*gatewayWatcher]struct{}
	closed   bool
	// installations are the latest advertisements by supervisor id;
	// discovery builds on them.
	installations map[string]gatewayAdvertisement
	// disc is what discovery publishes.
	disc discoveryState
}

// New reads both files. A file that cannot be read or parsed is an
// error: there is no previous state to keep.
func New(cfg Config) (*Gateway, error) {
	if cfg.ConfigPath == "" || cfg.TokensPath == "" {
		return nil, errors.New("gateway: ConfigPath and TokensPath are required")
	}
	g := &Gateway{
		configPath:    cfg.ConfigPath,
		tokensPath:    cfg.TokensPath,
		keepalive:     cfg.Keepalive,
		poll:          cfg.Poll,
		disablePush:   cfg.DisablePush,
		writeTimeout:  gatewayWriteTimeout,
		log:           cfg.Logger,
		m:             newGatewayMetrics(cfg.Registerer),
		dm:            newDiscoveryMetrics(cfg.Registerer),
		dcfg:          discoveryConfigFrom(cfg),
		discWake:      make(chan struct{}, 1),
		watchers:      make(map[*gatewayWatcher]struct{}),
		installations: make(map[string]gatewayAdvertisement),
		disc:          newDiscoveryState(time.Now()),
	}
	if g.keepalive <= 0 {
		g.keepalive = DefaultKeepalive
	}
	if g.poll <= 0 {
		g.poll = DefaultPoll
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	var docs map[string]gatewayDocument
	var tokens []gatewayToken
	var err error
	g.configSeen, docs, err = loadGatewayConfig(g.configPath)
	if err != nil {
		g.m.reloads.WithLabelValues("config", "failed").Inc()
		return nil, err
	}
	g.m.reloads.WithLabelValues("config", "ok").Inc()
	g.tokensSeen, tokens, err = loadGatewayTokens(g.tokensPath)
	if err != nil {
		g.m.reloads.WithLabelValues("tokens", "failed").Inc()
		return nil, err
	}
	g.m.reloads.WithLabelValues("tokens", "ok").Inc()
	g.state.Store(&gatewayState{docs: docs, tokens: tokens, grants: discoveryGrants(docs)})
	// Discovery counts as maintained for discoveryStaleAfter before Run
	// starts its loop, so that requests racing the start are answered.
	g.discBeat.Store(time.Now().UnixNano())
	g.log.Info("gateway files loaded", "config", g.configPath, "supervisors", len(docs),
		"tokens_file", g.tokensPath, "tokens", len(tokens))
	return g, nil
}

// Run checks both files every Poll and reloads the one whose stat identity
// changed, until ctx ends. A failed reload is logged once and not retried
// until the file changes again (a missing file counts as one change). It
// also runs the discovery loop (expiry of advertised routes); discovery
// answers 503 when Run is not running.
func (g *Gateway) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { g.runDiscovery(ctx) })
	ticker := time.NewTicker(g.poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		g.reloadChanged()
	}
}

// reloadChanged reloads each file whose identity differs from the one seen
// at its last read.
func (g *Gateway) reloadChanged() {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	if id, err := pollfile.Stat(g.configPath); err != nil || id != g.configSeen {
		if err == nil || g.configSeen.Valid() {
			_ = g.reloadConfigLocked()
		}
	}
	if id, err := pollfile.Stat(g.tokensPath); err != nil || id != g.tokensSeen {
		if err == nil || g.tokensSeen.Valid() {
			_ = g.reloadTokensLocked()
		}
	}
}

// Reload re-reads both files now. A file that fails keeps its previous
// contents; the errors are returned joined.
func (g *Gateway) Reload() error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	return errors.Join(g.reloadConfigLocked(), g.reloadTokensLocked())
}

// reloadConfigLocked re-reads the configuration file and pushes changed
// documents to their watchers. reloadMu is held.
func (g *Gateway) reloadConfigLocked() error {
	id, docs, err := loadGatewayConfig(g.configPath)
	g.configSeen = id
	if err != nil {
		g.m.reloads.WithLabelValues("config", "failed").Inc()
		g.log.Error("gateway config not reloaded; keeping the previous one", "path", g.configPath, "err", err)
		return err
	}
	g.m.reloads.WithLabelValues("config", "ok").Inc()
	grants := discoveryGrants(docs)

	g.mu.Lock()
	old := g.state.Load()
	next := &gatewayState{docs: docs, tokens: old.tokens, grants: grants}
	changed := make(map[string]gatewayDocument)
	for sup := range old.docs {
		if d := next.document(sup); !bytes.Equal(d.body, old.document(sup).body) {
			changed[sup] = d
		}
	}
	for sup := range docs {
		if d := next.document(sup); !bytes.Equal(d.body, old.document(sup).body) {
			changed[sup] = d
		}
	}
	g.state.Store(next)
	pushed := 0
	for w := range g.watchers {
		if d, ok := changed[w.supervisor]; ok && !w.ended {
			w.pending = d.body
			select {
			case w.notify <- struct{}{}:
			default:
			}
			pushed++
		}
	}
	// Grants may have changed: republish every workspace now.
	g.discRepublishLocked(time.Now(), nil)
	g.mu.Unlock()
	g.log.Info("gateway config reloaded", "path", g.configPath, "supervisors", len(docs),
		"changed", len(changed), "watchers_notified", pushed)
	return nil
}

// reloadTokensLocked re-reads the tokens file and ends the watch streams
// whose token no longer grants their supervisor. reloadMu is held.
func (g *Gateway) reloadTokensLocked() error {
	id, tokens, err := loadGatewayTokens(g.tokensPath)
	g.tokensSeen = id
	if err != nil {
		g.m.reloads.WithLabelValues("tokens", "failed").Inc()
		g.log.Error("gateway tokens not reloaded; keeping the previous ones", "path", g.tokensPath, "err", err)
		return err
	}
	g.m.reloads.WithLabelValues("tokens", "ok").Inc()

	g.mu.Lock()
	old := g.state.Load()
	next := &gatewayState{docs: old.docs, tokens: tokens, grants: old.grants}
	g.state.Store(next)
	revoked := g.discRevokeLocked(next)
	// A supervisor may have lost its last token: republish.
	g.discRepublishLocked(time.Now(), nil)
	for w := range g.watchers {
		if t := next.lookupDigest(w.digest); t == nil || t.supervisor != w.supervisor {
			if g.endWatcherLocked(w, "token revoked") {
				revoked++
			}
		}
	}
	g.mu.Unlock()
	g.log.Info("gateway tokens reloaded", "path", g.tokensPath, "tokens", len(tokens), "watches_revoked", revoked)
	return nil
}

// Close ends every open watch stream and refuses new ones (503), for
// shutdown. It may be called more than once.
func (g *Gateway) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	for w := range g.watchers {
		g.endWatcherLocked(w, "gateway closing")
	}
	for _, set := range g.disc.watchers {
		for w := range set {
			g.discEndLocked(w, discEndClosing)
		}
	}
}

// Handler returns the gateway's HTTP handler:
//
//	GET /v1/supervisors/{id}/config            the document, ETag, 304 on If-None-Match
//	GET /v1/supervisors/{id}/config?watch=1    NDJSON: the document, then every change and keepalives
//	PUT /v1/supervisors/{id}/installations     the supervisor's installed routes (204)
//	GET /v1/workspaces/{ws}/service-routes          discovery: the published routes of ws
//	GET /v1/workspaces/{ws}/service-routes?watch=1  NDJSON: that snapshot, then every change and keepalives
//
// Every request needs "Authorization: Bearer <token>": a supervisor token
// for {id}, or a workspace token granted {ws}. Errors have a one-line
// text/plain body.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/supervisors/{id}/config", g.serveConfig)
	mux.HandleFunc("/v1/supervisors/{id}/installations", g.serveInstallations)
	mux.HandleFunc("/v1/workspaces/{ws}/service-routes", g.serveServiceRoutes)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		g.fail(w, gwEndpointOther, http.StatusNotFound, "no such endpoint")
	})
	return mux
}

// fail answers code with a one-line plain-text body "CODE Status: reason".
func (g *Gateway) fail(w http.ResponseWriter, endpoint string, code int, reason string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), reason)
	g.m.request(endpoint, code)
}

// getOrWatch checks that r is a GET and reads its watch parameter; it
// answers the request itself (405, 400) and returns ok=false when not.
func (g *Gateway) getOrWatch(w http.ResponseWriter, r *http.Request, getEndpoint, watchEndpoint string) (watch bool, endpoint string, ok bool) {
	endpoint = getEndpoint
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use GET")
		return false, endpoint, false
	}
	switch r.URL.Query().Get("watch") {
	case "", "0", "false":
		return false, endpoint, true
	case "1", "true":
		return true, watchEndpoint, true
	}
	g.fail(w, endpoint, http.StatusBadRequest, "watch must be 1 or 0")
	return false, endpoint, false
}
