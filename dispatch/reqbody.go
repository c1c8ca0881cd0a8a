package dispatch

import (
	"errors"
	"net"
	"sync"
	"time"
)

// copyRequestBody streams the request body to the app. When the client
// side fails (a malformed body, a stalled or vanished client), it closes the
// app connection, so that the wait for a response ends at once.
func (c *clientConn) copyRequestBody(bc *backendConn) error {
	defer func() { c.in.src = c.conn }()
	w := appWriter{bc.conn, c.s.cfg.BodyTimeout, c}
	var n int64
	var err error
	switch c.req.body {
	case bodyLength:
		n, err = copyN(w, &c.in, c.req.length, nil)
	case bodyChunked:
		n, err = copyChunked(w, &c.in, true, nil)
	}
	c.s.m.bytesToApp.Add(float64(n))
	c.bodyIn.Store(n)
	if err != nil && !isAppWriteError(err) {
		_ = bc.conn.Close()
	}
	return err
}

// detachedHead is a copy of the parts of a request head needed after its
// buffer has been handed to the body copy.
type detachedHead struct {
	accept   []byte
	navigate bool
	method   string
	path     string
}

// deadlineReader sets a read deadline before each read of a request body;
// abort makes the body copy stop at once.
type deadlineReader struct {
	conn    net.Conn
	timeout time.Duration
	mu      sync.Mutex
	aborted bool
	pause   throttlePause // the body's byte-rate pauses (ratelimit.go); abort ends them
}

var errBodyAborted = errors.New("request body aborted")

// start prepares the reader for one request body.
func (d *deadlineReader) start(conn net.Conn, timeout time.Duration) {
	d.mu.Lock()
	d.conn, d.timeout, d.aborted = conn, timeout, false
	d.mu.Unlock()
	d.pause.reset()
}

// appWriter marks write errors towards the app, to tell them apart from
// failures on the client side of a body copy. Each write must make
// progress within timeout (a long upload is not bounded as a whole).
type appWriter struct {
	conn    net.Conn
	timeout time.Duration
	c       *clientConn // whose instance's byte rate the body is under
}

type appWriteError struct{ err error }

func (e *appWriteError) Error() string { return "write to app: " + e.err.Error() }

func (e *appWriteError) Unwrap() error { return e.err }

func (w appWriter) Write(p []byte) (int, error) {
	w.c.throttleRequest(len(p)) // ratelimit.go
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	n, err := w.conn.Write(p)
	if err != nil {
		err = &appWriteError{err}
	}
	return n, err
}

func isAppWriteError(err error) bool {
	var we *appWriteError
	return errors.As(err, &we)
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	d.mu.Lock()
	if d.aborted {
		d.mu.Unlock()
		return 0, errBodyAborted
	}
	_ = d.conn.SetReadDeadline(time.Now().Add(d.timeout))
	d.mu.Unlock()
	return d.conn.Read(p)
}

func (d *deadlineReader) abort() {
	d.mu.Lock()
	d.aborted = true
	_ = d.conn.SetReadDeadline(time.Now())
	d.mu.Unlock()
	d.pause.cancel()
}
