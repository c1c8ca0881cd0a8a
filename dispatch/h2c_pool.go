package dispatch

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/applistener/applistener/dispatch/internal/h2client"
	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/routes"
)

// h2cPool holds the HTTP/2 (prior knowledge, plain text) connections to
// the app of one route whose service declares "protocol": "h2c". Each is an
// h2client.Conn over a connection dialled through the route's connector
// (the same dial path as the HTTP/1.1 pool, network namespaces included).
// Requests share the first connection with a free stream; a further one
// is dialled (one dial at a time) only when every connection is at the
// app's SETTINGS_MAX_CONCURRENT_STREAMS, up to maxH2CConns, beyond which a
// request waits for a stream of the least loaded one. A connection idle
// for Config.BackendIdleTimeout closes itself. The pool is attached to the
// route's lease: revoking the route closes every connection, which ends
// every stream on them.
type h2cPool struct {
	s    *Server
	bp   *backendPool    // the route's connector, port and Host
	cfg  h2client.Config // the connections' settings
	addr string

	// writes counts the write calls made on the app connections (for
	// benchmarks: writes per call).
	writes atomic.Uint64

	mu      sync.Mutex
	clients []*h2cClient
	dialing *h2cDial // the dial under way, or nil
	conns   map[*h2cConn]struct{}
	closed  bool
}

// maxH2CConns bounds the app connections of one h2c route.
const maxH2CConns = 4

// h2cClient is one HTTP/2 connection of the pool.
type h2cClient struct {
	cc *h2client.Conn
}

// h2cDial is a dial that requests wait for.
type h2cDial struct {
	done chan struct{}
	err  error
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
	p := &h2cPool{s: s, bp: bp, conns: make(map[*h2cConn]struct{}), addr: bp.hostHeader}
	p.cfg = h2client.Config{
		// What the app may send ahead of what the clients take.
		StreamWindow:           h2cStreamWindow,
		ConnWindow:             h2cConnWindow,
		MaxResponseHeaderBytes: h2cMaxResponseHeaderBytes,
		// A dead app connection (a frozen sandbox) is found by PING.
		ReadIdleTimeout: H2ReadIdleTimeout,
		PingTimeout:     H2PingTimeout,
		// An app that reads nothing for this long loses the connection.
		WriteTimeout: s.cfg.BodyTimeout,
		// A connection without streams for this long closes itself.
		IdleTimeout: s.cfg.BackendIdleTimeout,
		// A panic in the frame loop closes that app connection only.
		OnPanic: p.panicked, // h2c_guard.go
	}
	if !lease.Attach(p) {
		p.closed = true
	}
	return p
}

// roundTrip sends req on a connection of the pool.
func (p *h2cPool) roundTrip(ctx context.Context, req *h2client.Request) (*h2client.Response, error) {
	cc, err := p.get(ctx)
	if err != nil {
		return nil, err // the body is untouched: the caller may try again
	}
	return cc.RoundTrip(ctx, req)
}

// get returns a connection with a stream reserved for the caller: the
// first with a free one, else a new one (one dial at a time), else, when
// maxH2CConns are all busy, the least loaded one once it has a stream
// free. The connections' state hook takes p.mu: Conn methods are never
// called under p.mu.
func (p *h2cPool) get(ctx context.Context) (*h2client.Conn, error) {
	for {
		var clients [maxH2CConns]*h2cClient
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, &dialError{errH2CPoolClosed}
		}
		n := copy(clients[:], p.clients)
		d := p.dialing
		p.mu.Unlock()
		var least *h2client.Conn
		leastN, usable := 0, 0
		for _, c := range clients[:n] {
			if c.cc.Reserve() {
				return c.cc, nil
			}
			if c.cc.Err() != nil {
				continue
			}
			usable++
			if inFlight := c.cc.InFlight(); least == nil || inFlight < leastN {
				least, leastN = c.cc, inFlight
			}
		}
		if usable >= maxH2CConns {
			if err := least.WaitReserve(ctx); err != nil {
				if ctx.Err() != nil {
					return nil, err
				}
				continue // that connection went away: choose again
			}
			return least, nil
		}
		if d == nil {
			p.mu.Lock()
			d = p.dialing
			mine := d == nil
			if mine {
				d = &h2cDial{done: make(chan struct{})}
				p.dialing = d
			}
			p.mu.Unlock()
			if mine {
				p.runDial(d)
			}
		}
		select {
		case <-d.done:
			if d.err != nil {
				return nil, d.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// runDial opens a connection and adds it to the pool.
func (p *h2cPool) runDial(d *h2cDial) {
	// The dial is bounded by DialTimeout (p.dial), not by the request
	// that started it: others may be waiting for it. So is the wait for
	// the app's SETTINGS.
	ctx, cancel := context.WithTimeout(context.Background(), p.s.cfg.DialTimeout)
	cc, err := p.newConn(ctx)
	cancel()
	if err == nil {
		p.mu.Lock()
		if p.closed {
			err = &dialError{errH2CPoolClosed}
		} else {
			p.clients = append(p.clients, &h2cClient{cc: cc})
		}
		p.mu.Unlock()
		if err != nil {
			_ = cc.Close()
		} else if cc.Err() != nil {
			// The app ended it (GOAWAY, hang-up) before it was added:
			// its state hook may have run already, and found nothing to
			// remove.
			p.remove(cc)
		}
	}
	p.mu.Lock()
	p.dialing = nil
	p.mu.Unlock()
	d.err = err
	close(d.done)
}

// newConn dials the app and starts HTTP/2 on the connection.
func (p *h2cPool) newConn(ctx context.Context) (*h2client.Conn, error) {
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	cfg := p.cfg
	cfg.StateHook = func(cc *h2client.Conn) { p.remove(cc) }
	return h2client.NewConn(ctx, conn, cfg)
}

// remove forgets a connection that takes no new streams.
func (p *h2cPool) remove(cc *h2client.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.clients {
		if x.cc == cc {
			p.clients = append(p.clients[:i], p.clients[i+1:]...)
			return
		}
	}
}

// The receive windows toward h2c apps, the same as the client side's
// (h2engine.Config.InitialWindowSize and ConnWindowSize, which dispatch
// leaves at their defaults). They bound what the listener buffers of an
// app's responses: the client keeps a stream's DATA until the stream's
// copy (proxyH2C) takes it, which it does only as fast as the client
// accepts it, and gives the app window back only for what was taken. An
// app writing to a client who reads nothing is therefore stopped by flow
// control after h2cStreamWindow bytes on that stream, and after
// h2cConnWindow (plus the protocol's initial 64 KiB) on its connection
// in all.
//
// The price is head-of-line blocking between the streams of one app
// connection: streams whose clients read nothing hold their windows' worth
// until they read or the engine resets them (Config.BodyTimeout without
// window), and four such streams stop the connection's other streams
// for that long. Only the route's own clients share its app connections.
const (
	h2cStreamWindow = h2engine.DefaultInitialWindowSize
	h2cConnWindow   = h2engine.DefaultConnWindowSize
)

// h2cMaxResponseHeaderBytes bounds an app's response head (and trailers).
const h2cMaxResponseHeaderBytes = 64 << 10

// dial opens a connection to the app through the route's connector,
// bounded by Config.DialTimeout. A failure comes back as a *dialError.
func (p *h2cPool) dial(ctx context.Context) (net.Conn, error) {
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
	clients := p.clients
	p.clients = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	for _, c := range clients {
		_ = c.cc.Close()
	}
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
