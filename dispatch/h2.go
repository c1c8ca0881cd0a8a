package dispatch

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/listener"
)

// HTTP/2 settings of the client side. The app is always spoken to in
// HTTP/1.1 through the same per-route backend pool as HTTP/1.1 clients.
const (
	// H2MaxConcurrentStreams is SETTINGS_MAX_CONCURRENT_STREAMS.
	H2MaxConcurrentStreams = 250
	// H2ReadIdleTimeout: a connection with no frame read for this long is
	// sent a PING ...
	H2ReadIdleTimeout = 60 * time.Second
	// H2PingTimeout: ... and closed when the PING is not answered in time.
	H2PingTimeout = 15 * time.Second
)

// h2State is the Server's HTTP/2 machinery, created on first use.
//
// It is x/net's HTTP/2 server driven one connection at a time through
// Server.ServeConn. x/net marks that API deprecated in favour of net/http's
// own HTTP/2 (http.Server.Protocols and Serve), but net/http cannot serve a
// single connection accepted, handshaken and routed by someone else:
// ServeH2 hands over a connection whose Close closes the raw TCP connection
// (h2NetConn, which net/http would not take for TLS and so not for h2),
// and returns when that connection ends. Hence the SA1019 exceptions below.
type h2State struct {
	once sync.Once
	srv  *http2.Server //nolint:staticcheck // SA1019: ServeConn has no net/http equivalent, see h2State.
	// base carries the settings x/net takes from an http.Server
	// (MaxHeaderBytes → MAX_HEADER_LIST_SIZE, IdleTimeout, ErrorLog, the
	// HTTP2 settings) and, through http2.ConfigureServer, the graceful
	// shutdown hook: its Shutdown makes every connection served with it
	// send GOAWAY.
	base *http.Server
	used atomic.Bool // srv and base exist

	// byIdle holds a server (and its base) per instance idle timeout
	// (limits.idle_timeout_seconds): x/net takes the idle timeout from the
	// server, not per connection. At most maxH2IdleVariants; further
	// values get the default.
	mu     sync.Mutex
	byIdle map[time.Duration]h2Variant
}

// h2Variant is an HTTP/2 server and its base for one idle timeout.
type h2Variant struct {
	srv  *http2.Server //nolint:staticcheck // SA1019: see h2State.
	base *http.Server
}

// maxH2IdleVariants bounds the distinct per-instance idle timeouts that get
// an HTTP/2 server of their own.
const maxH2IdleVariants = 32

// h2Server returns the http2.Server and its base configuration.
func (s *Server) h2Server() (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	s.h2.once.Do(func() {
		s.h2.srv, s.h2.base = s.newH2Server(s.cfg.IdleTimeout)
		s.h2.used.Store(true)
	})
	return s.h2.srv, s.h2.base
}

// h2ServerFor returns the HTTP/2 server for a connection whose instance
// has idle timeout idle (0: the server's).
func (s *Server) h2ServerFor(idle time.Duration) (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	srv, base := s.h2Server()
	if idle <= 0 || idle == s.cfg.IdleTimeout {
		return srv, base
	}
	s.h2.mu.Lock()
	defer s.h2.mu.Unlock()
	if v, ok := s.h2.byIdle[idle]; ok {
		return v.srv, v.base
	}
	if len(s.h2.byIdle) >= maxH2IdleVariants {
		return srv, base
	}
	if s.h2.byIdle == nil {
		s.h2.byIdle = make(map[time.Duration]h2Variant)
	}
	v := h2Variant{}
	v.srv, v.base = s.newH2Server(idle)
	s.h2.byIdle[idle] = v
	return v.srv, v.base
}

// newH2Server builds an HTTP/2 server whose connections close after idle
// without streams.
func (s *Server) newH2Server(idle time.Duration) (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	base := &http.Server{
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
		IdleTimeout:    idle,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		// x/net reads these from the base server and lets them take
		// precedence over its own (deprecated) fields.
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: H2MaxConcurrentStreams,
			SendPingTimeout:      H2ReadIdleTimeout,
			PingTimeout:          H2PingTimeout,
			// A peer that reads nothing for this long loses the connection.
			WriteByteTimeout: s.cfg.BodyTimeout,
		},
	}
	// Its idle timeout is base's (ConfigureServer copies it).
	srv := &http2.Server{} //nolint:staticcheck // SA1019: see h2State.
	// ConfigureServer fails only for a TLSConfig with an unusable
	// cipher suite list; base has none.
	if err := http2.ConfigureServer(base, srv); err != nil { //nolint:staticcheck // SA1019: the GOAWAY-on-Shutdown hook for ServeConn, see h2State.
		s.log.Error("http2 configuration failed", "err", err)
	}
	return srv, base
}

