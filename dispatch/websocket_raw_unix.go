//go:build unix

package dispatch

import (
	"io"
	"os"
	"syscall"
)

// rawSource returns the socket of a direction whose source is a plain
// socket (the app's side), for copyRaw; nil otherwise.
func (p *wsPump) rawSource() syscall.RawConn {
	if p.src.raw == nil || p.src.r != p.src.raw {
		return nil
	}
	return rawConnOf(p.src.raw)
}

// copyRaw forwards what arrives on rc (through buf) inside one
// syscall.RawConn.Read, the way an event loop does: after a read that
// drained the socket (fewer bytes than buf holds) it lets the runtime
// poller wait for the next ones, instead of a read(2) that would fail with
// EAGAIN first, as Go's Read does at every call. Within one RawConn.Read
// no readiness notification is lost, so the wait cannot miss bytes that
// arrived meanwhile; the first read of each call is a real one. It returns
// when the destination finished or failed (stop, with the write's error),
// or with the read's error: io.EOF, a deadline, a closed connection.
func (p *wsPump) copyRaw(rc syscall.RawConn, buf []byte) (stop bool, werr, rerr error) {
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
			finished, e := p.forward(buf[:n])
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
