package dispatch

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/routes"
)

// backendConn is one connection to an app, reusable for keep-alive.
type backendConn struct {
	conn      net.Conn
	in        inbuf
	idleSince time.Time
	reused    bool
	probe     sock.IdleProbe
	wait      sock.ReplyWait // writing a request and waiting for its answer
	src       appSource      // what in reads from: conn, acknowledging early (appack.go)
	// hangups, set when dialled, watches for the app's close of this
	// connection (apphangup.go); nil: it is probed before reuse instead.
	hangups *appHangups
	// watchID is its registration in hangups (0: none any more), under
	// hangups.mu.
	watchID uint64
	// appClosed: hangups saw the app close (or reset) the connection.
	appClosed atomic.Bool
}

func (b *backendConn) close() {
	b.hangups.unwatch(b)
	_ = b.conn.Close()
	b.in.r = b.in.w // drop unread bytes so the buffer can go back
	b.in.release()
}

// backendPool keeps the idle keep-alive connections to one route's target.
// It is attached to the route's lease: revoking the route closes them all.
//
// It holds as many as the route's concurrency needs. A connection is
// dialled only when none is idle, so the pool never holds more than the
// most requests the route had in flight at once; it hands out the most
// recently used one first (LIFO), so that the connections a quieter route
// no longer needs sink to the bottom, stay unused and are retired once idle
// for idleTimeout — before the app's own keep-alive timeout can race a
// reuse (an app that closes sooner is caught by get's checks). The
// instance's max_streams (requests in flight cannot exceed it) and, when
// set, maxIdle bound the idle connections; beyond the bound the oldest is
// closed.
type backendPool struct {
	connector connector.Connector
	port      int
	// maxIdle bounds the idle connections when positive; instance, when
	// set, bounds them by its max_streams as well (see limit).
	maxIdle     int
	instance    *routes.Instance
	idleTimeout time.Duration
	bufPool     *sync.Pool

	// hostHeader is the Host sent to the app (unless the public one is
	// preserved): host:port of its loopback address.
	hostHeader string
	// access is the route's access state when it is private (access.go);
	// nil for a public route.
	access *accessRoute
	// cookieWarned: a widened cookie Domain was logged for this route.
	cookieWarned atomic.Bool
	// onStale, when set, counts an idle connection found closed by the
	// app (or carrying unsolicited bytes) when it was about to be reused.
	onStale func()
	// h2c is the route's HTTP/2 pool when its service declares h2c (h2c_pool.go).
	h2c h2cSlot
	// hangups, when set, notes the app's closes of the connections it
	// dials (the Server's, shared by all routes; apphangup.go).
	hangups *appHangups

	mu sync.Mutex
	// idle is oldest first: put appends, pop takes the last (LIFO).
	idle   []*backendConn
	closed bool
	timer  *time.Timer
}

func newBackendPool(c connector.Connector, port, maxIdle int, inst *routes.Instance, idleTimeout time.Duration, bufPool *sync.Pool, lease *routes.Lease) *backendPool {
	p := &backendPool{connector: c, port: port, maxIdle: maxIdle, instance: inst, idleTimeout: idleTimeout, bufPool: bufPool}
	if !lease.Attach(p) {
		p.closed = true
	}
	return p
}

// limit is the most idle connections the pool keeps now; 0: no bound but
// the route's concurrency and the idle timeout.
func (p *backendPool) limit() int {
	n := p.maxIdle
	if p.instance != nil {
		if m := int(min(p.instance.MaxStreams(), int64(routes.MaxStreamsLimit))); m > 0 && (n <= 0 || m < n) {
			n = m
		}
	}
	return max(n, 0)
}

// get returns an idle connection that the app has not closed, or nil.
// Connections the app closed while they were idle are discarded here,
// before any request byte is written on them (see usable), so that the
// request goes to a new connection exactly once.
func (p *backendPool) get() *backendConn {
	for {
		now := time.Now()
		bc := p.pop(now)
		if bc == nil {
			return nil
		}
		if bc.usable(now) {
			bc.reused = true
			bc.src.reads = 0
			return bc
		}
		if p.onStale != nil {
			p.onStale()
		}
		bc.close()
	}
}

// usable reports whether the idle connection bc may carry a request now,
// as far as the listener can tell without reading: the app has not closed
// it (nor, for one idle a while, sent bytes nobody asked for). How it
// tells depends on how long bc has been idle:
//   - seen closed by the hang-up watch (apphangup.go): never usable;
//   - under probeIdleAfter: usable (apps close idle connections after
//     seconds, or announce the close in the response, never pooled);
//   - under probeAllAfter and watched: the watch's word, as of a poll at
//     most hangupPollEvery old; a busy route's reuses share that poll, so
//     its requests make no system call of their own here;
//   - otherwise (or unwatched): its own probe (sock.IdleProbe, a system
//     call), exact, which also finds unsolicited bytes.
//
// An app that closes a connection in the moment before its reuse (the
// first two cases' margins) costs that request a 502; it is not replayed
// (retry.go).
func (bc *backendConn) usable(now time.Time) bool {
	if bc.appClosed.Load() {
		return false
	}
	idle := now.Sub(bc.idleSince)
	switch {
	case idle < probeIdleAfter:
		return true
	case idle < probeAllAfter && bc.hangups != nil:
		return !bc.hangups.hungUp(bc, now)
	}
	return bc.probe.Usable()
}

