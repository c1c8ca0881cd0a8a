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
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/routes"
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

// gatewayState is one immutable generation of the gateway's files.
type gatewayState struct {
	docs   map[string]gatewayDocument
	tokens []gatewayToken
	// grants are, per supervisor, the services its section declares: what
	// discovery may publish from its advertisements.
	grants map[string]map[grantKey]struct{}
}

// gatewayDocument is one supervisor's configuration document.
type gatewayDocument struct {
	body []byte // compact JSON, no newline
	etag string // quoted entity tag
}

// gatewayToken is one entry of the tokens file. Only the SHA-256 digest of
// the token is kept.
type gatewayToken struct {
	digest     [sha256.Size]byte
	supervisor string
	workspaces []string
}

// gatewayAdvertisement is the last installations body of one supervisor.
type gatewayAdvertisement struct {
	received      time.Time
	body          []byte            // compact JSON object
	installations []json.RawMessage // the "installations" entries
	routes        []advertisedRoute // the valid entries
	rejected      string            // why the others were left out, for logs
}

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

type gatewayMetrics struct {
	requests *prometheus.CounterVec
	watchers prometheus.Gauge
	reloads  *prometheus.CounterVec
	pushes   prometheus.Counter
}

func newGatewayMetrics(reg prometheus.Registerer) *gatewayMetrics {
	m := &gatewayMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_requests_total", Help: "Gateway requests, by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_gateway_watchers", Help: "Open configuration watch streams.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_gateway_reloads_total", Help: "Reads of the gateway's files, by file (config, tokens) and result (ok, failed).",
		}, []string{"file", "result"}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_gateway_pushes_total", Help: "Changed documents written to watch streams.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.watchers, m.reloads, m.pushes)
	}
	return m
}

// Request endpoints, the values of the "endpoint" label.
const (
	gwEndpointConfig        = "config"
	gwEndpointWatch         = "watch"
	gwEndpointInstallations = "installations"
	gwEndpointOther         = "other"
)

func (m *gatewayMetrics) request(endpoint string, code int) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
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

// document returns the document of supervisor sup: its section, or the
// empty document when the configuration has none.
func (s *gatewayState) document(sup string) gatewayDocument {
	if d, ok := s.docs[sup]; ok {
		return d
	}
	return gatewayDocument{body: []byte(emptyGatewayDocument), etag: emptyGatewayETag}
}

var emptyGatewayETag = gatewayETag([]byte(emptyGatewayDocument), "")

