package dispatch

import "runtime"

// Between two requests on an HTTP/1.1 keep-alive connection, the serving
// goroutine yields once before it reads the next request (when no
// pipelined bytes are buffered). A client sends its next request only
// after it has read the response just written, so a read made at once
// nearly always fails with EAGAIN, and the goroutine parks and is woken
// again by the poller: two system calls and two switches for one request.
// Under load, other connections' goroutines are runnable: the yield lets
// them go first, and by the time this one reads, its client's request has
// usually arrived. With nothing else to run, the yield returns at once.
//
// Waiting for readiness before reading instead would be cheaper still, but
// it is unsafe with Go's poller: a wait forgets the readiness reported
// before it starts, so bytes that arrived meanwhile (a pipelined request)
// would not wake it.

// keepAliveYield is how the loop yields (a test replaces it).
var keepAliveYield = runtime.Gosched

// yieldBeforeNextRequest yields before the next request is read, unless
// bytes of it are already at hand.
func (c *clientConn) yieldBeforeNextRequest() {
	if c.in.buffered() == 0 && len(c.pending) == 0 && !c.parksAtOnce() {
		keepAliveYield()
	}
}
