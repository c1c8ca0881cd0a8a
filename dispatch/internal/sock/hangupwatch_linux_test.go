//go:build linux

package sock

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestHangupWatch: a watched socket is noted once its peer closes (FIN) or
// resets it, once only; bytes from the peer are not a hang-up and stay
// there to read; a socket closed here is never noted.
func TestHangupWatch(t *testing.T) {
	w, err := OpenHangupWatch()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	type pair struct{ ours, peer net.Conn }
	pairs := map[uint64]pair{}
	for id := uint64(1); id <= 4; id++ {
		ours, peer := tcpPair(t)
		fd, ok := FD(ours)
		if !ok {
			t.Fatal("no descriptor")
		}
		// Ids use both halves of the 64 bits the event carries.
		if err := w.Add(fd, id<<32|id); err != nil {
			t.Fatal(err)
		}
		pairs[id<<32|id] = pair{ours, peer}
	}
	var noted []uint64
	poll := func() []uint64 {
		if err := w.Poll(func(id uint64) { noted = append(noted, id) }); err != nil {
			t.Fatal(err)
		}
		return noted
	}
	const fin, reset, data, here = 1<<32 | 1, 2<<32 | 2, 3<<32 | 3, 4<<32 | 4
	if _, err := pairs[data].peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = pairs[fin].peer.Close()
	if err := pairs[reset].peer.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = pairs[reset].peer.Close()
	_ = pairs[here].ours.Close()
	_ = pairs[here].peer.Close()
	testutil.Eventually(t, 5*time.Second, "the FIN and the reset to be noted", func() bool {
		got := poll()
		return slices.Contains(got, fin) && slices.Contains(got, reset)
	})
	// Once more: nothing new (one-shot), and never the data or closed-here socket.
	got := poll()
	slices.Sort(got)
	if want := []uint64{fin, reset}; !slices.Equal(got, want) {
		t.Fatalf("noted %x; want %x", got, want)
	}
	_ = pairs[data].ours.SetReadDeadline(time.Now().Add(5 * time.Second))
	one := make([]byte, 1)
	if n, err := pairs[data].ours.Read(one); n != 1 || one[0] != 'x' {
		t.Fatalf("read %q, %v; want the peer's byte", one[:n], err)
	}
	if a := testing.AllocsPerRun(100, func() { _ = w.Poll(func(uint64) {}) }); a != 0 {
		t.Fatalf("a poll allocates %v times, want 0", a)
	}
}
