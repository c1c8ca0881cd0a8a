//go:build unix

package sock

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// TestReadLoop: every byte the peer writes is delivered in order, through
// reads that fill the buffer and reads that drain the socket, until EOF;
// a read deadline ends the loop with its error.
func TestReadLoop(t *testing.T) {
	ours, peer := tcpPair(t)
	if !ReadLoopAvailable {
		t.Fatal("ReadLoop is not available on Unix")
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), 1000) // 16,000 bytes: many full 64-byte buffers
	go func() {
		_, _ = peer.Write(want)
		_ = peer.Close()
	}()
	var got []byte
	deliver := func(b []byte) (bool, error) { got = append(got, b...); return false, nil }
	_ = ours.SetReadDeadline(time.Now().Add(10 * time.Second))
	stop, werr, rerr := ReadLoop(Raw(ours), make([]byte, 64), deliver)
	if stop || werr != nil || rerr != io.EOF {
		t.Fatalf("ReadLoop: stop %v, write error %v, read error %v; want EOF", stop, werr, rerr)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("delivered %d bytes, want %d in order", len(got), len(want))
	}
}

// TestReadLoopStops: a delivery that reports the destination finished or
// failed stops the loop at once, with its error; a deadline ends a loop
// that has nothing to read.
func TestReadLoopStops(t *testing.T) {
	ours, peer := tcpPair(t)
	if _, err := peer.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("destination failed")
	_ = ours.SetReadDeadline(time.Now().Add(10 * time.Second))
	stop, werr, rerr := ReadLoop(Raw(ours), make([]byte, 64), func([]byte) (bool, error) { return false, failed })
	if !stop || werr != failed || rerr != nil {
		t.Fatalf("ReadLoop: stop %v, write error %v, read error %v; want stop with the destination's error", stop, werr, rerr)
	}
	_ = ours.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	stop, werr, rerr = ReadLoop(Raw(ours), make([]byte, 64), func([]byte) (bool, error) { return true, nil })
	if stop || werr != nil || !errors.Is(rerr, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadLoop with nothing to read: stop %v, write error %v, read error %v; want the deadline", stop, werr, rerr)
	}
}
