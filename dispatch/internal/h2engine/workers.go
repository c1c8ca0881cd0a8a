package h2engine

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/panicguard"
)

// The goroutines that run handlers: startStream starts a stream's
// handler on a goroutine that served an earlier stream of the connection
// (handed over by nextStream), else on a spare goroutine that served a
// stream of any connection (spareWorkers), else on a new one; when the
// handler has returned, finishStream closes the stream and gives its place
// among the MaxConcurrentStreams back.

// startStream opens st and runs its handler, or refuses it.
func (c *Conn) startStream(st *Stream, endStream bool) error {
	c.mu.Lock()
	if c.closing || c.draining || c.live >= int(c.cfg.MaxConcurrentStreams) {
		c.remember(st.id, true)
		c.mu.Unlock()
		id := st.id
		st.recycle()
		if !c.chargeReset() {
			return errRapidReset
		}
		c.report(ErrorEvent{StreamID: id, Code: http2.ErrCodeRefusedStream, Reason: "too many concurrent streams"})
		return c.queueCtrlFromReader(ctrlFrame{kind: ctrlRST, id: id, val: uint32(http2.ErrCodeRefusedStream)})
	}
	st.sendWin = c.peerInitWin
	st.remoteClosed = endStream
	if endStream && st.ContentLength < 0 {
		st.ContentLength = 0 // no body: HEADERS ended the stream
	}
	c.streams = append(c.streams, st)
	c.live++
	c.mu.Unlock()
	select {
	case c.handoff <- st: // a goroutine that served a stream takes it
		return nil
	default:
	}
	c.wg.Add(1)
	select {
	case spareWorkers <- spareJob{c, st}: // a spare goroutine takes it
	default:
		go runWorker(c, st)
	}
	return nil
}

// runStreams runs the handler of st, then finishes the stream; then,
// while other streams of the connection run, it waits to serve the next
// new stream (nextStream). A goroutine that served a request has grown
// its stack to what a handler needs: reusing it spares the next stream
// the goroutine's start and the stack growth.
func (c *Conn) runStreams(st *Stream) {
	defer c.wg.Done()
	for st != nil {
		c.runStream(st)
		st = c.nextStream()
	}
}

// Spare goroutines. A connection with one stream at a time (a browser's
// or a client's request after request, h2load -m1) has no other stream
// running when its handler returns, so nextStream lets the goroutine end,
// and the next request's handler would start on a new goroutine whose
// stack grows again to what a handler needs (the copies cost about a
// tenth of the CPU of such a request: the TLS write's frames are deep).
// Instead the goroutine waits as a spare, for a stream of any connection,
// up to spareIdle; at most maxSpares wait at once. A connection's flusher
// (write.go) runs on a spare as well: its TLS write needs the same stack. A spare belongs to no
// connection while it waits (the connection it served has counted it out
// of its WaitGroup), so an idle connection still holds no goroutine but
// its reader, and a spare ends on its own soon after the load stops.

// spareJob is a stream handed to a spare goroutine, with its connection
// (which has counted the goroutine in its WaitGroup); without a stream,
// the connection's flusher (runFlusher) is to run.
type spareJob struct {
	c  *Conn
	st *Stream
}

// spareWorkers hands streams to the spare goroutines waiting in
// waitSpare.
var spareWorkers = make(chan spareJob)

// spares counts the goroutines waiting in waitSpare.
var spares atomic.Int32

// defaultSpareIdle is how long a spare goroutine waits for a stream
// before it ends (spareIdle).
const defaultSpareIdle = 20 * time.Millisecond

// spareIdleOverride, when positive, replaces defaultSpareIdle: tests that
// must find a spare still waiting on a loaded machine lengthen it.
var spareIdleOverride atomic.Int64

// spareIdle is how long a spare goroutine waits for a stream before it
// ends.
func spareIdle() time.Duration {
	if d := spareIdleOverride.Load(); d > 0 {
		return time.Duration(d)
	}
	return defaultSpareIdle
}

// maxSpares bounds the spare goroutines waiting at once (at a handler's
// stack of 16 to 32 KiB, a few MiB, for spareIdle after the load stops):
// enough for the bursts of a few connections with 100 streams each, whose
// goroutines all end when a burst is over (nextStream).
const maxSpares = 256

