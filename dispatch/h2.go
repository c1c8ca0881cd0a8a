package dispatch

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
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

// h2HeaderListSlack is added to Config.MaxHeaderBytes for
// SETTINGS_MAX_HEADER_LIST_SIZE, which counts 32 bytes per field (room for
// ten fields' overhead, as net/http allows).
const h2HeaderListSlack = 10 * 32

// h2Config returns the engine settings of a connection whose instance has
// idle timeout idle (0: the server's).
func (s *Server) h2Config(hc *h2Conn, idle time.Duration) h2engine.Config {
	if idle <= 0 {
		idle = s.cfg.IdleTimeout
	}
	return h2engine.Config{
		MaxConcurrentStreams:  H2MaxConcurrentStreams,
		MaxHeaderListSize:     uint32(max(s.cfg.MaxHeaderBytes, 0)) + h2HeaderListSlack,
		EnableConnectProtocol: !s.cfg.DisableHTTP2WebSockets,
		IdleTimeout:           idle,
		PingInterval:          H2ReadIdleTimeout,
		PingTimeout:           H2PingTimeout,
		// A peer that reads nothing (or gives no window) for this long
		// loses the connection (the stream); a request body that stops
		// arriving for this long fails the request (408).
		WriteTimeout:  s.cfg.BodyTimeout,
		ReadTimeout:   s.cfg.BodyTimeout,
		HeaderTimeout: s.cfg.HeaderTimeout,
		OnError:       hc.engineError,
		OnPanic:       hc.panicked,
		Identity:      hc.sni,
	}
}

// h2GoAway asks every HTTP/2 connection to finish gracefully: GOAWAY, then
// in-flight streams may complete. It is idempotent per connection and is
// called repeatedly while draining.
func (s *Server) h2GoAway() {
	s.mu.Lock()
	hcs := make([]*h2Conn, 0, len(s.h2conns))
	for hc := range s.h2conns {
		hcs = append(hcs, hc)
	}
	s.mu.Unlock()
	for _, hc := range hcs {
		hc.shutdown()
	}
}

// ServeH2 serves HTTP/2 on lc.Conn, a TLS connection that negotiated ALPN
// "h2" and whose SNI named lc.Route, with the HTTP/2 engine
// (internal/h2engine). Revocation closes lc.Raw, the TCP connection under
// it (never the TLS connection, whose Close can block on a stalled peer),
// which ends every stream of the connection. Each request is checked
// (route still usable, :authority names the SNI, method, instance limit)
// and forwarded to the app over HTTP/1.1; a request for another host (a
// browser coalescing connections under the wildcard certificate) gets 421
// on its stream only. ServeH2 returns, after calling lc.Done, when the
// connection is closed and every stream handler has returned.
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
	// Deadlines left by the handshake would end the connection; the
	// engine keeps its own (head, idle, ping, write).
	_ = conn.SetDeadline(time.Time{})
	nc := &h2NetConn{Conn: tc, raw: raw}
	hc.nc = nc
	// The instance's idle timeout, as it is when the connection starts.
	ec := h2engine.NewConn(nc, s.h2Config(hc, route.Instance.IdleTimeout()), hc)
	hc.ec = ec
	release, ok := admit(s, &s.h2conns, hc, raw, route)
	if !ok {
		return
	}
	defer release()
	if s.draining.Load() {
		ec.Shutdown() // GOAWAY right after the server preface
	}
	_ = ec.Serve()
	_ = raw.Close()
}

// h2NetConn is the connection handed to the engine: closing it closes the
// raw TCP connection. HTTP/2 ends connections with GOAWAY, so no
// close_notify is needed, and a stalled peer cannot block the close.
type h2NetConn struct {
	*tls.Conn
	raw net.Conn
	// nextWrite is closed by the next write (afterNextWrite).
	nextWrite atomic.Pointer[chan struct{}]
}

func (c *h2NetConn) Close() error { return c.raw.Close() }

// Write writes the engine's frames and wakes afterNextWrite's waiters.
func (c *h2NetConn) Write(p []byte) (int, error) {
	waiting := c.nextWrite.Swap(nil)
	n, err := c.Conn.Write(p)
	if waiting != nil {
		close(*waiting)
	}
	return n, err
}

// afterNextWrite returns a channel closed when a write to the connection
// that starts after this call has returned.
func (c *h2NetConn) afterNextWrite() <-chan struct{} {
	for {
		if ch := c.nextWrite.Load(); ch != nil {
			return *ch
		}
		ch := make(chan struct{})
		if c.nextWrite.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// engineError records what the engine answered itself: a request head
// that took too long (408), a header list too large (431), and protocol
// errors and defences (debug log).
func (hc *h2Conn) engineError(ev h2engine.ErrorEvent) {
	s := hc.s
	switch {
	case ev.StreamID == 0 && ev.Reason == reasonEngineHeadTimeout:
		hc.logEngineDenial(denyReqTimeout)
	case ev.Status == 431:
		hc.logEngineDenial(denial{status: 431, reason: ev.Reason})
	default:
		if s.log.Enabled(context.Background(), slog.LevelDebug) {
			s.log.LogAttrs(context.Background(), slog.LevelDebug, "http2 error",
				slog.Uint64("stream", uint64(ev.StreamID)),
				slog.String("code", ev.Code.String()),
				slog.String("reason", ev.Reason),
				slog.String("sni", hc.sni),
				slog.String("src", hc.peer.String()))
		}
	}
}

// reasonEngineHeadTimeout is the engine's reason for a connection closed
// because a request head did not arrive within the head timeout.
const reasonEngineHeadTimeout = "request header timeout"

// logEngineDenial counts and logs a request the engine refused.
func (hc *h2Conn) logEngineDenial(d denial) {
	s := hc.s
	status, reason := d.status, d.reason
	s.m.denied(status)
	s.ocsfConnDenied(&hc.ci, d, protoH2)
	if s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "request denied",
			slog.Int("class_uid", 4002),
			slog.String("rule", "app-listener"),
			slog.Int("status", status),
			slog.String("reason", reason),
			slog.String("sni", hc.sni),
			slog.String("src", hc.peer.String()),
			slog.String("protocol", "HTTP/2.0"))
	}
}
