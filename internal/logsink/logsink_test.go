package logsink

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestWholeLinesInOrder(t *testing.T) {
	var out lockedBuffer
	w := New(&out, 16, time.Hour, false)
	for i := range 10 {
		buf := []byte("line " + string(rune('0'+i)) + "\n")
		_, _ = w.Write(buf)
		copy(buf, "XXXXXX") // the writer must have copied the line
	}
	w.Close(time.Second)
	want := "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\nline 9\n"
	if got := out.String(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// A destination nobody reads (a full pipe) must not block writers: lines
// beyond the queue are dropped and counted, and a summary line follows once
// the destination drains.
func TestBlockedDestinationDropsAndCounts(t *testing.T) {
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	w := New(wr, 8, 10*time.Millisecond, true)
	line := []byte(strings.Repeat("x", 4095) + "\n")
	start := time.Now()
	for range 200 { // 800 KiB: far more than a pipe buffer plus the queue
		_, _ = w.Write(line)
	}
	if w.Dropped() == 0 {
		t.Fatalf("nothing dropped although the pipe is not read (took %v)", time.Since(start))
	}
	// Drain the pipe and look for the summary line.
	var got bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return
			}
			if bytes.Contains(got.Bytes(), []byte(`"msg":"log lines dropped"`)) {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no summary line within 5s")
	}
	if !bytes.Contains(got.Bytes(), []byte(`"total_dropped":`)) {
		t.Fatalf("summary line missing its count")
	}
	go func() { _, _ = r.Read(make([]byte, 1<<20)) }()
	w.Close(time.Second)
	_ = wr.Close()
}

func TestConcurrentWritersNeverInterleave(t *testing.T) {
	var out lockedBuffer
	w := New(&out, 4096, time.Hour, false)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			line := []byte(strings.Repeat(string(rune('a'+g)), 100) + "\n")
			for range 100 {
				_, _ = w.Write(line)
			}
		})
	}
	wg.Wait()
	w.Close(time.Second)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("got %d lines, want 800", len(lines))
	}
	for _, l := range lines {
		if len(l) != 100 || strings.Count(l, l[:1]) != 100 {
			t.Fatalf("interleaved line %q", l)
		}
	}
	testutil.Eventually(t, 5*time.Second, "no dropped lines", func() bool { return w.Dropped() == 0 })
}

// gatedWriter blocks its first Write until release is closed and records
// every Write it gets.
type gatedWriter struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	writes  []string
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.once.Do(func() { close(g.started); <-g.release })
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes = append(g.writes, string(p))
	return len(p), nil
}

// TestQueuedLinesShareOneWrite: lines that queue up while the destination
// is busy reach it in one Write (one system call for a file or pipe), whole
// and in order, and a batch stays within the writer's byte bound.
func TestQueuedLinesShareOneWrite(t *testing.T) {
	g := &gatedWriter{started: make(chan struct{}), release: make(chan struct{})}
	w := New(g, 4096, time.Hour, false)
	_, _ = w.Write([]byte("first\n"))
	<-g.started // the drain goroutine is blocked in the first Write
	var want strings.Builder
	want.WriteString("first\n")
	line := strings.Repeat("y", 999) + "\n"
	for i := range 200 { // 200,000 bytes
		l := strings.Replace(line, "yyy", strconv.Itoa(i%1000), 1)
		_, _ = w.Write([]byte(l))
		want.WriteString(l)
	}
	close(g.release)
	w.Close(5 * time.Second)
	g.mu.Lock()
	defer g.mu.Unlock()
	if got := strings.Join(g.writes, ""); got != want.String() {
		t.Fatalf("lines lost, cut or reordered: %d bytes written, want %d", len(got), want.Len())
	}
	// first, then the 200 lines queued behind it in one batch.
	if len(g.writes) != 2 {
		t.Errorf("%d writes for 201 lines, 200 of them queued behind the first: want 2 (batched)", len(g.writes))
	}
	for i, wr := range g.writes {
		if len(wr) > maxPendingBytes || !strings.HasSuffix(wr, "\n") {
			t.Errorf("write %d: %d bytes (max %d), ends in a whole line: %v", i, len(wr), maxPendingBytes, strings.HasSuffix(wr, "\n"))
		}
	}
}

// countingWriter counts the Write calls it receives.
type countingWriter struct {
	mu     sync.Mutex
	writes int
	bytes  int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	c.bytes += len(p)
	return len(p), nil
}

// TestReadyWritersShareOneWriteOnOneCore: on one core (GOMAXPROCS=1, as the
// benchmarks and small hosts run the listener), many goroutines that are
// ready at once and write one line each — the requests of many connections
// ending together — reach the destination in a few writes, not one system
// call per line (a drain goroutine woken by a channel runs next, before
// the others, unless it yields; one woken through the poller waits its
// turn). The race detector shuffles the order in which ready
// goroutines run, so under -race this passes without the yield too; without
// -race it fails (one write per line).
func TestReadyWritersShareOneWriteOnOneCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 200
	dst := &countingWriter{}
	w := New(dst, 4096, time.Hour, false)
	start := make(chan struct{})
	var wg sync.WaitGroup
	line := []byte("a request ended\n")
	for range n {
		wg.Go(func() {
			<-start
			_, _ = w.Write(line)
		})
	}
	close(start)
	wg.Wait()
	w.Close(5 * time.Second)
	dst.mu.Lock()
	defer dst.mu.Unlock()
	if dst.bytes != n*len(line) {
		t.Fatalf("%d bytes written, want %d", dst.bytes, n*len(line))
	}
	if dst.writes > n/10 {
		t.Errorf("%d writes for %d lines from goroutines ready at once on one core: want at most %d (batched)", dst.writes, n, n/10)
	}
}

// TestWakeKeepsTheNextPlaceOnOneCore: on one core, a goroutine started
// just before a line is written (a neighbour's request the writer of the
// line has just delivered) still runs before the goroutines that were
// already waiting; the drain goroutine's wake does not take its place. A
// wake by channel send would (the started goroutine then ran after all of
// them), which pushed quiet instances' requests behind a flood's.
func TestWakeKeepsTheNextPlaceOnOneCore(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector randomises the run order; `make test` runs this without it")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	dst := &countingWriter{}
	w := New(dst, 0, time.Hour, false)
	defer w.Close(5 * time.Second)
	line := []byte("a request ended\n")
	// The drain goroutine is parked in its wait once a first line is out.
	_, _ = w.Write(line)
	testutil.Eventually(t, 5*time.Second, "the first line written", func() bool {
		dst.mu.Lock()
		defer dst.mu.Unlock()
		return dst.bytes == len(line)
	})

	// A preemption by the runtime's monitor (the test's thread kept off
	// its core for 10 ms) or a GC starting inside the few microseconds
	// below could reorder one attempt; a channel wake reorders every one.
	var orders [][]string
	for range 5 {
		runtime.GC()
		var ran testutil.RunOrder
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { ran.Note("waiting") })
		}
		wg.Go(func() { ran.Note("started") }) // takes the processor's next place
		_, _ = w.Write(line)                  // wakes the drain goroutine
		wg.Wait()
		order := ran.Names()
		if order[0] == "started" {
			return
		}
		orders = append(orders, order)
	}
	t.Errorf("run orders %v: the goroutine started before the line was written ran after those already waiting (the writer's wake took its place)", orders)
}
