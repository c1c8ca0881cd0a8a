package dispatch

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parkAfter is how long a WebSocket direction may wait for its next
// message while holding a pooled buffer; after that it gives the buffer
// back and parks on the socket's readiness instead, so an idle WebSocket
// holds no read buffers (a busy one pays no extra system calls).
const parkAfter = 50 * time.Millisecond

// waitReadable blocks, without a buffer, until raw has bytes to read (or
// has reached EOF or failed). It peeks at one byte with MSG_PEEK and lets
// the runtime's poller wait when there is none; read deadlines set on raw
// apply. Connections without a file descriptor return at once.
func waitReadable(raw net.Conn) error {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var one [1]byte
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		_, _, e := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if errors.Is(e, unix.EAGAIN) || errors.Is(e, unix.EINTR) {
			return false
		}
		perr = e
		return true
	})
	if err != nil {
		return err
	}
	// A peek error (a reset) is reported by the next real read.
	_ = perr
	return nil
}

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
