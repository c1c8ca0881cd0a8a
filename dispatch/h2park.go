package dispatch

import (
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

// While fair admission is contended, the reader of an HTTP/2 connection
// whose instance is light waits for its client's next frames with the idle
// poller instead of Go's (as a light instance's HTTP/1.1 keep-alive
// connection parks, fairpoll.go): Go looks for network events only when
// its run queue is empty, which behind a neighbour's flood on one core can
// take milliseconds, while every request of the flood that gives back a
// slot looks at the idle poller (pollParked). The reader's goroutine stays;
// only its wait moves. A read the engine bounds (a request head in
// progress: headClock's deadline) waits as usual.

// readParked is h2NetConn.Read's wait with the idle poller. It first reads
// what is at hand without waiting (TLS may hold bytes already, which the
// socket's readiness would not tell of); done: that read's outcome is the
// Read's (n bytes, or a failure). Otherwise it has waited for the socket
// to be readable (or the connection to be closed), or could not park, and
// the caller reads as usual.
func (c *h2NetConn) readParked(p []byte) (n int, err error, done bool) {
	_ = c.Conn.SetReadDeadline(longAgo)
	n, err = c.Conn.Read(p)
	_ = c.Conn.SetReadDeadline(time.Time{})
	if n > 0 || (err != nil && !isDeadline(err)) {
		return n, err, true
	}
	fd, ok := sock.FD(c.raw)
	if !ok {
		return 0, nil, false
	}
	woke := make(chan struct{})
	c.parkMu.Lock()
	if c.closed {
		c.parkMu.Unlock()
		return 0, nil, false // the read that follows fails
	}
	id, werr := c.poller.waitInline(fd, func() { close(woke) })
	if werr != nil {
		c.parkMu.Unlock()
		return 0, nil, false
	}
	c.parkID, c.parkWoke = id, woke
	c.parkMu.Unlock()
	c.parks.Add(1)
	<-woke
	c.parkMu.Lock()
	c.parkID, c.parkWoke = 0, nil
	c.parkMu.Unlock()
	return 0, nil, false
}

// unpark takes the reader's registration with the idle poller, before the
// socket is closed (a descriptor number reused after the close must never
// be removed from the poller): if it was still waiting, the reader is woken
// here (its read then fails); if not, the poller's wake has run or is
// starting.
func (c *h2NetConn) unpark() {
	c.parkMu.Lock()
	c.closed = true
	id, woke := c.parkID, c.parkWoke
	c.parkID, c.parkWoke = 0, nil
	c.parkMu.Unlock()
	if id != 0 && c.poller.cancel(id) {
		close(woke)
	}
}
