// Package edge is an SNI pass-through front door: it reads the ClientHello
// of each TCP connection (without terminating TLS; it holds no key), looks
// the server name up in a cache fed by discovery, dials the owning
// supervisor's advertised endpoint, replays the hello and splices the two
// connections. Unknown, expired or missing names get the TLS alert
// unrecognized_name from the edge itself.
//
// The cache is a set of complete replacements per workspace (discovery
// snapshots). A route is used only until its expires_at, which the cache
// enforces with its own timer even when discovery is silent. When a hostname
// leaves the cache (withdrawn or expired) or its endpoint changes, the
// edge closes the spliced connections it holds for that hostname and old
// endpoint; new connections follow the current owner.
package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/buckets"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/tlshello"
	"github.com/applistener/applistener/routes"
)

// Source delivers the discovery snapshots of one workspace:
// *api.DiscoveryClient implements it. Watch calls fn with each complete
// replacement until ctx ends (it then returns ctx.Err()); it returns early
// with an error the edge logs before it calls Watch again, and with a
// refusal (api.IsDiscoveryRefusal) after which the edge stops using the
// workspace's routes until a new snapshot arrives.
type Source interface {
	Watch(ctx context.Context, workspace string, fn func(*api.RouteSnapshot)) error
}

// Defaults of the edge.
const (
	DefaultHelloTimeout     = 10 * time.Second
	DefaultDialTimeout      = 5 * time.Second
	DefaultHalfCloseTimeout = 60 * time.Second
	DefaultWithdrawGrace    = 2 * time.Second
	// DefaultDrainTimeout is how long a draining edge (SIGTERM) keeps its
	// spliced connections (WebSockets, long polls) open for them to end on
	// their own: an edge rollout must not cut them. A Pod needs a
	// terminationGracePeriodSeconds at least this long.
	DefaultDrainTimeout = time.Hour
	// refusedRetry is the delay before a refused workspace is watched again.
	refusedRetry = 5 * time.Second
	// writeHelloTimeout bounds replaying the ClientHello to the supervisor.
	writeHelloTimeout = 5 * time.Second
)

// Results of accepted connections, the values of the "result" label.
const (
	resultSpliced     = "spliced"
	resultNoSNI       = "no_sni"
	resultUnknownName = "unknown_name"
	resultNotTLS      = "not_tls"
	resultBadHello    = "malformed_hello"
	resultHelloFailed = "hello_read_failed"
	resultDialFailed  = "dial_failed"
	resultOverLimit   = "over_limit"
	resultDraining    = "draining"
)

