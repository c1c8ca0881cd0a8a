package dispatch

import (
	"time"

	"github.com/applistener/applistener/routes"
)

// While fair admission is busy (a neighbour's flood fills the slots, or
// queued lately: fairshare.Scheduler.Busy), an HTTP/1.1 keep-alive
// connection of a light instance (fewer than fairLightStreams requests in
// flight, none queued lately) parks with the idle poller as soon as its
// response is written, instead of after parkAfter, and every request of a
// flood that gives back a slot, or is about to queue for one, looks for a
// parked connection whose next request has arrived (idlePoller.pollNow,
// at most every 20 µs, one at a time) and steps aside for it (pollParked,
// pollBeforeQueueing). Go's own poller looks for network events only when
// its run queue is empty, which behind a flood on one core can take
// milliseconds; the flood's own progress now delivers its neighbours'
// requests. A flooding instance's connections wait as before.

// longAgo is a read deadline already past: a read with it returns only
// what TLS has buffered, without a system call.
var longAgo = time.Unix(1, 0)

// parksAtOnce reports whether the connection should park with the idle
// poller as soon as it is idle: fair admission is busy and its instance
// is light: fewer than fairLightStreams requests in flight, and none of
// its admissions queued lately. A flood's connection whose instance has
// few requests in flight for a moment (its clients are slow to send the
// next) would otherwise park too, and then be delivered at the front of
// the run queue like a neighbour's, ahead of the neighbours' own.
func (c *clientConn) parksAtOnce() bool {
	fair := c.s.cfg.Fair
	if !fair.Busy() || c.route == nil {
		return false
	}
	inst := c.route.Instance
	return inst.Active() < fairLightStreams && !fair.RecentlyQueued(&inst.Fair)
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

// pollParked delivers a parked connection's request that has arrived,
// while fair admission is busy (see above), when the caller's request (of
// inst) is a flood's: inst has more than fairLightStreams requests in
// flight. Its goroutine then steps aside, and the request delivered runs
// at once instead of behind the flood's queued goroutines. A light
// instance's request delivers nothing: it would not step aside (for a
// neighbour's request giving its slot back while it waits for its app,
// that would put it behind the flood), and whatever it wakes before it
// blocks (its access-log writer, a flood's waiter it hands its slot to)
// would push the request delivered behind the whole run queue. Measured
// on one core, nine quiet instances beside a 100-connection flood with
// 17 slots: a delivered request's start p99 0.55 ms (max 6.4 ms) when
// every release delivered.
func (s *Server) pollParked(inst *routes.Instance) {
	if stepsAside(inst) && s.cfg.Fair.Busy() {
		s.idleH1.pollNow(true)
	}
}

// stepsAside reports whether a request of inst steps aside for the
// requests pollParked delivers: inst is busy.
func stepsAside(inst *routes.Instance) bool {
	return inst.Active() > fairLightStreams
}
