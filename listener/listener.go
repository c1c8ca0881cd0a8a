// Package listener accepts TCP connections for the application listener,
// reads a PROXY protocol v2 header from the peers allowed to send one
// (proxy.go), reads each ClientHello before any handshake, refuses names that are not
// installed and fresh routes with the TLS alert unrecognized_name (no
// certificate is ever sent for them), terminates TLS for the others, and
// hands each connection, bound to the route its SNI named, to dispatch.
package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/buckets"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/internal/tlshello"
	"github.com/applistener/applistener/routes"
)

// Conn is a client connection the listener hands to its Handler once the
// TLS handshake is complete and its server name is bound to a route.
type Conn struct {
	// Conn is the connection to serve: a *tls.Conn whose handshake is done.
	Conn net.Conn
	// Raw is the TCP connection under it. Closing Raw ends the connection
	// at once (revocation) without waiting on a stalled TLS peer.
	Raw net.Conn
	// Client is the client's address: the source address that a permitted
	// proxy's PROXY protocol header carried, else the TCP peer's address.
	Client netip.AddrPort
	// SNI is the normalized server name the route was looked up by.
	SNI string
	// Route is the route SNI names; its lease revokes the connection.
	Route *routes.Route
	// Batcher collects the TLS records of one large write into one system
	// call; nil when the transport cannot.
	Batcher WriteBatcher
	// Done must be called exactly once, when the connection has ended and
	// is closed, possibly after the Serve method returned (an upgraded
	// WebSocket is served by goroutines of its own). Until then the
	// connection counts against MaxConnections and Shutdown waits for it.
	Done func()
}

// WriteBatcher is a transport that can hold the writes of one large TLS
// write and send them with one system call (tlshello.PrefixConn).
type WriteBatcher interface {
	HoldWrites()
	FlushWrites() error
}

// Handler serves connections after their handshake. dispatch.Server
// implements it.
type Handler interface {
	// ServeConn serves HTTP/1.1 on c.
	ServeConn(c Conn)
	// ServeH2 serves c, which negotiated ALPN "h2"; it closes c.Conn
	// before returning.
	ServeH2(c Conn)
	Shutdown(ctx context.Context) error
}

// Config configures a Listener.
type Config struct {
	// TLS is the server configuration (certificates, ALPN, tickets).
	TLS *tls.Config
	// Routes is the route table the SNI is looked up in.
	Routes *routes.Table
	// Handler serves connections after the handshake.
	Handler Handler
	// HandshakeTimeout bounds reading the ClientHello and the handshake.
	HandshakeTimeout time.Duration
	// MaxConnections bounds concurrent client connections (0: no bound);
	// beyond it new connections are closed at once.
	MaxConnections int
	// TrustedProxies may start a connection with a PROXY protocol v2
	// header, whose source address then becomes the client address. A
	// PROXY header (v1 or v2) from any other peer closes the connection.
	TrustedProxies []netip.Prefix
	// RequireProxyHeader lists peers that must start every connection with
	// a PROXY protocol v2 header (they may send one whether or not they are
	// in TrustedProxies); a connection of theirs without one is closed.
	RequireProxyHeader []netip.Prefix
	// OCSF receives a Network Activity record for every refused
	// connection and, at debug, every accepted one (ocsf.go); nil: none.
	OCSF *ocsf.Emitter
	// Fair admits new TLS handshakes in turn across instances (the SNI
	// names the instance before the handshake), shared with dispatch;
	// nil: no fair admission.
	Fair       *fairshare.Scheduler
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultHandshakeTimeout bounds the ClientHello read and TLS handshake.
const DefaultHandshakeTimeout = 10 * time.Second

// Listener is the application listener.
type Listener struct {
	cfg Config
	ln  net.Listener
	log *slog.Logger
	m   *metrics

	mu          sync.Mutex
	closed      bool
	handshaking map[net.Conn]struct{}
	active      int
	wg          sync.WaitGroup
}

// New wraps a bound TCP listener.
func New(ln net.Listener, cfg Config) *Listener {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Listener{
		cfg:         cfg,
		ln:          ln,
		log:         cfg.Logger,
		m:           newMetrics(cfg.Registerer),
		handshaking: make(map[net.Conn]struct{}),
	}
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Serve accepts connections until Shutdown; it then returns nil.
func (l *Listener) Serve() error {
	var backoff time.Duration
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors or a transient error: back off, retry.
			backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = raw.Close()
			return nil
		}
		if l.cfg.MaxConnections > 0 && l.active >= l.cfg.MaxConnections {
			l.mu.Unlock()
			l.m.rejections.WithLabelValues("max_connections").Inc()
			_ = raw.Close()
			continue
		}
		l.active++
		l.handshaking[raw] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serveConn(raw)
	}
}