// Config configures an Edge.
type Config struct {
	// Source feeds the route cache; required.
	Source Source
	// Workspaces are watched, one Source.Watch each; at least one.
	Workspaces []string
	// HelloTimeout bounds reading the ClientHello (DefaultHelloTimeout).
	HelloTimeout time.Duration
	// DialTimeout bounds connecting to a supervisor (DefaultDialTimeout).
	DialTimeout time.Duration
	// HalfCloseTimeout bounds a splice after one side has finished sending
	// (DefaultHalfCloseTimeout).
	HalfCloseTimeout time.Duration
	// WithdrawGrace is how long a spliced connection whose route was
	// withdrawn (not expired) stays open so that its supervisor, which
	// revokes the route too, can close it itself: a WebSocket then gets the
	// supervisor's close frame (1008) instead of a cut. New connections
	// for the name are refused at once. DefaultWithdrawGrace when zero;
	// negative: closed at once. Expired routes are closed at once (their
	// supervisor may be gone).
	WithdrawGrace time.Duration
	// MaxConnections bounds concurrent client connections (0: no bound).
	MaxConnections int
	// ProxyProtocol sends each supervisor a PROXY protocol v2 header (the
	// client's address, the edge address it connected to, the SNI as
	// PP2_TYPE_AUTHORITY) before the ClientHello (proxy.go). Supervisors
	// must list the edge in --trusted-proxies or --require-proxy-protocol.
	ProxyProtocol bool
	// ProxyFallback (with ProxyProtocol: the auto mode) copes with a
	// supervisor that does not accept the header from the edge (one
	// started with its defaults): when it closes the connection without a
	// byte after the header, the edge logs why, redials and sends the
	// ClientHello alone, and sends that endpoint no header for
	// ProxyRecheck; the client's address is then the edge's.
	ProxyFallback bool
	// Dial connects to supervisors; nil uses a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Logger receives the edge's logs; nil means slog.Default().
	Logger *slog.Logger
	// OCSF receives a Network Activity record per refused connection and,
	// at debug, per spliced one (ocsf.go); nil: none.
	OCSF *ocsf.Emitter
	// Registerer receives the edge's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// route is one cached route; immutable.
type route struct {
	host       string
	workspace  string
	endpoint   string // host:port
	supervisor string
	version    uint64
	expires    time.Time
}

// spliceKey identifies the connections that use one owner of a hostname.
type spliceKey struct {
	host, endpoint string
}

// splice is one client connection spliced to a supervisor.
type splice struct {
	client, backend net.Conn
	key             spliceKey // the hostname and the endpoint it was spliced to
	proxyHeader     bool      // it started with a PROXY protocol header
	once            sync.Once
	closed          atomic.Bool // close was called (the edge ended it)
}

func (s *splice) close() {
	s.once.Do(func() {
		s.closed.Store(true)
		_ = s.client.Close()
		_ = s.backend.Close()
	})
}

// Edge is the SNI pass-through front door. Create it with New, run Run (the
// discovery feeds and the expiry timer) and Serve (the accept loop), and
// stop it with Shutdown and by ending Run's context.
type Edge struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	// proxy is the PROXY protocol state by endpoint (proxy.go).
	proxyMu sync.Mutex
	proxy   map[string]*endpointProxy

	// table is the current host → route map, immutable, replaced whole.
	table atomic.Pointer[map[string]*route]

	mu       sync.Mutex
	perWS    map[string][]api.ServiceRoute // latest snapshot per workspace
	revision map[string]string
	have     map[string]bool // a usable snapshot arrived (and was not refused since)
	splices  map[spliceKey]map[*splice]struct{}
	// lingering are splices of withdrawn routes waiting out
	// WithdrawGrace for their supervisor to close them, each with the
	// withdrawal (its grace timer) that put it there.
	lingering  map[*splice]*int
	pending    map[net.Conn]struct{} // accepted, not yet spliced
	active     int                   // client connections being served
	closed     bool
	ln         net.Listener
	nextExpiry time.Time
	wake       chan struct{} // capacity 1: the expiry loop re-reads nextExpiry
	rewatch    chan struct{} // closed by Rewatch: every discovery watch is reopened
	wg         sync.WaitGroup
}

