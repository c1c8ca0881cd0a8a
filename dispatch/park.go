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

// socketFD returns the file descriptor of raw, valid while raw is open.
func socketFD(raw net.Conn) (int, bool) {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
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
