//go:build linux && !386

package dispatch

import (
	"syscall"
	"unsafe"
)

// idleProbe tells whether an idle app connection is still usable before a
// request is written on it: one non-blocking recv(MSG_PEEK) that reports
// whether the app has closed it (EOF or reset) or sent bytes nobody asked
// for. It is prepared once per connection, so a probe allocates nothing.
type idleProbe struct {
	raw  syscall.RawConn
	fn   func(fd uintptr) bool
	buf  [1]byte
	n    uintptr
	errn syscall.Errno
}

// init prepares the probe for conn; conns that do not expose their socket
// (tests' in-memory pipes) are never probed.
func (p *idleProbe) init(conn any) {
	p.raw = rawConnOf(conn)
	if p.raw == nil {
		return
	}
	p.fn = func(fd uintptr) bool {
		p.n, _, p.errn = syscall.Syscall6(syscall.SYS_RECVFROM, fd,
			uintptr(unsafe.Pointer(&p.buf[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		return true
	}
}

// usable reports false when the app closed the connection while it was
// idle (EOF, reset) or sent unsolicited bytes: writing a request on it
// would be lost. Nothing has been written when it says so, so the request
// can go to another connection without being a retry.
func (p *idleProbe) usable() bool {
	if p.raw == nil {
		return true
	}
	if err := p.raw.Read(p.fn); err != nil {
		return false // closed locally
	}
	switch p.errn {
	case syscall.EAGAIN:
		return true // nothing to read: open and quiet
	case syscall.EINTR:
		return true // inconclusive; the request's own errors still count
	}
	// n == 0 with no error is EOF; n > 0 is unsolicited bytes; any other
	// error (ECONNRESET) is a dead connection.
	return false
}
