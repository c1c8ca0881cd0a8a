package sock

import (
	"net"
	"testing"
)

// tcpPair is a real loopback TCP connection: ours and the peer's side, both
// closed on cleanup.
func tcpPair(t testing.TB) (ours, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	ours, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err = ln.Accept()
	if err != nil {
		_ = ours.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ours.Close(); _ = peer.Close() })
	return ours, peer
}

// TestRawAndFD: a TCP connection gives its socket and descriptor while it
// is open; a closed one gives no descriptor, and a connection without a
// socket (an in-memory pipe) gives neither.
func TestRawAndFD(t *testing.T) {
	ours, _ := tcpPair(t)
	if Raw(ours) == nil {
		t.Fatal("Raw of a TCP connection is nil")
	}
	fd, ok := FD(ours)
	if !ok || fd < 0 {
		t.Fatalf("FD of an open TCP connection: %d, %v", fd, ok)
	}
	_ = ours.Close()
	if fd, ok := FD(ours); ok {
		t.Fatalf("FD of a closed connection: %d, true", fd)
	}

	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	if Raw(a) != nil {
		t.Fatal("Raw of a pipe is not nil")
	}
	if _, ok := FD(a); ok {
		t.Fatal("FD of a pipe reports a descriptor")
	}
	if Raw("not a conn") != nil {
		t.Fatal("Raw of a non-connection is not nil")
	}
}
