package h2client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestControlFloodFromAPeerThatDoesNotRead: a peer that floods PINGs (each
// one asks for an answer) and reads nothing must not make the connection
// queue answers without bound while the write is stuck: it is ended with
// ENHANCE_YOUR_CALM long before the flood ends (or WriteTimeout passes).
func TestControlFloodFromAPeerThatDoesNotRead(t *testing.T) {
	// net.Pipe: nothing is buffered between the two ends, so the first
	// answer the peer does not read stops the connection's writes.
	const flood = 1 << 20 // 17 MiB of PINGs
	sent := make(chan int, 1)
	cc, wait := pipePeer(func(fr *http2.Framer, c net.Conn) {
		if !readUntilSettingsAck(fr) {
			sent <- 0
			return
		}
		// From here on the peer reads nothing.
		n := 0
		for ; n < flood; n++ {
			if err := fr.WritePing(false, [8]byte{byte(n)}); err != nil {
				break
			}
		}
		sent <- n
	})
	defer wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := NewConn(ctx, cc, Config{WriteTimeout: time.Minute})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	var n int
	select {
	case n = <-sent:
	case <-time.After(60 * time.Second):
		t.Fatal("the flood neither ended nor was stopped")
	}
	if n >= flood {
		t.Fatalf("the peer wrote all its %d PINGs without reading an answer; the connection is still open (%v)", n, c.Err())
	}
	var pe *ProtocolError
	if err := c.Err(); !errors.As(err, &pe) || pe.Code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("the connection ended with %v; want a ProtocolError with ENHANCE_YOUR_CALM", err)
	}
}

// TestGoAwayRightAfterSettings: a peer that answers the preface with
// SETTINGS and GOAWAY at once has its connection closed by the read loop
// while NewConn may still be arming the PING and idle timers; the timers
// must be set before the read loop starts (go test -race finds the race
// otherwise), and the state hook still runs once.
func TestGoAwayRightAfterSettings(t *testing.T) {
	cc, wait := pipePeer(func(fr *http2.Framer, c net.Conn) {
		if !readUntilSettingsAck(fr) {
			return
		}
		// NewConn returns once this ACK is read: the GOAWAY
		// races with what it does after.
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	})
	defer wait()
	hooked := make(chan struct{}, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := NewConn(ctx, cc, Config{ReadIdleTimeout: time.Minute, IdleTimeout: time.Minute, StateHook: func(*Conn) { hooked <- struct{}{} }})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	select {
	case <-hooked:
	case <-time.After(10 * time.Second):
		t.Fatal("the state hook did not run after GOAWAY")
	}
	if err := c.Err(); !errors.Is(err, ErrGoAway) {
		t.Fatalf("Err() = %v; want ErrGoAway", err)
	}
	_ = c.Close()
	if len(hooked) != 0 {
		t.Fatal("the state hook ran twice")
	}
}

// readUntilSettingsAck reads frames until the client acknowledges the
// peer's SETTINGS; false when the connection failed first.
func readUntilSettingsAck(fr *http2.Framer) bool {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return false
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && sf.IsAck() {
			return true
		}
	}
}
