package h2engine

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/testutil"
)

// gidRecorder is a handler that blocks on /block and otherwise answers
// testHandler's way after noting the goroutine that served each path.
type gidRecorder struct {
	mu   sync.Mutex
	gids map[string]string
}

func (g *gidRecorder) ServeStream(st *Stream) {
	if st.Path != "/block" {
		buf := make([]byte, 64)
		buf = buf[:runtime.Stack(buf, false)]
		id, _, _ := strings.Cut(string(bytes.TrimPrefix(buf, []byte("goroutine "))), " ")
		g.mu.Lock()
		g.gids[st.Path] = id
		g.mu.Unlock()
	}
	testHandler(st)
}

func (g *gidRecorder) gid(path string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gids[path]
}

// waitingWorkers counts the goroutines waiting for a new stream.
func waitingWorkers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "h2engine.(*Conn).nextStream")
}

// waitEnd waits for the frame that ends stream id's response.
func (c *rawClient) waitEnd(id uint32) {
	c.t.Helper()
	c.waitFor(10*time.Second, "the end of the response", func(f http2.Frame) bool {
		return f.Header().StreamID == id && f.Header().Flags.Has(http2.FlagDataEndStream)
	})
}

// TestStreamGoroutineReused: while a stream runs, the goroutine that
// served another stream serves the next new one; once no stream runs,
// it ends.
func TestStreamGoroutineReused(t *testing.T) {
	testutil.VerifyNone(t)
	h := &gidRecorder{gids: map[string]string{}}
	s := newTestServer(t, false, Config{}, h)
	c := dialRaw(t, s)
	c.request(1, "/block", true) // keeps the connection busy
	c.request(3, "/a", true)
	c.waitEnd(3)
	testutil.Eventually(t, 10*time.Second, "stream 3's goroutine to wait for a stream", func() bool { return waitingWorkers() == 1 })
	c.request(5, "/b", true)
	c.waitEnd(5)
	if a, b := h.gid("/a"), h.gid("/b"); a == "" || a != b {
		t.Fatalf("streams 3 and 5 ran on goroutines %q and %q, want the same", a, b)
	}
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "no goroutine to wait once no stream runs", func() bool { return waitingWorkers() == 0 })
}

// TestStreamGoroutineReleasedOnTick: a connection holding only a long-
// lived stream (a WebSocket, say) keeps no waiting goroutine beyond the
// connection timer's next tick.
func TestStreamGoroutineReleasedOnTick(t *testing.T) {
	testutil.VerifyNone(t)
	h := &gidRecorder{gids: map[string]string{}}
	s := newTestServer(t, false, Config{IdleTimeout: 200 * time.Millisecond}, h)
	c := dialRaw(t, s)
	c.request(1, "/block", true)
	c.request(3, "/a", true)
	c.waitEnd(3)
	testutil.Eventually(t, 10*time.Second, "the waiting goroutine to end at the timer's tick", func() bool { return waitingWorkers() == 0 })
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
}

// spareGoroutines returns the ids of the spare goroutines waiting for a
// stream.
func spareGoroutines() map[string]bool { return goroutinesIn("h2engine.waitSpare") }

// goroutinesIn returns the ids of the goroutines whose stack holds fn
// ("": all).
func goroutinesIn(fn string) map[string]bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	ids := map[string]bool{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
			ids[id] = true
		}
	}
	return ids
}

// TestStreamGoroutineSpare: a connection with one stream at a time has
// its next request served by a goroutine that served an earlier stream
// and waited as a spare (no other stream ran when it finished), not by a
// new goroutine whose stack grows again; spares end within spareIdle once
// no stream comes, so nothing is left waiting.
func TestStreamGoroutineSpare(t *testing.T) {
	testutil.VerifyNone(t)
	h := &gidRecorder{gids: map[string]string{}}
	// Spares of earlier tests could take this test's streams.
	testutil.Eventually(t, 10*time.Second, "earlier spares to end", func() bool { return len(spareGoroutines()) == 0 })
	// A spare waits 3 s here instead of 20 ms: on a loaded machine the
	// next request could come after a 20 ms spare had ended, and a new
	// goroutine rightly served it.
	spareIdleOverride.Store(int64(3 * time.Second))
	defer spareIdleOverride.Store(0)
	s := newTestServer(t, false, Config{}, h)
	c := dialRaw(t, s)
	c.request(1, "/a", true)
	c.waitEnd(1)
	id := uint32(3)
	for _, path := range []string{"/b", "/c"} {
		// Wait for the last stream's goroutine to wait as a spare first:
		// a request that comes sooner finds none and starts a goroutine.
		testutil.Eventually(t, 10*time.Second, "the goroutine to wait as a spare", func() bool { return len(spareGoroutines()) > 0 })
		// No other goroutine of the connection waits (no stream runs): a
		// goroutine that was there before the request and served it was
		// a spare.
		before := goroutinesIn("")
		c.request(id, path, true)
		c.waitEnd(id)
		if g := h.gid(path); !before[g] {
			t.Fatalf("stream %s ran on goroutine %q, started for it; want a spare", path, g)
		}
		id += 2
	}
	// The spare now waiting ends at its 3 s timer.
	testutil.Eventually(t, 10*time.Second, "the spares to end once no stream comes", func() bool { return len(spareGoroutines()) == 0 })
}