// lookupDigest returns the token whose digest is d, or nil. It compares d
// with every token in constant time.
func (s *gatewayState) lookupDigest(d [sha256.Size]byte) *gatewayToken {
	var found *gatewayToken
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(d[:], s.tokens[i].digest[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	return found
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

// authorize checks the bearer token for supervisor sup. On failure it
// answers the request and returns nil.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request, endpoint, sup string) *gatewayToken {
	token, ok := bearerToken(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "missing bearer token")
		g.log.Debug("gateway request refused: missing bearer token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	t := g.state.Load().lookupDigest(sha256.Sum256([]byte(token)))
	if t == nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "unknown token")
		g.log.Info("gateway request refused: unknown token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	if t.supervisor == "" {
		g.fail(w, endpoint, http.StatusForbidden, "a workspace token cannot read or write supervisor state")
		g.log.Warn("gateway request refused: workspace token used for a supervisor endpoint",
			"endpoint", endpoint, "supervisor", sup, "remote", r.RemoteAddr)
		return nil
	}
	if t.supervisor != sup {
		g.fail(w, endpoint, http.StatusForbidden, "the token is not granted this supervisor")
		g.log.Warn("gateway request refused: token of another supervisor",
			"endpoint", endpoint, "supervisor", sup, "token_supervisor", t.supervisor, "remote", r.RemoteAddr)
		return nil
	}
	return t
}

// bearerToken returns the token of the request's one Authorization header
// with the Bearer scheme (any case).
func bearerToken(h http.Header) (string, bool) {
	vals := h.Values("Authorization")
	if len(vals) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
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

func (g *Gateway) serveInstallations(w http.ResponseWriter, r *http.Request) {
	const endpoint = gwEndpointInstallations
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", http.MethodPut)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use PUT")
		return
	}
	sup := r.PathValue("id")
	if g.authorize(w, r, endpoint, sup) == nil {
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
	adv, err := parseInstallations(body)
	if err != nil {
		g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
		return
	}
	now := time.Now()
	adv.received = now
	var rejected []string
	adv.routes, rejected = parseAdvertisedRoutes(sup, adv.installations, now)
	g.mu.Lock()
	adv.rejected = g.logRejectedInstallations(sup, rejected, g.installations[sup].rejected)
	g.storeInstallationsLocked(sup, adv, now)
	g.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	g.m.request(endpoint, http.StatusNoContent)
	g.log.Debug("gateway installations stored", "supervisor", sup, "installations", len(adv.installations))
}

// parseInstallations checks an installations body: a JSON object with an
// "installations" array of objects. Other top-level fields are kept.
func parseInstallations(body []byte) (gatewayAdvertisement, error) {
	if !utf8.Valid(body) {
		return gatewayAdvertisement{}, errors.New("installations: body is not valid UTF-8")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: not valid JSON: %w", err)
	}
	if compact.Len() == 0 || compact.Bytes()[0] != '{' {
		return gatewayAdvertisement{}, errors.New("installations: body must be a JSON object")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(compact.Bytes(), &top); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: %w", err)
	}
	raw, ok := top["installations"]
	if !ok || len(raw) == 0 || raw[0] != '[' {
		return gatewayAdvertisement{}, errors.New(`installations: body must have an "installations" array`)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: %w", err)
	}
	for i, e := range entries {
		if len(e) == 0 || e[0] != '{' {
			return gatewayAdvertisement{}, fmt.Errorf("installations[%d]: must be a JSON object", i)
		}
	}
	return gatewayAdvertisement{body: compact.Bytes(), installations: entries}, nil
}

// loadGatewayConfig reads and parses the configuration file. The identity
// is taken before the read, so a change during the read is seen next time.
func loadGatewayConfig(path string) (pollfile.Identity, map[string]gatewayDocument, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxConfigBytes)
	if err != nil {
		return id, nil, fmt.Errorf("config file: %w", err)
	}
	docs, err := parseGatewayConfig(data)
	if err != nil {
		return id, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return id, docs, nil
}

// parseGatewayConfig parses {"supervisors": {"<id>": {...}, ...}}: the top
// level has exactly the key "supervisors", ids are distinct and valid, and
// every section is a JSON object of at most routes.MaxDocumentBytes once
// compacted (with its newline). Sections are not validated further: the
// supervisor does that.
//
// The file is validated and compacted by one pass of json.Compact; the
// result is then read member by member with encoding/json's Decoder, which
// hands over the keys in order, so a repeated key is refused (decoding into
// a map would silently keep the last one). No hand-written scanner is
// needed here (routes.ParseDocument has one because it validates a large
// document one entry at a time and steps aside between entries, on the
// data plane's processor): this file is read only when it changes, and the
// reload that reads it spends more time parsing its sections for the
// discovery grants (discoveryGrants) than reading it.
func parseGatewayConfig(data []byte) (map[string]gatewayDocument, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	var buf bytes.Buffer
	buf.Grow(len(data))
	if err := json.Compact(&buf, data); err != nil {
		return nil, jsonSyntaxError(data)
	}
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	var docs map[string]gatewayDocument
	err := objectMembers(dec, "top level must be a JSON object", func(key string) error {
		if key != "supervisors" {
			return fmt.Errorf("unknown top-level key %q (want only \"supervisors\")", key)
		}
		if docs != nil {
			return errors.New(`"supervisors" appears twice`)
		}
		var err error
		docs, err = parseSupervisors(dec)
		return err
	})
	if err != nil {
		return nil, err
	}
	if docs == nil {
		return nil, errors.New(`missing "supervisors"`)
	}
	return docs, nil
}

// parseSupervisors parses the "supervisors" object that dec is at.
func parseSupervisors(dec *json.Decoder) (map[string]gatewayDocument, error) {
	docs := make(map[string]gatewayDocument)
	err := objectMembers(dec, `"supervisors" must be a JSON object`, func(sup string) error {
		if err := validSupervisorID(sup); err != nil {
			return fmt.Errorf("supervisors: %w", err)
		}
		if _, dup := docs[sup]; dup {
			return fmt.Errorf("supervisors: %q appears twice", sup)
		}
		var value json.RawMessage // compact, and a copy of its own
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("supervisors[%q]: %w", sup, err)
		}
		if value[0] != '{' {
			return fmt.Errorf("supervisors[%q]: the configuration document must be a JSON object", sup)
		}
		if len(value)+1 > routes.MaxDocumentBytes {
			return fmt.Errorf("supervisors[%q]: the configuration document is %d bytes, larger than a supervisor accepts (%d)",
				sup, len(value), routes.MaxDocumentBytes-1)
		}
		body := []byte(value)
		docs[sup] = gatewayDocument{body: body, etag: gatewayETag(body, documentRevision(body))}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return docs, nil
}

// jsonSyntaxError explains why data is not valid JSON, with the line and
// column of the error when known. (json.Compact's errors carry no offset.)
func jsonSyntaxError(data []byte) error {
	err := json.Unmarshal(data, new(json.RawMessage))
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	// Offset counts the offending byte.
	off := min(int(se.Offset), len(data))
	line := 1 + bytes.Count(data[:off], gatewayNewline)
	col := max(1, off-bytes.LastIndexByte(data[:off], '\n')-1)
	return fmt.Errorf("not valid JSON at line %d, column %d: %w", line, col, err)
}

// objectMembers reads the object that dec is at and calls fn with the key
// of each member, in order; fn reads the member's value from dec. It stops
// at the first error. dec must be reading valid JSON; when its next value is
// not an object the error is notObject.
func objectMembers(dec *json.Decoder, notObject string, fn func(key string) error) error {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New(notObject)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("key: %w", err)
		}
		key, _ := t.(string)
		if err := fn(key); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

// documentRevision returns the top-level "revision" of a document when it
// is a string, else "".
func documentRevision(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	var rev string
	_ = objectMembers(dec, "", func(key string) error {
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return err
		}
		if key == "revision" && value[0] == '"' {
			if err := json.Unmarshal(value, &rev); err != nil {
				rev = ""
			}
			return errors.New("found") // stop: a later duplicate is not looked at
		}
		return nil
	})
	return rev
}

// gatewayETag is `"<revision>"` when the revision is non-empty and made of
// entity-tag characters only, else `"sha256:<first 16 hex digits>"` of the
// document.
func gatewayETag(body []byte, revision string) string {
	if revision != "" && validETagChars(revision) {
		return `"` + revision + `"`
	}
	sum := sha256.Sum256(body)
	return `"sha256:` + hex.EncodeToString(sum[:8]) + `"`
}

// validETagChars reports whether s is made of the ASCII entity-tag
// characters (RFC 9110 §8.8.3: %x21 / %x23-7E; obs-text is left out because
// clients treat it inconsistently).
func validETagChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c == '"' || c > 0x7e {
			return false
		}
	}
	return true
}