// probeIdleAfter is how long a connection must have been idle before its
// reuse is checked at all (a connection handed back under a millisecond
// ago is reused as is).
const probeIdleAfter = time.Millisecond

// probeAllAfter is how long a connection must have been idle before its
// reuse is preceded by its own probe (about 1 µs, a system call) even when
// the hang-up watch has it: apps close idle connections on a timer of
// seconds, and the probe makes the reuse of a connection the app may just
// have timed out exact. Below it, the watch answers.
const probeAllAfter = 100 * time.Millisecond

// pop takes the most recently used idle connection that has not outlived
// the idle timeout; the expired ones it passes are closed (outside the lock).
func (p *backendPool) pop(now time.Time) *backendConn {
	var expired []*backendConn
	p.mu.Lock()
	var bc *backendConn
	for n := len(p.idle); n > 0; n-- {
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if now.Sub(c.idleSince) < p.idleTimeout {
			bc = c
			break
		}
		expired = append(expired, c)
	}
	p.mu.Unlock()
	for _, c := range expired {
		c.close()
	}
	return bc
}

// dial opens a new connection.
func (p *backendPool) dial(ctx context.Context) (*backendConn, error) {
	conn, err := p.connector.Dial(ctx, p.port)
	if err != nil {
		return nil, err
	}
	bc := &backendConn{conn: conn}
	bc.src.init(conn)
	bc.in = inbuf{src: &bc.src, pool: p.bufPool}
	bc.probe.Init(conn)
	bc.wait.Init(conn)
	p.hangups.watch(bc)
	return bc, nil
}

// put returns a connection for reuse, or closes it when the pool is
// closed. When the pool is at its bound, its oldest connections are closed
// to make room: the one just used is the one most likely to be used next.
func (p *backendPool) put(bc *backendConn) {
	if bc.in.buffered() > 0 {
		// The app sent bytes beyond the response: it cannot be trusted.
		bc.close()
		return
	}
	bc.in.release()
	bc.idleSince = time.Now()
	limit := p.limit()
	var evicted []*backendConn
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		bc.close()
		return
	}
	if limit > 0 && len(p.idle) >= limit {
		// Rare: only a lowered max_streams (or maxIdle) gets here, since
		// the pool never holds more than the route had in flight.
		k := len(p.idle) - limit + 1
		evicted = append(evicted, p.idle[:k]...)
		n := copy(p.idle, p.idle[k:])
		clear(p.idle[n:])
		p.idle = p.idle[:n]
	}
	p.idle = append(p.idle, bc)
	if p.timer == nil {
		p.timer = time.AfterFunc(p.idleTimeout, p.reap)
	}
	p.mu.Unlock()
	for _, c := range evicted {
		c.close()
	}
}

// reap closes connections idle longer than idleTimeout (outside the lock).
// It runs when the oldest idle connection expires, but at most reapSlack
// times per idle timeout: a connection may be closed up to
// idleTimeout/reapSlack late (pop never hands out an expired one).
func (p *backendPool) reap() {
	now := time.Now()
	var expired []*backendConn
	p.mu.Lock()
	p.timer = nil
	if p.closed {
		p.mu.Unlock()
		return
	}
	keep := p.idle[:0]
	var next time.Duration
	for _, bc := range p.idle {
		age := now.Sub(bc.idleSince)
		if age >= p.idleTimeout {
			expired = append(expired, bc)
			continue
		}
		if left := p.idleTimeout - age; next == 0 || left < next {
			next = left
		}
		keep = append(keep, bc)
	}
	clear(p.idle[len(keep):])
	p.idle = keep
	if len(p.idle) > 0 {
		p.timer = time.AfterFunc(max(next, p.idleTimeout/reapSlack), p.reap)
	}
	p.mu.Unlock()
	for _, bc := range expired {
		bc.close()
	}
}

// reapSlack: the reaper runs at most reapSlack times per idle timeout.
const reapSlack = 8

// Revoke closes every idle connection and refuses further reuse.
func (p *backendPool) Revoke(error) {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
	for _, bc := range idle {
		bc.close()
	}
}

// idleCount returns the number of idle connections.
func (p *backendPool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

type failingConnector struct{ err error }

func (f failingConnector) Dial(context.Context, int) (net.Conn, error) { return nil, f.err }

func (f failingConnector) String() string { return "unavailable" }

// routePool returns the route's backend pool, shared by its HTTP/1.1 and
// HTTP/2 clients; it is created on first use and closed with the route.
func (s *Server) routePool(route *routes.Route) *backendPool {
	return route.Data(func() any {
		conn, err := s.cfg.NewConnector(route.Connector)
		if err != nil {
			s.log.Error("connector unavailable", "host", route.Host, "err", err)
			conn = failingConnector{err}
		}
		p := newBackendPool(conn, route.Port, s.cfg.MaxIdlePerRoute, route.Instance, s.cfg.BackendIdleTimeout, &s.bufPool, route.Lease)
		p.onStale = s.m.staleConns.Inc
		p.hangups = &s.appHangups
		// The Host the app sees unless PreserveHost: its own loopback
		// address, what dev servers accept.
		host := routes.DefaultConnectorHost
		if route.Connector.Type == "tcp" && route.Connector.Host != "" {
			host = route.Connector.Host
		}
		p.hostHeader = net.JoinHostPort(host, strconv.Itoa(route.Port))
		p.access = newAccessRoute(route)
		return p
	}).(*backendPool)
}
