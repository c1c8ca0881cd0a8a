package dispatch

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/applistener/applistener/routes"
)

// h2cPool holds the HTTP/2 (prior knowledge, plain text) connections to
// the app of one route whose service declares "protocol": "h2c". It is
// net/http's Transport restricted to unencrypted HTTP/2, dialling through
// the route's connector (the same dial path as the HTTP/1.1 pool, network
// namespaces included): requests share one multiplexed connection, and a
// further one is opened only when the app's SETTINGS_MAX_CONCURRENT_STREAMS
// is reached. It is attached to the route's lease: revoking the route
// closes every connection, which ends every stream on them.
type h2cPool struct {
	s  *Server
	bp *backendPool // the route's connector, port and Host
	t  *http.Transport

	mu     sync.Mutex
	conns  map[*h2cConn]struct{}
	closed bool
}

// h2cSlot is the h2c pool of a route, created on first use (a field of the
// route's backendPool).
type h2cSlot struct {
	once sync.Once
	p    *h2cPool
}

// errH2CPoolClosed: the route was revoked; no connection is dialled for it.
var errH2CPoolClosed = errors.New("route revoked: h2c pool closed")

// h2cPoolOf returns the route's h2c pool, created on first use and closed
// with the route.
func (s *Server) h2cPoolOf(route *routes.Route, bp *backendPool) *h2cPool {
	bp.h2c.once.Do(func() { bp.h2c.p = newH2CPool(s, bp, route.Lease) })
	return bp.h2c.p
}

func newH2CPool(s *Server, bp *backendPool, lease *routes.Lease) *h2cPool {
	p := &h2cPool{s: s, bp: bp, conns: make(map[*h2cConn]struct{})}
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	p.t = &http.Transport{
		Protocols:   protos,
		DialContext: p.dial,
		// Bodies and their encodings pass through untouched.
		DisableCompression: true,
		// Idle connections are retired as HTTP/1.1 ones are.
		IdleConnTimeout:        s.cfg.BackendIdleTimeout,
		MaxResponseHeaderBytes: h2cMaxResponseHeaderBytes,
		HTTP2: &http.HTTP2Config{
			// A dead app connection (a frozen sandbox) is found by PING.
			SendPingTimeout: H2ReadIdleTimeout,
			PingTimeout:     H2PingTimeout,
			// An app that reads nothing for this long loses the connection.
			WriteByteTimeout: s.cfg.BodyTimeout,
		},
	}
	if !lease.Attach(p) {
		p.closed = true
	}
	return p
}

// h2cMaxResponseHeaderBytes bounds an app's response head (and trailers).
const h2cMaxResponseHeaderBytes = 64 << 10

// dial opens a connection to the app through the route's connector,
// bounded by Config.DialTimeout. A failure comes back as a *dialError.
func (p *h2cPool) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	if p.isClosed() {
		return nil, &dialError{errH2CPoolClosed}
	}
	dctx, cancel := context.WithTimeout(ctx, p.s.cfg.DialTimeout)
	conn, err := p.bp.connector.Dial(dctx, p.bp.port)
	cancel()
	p.s.m.dials.WithLabelValues(dialResult(err)).Inc()
	if err != nil {
		return nil, &dialError{err}
	}
	c := &h2cConn{Conn: conn, p: p}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = conn.Close()
		return nil, &dialError{errH2CPoolClosed}
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	return c, nil
}

func (p *h2cPool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Revoke closes every connection of the pool (their streams end: the
// client side sees its request fail) and refuses new ones.
func (p *h2cPool) Revoke(error) {
	p.mu.Lock()
	p.closed = true
	conns := make([]*h2cConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	p.t.CloseIdleConnections()
}

// open returns the number of open app connections.
func (p *h2cPool) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// h2cConn is one app connection of an h2cPool.
type h2cConn struct {
	net.Conn
	p    *h2cPool
	once sync.Once
}

func (c *h2cConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
	return err
}