// New checks cfg and returns an Edge with an empty cache.
func New(cfg Config) (*Edge, error) {
	if cfg.Source == nil {
		return nil, errors.New("edge: a Source is required")
	}
	if len(cfg.Workspaces) == 0 {
		return nil, errors.New("edge: at least one workspace is required")
	}
	seen := map[string]bool{}
	for _, ws := range cfg.Workspaces {
		if err := routes.ValidName(ws); err != nil {
			return nil, fmt.Errorf("edge: workspace: %w", err)
		}
		if seen[ws] {
			return nil, fmt.Errorf("edge: workspace %q listed twice", ws)
		}
		seen[ws] = true
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = DefaultHelloTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.HalfCloseTimeout <= 0 {
		cfg.HalfCloseTimeout = DefaultHalfCloseTimeout
	}
	switch {
	case cfg.WithdrawGrace == 0:
		cfg.WithdrawGrace = DefaultWithdrawGrace
	case cfg.WithdrawGrace < 0:
		cfg.WithdrawGrace = 0
	}
	if cfg.Dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Edge{
		cfg:       cfg,
		log:       cfg.Logger,
		m:         newMetrics(cfg.Registerer),
		perWS:     make(map[string][]api.ServiceRoute),
		revision:  make(map[string]string),
		have:      make(map[string]bool),
		splices:   make(map[spliceKey]map[*splice]struct{}),
		pending:   make(map[net.Conn]struct{}),
		lingering: make(map[*splice]*int),
		wake:      make(chan struct{}, 1),
		rewatch:   make(chan struct{}),
		proxy:     make(map[string]*endpointProxy),
	}
	empty := map[string]*route{}
	e.table.Store(&empty)
	return e, nil
}

// Ready reports whether every workspace has a current snapshot.
func (e *Edge) Ready() (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ws := range e.cfg.Workspaces {
		if !e.have[ws] {
			return false, "no discovery snapshot yet for workspace " + ws
		}
	}
	return true, ""
}

// Lookup returns the endpoint (host:port) that owns host now, if any.
func (e *Edge) Lookup(host string) (string, bool) {
	r := e.lookup(host, time.Now())
	if r == nil {
		return "", false
	}
	return r.endpoint, true
}

func (e *Edge) lookup(host string, now time.Time) *route {
	r := (*e.table.Load())[host]
	if r == nil || !now.Before(r.expires) {
		return nil
	}
	return r
}

// Run feeds the cache from the Source, one watch per workspace, and drops
// routes at their expires_at, until ctx ends. It returns when all its
// goroutines have.
func (e *Edge) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ws := range e.cfg.Workspaces {
		wg.Go(func() { e.watch(ctx, ws) })
	}
	wg.Go(func() { e.guardedExpiryLoop(ctx) }) // guard.go
	wg.Wait()
}

