package dispatch

import (
	"sync"
	"time"
)

// The app's response-head timeout (Config.ResponseHeaderTimeout) starts
// only once the request body has been sent: an app that reads a slow
// upload for longer than the timeout and then answers gets its answer
// through. While the body copy runs, the wait for the head has no
// deadline of its own; the copy is bounded by Config.BodyTimeout on both
// sides (a client that stops sending, an app that stops reading), and when
// it returns, whatever the outcome, the head timeout starts. An app that
// answers before it has read the whole body is relayed at once as before.

// headWait hands the start of the response-head timeout from the body
// copy to the reader of the head, without a race between the two.
type headWait struct {
	mu      sync.Mutex
	copied  bool // the body copy has returned
	waiting bool // a head is being waited for without a deadline
}

// armHeadTimeout sets the read deadline for the next response head:
// ResponseHeaderTimeout from now when the request body has been sent (or
// there is none), none while it is still being copied.
func (x *exchange) armHeadTimeout() {
	if x.body == nil {
		_ = x.bc.conn.SetReadDeadline(time.Now().Add(x.s.cfg.ResponseHeaderTimeout))
		return
	}
	x.hw.mu.Lock()
	defer x.hw.mu.Unlock()
	if x.hw.copied {
		_ = x.bc.conn.SetReadDeadline(time.Now().Add(x.s.cfg.ResponseHeaderTimeout))
		return
	}
	_ = x.bc.conn.SetReadDeadline(time.Time{})
	x.hw.waiting = true
}

// bodyCopied runs when the body copy on bc returns: a head waited for
// without a deadline now gets ResponseHeaderTimeout.
func (x *exchange) bodyCopied(bc *backendConn) {
	x.hw.mu.Lock()
	defer x.hw.mu.Unlock()
	x.hw.copied = true
	if x.hw.waiting {
		_ = bc.conn.SetReadDeadline(time.Now().Add(x.s.cfg.ResponseHeaderTimeout))
	}
}
