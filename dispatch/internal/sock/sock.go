// Package sock is the socket-level face of the data plane: the system calls
// dispatch makes on its TCP connections, behind one portable API, in the
// shape of Tailscale's net/tcpinfo. Each facility has a file for the systems
// that have it (Linux or Unix) and one for everywhere else, where it does
// nothing, reports what a quiet socket would, or fails so that the caller
// falls back; dispatch keeps the policy (when to probe, park, acknowledge or
// wait) and has no platform files of its own for these.
//
// No function here reads bytes a caller has not asked for: peeks and polls
// leave what the peer sent in place.
//
// Files:
//   - sock.go: Raw and FD, a connection's socket for raw system calls.
//   - quickack_linux.go, quickack_other.go: QuickAck, the early ACK
//     (TCP_QUICKACK).
//   - hangup_linux.go, hangup_other.go: PeerHungUp, a peer's FIN or reset
//     seen without reading (POLLRDHUP).
//   - probe_linux.go, probe_other.go: IdleProbe, whether an idle connection
//     is still usable (a zero-timeout poll).
//   - hangupwatch_linux.go, hangupwatch_other.go: HangupWatch, which of
//     many sockets the peer closed, noted by one epoll instance and
//     collected with one system call.
//   - readable_unix.go, readable_other.go: WaitReadable, a wait for bytes
//     without a buffer (MSG_PEEK inside the runtime poller).
//   - replywait.go, replywait_unix.go, replywait_other.go: ReplyWait, a
//     request written inside RawConn.Read, then a wait for its answer.
//   - readloop_unix.go, readloop_other.go: ReadLoop, an event loop's reads
//     inside one RawConn.Read.
//   - epoll_linux.go, epoll_other.go: Epoll, an epoll instance waited on
//     through the runtime's poller (the idle poller's system calls).
package sock

import (
	"net"
	"syscall"
)

// Raw returns conn's socket for raw system calls, or nil when conn has none
// (tests' in-memory pipes, a TLS conn) or it cannot be had.
func Raw(conn any) syscall.RawConn {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// FD returns the file descriptor of conn, valid while conn is open; false
// when conn has no socket or is closed.
func FD(conn net.Conn) (int, bool) {
	rc := Raw(conn)
	if rc == nil {
		return 0, false
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}