// h2GoAway asks every HTTP/2 connection to finish gracefully: GOAWAY, then
// in-flight streams may complete. It is idempotent per connection and is
// called repeatedly while draining (a connection registers with x/net only
// once it starts being served).
func (s *Server) h2GoAway() {
	if !s.h2.used.Load() {
		return // no HTTP/2 connection was ever served
	}
	_, base := s.h2Server()
	// With no listener and no HTTP/1 connection of its own, Shutdown runs
	// the registered hooks and returns at once.
	_ = base.Shutdown(context.Background())
	s.h2.mu.Lock()
	variants := make([]*http.Server, 0, len(s.h2.byIdle))
	for _, v := range s.h2.byIdle {
		variants = append(variants, v.base)
	}
	s.h2.mu.Unlock()
	for _, b := range variants {
		_ = b.Shutdown(context.Background())
	}
}

// ServeH2 serves HTTP/2 on lc.Conn, a TLS connection that negotiated ALPN
// "h2" and whose SNI named lc.Route. Revocation closes lc.Raw, the TCP
// connection under it (never the TLS connection, whose Close can block on
// a stalled peer), which ends every stream of the connection. Each request
// is checked (route still usable, :authority names the SNI, method,
// instance limit) and forwarded to the app over HTTP/1.1; a request for
// another host (a browser coalescing connections under the wildcard
// certificate) gets 421 on its stream only. ServeH2 returns, after calling
// lc.Done, when the connection is closed and every stream handler has
// returned.
func (s *Server) ServeH2(lc listener.Conn) {
	if lc.Done != nil {
		defer lc.Done()
	}
	conn, raw, sni, route := lc.Conn, lc.Raw, lc.SNI, lc.Route
	tc, ok := conn.(*tls.Conn)
	if !ok {
		_ = raw.Close()
		return
	}
	hc := &h2Conn{s: s, raw: raw, sni: sni, route: route}
	hc.peer, hc.trusted = s.peerOf(lc)
	hc.ci = connInfo{route: route, sni: sni, peer: hc.peer, tlsVer: tc.ConnectionState().Version, raw: raw, client: lc.Client}
	release, ok := admit(s, &s.h2conns, hc, raw, route)
	if !ok {
		return
	}
	defer release()

	// The instance's idle timeout, as it is when the connection starts.
	srv, base := s.h2ServerFor(route.Instance.IdleTimeout())
	// Deadlines left by the handshake would end the connection; x/net
	// keeps its own timers (idle, ping, write-byte).
	_ = conn.SetDeadline(time.Time{})
	nc := &h2NetConn{Conn: tc, raw: raw, onHeadTimeout: hc.headTimedOut, hideXConnect: s.cfg.DisableHTTP2WebSockets}
	hc.nc = nc
	nc.heads.start(tc, s.cfg.HeaderTimeout)
	//nolint:staticcheck // SA1019: no net/http equivalent, see h2State.
	srv.ServeConn(nc, &http2.ServeConnOpts{
		BaseConfig: base,
		Handler:    hc,
	})
	_ = raw.Close()
	hc.endAndWait()
}

// h2NetConn is the connection handed to x/net: closing it closes the raw
// TCP connection. HTTP/2 ends connections with GOAWAY, so no close_notify
// is needed, and a stalled peer cannot block the close.
type h2NetConn struct {
	*tls.Conn
	raw   net.Conn
	heads h2HeadClock
	// onHeadTimeout runs once when a request head took too long.
	onHeadTimeout func()
	// hideXConnect: advertise SETTINGS_ENABLE_CONNECT_PROTOCOL = 0
	// (Config.DisableHTTP2WebSockets; h2websocket.go rewrites it).
	hideXConnect bool
	settings     settingsRewriter
	// nextWrite is closed by the next write (afterNextWrite).
	nextWrite atomic.Pointer[chan struct{}]
}

func (c *h2NetConn) Close() error { return c.raw.Close() }

// Read reads for x/net, bounding request heads in time (h2HeadClock).
func (c *h2NetConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heads.observe(p[:n])
	}
	if err != nil && c.heads.timedOut(err) && c.onHeadTimeout != nil {
		c.onHeadTimeout()
	}
	return n, err
}
