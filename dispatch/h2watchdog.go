package dispatch

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// h2Watchdogs bound one blocking read of the request body and one
// blocking write to the client. A watchdog that fires closes the request
// body (the read fails) or resets the stream (the write fails). Each is
// armed only around the blocking call, so an idle stream (server-sent
// events) is never cut.
type h2Watchdogs struct {
	timeout time.Duration
	mu      sync.Mutex
	stopped bool
	readTO  bool // the read watchdog fired
	read    *time.Timer
	write   *time.Timer
	body    io.Closer
	rc      *http.ResponseController
}

func (d *h2Watchdogs) init(timeout time.Duration) { d.timeout = timeout }

func (d *h2Watchdogs) armRead(body io.Closer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.body = body
	if d.read == nil {
		d.read = time.AfterFunc(d.timeout, d.fireRead)
		return
	}
	d.read.Reset(d.timeout)
}

func (d *h2Watchdogs) disarmRead() {
	d.mu.Lock()
	d.read.Stop()
	d.mu.Unlock()
}

func (d *h2Watchdogs) armWrite(rc *http.ResponseController) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rc = rc
	if d.write == nil {
		d.write = time.AfterFunc(d.timeout, d.fireWrite)
		return
	}
	d.write.Reset(d.timeout)
}

func (d *h2Watchdogs) disarmWrite() {
	d.mu.Lock()
	d.write.Stop()
	d.mu.Unlock()
}

func (d *h2Watchdogs) fireRead() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		d.readTO = true
		_ = d.body.Close()
	}
}

func (d *h2Watchdogs) readTimedOut() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.readTO
}

func (d *h2Watchdogs) fireWrite() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		// A deadline in the past resets the stream at once.
		_ = d.rc.SetWriteDeadline(time.Now().Add(-time.Second))
	}
}

// stop disables both for good; it returns after a running one has finished
// (the ResponseWriter must not be used once the handler has returned).
func (d *h2Watchdogs) stop() {
	d.mu.Lock()
	d.stopped = true
	if d.read != nil {
		d.read.Stop()
	}
	if d.write != nil {
		d.write.Stop()
	}
	d.mu.Unlock()
}
