//go:build linux

package sock

import "syscall"

// QuickAck sends the pending ACK of a socket at once (setsockopt
// TCP_QUICKACK 1, which also leaves delayed-ACK pingpong mode until the
// next request is written). It is prepared once per connection, so it
// allocates nothing. The zero QuickAck does nothing.
type QuickAck struct {
	raw syscall.RawConn
	fn  func(fd uintptr)
}

// Init prepares q for conn; conns that do not expose their socket (tests'
// in-memory pipes) are left alone.
func (q *QuickAck) Init(conn any) {
	q.raw = Raw(conn)
	if q.raw == nil {
		return
	}
	q.fn = func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	}
}

// Now acknowledges what has been received (best effort: an error leaves
// the ACK to the kernel's timer).
func (q *QuickAck) Now() {
	if q.raw != nil {
		_ = q.raw.Control(q.fn)
	}
}
