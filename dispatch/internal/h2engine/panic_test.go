package h2engine

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// afterResetPanicker is a handler that registers an AfterReset function
// (as dispatch does for the app connection a stream holds) and panics on
// /panic; other paths are testHandler's.
type afterResetPanicker struct {
	released atomic.Int64 // AfterReset functions run
}

func (h *afterResetPanicker) ServeStream(st *Stream) {
	if st.Path != "/panic" {
		testHandler(st)
		return
	}
	st.AfterReset(func() { h.released.Add(1) })
	panic("injected handler panic")
}

// TestHandlerPanicRunsAfterResetAndFreesItsSlot: a handler that panics
// while it holds something released by AfterReset gets it released (the
// engine resets the stream and runs the function), and its stream's slot
// is freed: more panics than SETTINGS_MAX_CONCURRENT_STREAMS on one
// connection leave it serving.
func TestHandlerPanicRunsAfterResetAndFreesItsSlot(t *testing.T) {
	testutil.VerifyNone(t)
	const maxStreams = 4
	var panics atomic.Int64
	h := &afterResetPanicker{}
	s := newTestServer(t, false, Config{MaxConcurrentStreams: maxStreams,
		OnPanic: func(string, any) { panics.Add(1) }}, h)
	c := dialRaw(t, s)
	const n = 3 * maxStreams
	id := uint32(1)
	for i := 0; i < n; i++ {
		c.request(id, "/panic", true)
		sid := id
		c.waitFor(10*time.Second, "the panicking stream's reset", func(f http2.Frame) bool {
			rst, ok := f.(*http2.RSTStreamFrame)
			return ok && rst.StreamID == sid && rst.ErrCode == http2.ErrCodeInternal
		})
		id += 2
	}
	if got := panics.Load(); got != n {
		t.Fatalf("OnPanic told of %d panics; want %d", got, n)
	}
	if got := h.released.Load(); got != n {
		t.Fatalf("%d AfterReset functions ran after %d panics; want every one", got, n)
	}
	c.request(id, "/", true)
	c.waitEnd(id)
}
