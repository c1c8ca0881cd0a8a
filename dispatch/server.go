// Package dispatch serves the connections that the listener has bound to
// one route, over HTTP/1.1 and HTTP/2: it checks every request (Host or
// :authority equals SNI, the route is still installed and fresh, the
// instance is under its stream limit), sanitises headers, forwards the
// request to the route's connector over reused keep-alive connections, and
// turns accepted WebSocket upgrades into raw byte streams that end when the
// route is revoked. It knows nothing of how configuration arrives.
//
// Files by concept:
//
//	server.go      Server: configuration, lifecycle, admission, drain
//	conn.go        an HTTP/1.1 client connection: request loop, answers
//	h2.go          HTTP/2: ServeH2 on the engine (internal/h2engine), its settings, drain
//	h2conn.go      an HTTP/2 connection bound to a route (revocation)
//	h2stream.go    an HTTP/2 stream: checks, conversion, forwarding
//	h2websocket.go WebSockets over HTTP/2 (RFC 8441 extended CONNECT)
//	h2c.go         streams to services that declare h2c (gRPC): HTTP/2 to the app
//	h2c_pool.go    the per-route pool of HTTP/2 app connections (h2c)
//	exchange.go    one request forwarded to the app, shared by both
//	headwait.go    the response-head timeout, started once the body is sent
//	retry.go       when a request may be sent to the app again
//	appstart.go    waiting for an app that is not listening yet
//	backend.go     the per-route pool of app connections (as many as the
//	               route's concurrency needs, LIFO, idle timeout)
//	request.go     parsing an HTTP/1.1 request head
//	lexer.go       the HTTP/1.1 field and token grammar
//	inbuf.go       the pooled input buffer
//	appack.go      an app connection's reads: early ACK when a response needs a second read
//	forward.go     the request head sent to the app (sanitising)
//	response.go    the app's response head, parsed and relayed
//	reqbody.go     streaming an HTTP/1.1 request body to the app
//	body.go        body framing: lengths, chunks, until-close
//	cookies.go     app cookies made host-only
//	redirect.go    redirects to the app's loopback origin made public
//	errors.go      the listener's own answers (denials)
//	accesslog.go   the access log (one line per request) and latency histograms
//	ratebound.go   the lock-free bound on access-log lines of the whole process
//	ocsf.go        the OCSF records: HTTP Activity per request, failed app connections
//	upgrade.go     the handoff of an accepted WebSocket upgrade
//	websocket.go   the WebSocket splice and its revocation
//	websocket_raw.go   the app's side of a WebSocket read as an event loop would
//	park.go, idlepoll.go  idle WebSockets without goroutine or buffer
//	idlepark.go    idle HTTP/1.1 keep-alive connections without goroutine
//	keepalive.go   the yield before the next request of a keep-alive connection
//	metrics.go     the data plane's metrics
//	access.go      private services: credentials, intent, the decision
//	access_answer.go  the listener's access answers (401/403/303/204, gRPC)
//	access_conn.go the decision's hooks in both protocols, key revocation
//
// The system calls on sockets (a conn's raw socket, the early ACK, a hang-up
// seen without reading, the idle probe, the readable wait, a request written
// inside the read that waits for its answer, event-loop reads, the epoll
// instance of the idle pollers) are in internal/sock, one file per platform;
// this package keeps when and why they are made.
package dispatch

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/internal/accessjwt"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/wake"
)

