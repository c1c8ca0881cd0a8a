//go:build linux

package sock

import (
	"net"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestIdleProbeQuiet: an open connection on which the peer sent nothing is
// usable, probe after probe, and a probe allocates nothing.
func TestIdleProbeQuiet(t *testing.T) {
	ours, _ := tcpPair(t)
	var p IdleProbe
	p.Init(ours)
	for range 3 {
		if !p.Usable() {
			t.Fatal("an open, quiet connection probed unusable")
		}
	}
	if a := testing.AllocsPerRun(100, func() { p.Usable() }); a != 0 {
		t.Fatalf("a probe allocates %v times, want 0", a)
	}
}

// TestIdleProbeDead: a connection the peer closed (FIN), reset, or wrote
// unsolicited bytes on is unusable, and so is one closed here; the bytes
// the peer sent are still there to read after the probe.
func TestIdleProbeDead(t *testing.T) {
	t.Run("fin", func(t *testing.T) {
		ours, peer := tcpPair(t)
		var p IdleProbe
		p.Init(ours)
		_ = peer.Close()
		testutil.Eventually(t, 5*time.Second, "the FIN to be seen", func() bool { return !p.Usable() })
	})
	t.Run("reset", func(t *testing.T) {
		ours, peer := tcpPair(t)
		var p IdleProbe
		p.Init(ours)
		if err := peer.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		_ = peer.Close() // linger 0: a reset
		testutil.Eventually(t, 5*time.Second, "the reset to be seen", func() bool { return !p.Usable() })
	})
	t.Run("unsolicited bytes", func(t *testing.T) {
		ours, peer := tcpPair(t)
		var p IdleProbe
		p.Init(ours)
		if _, err := peer.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, "the byte to be seen", func() bool { return !p.Usable() })
		_ = ours.SetReadDeadline(time.Now().Add(5 * time.Second))
		one := make([]byte, 1)
		if n, err := ours.Read(one); n != 1 || one[0] != 'x' {
			t.Fatalf("read %q, %v after the probe; want the peer's byte", one[:n], err)
		}
	})
	t.Run("closed here", func(t *testing.T) {
		ours, _ := tcpPair(t)
		var p IdleProbe
		p.Init(ours)
		_ = ours.Close()
		if p.Usable() {
			t.Fatal("a connection closed here probed usable")
		}
	})
}

// TestIdleProbeNoSocket: a connection without a socket (a pipe) is never
// probed: always usable.
func TestIdleProbeNoSocket(t *testing.T) {
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	var p IdleProbe
	p.Init(a)
	_ = b.Close()
	if !p.Usable() {
		t.Fatal("a pipe probed unusable")
	}
}

// BenchmarkIdleProbe is the cost the stale-connection probe adds to each
// reuse of a pooled app connection (one poll(2) with a zero timeout on
// Linux), on a real loopback TCP connection.
func BenchmarkIdleProbe(b *testing.B) {
	c, _ := tcpPair(b)
	var p IdleProbe
	p.Init(c)
	b.ReportAllocs()
	for b.Loop() {
		if !p.Usable() {
			b.Fatal("an open, quiet connection probed unusable")
		}
	}
}
