//go:build unix

package dispatch

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

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
