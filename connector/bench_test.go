//go:build linux

package connector

import (
	"context"
	"net"
	"path/filepath"
	"testing"
)

// Connect latency of each connector kind: one Dial and one Close (a reset
// for TCP, see closeNow) per operation, to an app that accepts and waits for
// EOF. The netns app runs in its own namespace (a helper process); the tcp
// and unix apps run in this process, so their B/op and allocs/op include the
// app's side.
//
//	go test -run XXX -bench . -benchtime 2s ./connector/

// acceptUntilEOF serves ln like a trivial app: every connection is read
// until EOF and closed.
func acceptUntilEOF(b *testing.B, ln net.Listener) {
	echoServer(b, ln, "bench")
}

// closeNow closes conn; a TCP connection is reset (SO_LINGER 0) so that the
// benchmark does not fill the loopback with TIME_WAIT sockets, which would
// slow down the choice of ephemeral ports and measure the kernel's port
// search instead of the connector.
func closeNow(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func benchDial(b *testing.B, c Connector, port int) {
	ctx := context.Background()
	// Warm up (and fail early with a clear error).
	conn, err := c.Dial(ctx, port)
	if err != nil {
		b.Fatalf("%s: Dial: %v", c, err)
	}
	closeNow(conn)
	b.ReportAllocs()
	for b.Loop() {
		conn, err := c.Dial(ctx, port)
		if err != nil {
			b.Fatalf("%s: Dial: %v", c, err)
		}
		closeNow(conn)
	}
}

func BenchmarkDialTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	acceptUntilEOF(b, ln)
	benchDial(b, TCP{Host: "127.0.0.1"}, ln.Addr().(*net.TCPAddr).Port)
}

func BenchmarkDialUnix(b *testing.B) {
	dir := shortTempDir(b)
	ln, err := net.Listen("unix", filepath.Join(dir, "8080.sock"))
	if err != nil {
		b.Fatal(err)
	}
	acceptUntilEOF(b, ln)
	benchDial(b, Unix{PathTemplate: filepath.Join(dir, "{port}.sock")}, 8080)
}

func BenchmarkDialNetNS(b *testing.B) {
	ns := nsCreate(b)
	nsStartEcho(b, ns, "bench")
	benchDial(b, NetNS{Path: ns.path}, nsPort)
}
