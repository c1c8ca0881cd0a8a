//go:build unix

package sock

import (
	"errors"
	"os"
	"testing"
	"time"
)

// TestWaitReadable: the wait holds until bytes arrive (or the read deadline
// passes) and leaves them to be read; a closed peer ends it too.
func TestWaitReadable(t *testing.T) {
	ours, peer := tcpPair(t)
	_ = ours.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if err := WaitReadable(ours); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("wait with nothing to read: %v, want the deadline", err)
	}
	_ = ours.SetReadDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() { done <- WaitReadable(ours) }()
	if _, err := peer.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait after the peer wrote: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end when bytes arrived")
	}
	buf := make([]byte, 2)
	if n, err := ours.Read(buf); string(buf[:n]) != "hi" {
		t.Fatalf("read %q, %v after the wait; want the peer's bytes", buf[:n], err)
	}
	_ = peer.Close()
	if err := WaitReadable(ours); err != nil {
		t.Fatalf("wait after the peer closed: %v, want nil (EOF is for the read)", err)
	}
}
