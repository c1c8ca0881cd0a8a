// Package logsink is the process's one log writer: bounded and
// non-blocking. Every Write is one whole record (slog handlers write each
// record in a single call) and is queued as one line; when the queue is
// full the new line is dropped and counted, so a blocked stderr never slows
// the data plane. A summary line reports drops once the writer catches up.
package logsink

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultQueue is the number of lines the writer holds.
const DefaultQueue = 1024

// Writer is a bounded, non-blocking line writer.
type Writer struct {
	dst      io.Writer
	queue    chan []byte
	dropped  atomic.Uint64
	reported uint64 // drops already reported; owned by the drain goroutine
	interval time.Duration
	json     bool
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// New starts a writer to dst holding up to queue lines (DefaultQueue when
// queue <= 0). summaryEvery is how often dropped lines are reported (10 s
// when 0); json makes the summary line a JSON object.
func New(dst io.Writer, queue int, summaryEvery time.Duration, json bool) *Writer {
	if queue <= 0 {
		queue = DefaultQueue
	}
	if summaryEvery <= 0 {
		summaryEvery = 10 * time.Second
	}
	w := &Writer{
		dst:      dst,
		queue:    make(chan []byte, queue),
		interval: summaryEvery,
		json:     json,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go w.drain()
	return w
}

// Write queues a copy of p as one line, or drops it when the queue is full.
// It never blocks and never fails.
func (w *Writer) Write(p []byte) (int, error) {
	line := make([]byte, len(p))
	copy(line, p)
	select {
	case w.queue <- line:
	default:
		w.dropped.Add(1)
	}
	return len(p), nil
}

// Dropped returns the number of lines dropped so far.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

func (w *Writer) drain() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case line := <-w.queue:
			_, _ = w.dst.Write(line)
		case <-t.C:
			w.summary()
		case <-w.stop:
			for {
				select {
				case line := <-w.queue:
					_, _ = w.dst.Write(line)
				default:
					w.summary()
					return
				}
			}
		}
	}
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
	w.once.Do(func() { close(w.stop) })
	select {
	case <-w.done:
	case <-time.After(wait):
	}
}