// Config configures a Server. Zero durations and sizes take the defaults.
type Config struct {
	// PreserveHost forwards the public Host exactly as the client sent it
	// (HTTP/2: :authority), port included, instead of 127.0.0.1:PORT.
	// Without it, redirects to that loopback origin are rewritten to the
	// public one (redirect.go).
	PreserveHost bool
	// AllowUnderscoreHeaders forwards request fields whose names contain
	// '_' (dropped by default, as nginx and Caddy do). Aliases of Host, the
	// framing, hop-by-hop and forwarding fields are dropped regardless.
	AllowUnderscoreHeaders bool
	// PassCookieDomain forwards the Domain attribute of an app's Set-Cookie
	// as it is. By default a Domain other than the request's host is
	// removed, so that one sandbox cannot set cookies for the others (safe
	// to turn on only when the app domain is on the Public Suffix List).
	PassCookieDomain bool
	// TrustedProxies may send X-Forwarded-*, Forwarded and client identity headers.
	TrustedProxies []netip.Prefix
	// MaxHeaderBytes bounds a request head (request line and fields); 431 beyond it.
	MaxHeaderBytes int
	// MaxHeaderFields bounds the number of request header fields; 431 beyond it.
	MaxHeaderFields int
	// HeaderTimeout bounds reading one request head once its first byte arrived.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive client connection with no request.
	IdleTimeout time.Duration
	// BodyTimeout bounds each read of a request body and each write to the client.
	BodyTimeout time.Duration
	// DialTimeout bounds connecting to the app (504 beyond it).
	DialTimeout time.Duration
	// AppStartGrace is how long a request waits, redialling with backoff,
	// for an app that refuses connections (not listening yet) before it is
	// answered 502 "not listening" (appstart.go); a service's
	// start_grace_seconds overrides it. 0: DefaultAppStartGrace; negative:
	// no wait.
	AppStartGrace time.Duration
	// ResponseHeaderTimeout bounds waiting for the app's response head
	// (504), from the moment the request body has been sent (headwait.go).
	ResponseHeaderTimeout time.Duration
	// BackendIdleTimeout retires idle app connections; keep it below the
	// app's own keep-alive timeout (Node.js: 5 s).
	BackendIdleTimeout time.Duration
	// MaxIdlePerRoute, when positive, bounds the idle app connections kept
	// per route. Without it a route keeps as many as its concurrency needs:
	// at most its peak of requests in flight (so at most the instance's
	// max_streams), each retired after BackendIdleTimeout unused.
	MaxIdlePerRoute int
	// DisableHTTP2WebSockets turns WebSockets over HTTP/2 (RFC 8441
	// extended CONNECT) off: SETTINGS_ENABLE_CONNECT_PROTOCOL is sent as 0
	// and extended CONNECT streams get 405, so clients use HTTP/1.1 for
	// WebSockets.
	DisableHTTP2WebSockets bool
	// WebSocketCloseGrace is how long a revoked WebSocket may take to reach
	// a frame boundary before it is closed anyway.
	WebSocketCloseGrace time.Duration
	// AccessKeys returns the keys that verify the access tokens of
	// services in access mode token (access.go); nil, or a nil set: none,
	// and every request to such a service is refused.
	AccessKeys func() *accesstoken.KeySet
	// AccessJWT, when set, verifies platform-signed JWTs (JWKS) that are
	// swapped for the listener's own tokens, minted with the first of
	// AccessKeys (access_jwt.go); nil: only the listener's tokens.
	AccessJWT *accessjwt.Verifier
	// Wakes holds the requests that may wake a sleeping instance until it
	// is active (sleep.go); nil: they are answered 503 at once.
	Wakes *wake.Coordinator
	// NewConnector builds the connector of a route.
	NewConnector func(routes.ConnectorSpec) (connector.Connector, error)
	// AccessLog is the access log's format, AccessLogText, AccessLogJSON or
	// AccessLogOCSF:
	// one line per request and one per WebSocket when it ends, written to
	// AccessLogWriter (accesslog.go). "", AccessLogOff or a nil writer: none.
	AccessLog       string
	AccessLogWriter io.Writer
	// AccessLogRate bounds the access-log lines of each instance per
	// second, with bursts of AccessLogBurst lines (a token bucket; lines
	// beyond are dropped and counted). 0: DefaultAccessLogRate (burst
	// twice the rate); negative: no bound.
	AccessLogRate  float64
	AccessLogBurst int
	// AccessLogTotalRate bounds the access-log lines of all instances
	// together per second, with bursts of AccessLogTotalBurst lines; a line
	// within its instance's bound but beyond this one is dropped and
	// counted the same way. 0: DefaultAccessLogTotalRate (burst twice the
	// rate); negative: no bound.
	AccessLogTotalRate  float64
	AccessLogTotalBurst int
	// OCSF receives the OCSF records of the data plane (ocsf.go) at its
	// own level; nil: none. Its product names the access log's OCSF lines.
	OCSF *ocsf.Emitter
	// Fair admits request heads, HTTP/2 streams and, when contended,
	// WebSocket chunks in turn across instances (fair.go); it is shared
	// with the listener. nil: no fair admission.
	Fair       *fairshare.Scheduler
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Defaults.
const (
	DefaultMaxHeaderBytes        = 16 << 10
	DefaultMaxHeaderFields       = 100
	DefaultHeaderTimeout         = 10 * time.Second
	DefaultIdleTimeout           = 120 * time.Second
	DefaultBodyTimeout           = 60 * time.Second
	DefaultDialTimeout           = 5 * time.Second
	DefaultAppStartGrace         = 5 * time.Second
	DefaultResponseHeaderTimeout = 60 * time.Second
	DefaultBackendIdleTimeout    = 4 * time.Second
	DefaultWebSocketCloseGrace   = 50 * time.Millisecond
)

// NewConnector is the default connector factory: a route's connector
// (tcp, unix or netns; a tcp connector without a host dials
// routes.DefaultConnectorHost).
func NewConnector(spec routes.ConnectorSpec) (connector.Connector, error) {
	kind, host := spec.Type, spec.Host
	if kind == "" {
		kind = connector.KindTCP
	}
	if kind == connector.KindTCP && host == "" {
		host = routes.DefaultConnectorHost
	}
	return connector.New(kind, host, spec.Path)
}

// Server serves client connections. It is safe for concurrent use.
type Server struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	alog *accessLog // nil: no access log
	// noObserve turns the latency histograms off as well (only for the
	// benchmark that measures their cost).
	noObserve bool
	// holdFairAppWait keeps an HTTP/2 stream's fair-admission slot while
	// it waits for its app, as HTTP/1.1 requests always do (fair.go);
	// only for the test that checks the admission order through the
	// listener, which the app's holds must pin.
	holdFairAppWait bool
	// idleParkAfter replaces parkAfter for HTTP/1.1 keep-alive connections
	// when positive (tests: an hour makes parking at once observable).
	idleParkAfter time.Duration

	bufPool sync.Pool // *[]byte read buffers, client and app side
	bwPool  sync.Pool // *bufio.Writer towards clients
	bigPool sync.Pool // *[]byte app-side buffers while a large body is copied

	mu       sync.Mutex
	conns    map[*clientConn]struct{}
	h2conns  map[*h2Conn]struct{} // HTTP/2 connections (h2.go), under mu
	draining atomic.Bool
	stopping chan struct{} // closed when Shutdown starts: ends waits for apps to listen
	stopOnce sync.Once
	idleCh   chan struct{} // signalled when a connection ends during drain

	idle idlePoller // idle WebSocket directions (idlepoll.go)
	// idleH1 holds the idle HTTP/1.1 keep-alive connections (idlepark.go).
	idleH1 idlePoller
	// appHangups notes the app connections that apps closed (apphangup.go).
	appHangups appHangups
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.MaxHeaderFields <= 0 {
		cfg.MaxHeaderFields = DefaultMaxHeaderFields
	}
	setDefault(&cfg.HeaderTimeout, DefaultHeaderTimeout)
	setDefault(&cfg.IdleTimeout, DefaultIdleTimeout)
	setDefault(&cfg.BodyTimeout, DefaultBodyTimeout)
	setDefault(&cfg.DialTimeout, DefaultDialTimeout)
	if cfg.AppStartGrace == 0 {
		cfg.AppStartGrace = DefaultAppStartGrace
	}
	setDefault(&cfg.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	setDefault(&cfg.BackendIdleTimeout, DefaultBackendIdleTimeout)
	setDefault(&cfg.WebSocketCloseGrace, DefaultWebSocketCloseGrace)
	if cfg.NewConnector == nil {
		cfg.NewConnector = NewConnector
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	bufSize := max(cfg.MaxHeaderBytes+1024, 16<<10)
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		conns:    make(map[*clientConn]struct{}),
		idleCh:   make(chan struct{}, 1),
		stopping: make(chan struct{}),
	}
	s.m = newMetrics(cfg.Registerer, func() float64 { return float64(s.idle.waiters()) })
	s.alog = newAccessLog(&s.cfg, s.m.accessLogDropped)
	s.bufPool.New = func() any { b := make([]byte, bufSize); return &b }
	s.bwPool.New = func() any { return bufio.NewWriterSize(nil, 16<<10) }
	s.bigPool.New = func() any { b := make([]byte, bigBodyBuf); return &b }
	return s
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// ServeConn serves HTTP/1.1 on lc, a connection whose handshake is complete
// and whose SNI named lc.Route. It closes the connection and calls lc.Done
// (if set) once the connection has ended. It returns then, or earlier: for
// an upgraded WebSocket, whose two directions run in goroutines of their
// own (none at all while idle) and call Done when the WebSocket ends; and
// for a keep-alive connection idle between requests, which waits without a
// goroutine (idlepark.go) and is served by a new one when the next request
// arrives.
func (s *Server) ServeConn(lc listener.Conn) {
	done := lc.Done
	if done == nil {
		done = func() {}
	}
	c := &clientConn{
		s:     s,
		conn:  lc.Conn,
		raw:   lc.Raw,
		batch: lc.Batcher,
		sni:   lc.SNI,
		route: lc.Route,
		in:    inbuf{src: lc.Conn, pool: &s.bufPool},
	}
	c.peer, c.trusted = s.peerOf(lc)
	c.ci = connInfo{route: lc.Route, sni: lc.SNI, peer: c.peer, tlsVer: tlsVersionOf(lc.Conn), raw: lc.Raw, client: lc.Client}
	release, ok := admit(s, &s.conns, c, lc.Raw, lc.Route)
	if !ok {
		done()
		return
	}
	c.release = func() {
		release()
		done()
	}
	c.serve()
}

// admit registers a client connection in set (for drain) and on its
// route's lease (for revocation), and counts it. It closes raw and returns
// false while draining or when the route was revoked after the handshake;
// release undoes everything.
func admit[C interface {
	comparable
	routes.Stream
}](s *Server, set *map[C]struct{}, c C, raw net.Conn, route *routes.Route) (release func(), ok bool) {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		_ = raw.Close()
		return nil, false
	}
	if *set == nil {
		*set = make(map[C]struct{})
	}
	(*set)[c] = struct{}{}
	s.mu.Unlock()
	untrack := func() {
		s.mu.Lock()
		delete(*set, c)
		n := len(s.conns) + len(s.h2conns)
		s.mu.Unlock()
		if n == 0 && s.draining.Load() {
			select {
			case s.idleCh <- struct{}{}:
			default:
			}
		}
	}
	if !route.Lease.Attach(c) {
		// Revoked between the handshake and now.
		_ = raw.Close()
		untrack()
		return nil, false
	}
	s.m.connsActive.Inc()
	return func() {
		s.m.connsActive.Dec()
		route.Lease.Detach(c)
		untrack()
	}, true
}

// peerOf returns the client address of lc and whether that client is a
// trusted proxy (its forwarding headers are kept). The address is the one
// a trusted proxy's PROXY header carried (lc.Client), else the TCP peer's:
// behind a TCP proxy the HTTP headers are the client's own, so they are
// trusted only if the client itself is.
func (s *Server) peerOf(lc listener.Conn) (netip.Addr, bool) {
	ap := lc.Client
	if !ap.IsValid() {
		var err error
		if ap, err = netip.ParseAddrPort(lc.Raw.RemoteAddr().String()); err != nil {
			return netip.Addr{}, false
		}
	}
	peer := ap.Addr().Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(peer) {
			return peer, true
		}
	}
	return peer, false
}

