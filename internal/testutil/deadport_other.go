//go:build !unix

package testutil

import (
	"net"
	"testing"
)

// DeadLoopbackPort returns a loopback TCP port nothing listens on (here a
// port listened on and closed again, which a later listener may be given;
// see deadport_unix.go).
func DeadLoopbackPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}
