//go:build unix

package testutil

import (
	"syscall"
	"testing"
)

// DeadLoopbackPort returns a loopback TCP port that refuses connections
// for the rest of the test: a socket is bound to it (without SO_REUSEADDR)
// but never listens, and is closed on cleanup. No listener of this process
// or another can be given the port meanwhile; a port merely listened on
// and closed again can be (the ephemeral range is shared), and the "dead"
// endpoint then answers as whatever took it.
func DeadLoopbackPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("getsockname: %T", sa)
	}
	return in4.Port
}