// validSupervisorID checks a supervisor id: 1 to MaxSupervisorIDLen
// characters from [A-Za-z0-9._:~-] (it is a URL path segment).
func validSupervisorID(s string) error {
	if s == "" {
		return errors.New("empty supervisor id")
	}
	if len(s) > MaxSupervisorIDLen {
		return fmt.Errorf("supervisor id %.40q…: longer than %d characters", s, MaxSupervisorIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:~-", c) >= 0 {
			continue
		}
		return fmt.Errorf("supervisor id %q: character %q not allowed (use [A-Za-z0-9._:~-])", s, c)
	}
	return nil
}

// gatewayTokensFile is the tokens file.
type gatewayTokensFile struct {
	Tokens *[]gatewayTokenEntry `json:"tokens"`
}

type gatewayTokenEntry struct {
	Token      string   `json:"token"`
	Supervisor string   `json:"supervisor"`
	Workspaces []string `json:"workspaces"`
}

// loadGatewayTokens reads and parses the tokens file.
func loadGatewayTokens(path string) (pollfile.Identity, []gatewayToken, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxTokensBytes)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file: %w", err)
	}
	tokens, err := parseGatewayTokens(data)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return id, tokens, nil
}

// parseGatewayTokens parses {"tokens": [...]}. Unknown fields are refused.
// Each entry has a token (1 to MaxTokenLen visible ASCII characters, not
// repeated) and exactly one of a supervisor id or a non-empty list of
// workspace names. Errors never contain a token.
func parseGatewayTokens(data []byte) ([]gatewayToken, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f gatewayTokensFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("cannot parse: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the top-level object")
	}
	if f.Tokens == nil {
		return nil, errors.New(`missing "tokens" array`)
	}
	out := make([]gatewayToken, 0, len(*f.Tokens))
	seen := make(map[[sha256.Size]byte]int, len(*f.Tokens))
	for i, e := range *f.Tokens {
		if e.Token == "" {
			return nil, fmt.Errorf("tokens[%d]: empty token", i)
		}
		if len(e.Token) > MaxTokenLen {
			return nil, fmt.Errorf("tokens[%d]: token longer than %d characters", i, MaxTokenLen)
		}
		for j := 0; j < len(e.Token); j++ {
			if c := e.Token[j]; c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("tokens[%d]: token has a character outside visible ASCII", i)
			}
		}
		t := gatewayToken{digest: sha256.Sum256([]byte(e.Token))}
		if j, dup := seen[t.digest]; dup {
			return nil, fmt.Errorf("tokens[%d]: same token as tokens[%d]", i, j)
		}
		seen[t.digest] = i
		switch {
		case e.Supervisor != "" && len(e.Workspaces) > 0:
			return nil, fmt.Errorf("tokens[%d]: has both a supervisor and workspaces (a token is one or the other)", i)
		case e.Supervisor != "":
			if err := validSupervisorID(e.Supervisor); err != nil {
				return nil, fmt.Errorf("tokens[%d]: %w", i, err)
			}
			t.supervisor = e.Supervisor
		case len(e.Workspaces) > 0:
			for _, ws := range e.Workspaces {
				if err := routes.ValidName(ws); err != nil {
					return nil, fmt.Errorf("tokens[%d]: workspace: %w", i, err)
				}
			}
			t.workspaces = append([]string(nil), e.Workspaces...)
		default:
			return nil, fmt.Errorf("tokens[%d]: needs a supervisor or workspaces", i)
		}
		out = append(out, t)
	}
	return out, nil
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
