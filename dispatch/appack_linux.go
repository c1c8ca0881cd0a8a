//go:build linux

package dispatch

import "syscall"

// quickAck sends the pending ACK of a socket at once (setsockopt
// TCP_QUICKACK 1, which also leaves delayed-ACK pingpong mode until the
// next request is written). It is prepared once per connection, so it
// allocates nothing.
type quickAck struct {
	raw syscall.RawConn
	fn  func(fd uintptr)
}

// init prepares q for conn; conns that do not expose their socket (tests'
// in-memory pipes) are left alone.
func (q *quickAck) init(conn any) {
	q.raw = rawConnOf(conn)
	if q.raw == nil {
		return
	}
	q.fn = func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	}
}

// now acknowledges what has been received (best effort: an error leaves
// the ACK to the kernel's timer).
func (q *quickAck) now() {
	if q.raw != nil {
		_ = q.raw.Control(q.fn)
	}
}
