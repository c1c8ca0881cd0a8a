//go:build unix

package sock

import (
	"io"
	"os"
	"syscall"
)

// ReadLoopAvailable reports whether ReadLoop can be used here.
const ReadLoopAvailable = true

// ReadLoop hands what arrives on rc (through buf) to deliver inside one
// syscall.RawConn.Read, the way an event loop does: after a read that
// drained the socket (fewer bytes than buf holds) it lets the runtime
// poller wait for the next ones, instead of a read(2) that would fail with
// EAGAIN first, as Go's Read does at every call. Within one RawConn.Read no
// readiness notification is lost, so the wait cannot miss bytes that
// arrived meanwhile; the first read of each call is a real one. It returns
// when deliver reports the destination finished or failed (stop, with
// deliver's error), or with the read's error: io.EOF, a deadline, a closed
// connection.
func ReadLoop(rc syscall.RawConn, buf []byte, deliver func([]byte) (bool, error)) (stop bool, werr, rerr error) {
	var readErr error
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.Read(int(fd), buf)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false
			case err != nil:
				readErr = os.NewSyscallError("read", err)
				return true
			case n == 0:
				readErr = io.EOF
				return true
			}
			finished, e := deliver(buf[:n])
			if finished || e != nil {
				stop, werr = true, e
				return true
			}
			if n < len(buf) {
				return false // drained: wait for the next bytes
			}
		}
	})
	if err != nil {
		return false, nil, err
	}
	return stop, werr, readErr
}
