//go:build linux

package routes

import (
	"encoding/binary"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// yieldBackstop bounds one step aside should the wake-up never come.
const yieldBackstop = 20 * time.Millisecond

// yield parks until the network poller has run once.
func (y *yielder) yield() {
	if y.ev == nil && !y.failed {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			y.failed = true
		} else {
			y.ev = os.NewFile(uintptr(fd), "yield")
		}
	}
	if y.failed {
		runtime.Gosched()
		return
	}
	rc, err := y.ev.SyscallConn()
	if err != nil {
		runtime.Gosched()
		return
	}
	_ = y.ev.SetReadDeadline(time.Now().Add(yieldBackstop))
	var buf [8]byte
	first := true
	_ = rc.Read(func(fd uintptr) bool {
		if first {
			// Made readable only now, after the poller's read state was
			// reset for this wait, so the wake-up cannot be lost.
			first = false
			binary.NativeEndian.PutUint64(buf[:], 1)
			_, werr := unix.Write(int(fd), buf[:])
			return werr != nil
		}
		_, _ = unix.Read(int(fd), buf[:]) // drain; the wait is over either way
		return true
	})
}
