//go:build linux

package sock

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerHungUp reports, without blocking or reading, whether the peer of conn
// has closed its side of the connection (FIN or reset). Bytes the peer sent
// and nobody has read yet do not hide a hang-up (POLLRDHUP), and are left in
// place. A connection closed here counts as hung up.
func PeerHungUp(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	hung := false
	err = rc.Control(func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, perr := unix.Poll(fds[:], 0)
		hung = perr == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return hung || err != nil
}