// Connections returns the number of client connections being served,
// HTTP/1.1 and HTTP/2.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) + len(s.h2conns)
}

// Shutdown drains: idle keep-alive connections are closed at once, requests
// waiting for an app to start listening are answered at once, requests in
// flight may finish (their responses carry Connection: close) until ctx
// ends, then everything left, WebSockets included (close code 1001), is
// closed. HTTP/2 connections get GOAWAY: their streams in flight may finish
// until ctx ends. It returns when every connection has ended.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.stopOnce.Do(func() { close(s.stopping) })
	s.h2GoAway()
	s.mu.Lock()
	for c := range s.conns {
		c.closeIfIdle()
	}
	n := len(s.conns) + len(s.h2conns)
	s.mu.Unlock()
	for n > 0 {
		select {
		case <-s.idleCh:
		case <-ctx.Done():
			s.mu.Lock()
			for c := range s.conns {
				go c.Revoke(routes.ErrShutdown)
			}
			for hc := range s.h2conns {
				go hc.Revoke(routes.ErrShutdown)
			}
			s.mu.Unlock()
			s.waitEmpty(5 * time.Second)
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
			// Re-check: a WebSocket or a request may have ended without
			// winning the race for idleCh.
		}
		// Again for HTTP/2 connections that were not yet being served.
		s.h2GoAway()
		s.mu.Lock()
		for c := range s.conns {
			c.closeIfIdle()
		}
		n = len(s.conns) + len(s.h2conns)
		s.mu.Unlock()
	}
	return nil
}

func (s *Server) waitEmpty(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if s.Connections() == 0 {
			return
		}
		select {
		case <-s.idleCh:
		case <-time.After(10 * time.Millisecond):
		}
	}
}
