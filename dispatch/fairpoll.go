package dispatch

import (
	"time"

	"github.com/applistener/applistener/routes"
)

// While fair admission is contended (a neighbour's flood fills the slots),
// an HTTP/1.1 keep-alive connection of a light instance (fewer than
// fairLightStreams requests in flight) parks with the idle poller as soon
// as its response is written, instead of after parkAfter, and every
// request that gives back a slot looks for parked connections whose next
// request has arrived (idlePoller.pollNow, at most every 20 µs): their
// goroutines start right behind it, and a flood's request steps aside for
// them (pollParked). Go's own poller looks for network events only when
// its run queue is empty, which behind a flood on one core can take
// milliseconds; the flood's own progress now delivers its neighbours'
// requests. A flooding instance's connections wait as before.

// longAgo is a read deadline already past: a read with it returns only
// what TLS has buffered, without a system call.
var longAgo = time.Unix(1, 0)

// parksAtOnce reports whether the connection should park with the idle
// poller as soon as it is idle: fair admission is contended and its
// instance is light.
func (c *clientConn) parksAtOnce() bool {
	return c.s.cfg.Fair.Contended() && c.route != nil && c.route.Instance.Active() < fairLightStreams
}

// parkAtOnce parks c until deadline unless a request is at hand: TLS may
// hold bytes of it already, which the socket's readiness would not tell
// of. parked: c is the poller's (the caller must not touch it); n > 0: a
// byte of the next request is in c.one; ended: the connection failed.
// None of them: wait in place as usual.
func (c *clientConn) parkAtOnce(deadline time.Time) (n int, parked, ended bool) {
	_ = c.conn.SetReadDeadline(longAgo)
	n, err := c.conn.Read(c.one[:])
	if n > 0 {
		return n, false, false
	}
	if !isDeadline(err) {
		return 0, false, true
	}
	return 0, c.park(deadline), false
}

// pollParked delivers parked connections' requests that have arrived,
// while fair admission is contended (see above). The caller's request is
// inst's. When inst is busy (a flood: more than fairLightStreams requests
// in flight), its goroutine steps aside for the requests delivered, which
// then run at once instead of behind the flood's queued goroutines; a
// light instance's request (a neighbour's, giving its slot back while it
// waits for its app) goes on, as yielding would put it behind them.
func (s *Server) pollParked(inst *routes.Instance) {
	if s.cfg.Fair.Contended() {
		s.idleH1.pollNow(stepsAside(inst))
	}
}

// stepsAside reports whether a request of inst steps aside for the
// requests pollParked delivers: inst is busy.
func stepsAside(inst *routes.Instance) bool {
	return inst.Active() > fairLightStreams
}
