//go:build unix

package sock

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// WaitReadable blocks, without a buffer, until conn has bytes to read (or
// has reached EOF or failed). It peeks at one byte with MSG_PEEK and lets
// the runtime's poller wait when there is none; read deadlines set on conn
// apply. Connections without a file descriptor return at once.
func WaitReadable(conn net.Conn) error {
	sc, ok := conn.(syscall.Conn)
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
