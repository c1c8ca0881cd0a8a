package dispatch

import (
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/internal/panicguard"
)

// An HTTP/1.1 keep-alive connection between requests first waits in place
// for parkAfter (a busy client's next request arrives well within it, at
// no extra cost). After that it parks: its socket is registered with the
// server's idle poller (idlepoll.go), its goroutine ends (ServeConn
// returns), and a timer stands for the idle timeout. It then holds no
// goroutine stack and no buffer, only its connection state: the handshake
// grows a connection goroutine's stack to 16 KiB, which used to stay with
// every idle connection.
//
// Exactly one party ends a parked connection, decided by the poller's
// registration: the poller (bytes or a hang-up arrived: resume serves the
// next request in a new goroutine), or whoever cancels the registration
// first, the idle timer, Revoke or closeIfIdle (drain), which then close
// and release it. The registration is made under c.mu, and only while
// neither Revoke nor closeIfIdle has claimed the connection (both mark it
// under c.mu before closing the socket), so a closed socket's descriptor
// number, possibly reused, is never registered.

// waitIdle waits up to idle for the first byte of the next request, into
// c.one; 0 means the connection should end. parked means it was handed to
// the idle poller instead: the caller must return without touching c.
func (c *clientConn) waitIdle(idle time.Duration) (n int, parked bool) {
	now := time.Now()
	deadline := now.Add(idle)
	if c.parksAtOnce() { // fairpoll.go
		n, parked, ended := c.parkAtOnce(deadline)
		if n > 0 || parked || ended {
			return n, parked
		}
	}
	first := deadline
	after := parkAfter
	if c.s.idleParkAfter > 0 {
		after = c.s.idleParkAfter
	}
	canPark := idle > after
	if canPark {
		first = now.Add(after)
	}
	_ = c.conn.SetReadDeadline(first)
	n, err := c.conn.Read(c.one[:])
	if n > 0 || !canPark || !isDeadline(err) {
		return n, false
	}
	// A read deadline does not break a TLS connection: bytes of a record
	// read so far stay buffered, and the next read completes it.
	if c.park(deadline) {
		return 0, true
	}
	_ = c.conn.SetReadDeadline(deadline)
	n, _ = c.conn.Read(c.one[:])
	return n, false
}

// park registers c with the idle poller until deadline; false: it could
// not (no descriptor or poller, or the connection is being closed) and
// the caller waits in place.
func (c *clientConn) park(deadline time.Time) bool {
	fd, ok := sock.FD(c.raw)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.revoked != nil || c.closing {
		return false
	}
	id, err := c.s.idleH1.wait(fd, c.resume)
	if err != nil {
		return false
	}
	c.parkID, c.parkDeadline = id, deadline
	if c.parkTimer == nil {
		c.parkTimer = time.AfterFunc(time.Until(deadline), c.parkExpired)
	} else {
		c.parkTimer.Reset(time.Until(deadline))
	}
	return true
}

// resume runs, in a new goroutine, once a parked connection's socket is
// readable (or hung up): it reads the first byte of the next request and
// serves on.
func (c *clientConn) resume() {
	defer func() { // serve recovers its own; this covers the first read
		if r := recover(); r != nil {
			c.abort()
			c.end()
			panicguard.Report(c.s.log, panicguard.HTTP1Conn, r, c.identity()...)
		}
	}()
	c.mu.Lock()
	c.parkID = 0
	deadline := c.parkDeadline
	c.mu.Unlock()
	c.stopParkTimer()
	_ = c.conn.SetReadDeadline(deadline)
	n, _ := c.conn.Read(c.one[:])
	c.setIdle(false)
	if n == 0 {
		c.end()
		return
	}
	c.in.acquire()
	c.in.buf[0] = c.one[0]
	c.in.r, c.in.w = 0, 1
	c.serve()
}

// parkExpired is the idle timeout of a parked connection.
func (c *clientConn) parkExpired() {
	c.mu.Lock()
	id := c.unparkLocked()
	c.mu.Unlock()
	if id != 0 && c.s.idleH1.cancel(id) {
		c.end()
	}
}

// unparkLocked takes c's poller registration (0: not parked), under c.mu.
func (c *clientConn) unparkLocked() uint64 {
	id := c.parkID
	c.parkID = 0
	return id
}

// ownParked cancels registration id (from unparkLocked); if it was still
// waiting, the caller owns the connection and it is ended (in a goroutine:
// Revoke and closeIfIdle run under locks that ending takes) and true is
// returned. False: it was not parked, or resume is starting and ends it.
func (c *clientConn) ownParked(id uint64) bool {
	if id == 0 || !c.s.idleH1.cancel(id) {
		return false
	}
	go c.end()
	return true
}

// stopParkTimer stops the idle timer of a parked connection, if any.
func (c *clientConn) stopParkTimer() {
	c.mu.Lock()
	t := c.parkTimer
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}