// watch holds the Source's watch of ws until ctx ends.
func (e *Edge) watch(ctx context.Context, ws string) {
	log := e.log.With("workspace", ws)
	failures := 0
	for ctx.Err() == nil {
		rewatched, err := e.guardedWatchOnce(ctx, ws) // guard.go
		if ctx.Err() != nil {
			return
		}
		if rewatched {
			// Reopened at once, keeping the cache: the next request
			// re-reads the token file and the CA file.
			log.Info("discovery watch reopened", "err", err)
			failures = 0
			continue
		}
		wait := min(100*time.Millisecond<<min(failures, 8), 30*time.Second)
		failures++
		if api.IsDiscoveryRefusal(err) {
			// Not (or no longer) authorized: stop routing the workspace.
			log.Error("discovery refused; the workspace's routes are dropped", "err", err, "retry_in", refusedRetry)
			e.clear(ws)
			wait = refusedRetry
		} else {
			log.Warn("discovery watch ended; retrying", "err", err, "retry_in", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchOnce runs one Source.Watch of ws; rewatched: Rewatch ended it.
func (e *Edge) watchOnce(ctx context.Context, ws string) (rewatched bool, err error) {
	e.mu.Lock()
	rw := e.rewatch
	e.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		select {
		case <-rw:
			cancel()
		case <-wctx.Done():
		}
	}()
	defer func() { cancel(); <-ended }() // also when Watch panics
	err = e.cfg.Source.Watch(wctx, ws, func(s *api.RouteSnapshot) { e.update(ws, s) })
	cancel()
	<-ended
	select {
	case <-rw:
		return ctx.Err() == nil, err
	default:
		return false, err
	}
}

// Rewatch reopens every discovery watch now (SIGHUP), so that a changed
// token or CA file applies at once; the cached routes stay in use
// meanwhile, each until its expires_at.
func (e *Edge) Rewatch() {
	e.mu.Lock()
	close(e.rewatch)
	e.rewatch = make(chan struct{})
	e.mu.Unlock()
}

// update replaces the routes of ws with snapshot s.
func (e *Edge) update(ws string, s *api.RouteSnapshot) {
	kept := make([]api.ServiceRoute, 0, len(s.Routes))
	for _, r := range s.Routes {
		// The discovery client checks routes; the edge keeps its own
		// guarantee that a feed cannot route another workspace's names:
		// the hostname (readable or hashed) must be the one of the
		// route's names, and the workspace ws.
		if err := api.CheckRoute(&r, ws); err != nil {
			e.log.Warn("discovery route ignored", "workspace", ws, "hostname", truncate(r.Hostname, 255), "err", err)
			continue
		}
		kept = append(kept, r)
	}
	e.applyLocked(func() { // guard.go: unlocked even by a panic
		e.perWS[ws] = kept
		e.revision[ws] = s.Revision
		e.have[ws] = true
		e.rebuildLocked(time.Now(), "discovery update")
	})
	e.m.updates.Inc()
	e.log.Debug("discovery snapshot applied", "workspace", ws, "revision", s.Revision, "routes", len(kept))
}

// clear drops every route of ws.
func (e *Edge) clear(ws string) {
	e.applyLocked(func() {
		delete(e.perWS, ws)
		e.have[ws] = false
		e.rebuildLocked(time.Now(), "discovery refused")
	})
}

// rebuildLocked builds the table from the latest snapshots without the
// expired routes, and closes the splices whose hostname left the table or
// now has another endpoint. e.mu is held.
func (e *Edge) rebuildLocked(now time.Time, why string) {
	table := make(map[string]*route)
	var next time.Time
	for ws, rs := range e.perWS {
		for _, r := range rs {
			if !now.Before(r.ExpiresAt) {
				continue
			}
			if _, dup := table[r.Hostname]; dup {
				continue
			}
			table[r.Hostname] = &route{
				host: r.Hostname, workspace: ws, endpoint: r.Endpoint.String(), supervisor: r.Supervisor,
				version: r.InstallationVersion, expires: r.ExpiresAt,
			}
			if next.IsZero() || r.ExpiresAt.Before(next) {
				next = r.ExpiresAt
			}
		}
	}
	old := *e.table.Load()
	e.table.Store(&table)
	e.m.routes.Set(float64(len(table)))
	for host, r := range table {
		if o := old[host]; o == nil || o.endpoint != r.endpoint || o.version != r.version {
			e.log.Info("edge route", "hostname", host, "endpoint", r.endpoint, "supervisor", r.supervisor,
				"installation_version", r.version, "expires_at", r.expires)
		}
	}
	for host, o := range old {
		if table[host] == nil {
			reason := "withdrawn"
			if !now.Before(o.expires) {
				reason = "expired"
			}
			e.log.Info("edge route removed", "hostname", host, "endpoint", o.endpoint, "reason", reason, "cause", why)
		}
	}
	e.restoreLingeringLocked(table)
	for key, set := range e.splices {
		r := table[key.host]
		if r != nil && r.endpoint == key.endpoint {
			continue
		}
		reason := "route_gone"
		if r != nil {
			reason = "owner_changed"
		}
		delete(e.splices, key)
		if o := old[key.host]; o != nil && now.Before(o.expires) && e.cfg.WithdrawGrace > 0 {
			// Withdrawn: the supervisor closes them itself (close frames).
			e.lingerLocked(set, reason)
			e.log.Info("edge route withdrawn: spliced connections left to their supervisor", "hostname", key.host,
				"endpoint", key.endpoint, "connections", len(set), "grace", e.cfg.WithdrawGrace, "reason", reason)
			continue
		}
		for sp := range set {
			sp.close()
		}
		e.m.revoked.WithLabelValues(reason).Add(float64(len(set)))
		e.log.Info("edge closed spliced connections", "hostname", key.host, "endpoint", key.endpoint,
			"connections", len(set), "reason", reason)
	}
	if !next.Equal(e.nextExpiry) {
		e.nextExpiry = next
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// expiryLoop rebuilds the table when a route reaches its expires_at.
func (e *Edge) expiryLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		e.mu.Lock()
		next := e.nextExpiry
		e.mu.Unlock()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-t.C:
			e.applyLocked(func() {
				panicguard.Point(panicguard.EdgeExpiry, "expire")
				if !e.nextExpiry.IsZero() && !time.Now().Before(e.nextExpiry) {
					e.rebuildLocked(time.Now(), "expiry")
				}
			})
		}
	}
}

// Serve accepts connections on ln until Shutdown; it then returns nil.
func (e *Edge) Serve(ln net.Listener) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	e.ln = ln
	e.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			e.mu.Lock()
			closed := e.closed
			e.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("edge: accept: %w", err)
			}
			backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
			e.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			e.m.conns.WithLabelValues(resultDraining).Inc()
			_ = c.Close()
			return nil
		}
		if e.cfg.MaxConnections > 0 && e.active >= e.cfg.MaxConnections {
			e.mu.Unlock()
			e.m.conns.WithLabelValues(resultOverLimit).Inc()
			_ = c.Close()
			continue
		}
		e.active++
		e.pending[c] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serveConn(c)
	}
}

