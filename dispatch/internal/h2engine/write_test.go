package h2engine

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// TestResponsesCoalesced: responses that become ready together on
// concurrent streams go out in a few writes to the socket, not one per
// response (each costs a system call and, over TLS, a record).
func TestResponsesCoalesced(t *testing.T) {
	const streams = 100
	gate := make(chan struct{})
	var started atomic.Int32
	h := HandlerFunc(func(st *Stream) {
		started.Add(1)
		<-gate
		_ = st.WriteHeaders(200, []HeaderField{{Name: "content-length", Value: "2"}}, false)
		_ = st.WriteLast([]byte("ok"))
	})
	c, conn := startStreams(t, streams, h, &started)
	before := conn.flushes.Load()
	close(gate)
	ended := 0
	c.waitFor(10*time.Second, "every response", func(f http2.Frame) bool {
		if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
			ended++
		}
		return ended == streams
	})
	if n := conn.flushes.Load() - before; n > streams/5 {
		t.Fatalf("%d responses ready together took %d writes, want at most %d", streams, n, streams/5)
	}
}

// TestFlushSoonCoalesced: body pieces that streams flush with FlushSoon
// at the same moment go out in a few writes, not one per stream, and each
// stream's piece reaches the client without the stream ending.
func TestFlushSoonCoalesced(t *testing.T) {
	const streams = 100
	gate := make(chan struct{})
	done := make(chan struct{})
	var started atomic.Int32
	h := HandlerFunc(func(st *Stream) {
		_ = st.WriteHeaders(200, nil, false)
		_ = st.Flush()
		started.Add(1)
		<-gate
		_, _ = st.Write([]byte("message"))
		_ = st.FlushSoon()
		<-done
		_ = st.End()
	})
	c, conn := startStreams(t, streams, h, &started)
	before := conn.flushes.Load()
	close(gate)
	got := 0
	c.waitFor(10*time.Second, "every message", func(f http2.Frame) bool {
		if d, ok := f.(*http2.DataFrame); ok && len(d.Data()) > 0 {
			if d.StreamEnded() {
				t.Fatal("a message arrived with END_STREAM")
			}
			got++
		}
		return got == streams
	})
	if n := conn.flushes.Load() - before; n > streams/5 {
		t.Errorf("%d messages flushed together took %d writes, want at most %d", streams, n, streams/5)
	}
	close(done)
}

// startStreams opens n streams on one connection served by h and waits
// until started counts n handlers.
func startStreams(t *testing.T, n int, h Handler, started *atomic.Int32) (*rawClient, *Conn) {
	t.Helper()
	s := newTestServer(t, false, Config{MaxConcurrentStreams: uint32(n)}, h)
	c := dialRaw(t, s)
	for i := range n {
		c.request(uint32(2*i+1), "/", true)
	}
	testutil.Eventually(t, 10*time.Second, "every handler started", func() bool { return started.Load() == int32(n) })
	s.mu.Lock()
	defer s.mu.Unlock()
	return c, s.conns[0]
}
