package ndjson

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// KeepaliveLine is the line a watch stream writes when it has nothing
// else to say, so that its reader can tell a quiet stream from a dead one.
var KeepaliveLine = []byte(`{"keepalive":true}` + "\n")

// Newline ends a line whose value does not end with one.
var Newline = []byte("\n")

// ContentType is the media type of a watch stream.
const ContentType = "application/x-ndjson"

// Stream is the server side of one watch stream: an HTTP response that
// stays open and gets whole lines. It is used by one goroutine, the
// handler's.
type Stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	// deadline is the deadline of the last Send.
	deadline time.Time
}

// Start answers 200 with the headers of a streamed NDJSON response (no
// caching, no buffering by proxies in between; whatever the caller set in
// w.Header() before is kept) and returns the stream. Each Send must be
// taken by the reader within sendTimeout.
func Start(w http.ResponseWriter, sendTimeout time.Duration) *Stream {
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &Stream{w: w, rc: http.NewResponseController(w), timeout: sendTimeout}
}

// Send writes parts (together one or more whole lines) and flushes them,
// within the send timeout: it sets the write deadline, writes, flushes and
// clears the deadline again, because over HTTP/2 a write deadline is a
// timer that resets the stream when it fires, even with no write pending
// (a deadline left behind would end a quiet, healthy stream). A response
// writer without deadlines (http.ErrNotSupported) is written without one.
func (s *Stream) Send(parts ...[]byte) error {
	s.deadline = time.Now().Add(s.timeout)
	if err := s.rc.SetWriteDeadline(s.deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("set write deadline: %w", err)
	}
	for _, p := range parts {
		if _, err := s.w.Write(p); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if err := s.rc.SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("clear write deadline: %w", err)
	}
	return nil
}

// TimedOut reports whether err, returned by the last Send, means that the
// reader did not take the line within the send timeout: a deadline error,
// or any error once the deadline had passed (over HTTP/2 the deadline's
// timer resets the stream, and the write may see the reset rather than a
// timeout).
func (s *Stream) TimedOut(err error) bool {
	return err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(s.deadline))
}

// Mailbox hands one watch stream the latest value to write, never a queue
// (a value posted before the previous one was taken replaces it), and
// tells it to end, with a reason. It has a lock of its own, taken after any
// lock of its callers and never around a call out, so that a publisher may
// post while holding its own lock.
type Mailbox struct {
	notify chan struct{} // capacity 1: "a value was posted"
	done   chan struct{} // closed by End

	mu      sync.Mutex
	pending []byte
	ended   bool
	reason  string
}

// NewMailbox returns an open, empty mailbox.
func NewMailbox() *Mailbox {
	return &Mailbox{notify: make(chan struct{}, 1), done: make(chan struct{})}
}

// Post replaces the pending value by v and wakes the stream; it reports
// false (and drops v) when the mailbox has ended.
func (m *Mailbox) Post(v []byte) bool {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return false
	}
	m.pending = v
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
	return true
}

// Take returns and clears the pending value (nil when none); open is false
// once the mailbox has ended.
func (m *Mailbox) Take() (v []byte, open bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, m.pending = m.pending, nil
	return v, !m.ended
}

// End tells the stream to end for reason and drops the pending value; it
// reports whether the mailbox was still open (the first reason is kept).
func (m *Mailbox) End(reason string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return false
	}
	m.ended, m.reason, m.pending = true, reason, nil
	close(m.done)
	return true
}

// Ended reports whether End was called.
func (m *Mailbox) Ended() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ended
}

// Reason returns the reason End was given ("" while open).
func (m *Mailbox) Reason() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reason
}

// Posted is ready when a value was posted since the last receive from it.
func (m *Mailbox) Posted() <-chan struct{} { return m.notify }

// Done is closed when the mailbox ends.
func (m *Mailbox) Done() <-chan struct{} { return m.done }