// serveConn serves one client connection.
func (e *Edge) serveConn(c net.Conn) {
	defer func() {
		e.mu.Lock()
		e.active--
		delete(e.pending, c)
		e.mu.Unlock()
		_ = c.Close()
		e.wg.Done()
	}()
	src := c.RemoteAddr().String()
	var host string
	var sp *splice
	defer func() {
		if r := recover(); r != nil { // this connection only
			if sp != nil {
				sp.close()
			}
			_ = c.Close()
			panicguard.Report(e.log, panicguard.EdgeConn, r, "sni", host, "src", src)
		}
	}()
	accepted := time.Now()
	_ = c.SetDeadline(accepted.Add(e.cfg.HelloTimeout))
	hello, err := tlshello.ReadClientHello(c, tlshello.DefaultMaxClientHelloBytes)
	if err != nil {
		e.refuseHello(c, err)
		return
	}
	host, ok := routes.NormalizeHost(hello.ServerName)
	panicguard.Point(panicguard.EdgeConn, host)
	var r *route
	if ok {
		r = e.lookup(host, time.Now())
	}
	if r == nil {
		result := resultUnknownName
		if hello.ServerName == "" {
			result = resultNoSNI
		}
		e.m.conns.WithLabelValues(result).Inc()
		e.log.Info("edge refused connection", "reason", result, "sni", truncate(hello.ServerName, 255), "src", src)
		e.ocsfConn(c, ocsf.NetRefuse, hello.ServerName, result, "")
		_ = tlshello.WriteAlert(c, tlshello.AlertUnrecognizedName)
		return
	}
	_ = c.SetDeadline(time.Time{})

	// Dial the owner and send it the preamble. In the PROXY protocol's
	// auto mode (ProxyFallback), an owner that closes the connection
	// without a byte after the header refuses it: the edge redials and
	// sends the ClientHello alone (proxy.go).
	var backend net.Conn
	var pending []byte // the owner's first bytes, read by the auto mode
	withoutHeader, header := false, false
	for {
		backend, sp, r = e.connect(c, host, r, src)
		if sp == nil {
			return
		}
		header = !withoutHeader && e.sendsProxyHeader(r.endpoint)
		_ = backend.SetWriteDeadline(time.Now().Add(writeHelloTimeout))
		if _, err := backend.Write(e.preamble(c, host, hello.Raw, header)); err != nil {
			e.unregister(host, r.endpoint, sp)
			sp.close()
			return
		}
		_ = backend.SetWriteDeadline(time.Time{})
		if !header || !e.cfg.ProxyFallback {
			break
		}
		var refused bool
		pending, refused = e.awaitAnswer(backend, accepted)
		if !refused {
			break
		}
		if sp.closed.Load() {
			// The edge closed it meanwhile (a revoked route, the drain's
			// end), not the supervisor.
			e.unregister(host, r.endpoint, sp)
			return
		}
		e.proxyHeaderRefused(host, r)
		e.unregister(host, r.endpoint, sp)
		_ = backend.Close()
		withoutHeader = true
	}
	defer e.unregister(host, r.endpoint, sp)
	sp.proxyHeader = header
	e.m.conns.WithLabelValues(resultSpliced).Inc()
	e.m.active.Inc()
	defer e.m.active.Dec()
	e.log.Debug("edge splicing", "hostname", host, "endpoint", r.endpoint, "supervisor", r.supervisor, "src", src)
	e.ocsfConn(c, ocsf.NetOpen, host, "", "")

	firstByteSince := accepted
	if pending != nil {
		// The auto mode read the owner's first bytes (and observed them).
		n, err := c.Write(pending)
		e.m.bytesDown.Add(float64(n))
		if err != nil {
			sp.close()
			return
		}
		firstByteSince = time.Time{}
	}
	var wg sync.WaitGroup
	wg.Go(func() { e.pipe(sp, backend, c, e.m.bytesUp, time.Time{}) })
	wg.Go(func() { e.pipe(sp, c, backend, e.m.bytesDown, firstByteSince) })
	wg.Wait()
	sp.close()
}

