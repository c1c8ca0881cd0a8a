//go:build linux

package sock

import (
	"net"
	"syscall"
	"testing"
)

// TestQuickAck: Now leaves the socket in quick-ACK mode (TCP_QUICKACK reads
// 1 after it), and a connection without a socket is left alone.
func TestQuickAck(t *testing.T) {
	ours, peer := tcpPair(t)
	// Ping-pong traffic puts the socket in delayed-ACK pingpong mode.
	for range 3 {
		if _, err := ours.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write([]byte("a")); err != nil {
			t.Fatal(err)
		}
		if _, err := ours.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// It then reads 0 (not asserted: on a loaded machine the replies may
	// come too late for pingpong mode).
	var q QuickAck
	q.Init(ours)
	q.Now()
	v := -1
	if err := Raw(ours).Control(func(fd uintptr) {
		v, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
	}); err != nil {
		t.Fatal(err)
	}
	if v != 1 {
		t.Fatalf("TCP_QUICKACK after Now: %d, want 1", v)
	}

	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	var none QuickAck
	none.Init(a)
	none.Now() // nothing to do, nothing to fail
}
