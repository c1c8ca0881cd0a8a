package dispatch

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// parkAfter is how long a WebSocket direction may wait for its next
// message while holding a pooled buffer; after that it gives the buffer
// back and parks on the socket's readiness instead, so an idle WebSocket
// holds no read buffers (a busy one pays no extra system calls).
const parkAfter = 50 * time.Millisecond

// rawConnOf returns conn's socket for raw system calls, or nil when conn
// has none (tests' in-memory pipes, a TLS conn) or it cannot be had.
func rawConnOf(conn any) syscall.RawConn {
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

// socketFD returns the file descriptor of raw, valid while raw is open.
func socketFD(raw net.Conn) (int, bool) {
	rc := rawConnOf(raw)
	if rc == nil {
		return 0, false
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}

// isDeadline reports whether err is a read deadline expiring.
func isDeadline(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