// connect dials the owner of host (r) and registers the splice of c to
// it; if the owner changes while dialing, it follows it. A nil sp: c was
// answered (an alert) or the edge is draining, and must be closed.
func (e *Edge) connect(c net.Conn, host string, r *route, src string) (backend net.Conn, sp *splice, _ *route) {
	var err error
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.DialTimeout)
		backend, err = e.cfg.Dial(ctx, "tcp", r.endpoint)
		cancel()
		if err != nil {
			e.m.conns.WithLabelValues(resultDialFailed).Inc()
			e.log.Warn("edge could not reach the owning supervisor", "hostname", host, "endpoint", r.endpoint,
				"supervisor", r.supervisor, "src", src, "err", err)
			e.ocsfConn(c, ocsf.NetFail, host, "supervisor unreachable: "+err.Error(), r.endpoint)
			_ = tlshello.WriteAlert(c, tlshello.AlertInternalError)
			return nil, nil, r
		}
		var current *route
		var closing bool
		sp, current, closing = e.register(host, r.endpoint, c, backend)
		if sp != nil {
			return backend, sp, r
		}
		_ = backend.Close()
		if closing {
			e.m.conns.WithLabelValues(resultDraining).Inc()
			return nil, nil, r
		}
		if current == nil || attempt == 2 {
			// The route went away (or kept moving) while dialing.
			e.m.conns.WithLabelValues(resultUnknownName).Inc()
			_ = tlshello.WriteAlert(c, tlshello.AlertUnrecognizedName)
			return nil, nil, r
		}
		r = current
	}
}

// pipe copies src to dst, counting the bytes in n when it ends. With
// firstByteSince set, the first read is made here (src's first bytes: the
// supervisor's ServerHello or alert) and the time since then observed as
// the edge's time to first byte; the rest goes through io.Copy, which
// splices socket to socket. At src's end of stream it half-closes dst and
// gives the other direction HalfCloseTimeout to finish; on an error it
// closes the splice.
func (e *Edge) pipe(sp *splice, dst, src net.Conn, n prometheus.Counter, firstByteSince time.Time) {
	defer func() {
		if r := recover(); r != nil {
			sp.close() // this splice only; serveConn then ends
			panicguard.Report(e.log, panicguard.EdgePipe, r, "sni", sp.key.host, "src", sp.client.RemoteAddr().String(), "endpoint", sp.key.endpoint)
		}
	}()
	panicguard.Point(panicguard.EdgePipe, sp.key.host)
	var first int64
	var err error
	if !firstByteSince.IsZero() {
		buf := make([]byte, 4096)
		var r int
		r, err = src.Read(buf)
		if r == 0 && err != nil && !timedOut(err) {
			e.closedWithoutAnswer(sp)
		}
		if r > 0 {
			e.m.firstByte.Observe(time.Since(firstByteSince).Seconds())
			w, werr := dst.Write(buf[:r])
			first = int64(w)
			if werr != nil && err == nil {
				err = werr
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil // an empty stream: half-close below
		} else if err == nil {
			var copied int64
			copied, err = io.Copy(dst, src)
			first += copied
		}
	} else {
		first, err = io.Copy(dst, src)
	}
	n.Add(float64(first))
	if err != nil {
		sp.close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		// The other direction reads from dst.
		_ = dst.SetReadDeadline(time.Now().Add(e.cfg.HalfCloseTimeout))
		return
	}
	sp.close()
}

// register records a splice of host to endpoint, if endpoint still owns
// host and the edge is not closing. Otherwise it returns the current route
// of host (nil when none), or closing.
func (e *Edge) register(host, endpoint string, c, backend net.Conn) (sp *splice, current *route, closing bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, nil, true
	}
	cur := e.lookup(host, time.Now())
	if cur == nil || cur.endpoint != endpoint {
		return nil, cur, false
	}
	key := spliceKey{host, endpoint}
	set := e.splices[key]
	if set == nil {
		set = make(map[*splice]struct{})
		e.splices[key] = set
	}
	sp = &splice{client: c, backend: backend, key: key}
	set[sp] = struct{}{}
	delete(e.pending, c)
	return sp, nil, false
}