func (l *Listener) serveConn(raw net.Conn) {
	// A panic closes this connection only (the deferred releases below run
	// first); dispatch recovers its own after the handoff.
	var host string
	var client netip.AddrPort
	var done func()
	defer func() {
		if r := recover(); r != nil {
			_ = raw.Close()
			if done != nil {
				done()
			}
			panicguard.Report(l.log, panicguard.ListenerConn, r, "sni", host, "peer", raw.RemoteAddr().String(), "client", client.String())
		}
	}()
	handedOff := false
	slotPassed := false // the handler releases the connection slot (done)
	releaseSlot := func() {
		l.mu.Lock()
		l.active--
		l.mu.Unlock()
		l.wg.Done()
	}
	defer func() {
		if !handedOff {
			l.mu.Lock()
			delete(l.handshaking, raw)
			l.mu.Unlock()
		}
		if !slotPassed {
			releaseSlot()
		}
	}()
	l.m.accepted.Inc()
	start := time.Now()
	_ = raw.SetDeadline(start.Add(l.cfg.HandshakeTimeout))
	client, helloSrc, ok := l.readPreamble(raw, addrPortOf(raw.RemoteAddr()))
	if !ok {
		_ = raw.Close()
		return
	}
	hello, err := tlshello.ReadClientHello(helloSrc, tlshello.DefaultMaxClientHelloBytes)
	if err != nil {
		l.refuseHello(raw, client, err)
		_ = raw.Close()
		return
	}
	host, ok = routes.NormalizeHost(hello.ServerName)
	var route *routes.Route
	if ok {
		route = l.cfg.Routes.Lookup(host)
	}
	if route == nil {
		reason := "unknown_sni"
		if hello.ServerName == "" {
			reason = "no_sni"
		}
		l.m.rejections.WithLabelValues(reason).Inc()
		l.log.Info("handshake refused", "class_uid", 4001, "rule", "app-listener-sni",
			"reason", reason, "sni", truncate(hello.ServerName, 255), "src", client.String())
		l.ocsfConn(raw, client, ocsf.NetRefuse, hello.ServerName, reason, 0, nil)
		_ = tlshello.WriteAlert(raw, tlshello.AlertUnrecognizedName)
		_ = raw.Close()
		return
	}
	panicguard.Point(panicguard.ListenerConn, host)
	pc := tlshello.NewPrefixConn(raw, hello.Raw)
	tc := tls.Server(pc, l.cfg.TLS)
	// Fair admission for the handshake's CPU work (the SNI named the instance).
	fair, ok := l.admitHandshake(route, start)
	if !ok {
		_ = raw.Close()
		return
	}
	err = tc.Handshake()
	l.cfg.Fair.Release(fair)
	if err != nil {
		l.m.rejections.WithLabelValues("handshake").Inc()
		l.log.Debug("handshake failed", "sni", host, "src", client.String(), "err", err)
		l.ocsfConn(raw, client, ocsf.NetRefuse, host, "handshake: "+err.Error(), 0, route)
		_ = raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})
	l.m.handshakes.Inc()
	l.m.handshakeSeconds.Observe(time.Since(start).Seconds())
	l.ocsfConn(raw, client, ocsf.NetOpen, host, "", tc.ConnectionState().Version, route)
	l.mu.Lock()
	delete(l.handshaking, raw)
	handedOff = true
	l.mu.Unlock()
	switch tc.ConnectionState().NegotiatedProtocol {
	case "acme-tls/1":
		// A TLS-ALPN-01 validation: the handshake itself was the answer.
		_ = raw.Close()
		return
	}
	slotPassed = true
	done = sync.OnceFunc(releaseSlot)
	c := Conn{Conn: tc, Raw: raw, Client: client, SNI: host, Route: route, Done: done}
	if b, ok := pc.(WriteBatcher); ok {
		c.Batcher = b
	}
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		l.cfg.Handler.ServeH2(c)
		return
	}
	l.cfg.Handler.ServeConn(c)
}

