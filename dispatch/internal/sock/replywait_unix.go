//go:build unix

package sock

import (
	"errors"

	"golang.org/x/sys/unix"
)

// rawReadWait: the runtime poller waits inside syscall.RawConn.Read
// (replywait.go).
const rawReadWait = true

// peekReadable reports whether socket fd has bytes to read, has reached
// EOF or failed: one non-blocking MSG_PEEK.
func peekReadable(fd uintptr) bool {
	var one [1]byte
	_, _, err := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR)
}