// restoreLingeringLocked cancels the withdrawal grace of the lingering
// splices whose route is back in table with the same endpoint (a
// withdrawal that was undone, e.g. by a gateway restart): they are spliced
// connections of a live route again, which only a later withdrawal or
// expiry closes. e.mu is held.
func (e *Edge) restoreLingeringLocked(table map[string]*route) {
	restored := map[spliceKey]int{}
	for sp := range e.lingering {
		r := table[sp.key.host]
		if r == nil || r.endpoint != sp.key.endpoint {
			continue
		}
		delete(e.lingering, sp)
		set := e.splices[sp.key]
		if set == nil {
			set = make(map[*splice]struct{})
			e.splices[sp.key] = set
		}
		set[sp] = struct{}{}
		restored[sp.key]++
	}
	for key, n := range restored {
		e.log.Info("edge route returned: withdrawal grace cancelled, spliced connections kept", "hostname", key.host,
			"endpoint", key.endpoint, "connections", n)
	}
}

// lingerLocked keeps the splices of a withdrawn route open for
// WithdrawGrace, then closes those still open. e.mu is held.
func (e *Edge) lingerLocked(set map[*splice]struct{}, reason string) {
	batch := make([]*splice, 0, len(set))
	withdrawal := new(int) // identifies this grace: a splice restored and withdrawn again waits out its new one
	for sp := range set {
		e.lingering[sp] = withdrawal
		batch = append(batch, sp)
	}
	time.AfterFunc(e.cfg.WithdrawGrace, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		closed := 0
		for _, sp := range batch {
			if w, ok := e.lingering[sp]; ok && w == withdrawal {
				delete(e.lingering, sp)
				sp.close()
				closed++
			}
		}
		if closed > 0 {
			e.m.revoked.WithLabelValues(reason).Add(float64(closed))
			e.log.Info("edge closed spliced connections after the withdrawal grace", "connections", closed, "reason", reason)
		}
	})
}

func (e *Edge) unregister(host, endpoint string, sp *splice) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.lingering, sp)
	key := spliceKey{host, endpoint}
	if set := e.splices[key]; set != nil {
		delete(set, sp)
		if len(set) == 0 {
			delete(e.splices, key)
		}
	}
}

// helloResults are the results of a ClientHello that could not be read.
var helloResults = [...]string{
	tlshello.RefusalNotTLS:     resultNotTLS,
	tlshello.RefusalMalformed:  resultBadHello,
	tlshello.RefusalReadFailed: resultHelloFailed,
}