// admitHandshake admits a handshake for route's instance under fair
// admission (Config.Fair), queued at most until the handshake deadline or
// the route's revocation; false: refused (counted as fair_wait).
func (l *Listener) admitHandshake(route *routes.Route, start time.Time) (fairshare.Ticket, bool) {
	if l.cfg.Fair == nil {
		return fairshare.Ticket{}, true
	}
	wait := max(time.Until(start.Add(l.cfg.HandshakeTimeout)), time.Nanosecond)
	t, err := l.cfg.Fair.Admit(&route.Instance.Fair, fairshare.KindHandshake, route.Lease.Done(), wait)
	if err != nil {
		l.m.rejections.WithLabelValues("fair_wait").Inc()
		return t, false
	}
	return t, true
}

// helloRejections are the rejection reasons (metric label) of a ClientHello
// that could not be read.
var helloRejections = [...]string{
	tlshello.RefusalNotTLS:     "not_tls",
	tlshello.RefusalMalformed:  "malformed_hello",
	tlshello.RefusalReadFailed: "hello_read",
}

func (l *Listener) refuseHello(raw net.Conn, src netip.AddrPort, err error) {
	l.m.rejections.WithLabelValues(helloRejections[tlshello.Classify(err)]).Inc()
	_ = tlshello.Refuse(raw, err)
	l.log.Debug("client hello refused", "src", src.String(), "err", err)
	l.ocsfConn(raw, src, ocsf.NetRefuse, "", helloRejections[tlshello.Classify(err)], 0, nil)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Shutdown stops accepting, aborts handshakes in progress, and drains the
// handler until ctx ends. It returns when every connection goroutine is done.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	for c := range l.handshaking {
		_ = c.Close()
	}
	l.mu.Unlock()
	err := l.ln.Close()
	if herr := l.cfg.Handler.Shutdown(ctx); herr != nil && !errors.Is(herr, context.DeadlineExceeded) && !errors.Is(herr, context.Canceled) {
		err = herr
	}
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

type metrics struct {
	accepted   prometheus.Counter
	handshakes prometheus.Counter
	rejections *prometheus.CounterVec
	// proxyHeaders counts the PROXY protocol headers accepted, by command.
	proxyHeaders *prometheus.CounterVec
	// handshakeSeconds: from accept to a completed handshake (ClientHello
	// read, route lookup, TLS handshake); refused or failed handshakes are
	// not observed.
	handshakeSeconds prometheus.Histogram
}

// handshakeBuckets: 100 µs to 10 s, the project's round bounds; a loopback
// handshake takes about a millisecond, HandshakeTimeout is 10 s.
var handshakeBuckets = buckets.Handshake

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_connections_accepted_total", Help: "TCP connections accepted by the app listener.",
		}),
		handshakes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_tls_handshakes_total", Help: "Completed TLS handshakes.",
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_handshake_rejections_total", Help: "Connections refused before or during the TLS handshake, by reason.",
		}, []string{"reason"}),
		proxyHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "applistener_proxy_protocol_headers_total", Help: "PROXY protocol v2 headers accepted from trusted proxies, by command (proxy, local).",
		}, []string{"command"}),
		handshakeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "applistener_tls_handshake_seconds",
			Help:    "Time from accepting a connection to its completed TLS handshake (ClientHello read and handshake).",
			Buckets: handshakeBuckets,
		}),
	}
	if reg != nil {
		reg.MustRegister(m.accepted, m.handshakes, m.rejections, m.proxyHeaders, m.handshakeSeconds)
	}
	return m
}
