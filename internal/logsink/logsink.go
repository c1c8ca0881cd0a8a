// Package logsink is the process's one log writer: bounded and
// non-blocking. Every Write is one whole record (slog handlers write each
// record in a single call) and is queued as one line; when the queue is
// full the new line is dropped and counted, so a blocked stderr never slows
// the data plane. A summary line reports drops once the writer catches up.
package logsink

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultQueue is the number of lines the writer holds.
const DefaultQueue = 1024

// maxPendingBytes bounds the bytes the writer holds, whatever the line
// count: DefaultQueue lines of up to 1 KiB, fewer long ones.
const maxPendingBytes = 1 << 20

// Writer is a bounded, non-blocking line writer.
//
// Write appends the line to a pending buffer under a mutex and, when the
// buffer was empty, wakes the drain goroutine; the drain goroutine swaps
// the buffer for its spare and writes everything pending in one call. A
// line costs a copy and an uncontended lock, not an allocation, and under
// load one system call carries many lines: woken, the drain goroutine
// waits its turn behind the goroutines ready to run (see waker), so that
// on a saturated core the lines of all of them share the call.
type Writer struct {
	dst      io.Writer
	dropped  atomic.Uint64
	reported uint64 // drops already reported; owned by the drain goroutine
	interval time.Duration
	json     bool
	wake     waker // rung when pending goes from empty to not, and to stop
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once

	mu       sync.Mutex
	pending  []byte // whole lines, in order
	lines    int    // lines in pending
	maxLines int
	closed   bool
}

// New starts a writer to dst holding up to queue lines (DefaultQueue when
// queue <= 0) and at most 1 MiB. summaryEvery is how often dropped lines
// are reported (10 s when 0); json makes the summary line a JSON object.
func New(dst io.Writer, queue int, summaryEvery time.Duration, json bool) *Writer {
	if queue <= 0 {
		queue = DefaultQueue
	}
	if summaryEvery <= 0 {
		summaryEvery = 10 * time.Second
	}
	w := &Writer{
		dst:      dst,
		maxLines: queue,
		interval: summaryEvery,
		json:     json,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	var err error
	if w.wake, err = newPipeBell(); err != nil {
		w.wake = newChanBell() // no descriptor to spare: log lines jump the queue
	}
	go w.drain()
	return w
}

// waker wakes the drain goroutine.
//
// On Unix it is a pipe the drain goroutine reads through the runtime's
// network poller. A goroutine woken by a channel send takes the
// processor's next place, ahead of every goroutine already waiting to
// run; on a busy core each access-log line thereby pushed a neighbour's
// request, delivered just before it, behind the whole run queue for a
// millisecond or more (measured in an execution trace of a ten-instance
// flood). A goroutine the poller wakes joins the back of the run queue:
// the log waits its turn (on a saturated core the runtime polls at least
// every 10 ms), and requests do not wait for the log. It costs a write of
// one byte when the buffer was empty, and a read per wake. (The wait's
// deadline, for the drop summary, still wakes it like a timer: once per
// summary interval.)
type waker interface {
	ring()
	// wait waits until the bell rings (true) or until (false).
	wait(until time.Time) bool
	close()
}

// chanBell is the waker without a pipe: a channel, and one timer for the
// wait's deadline (only the drain goroutine waits).
type chanBell struct {
	c chan struct{}
	t *time.Timer
}

func newChanBell() *chanBell {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &chanBell{c: make(chan struct{}, 1), t: t}
}

func (b *chanBell) ring() {
	select {
	case b.c <- struct{}{}:
	default:
	}
}

func (b *chanBell) wait(until time.Time) bool {
	b.t.Reset(time.Until(until))
	defer b.t.Stop()
	select {
	case <-b.c:
		return true
	case <-b.t.C:
		return false
	}
}

func (b *chanBell) close() { b.t.Stop() }

// Write queues a copy of p as one line, or drops it when the writer holds
// its bound of lines or bytes (or is closed). It never blocks on the
// destination and never fails.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || w.lines >= w.maxLines || len(w.pending)+len(p) > maxPendingBytes {
		w.mu.Unlock()
		w.dropped.Add(1)
		return len(p), nil
	}
	wasEmpty := w.lines == 0
	w.pending = append(w.pending, p...)
	w.lines++
	w.mu.Unlock()
	if wasEmpty {
		w.wake.ring()
	}
	return len(p), nil
}

// Dropped returns the number of lines dropped so far.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

func (w *Writer) drain() {
	defer close(w.done)
	defer w.wake.close()
	next := time.Now().Add(w.interval)
	var spare []byte
	for {
		rung := w.wake.wait(next)
		select {
		case <-w.stop:
			w.mu.Lock()
			w.closed = true
			w.mu.Unlock()
			w.flush(spare)
			w.summary()
			return
		default:
		}
		if rung {
			// Let the goroutines that are ready to run go first (the
			// pipe's wake already does; a channel's put this one next
			// in line): on a busy core (GOMAXPROCS=1, every request's
			// goroutine writing one line) flushing at once would cost a
			// system call per line. Yielded, it writes the lines of
			// every request served meanwhile in one call; with nothing
			// else to run it flushes at once.
			runtime.Gosched()
			spare = w.flush(spare)
		}
		if now := time.Now(); !now.Before(next) {
			w.summary()
			next = now.Add(w.interval)
		}
	}
}

// flush writes every pending line in one Write, using spare as the next
// pending buffer, and returns the buffer to reuse as spare (dropped when a
// burst made it larger than the bound).
func (w *Writer) flush(spare []byte) []byte {
	w.mu.Lock()
	batch := w.pending
	w.pending, w.lines = spare[:0], 0
	w.mu.Unlock()
	if len(batch) > 0 {
		_, _ = w.dst.Write(batch)
	}
	if cap(batch) > 2*maxPendingBytes {
		return nil
	}
	return batch[:0]
}

func (w *Writer) summary() {
	if n := w.dropped.Load(); n > w.reported {
		now := time.Now().UTC().Format(time.RFC3339Nano)
		if w.json {
			_, _ = fmt.Fprintf(w.dst, `{"time":%q,"level":"WARN","msg":"log lines dropped","dropped":%d,"total_dropped":%d}`+"\n", now, n-w.reported, n)
		} else {
			_, _ = fmt.Fprintf(w.dst, "time=%s level=WARN msg=\"log lines dropped\" dropped=%d total_dropped=%d\n", now, n-w.reported, n)
		}
		w.reported = n
	}
}

// Close writes what is queued and stops, waiting at most wait for a slow
// destination. Lines written after Close are dropped.
func (w *Writer) Close(wait time.Duration) {
	w.once.Do(func() {
		close(w.stop)
		w.wake.ring()
	})
	select {
	case <-w.done:
	case <-time.After(wait):
	}
}