func (e *Edge) refuseHello(c net.Conn, err error) {
	e.m.conns.WithLabelValues(helloResults[tlshello.Classify(err)]).Inc()
	_ = tlshello.Refuse(c, err)
	lvl := slog.LevelDebug
	if errors.Is(err, os.ErrDeadlineExceeded) {
		lvl = slog.LevelInfo
	}
	e.log.Log(context.Background(), lvl, "edge refused client hello", "src", c.RemoteAddr().String(), "err", err)
	e.ocsfConn(c, ocsf.NetRefuse, "", helloResults[tlshello.Classify(err)], "")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Shutdown stops accepting, closes connections that are not spliced yet,
// lets spliced connections finish until ctx ends, then closes the rest
// and logs them (closeAllSplices). It returns when every connection
// goroutine is done. Routes keep following discovery meanwhile: a
// withdrawn or expired route still closes its connections.
func (e *Edge) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	for c := range e.pending {
		_ = c.Close()
	}
	var err error
	if e.ln != nil {
		err = e.ln.Close()
	}
	n := len(e.lingering)
	for _, set := range e.splices {
		n += len(set)
	}
	e.mu.Unlock()
	if deadline, ok := ctx.Deadline(); ok {
		e.log.Info("edge draining: no longer accepting; spliced connections may finish", "connections", n, "until", deadline)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
drain:
	for e.spliceCount() > 0 {
		select {
		case <-t.C:
		case <-ctx.Done():
			e.closeAllSplices()
			break drain
		}
	}
	e.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (e *Edge) spliceCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.lingering)
	for _, set := range e.splices {
		n += len(set)
	}
	return n
}

// closeAllSplices closes every spliced connection (drain timeout).
// It logs what it cut: one line per hostname and endpoint, then the total.
func (e *Edge) closeAllSplices() {
	e.mu.Lock()
	defer e.mu.Unlock()
	cut := map[spliceKey]int{}
	closed := 0
	for key, set := range e.splices {
		for sp := range set {
			sp.close()
			cut[key]++
			closed++
		}
		delete(e.splices, key)
	}
	for sp := range e.lingering {
		sp.close()
		cut[sp.key]++
		closed++
		delete(e.lingering, sp)
	}
	e.m.revoked.WithLabelValues("shutdown").Add(float64(closed))
	for key, n := range cut {
		e.log.Warn("drain timeout: spliced connections cut", "hostname", key.host, "endpoint", key.endpoint, "connections", n)
	}
	e.log.Warn("drain timeout: closed the remaining spliced connections", "connections", closed)
}

type metrics struct {
	// firstByte is the time from accepting a client connection to the
	// first byte the supervisor sends back through the splice.
	firstByte prometheus.Histogram
	// bytesUp and bytesDown are the bytes spliced from clients to
	// supervisors and back, counted when each connection ends.
	bytesUp, bytesDown prometheus.Counter

	conns   *prometheus.CounterVec
	active  prometheus.Gauge
	routes  prometheus.Gauge
	revoked *prometheus.CounterVec
	updates prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "applistener_edge_bytes_total", Help: "Bytes spliced, by direction (client_to_supervisor, supervisor_to_client), counted when each connection ends.",
	}, []string{"direction"})
	m := &metrics{
		firstByte: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "applistener_edge_first_byte_seconds",
			Help:    "Time from accepting a client connection to the owning supervisor's first byte (its ServerHello): ClientHello, lookup, dial and the supervisor's answer.",
			Buckets: buckets.Latency,
		}),
		bytesUp:   bytes.WithLabelValues("client_to_supervisor"),
		bytesDown: bytes.WithLabelValues("supervisor_to_client"),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_edge_connections_total", Help: "Client connections accepted by the edge, by result.",
		}, []string{"result"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_edge_active_splices", Help: "Client connections currently spliced to a supervisor.",
		}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_edge_routes", Help: "Unexpired routes in the edge's discovery cache.",
		}),
		revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_edge_splices_closed_total", Help: "Spliced connections closed by the edge, by reason (route_gone, owner_changed, shutdown).",
		}, []string{"reason"}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_edge_discovery_updates_total", Help: "Discovery snapshots applied to the cache.",
		}),
	}
	for _, r := range []string{resultSpliced, resultNoSNI, resultUnknownName, resultNotTLS, resultBadHello, resultHelloFailed, resultDialFailed, resultOverLimit, resultDraining} {
		m.conns.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.conns, m.active, m.routes, m.revoked, m.updates, m.firstByte, bytes)
	}
	return m
}