// runWorker serves st on c (runStreams), or runs c's flusher when st is
// nil, then, as a spare, the streams and flushers of any connection handed
// to it, until none comes for spareIdle.
func runWorker(c *Conn, st *Stream) {
	var idle *time.Timer
	for {
		if st == nil {
			c.runFlusher()
		} else {
			c.runStreams(st)
		}
		job, ok := waitSpare(&idle)
		if !ok {
			return
		}
		c, st = job.c, job.st
	}
}

// waitSpare waits, as one of at most maxSpares spare goroutines, up to
// spareIdle for a stream; false: none came, or there are spares enough.
// idle is the goroutine's timer, made on its first wait.
func waitSpare(idle **time.Timer) (spareJob, bool) {
	if spares.Add(1) > maxSpares {
		spares.Add(-1)
		return spareJob{}, false
	}
	defer spares.Add(-1)
	if *idle == nil {
		*idle = time.NewTimer(spareIdle())
	} else {
		(*idle).Reset(spareIdle())
	}
	select {
	case job := <-spareWorkers:
		(*idle).Stop()
		return job, true
	case <-(*idle).C:
		return spareJob{}, false
	}
}

// runStream runs the handler of st, then finishes the stream.
func (c *Conn) runStream(st *Stream) {
	defer func() {
		if r := recover(); r != nil {
			c.panicked(panicguard.H2Stream, r)
			c.report(ErrorEvent{StreamID: st.id, Code: http2.ErrCodeInternal, Reason: fmt.Sprintf("handler panic: %v", r)})
		}
		c.finishStream(st)
	}()
	c.h.ServeStream(st)
}

// nextStream waits for a new stream to serve, handed over by startStream;
// nil: the goroutine ends. It waits only while other streams of the
// connection run (their peers are likely to open more), at most
// MaxConcurrentStreams of them, and at most until the connection timer's
// next tick: an idle connection, or one that holds only a long-lived
// stream (a WebSocket), keeps no waiting goroutines.
func (c *Conn) nextStream() *Stream {
	c.mu.Lock()
	if c.live == 0 || c.closing || c.idleWorkers.Load() >= int32(min(c.cfg.MaxConcurrentStreams, 1<<30)) {
		c.mu.Unlock()
		return nil
	}
	if c.workersQuit == nil {
		c.workersQuit = make(chan struct{})
	}
	quit := c.workersQuit
	c.idleWorkers.Add(1)
	c.mu.Unlock()
	defer c.idleWorkers.Add(-1)
	select {
	case st := <-c.handoff:
		return st
	case <-quit:
		return nil
	}
}

// releaseWorkersLocked ends the goroutines waiting in nextStream (c.mu
// held).
func (c *Conn) releaseWorkersLocked() {
	if c.workersQuit != nil {
		close(c.workersQuit)
		c.workersQuit = nil
	}
}

// finishStream closes st once its handler has returned: a response not
// ended is reset (INTERNAL_ERROR); a request still being sent after a
// complete response is stopped (NO_ERROR, RFC 9113 8.1). An AfterReset
// function the handler left set (it panicked, say) runs then, as
// AfterReset promises.
func (c *Conn) finishStream(st *Stream) {
	c.mu.Lock()
	var code http2.ErrCode
	send := false
	var after func() // the handler's AfterReset, left set (it panicked)
	if !st.closed {
		code, send = http2.ErrCodeInternal, true
		if st.localClosed {
			code = http2.ErrCodeNo
		}
		after = st.resetLocked(streamResetError{code: code, byUs: true})
	}
	c.live--
	idle := c.live == 0
	if idle {
		c.idleSince = c.now()
		c.releaseWorkersLocked()
	}
	drained := idle && c.draining
	c.mu.Unlock()
	if after != nil {
		after() // e.g. closes the upstream connection the handler held
	}
	if send {
		c.queueCtrl(ctrlFrame{kind: ctrlRST, id: st.id, val: uint32(code)})
		c.lockWrite()
		_ = c.unlockWrite(true)
	}
	st.recycle()
	if drained {
		c.closeNow()
	}
}
