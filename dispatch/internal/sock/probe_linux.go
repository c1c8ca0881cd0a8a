//go:build linux

package sock

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// IdleProbe tells whether an idle connection is still usable before a
// request is written on it: one poll(2) with a zero timeout that reports
// whether the peer has closed it (EOF or reset) or sent bytes nobody asked
// for, without reading them. It is prepared once per connection and polls
// through a descriptor set it owns, so a probe allocates nothing. The zero
// IdleProbe reports every connection usable.
type IdleProbe struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool
	fds [1]unix.PollFd
	n   int
	err error
}

// probeEvents are what make an idle connection unusable: bytes or EOF to
// read (POLLIN), the peer's FIN (POLLRDHUP), a reset or error (POLLHUP,
// POLLERR; reported whether asked for or not).
const probeEvents = unix.POLLIN | unix.POLLRDHUP | unix.POLLHUP | unix.POLLERR

// Init prepares the probe for conn; conns that do not expose their socket
// (tests' in-memory pipes) are never probed.
func (p *IdleProbe) Init(conn any) {
	p.raw = Raw(conn)
	if p.raw == nil {
		return
	}
	p.fn = func(fd uintptr) bool {
		p.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}
		p.n, p.err = unix.Poll(p.fds[:], 0)
		return true
	}
}

// Usable reports false when the peer closed the connection while it was
// idle (EOF, reset) or sent unsolicited bytes, or when it was closed here:
// writing a request on it would be lost. Nothing has been written when it
// says so, so the request can go to another connection without being a
// retry.
func (p *IdleProbe) Usable() bool {
	if p.raw == nil {
		return true
	}
	if err := p.raw.Read(p.fn); err != nil {
		return false // closed locally
	}
	switch {
	case p.err == unix.EINTR:
		return true // inconclusive; the request's own errors still count
	case p.err != nil:
		return false
	}
	// No event: open and quiet. Otherwise EOF, unsolicited bytes or a
	// reset (ECONNRESET): a dead connection.
	return p.n == 0 || p.fds[0].Revents&probeEvents == 0
}
