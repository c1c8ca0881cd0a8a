package sock

import (
	"net"
	"syscall"
	"time"
)

// ReplyWait writes a request on a connection and waits for the answer's
// first bytes to be readable, without the read(2) that Go's own Read would
// try first and that finds nothing in almost every case (the peer has not
// answered yet): the write is made inside a syscall.RawConn.Read whose
// function then asks the runtime poller to wait. Writing inside the read is
// what makes the wait safe: the read forgets earlier readiness notifications
// before it calls the function, so bytes that arrived before the write
// could be missed, but the answer to the request can only arrive after it.
// A connection without a socket (tests' pipes), or one outside Unix, is
// written to as usual.
type ReplyWait struct {
	conn  net.Conn
	raw   syscall.RawConn
	fn    func(fd uintptr) bool
	head  []byte
	wrote bool
	n     int
	err   error
	at    time.Time
	// spin, when positive, is how long the wait polls for the answer
	// before it parks (WriteAwaitSpin); spun reports that it came then.
	spin time.Duration
	spun bool
}

// Init prepares the wait for conn, once per connection (nothing is
// allocated per request).
func (w *ReplyWait) Init(conn net.Conn) {
	w.conn = conn
	if !rawReadWait {
		return
	}
	w.raw = Raw(conn)
	if w.raw == nil {
		return
	}
	w.fn = func(fd uintptr) bool {
		if w.wrote {
			return true // readable (or failed): the read that follows tells
		}
		w.wrote = true
		w.n, w.err = w.conn.Write(w.head)
		w.at = time.Now()
		if w.err != nil {
			return true
		}
		return w.spin > 0 && w.poll(fd)
	}
}

// poll checks, until spin has passed since the write, whether the answer
// is readable; each check is one non-blocking peek.
func (w *ReplyWait) poll(fd uintptr) bool {
	deadline := w.at.Add(w.spin)
	for {
		if peekReadable(fd) {
			w.spun = true
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
	}
}

// WriteAwait writes head and then waits until the peer's answer can be
// read, the connection's read deadline passes, or it fails; a wait that
// ends without bytes is left to the read that follows. It returns the
// write's outcome and when it ended.
func (w *ReplyWait) WriteAwait(head []byte) (int, time.Time, error) {
	n, at, err, _ := w.WriteAwaitSpin(head, 0)
	return n, at, err
}

// WriteAwaitSpin is WriteAwait that first polls for the answer for up to
// spin after the write (one non-blocking peek after another) before it
// parks; spun reports that the answer came while it polled. A goroutine
// that parks is woken by the runtime's poller only when the run queue is
// empty, which on a busy core can be milliseconds; an app that answers
// within the spin is caught without it.
func (w *ReplyWait) WriteAwaitSpin(head []byte, spin time.Duration) (n int, at time.Time, err error, spun bool) {
	if w.raw == nil {
		n, err := w.conn.Write(head)
		return n, time.Now(), err, false
	}
	w.head, w.wrote, w.n, w.err, w.spin, w.spun = head, false, 0, nil, spin, false
	_ = w.raw.Read(w.fn)
	w.head = nil
	if !w.wrote {
		// The read failed before the function ran (closed, or a deadline
		// already past): write as usual, the error comes from there.
		n, err := w.conn.Write(head)
		return n, time.Now(), err, false
	}
	return w.n, w.at, w.err, w.spun
}
