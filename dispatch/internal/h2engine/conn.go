package h2engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/panicguard"
)

// clientPreface is what every HTTP/2 connection starts with.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Conn is one HTTP/2 server connection.
type Conn struct {
	nc  net.Conn
	cfg Config
	h   Handler

	// Read side: only the goroutine running Serve touches these.
	clock headClock     // wraps nc for reading
	br    readBuf       // over clock (readbuf.go)
	fr    *http2.Framer // reads from br; its writes go to out, under wmu
	dec   *hpack.Decoder
	hb    headerBlock
	// sawSettings: the client's first frame (its SETTINGS) arrived.
	sawSettings bool
	// settingsAcked: the client acknowledged the server's SETTINGS.
	settingsAcked bool
	// resets bounds streams ended before their handler answered (rapid
	// reset, MadeYouReset); invalid bounds the stream errors the client's
	// frames cause (defences.go).
	resets, invalid tokenBucket

	// Write side (write.go): wmu guards out, enc, hbuf and werr.
	wmu       sync.Mutex
	pending   atomic.Int32 // writers holding or waiting for wmu
	out       outBuf
	enc       *hpack.Encoder
	hbuf      bytes.Buffer
	needFlush bool
	werr      error
	wdeadline time.Time // the write deadline last set on nc
	// fixedDeadline: closing; the deadline set for the GOAWAY stays.
	fixedDeadline atomic.Bool
	// encTableSize is the peer's SETTINGS_HEADER_TABLE_SIZE not yet
	// applied to enc (-1: none).
	encTableSize atomic.Int64
	peerMaxFrame atomic.Uint32
	flushes      atomic.Uint64 // writes of the buffer to nc

	// Control frames queued by the reading goroutine (write.go).
	ctrlMu    sync.Mutex
	ctrl      []ctrlFrame
	ctrlSpare []ctrlFrame // the other buffer, written under wmu
	ctrlN     atomic.Int32
	ctrlFlood atomic.Bool // queueCtrl found the queue full
	flusherOn atomic.Bool
	// flushOwed: frames that ended a response are buffered for the
	// flusher (endAndFlush).
	flushOwed atomic.Bool

	// mu guards the connection and stream state below and the fields of
	// its streams documented as such.
	mu         sync.Mutex
	streams    []*Stream // open and half-closed streams
	live       int       // streams whose handler has not returned, or not closed
	maxSeen    uint32    // highest client stream id seen
	goAwayID   uint32    // last stream id of the GOAWAY sent
	goAwaySent bool
	// started: the server preface is written; a Shutdown before it is
	// held in shutdownPending and done right after it.
	started         bool
	shutdownPending bool
	draining        bool // Shutdown or the client's GOAWAY: no new streams
	closing         bool // the connection is being closed
	closed          bool // Serve is cleaning up: no new goroutines
	sendWin         int64
	peerInitWin     int64
	recvAvail       int64 // connection receive window left
	recvUnacked     int64 // consumed, not yet given back by WINDOW_UPDATE
	waiters         []*Stream
	recent          [32]recentStream
	recentI         int
	idleSince       int64 // clock time when live last became 0
	pingSentAt      int64 // clock time of the outstanding PING (0: none)

	epoch    time.Time
	lastRead atomic.Int64 // clock time of the last read from nc
	timer    *time.Timer
	wg       sync.WaitGroup // handlers and the control flusher

	// Stream goroutines waiting for a new stream (nextStream): handoff
	// passes it; closing workersQuit (guarded by mu) ends their wait.
	handoff     chan *Stream
	workersQuit chan struct{}
	idleWorkers atomic.Int32
}

// recentStream remembers a closed stream: frames on it get STREAM_CLOSED,
// or are ignored when the engine reset it (they may have been in flight).
type recentStream struct {
	id        uint32
	resetByUs bool
}

// NewConn prepares nc, a connection that negotiated HTTP/2 (or carries
// h2c with prior knowledge), to be served by Serve. nc's Close must end
// the connection at once (a TLS connection's raw TCP connection, say).
func NewConn(nc net.Conn, cfg Config, h Handler) *Conn {
	cfg.setDefaults()
	c := &Conn{nc: nc, cfg: cfg, h: h, epoch: time.Now(), handoff: make(chan *Stream)}
	c.clock.init(c, nc, cfg.HeaderTimeout)
	c.br.src = &c.clock
	c.fr = http2.NewFramer(&c.out, &c.br)
	c.fr.SetMaxReadFrameSize(cfg.MaxFrameSize)
	c.fr.SetReuseFrames()
	c.dec = hpack.NewDecoder(headerTableMax, c.onField)
	// A field over the header list limit is decoded (and answered 431);
	// only one beyond what a header block may hold fails the connection.
	c.dec.SetMaxStringLength(maxBlockBytes(&cfg))
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.out.c = c
	c.encTableSize.Store(-1)
	c.peerMaxFrame.Store(minFrameSize)
	c.sendWin = initialWindow
	c.peerInitWin = initialWindow
	c.recvAvail = int64(cfg.ConnWindowSize)
	c.resets.init(cfg.MaxResetBurst, cfg.MaxResetRate)
	c.invalid.init(cfg.MaxInvalidFrameBurst, cfg.MaxInvalidFrameRate)
	return c
}

// ServeConn serves HTTP/2 on nc until the connection ends and every
// stream handler has returned.
func ServeConn(nc net.Conn, cfg Config, h Handler) error {
	return NewConn(nc, cfg, h).Serve()
}

// now is the connection's monotonic clock.
func (c *Conn) now() int64 { return int64(time.Since(c.epoch)) }

// Serve serves the connection; it returns when the connection has ended
// and every stream handler has returned. The error tells why it ended
// (nil: the peer or Shutdown closed it normally).
func (c *Conn) Serve() error {
	err := c.serveRecovering()
	c.mu.Lock()
	c.closing, c.closed = true, true
	c.releaseWorkersLocked()
	var calls []func()
	for len(c.streams) > 0 {
		st := c.streams[len(c.streams)-1]
		if f := st.resetLocked(errConnClosed); f != nil {
			calls = append(calls, f)
		}
		c.removeLocked(st) // when it was already closed
	}
	c.mu.Unlock()
	for _, f := range calls {
		f()
	}
	_ = c.nc.Close()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.wg.Wait()
	c.br.release()
	// Under the write lock: a Shutdown that began before the connection
	// ended may still be writing its GOAWAY.
	c.wmu.Lock()
	c.out.release()
	c.wmu.Unlock()
	return err
}

// serveRecovering is serve; a panic closes the connection (Serve then
// ends its streams as for any other end) and is reported (panicked).
func (c *Conn) serveRecovering() (err error) {
	defer func() {
		if r := recover(); r != nil {
			_ = c.nc.Close()
			c.panicked(panicguard.H2Conn, r)
			err = fmt.Errorf("h2engine: panic: %v", r)
		}
	}()
	panicguard.Point(panicguard.H2Conn, c.cfg.Identity)
	return c.serve()
}

// panicked reports a recovered panic (Config.OnPanic); it must be called
// from the recovering deferred function.
func (c *Conn) panicked(where string, r any) {
	if c.cfg.OnPanic != nil {
		c.cfg.OnPanic(where, r)
		return
	}
	panicguard.Report(nil, where, r)
}

func (c *Conn) serve() error {
	c.writePreface()
	c.mu.Lock()
	c.started = true
	pending := c.shutdownPending
	c.mu.Unlock()
	if pending {
		c.Shutdown()
	}
	c.startTimer()
	var pre [len(clientPreface)]byte
	if _, err := io.ReadFull(&c.br, pre[:]); err != nil {
		return c.readFailed(err)
	}
	if string(pre[:]) != clientPreface {
		return c.connError(http2.ErrCodeProtocol, "invalid connection preface")
	}
	for {
		fh, err := c.fr.ReadFrameHeader()
		switch {
		case err != nil:
		case fh.Type == http2.FrameHeaders:
			err = c.readHeaders(fh)
		default:
			var f http2.Frame
			f, err = c.fr.ReadFrameForHeader(fh)
			if err != nil && fh.Type == http2.FrameContinuation && isStreamError(err) {
				// A CONTINUATION frame that cannot be parsed leaves HPACK
				// out of step: the connection cannot go on.
				err = connError{http2.ErrCodeProtocol, "malformed " + fh.Type.String() + " frame"}
			}
			if err == nil {
				err = c.processFrame(f)
			}
		}
		if err == nil && c.ctrlFlood.Load() {
			err = errCtrlFlood
		}
		if err == nil {
			continue
		}
		if done, rerr := c.handleError(err); done {
			return rerr
		}
	}
}

// isStreamError reports whether err is the Framer's http2.StreamError. It
// is a function of its own so that the target errors.As needs escapes to
// the heap only on this error path, not for every frame read.
func isStreamError(err error) bool {
	var hse http2.StreamError
	return errors.As(err, &hse)
}

// Errors the reading goroutine acts on.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string { return fmt.Sprintf("connection error %v: %s", e.code, e.reason) }

type streamError struct {
	id     uint32
	code   http2.ErrCode
	reason string
}

func (e streamError) Error() string {
	return fmt.Sprintf("stream %d error %v: %s", e.id, e.code, e.reason)
}

// errConnClosed resets streams when the connection ends.
var errConnClosed = ErrConnClosed

// handleError answers err; done: the connection is over.
func (c *Conn) handleError(err error) (done bool, _ error) {
	var ce connError
	var se streamError
	var hse http2.StreamError
	var hce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		return c.clientStreamError(se.id, se.code, se.reason)
	case errors.As(err, &ce):
		return true, c.connError(ce.code, ce.reason)
	case c.clock.err != nil:
		return true, c.readFailed(c.clock.err)
	case errors.As(err, &hse):
		reason := "invalid frame"
		if d := c.fr.ErrorDetail(); d != nil {
			reason = d.Error()
		}
		return c.clientStreamError(hse.StreamID, hse.Code, reason)
	case errors.As(err, &hce):
		reason := "invalid frame"
		if d := c.fr.ErrorDetail(); d != nil {
			reason = d.Error()
		}
		return true, c.connError(http2.ErrCode(hce), reason)
	case errors.Is(err, http2.ErrFrameTooLarge):
		return true, c.connError(http2.ErrCodeFrameSize, "frame larger than SETTINGS_MAX_FRAME_SIZE")
	default:
		// A frame the Framer could not parse (a pad length beyond the
		// payload, say): the bytes were read, so it is no I/O error.
		return true, c.connError(http2.ErrCodeProtocol, "malformed frame: "+err.Error())
	}
}

// readFailed ends the connection after a failed read.
func (c *Conn) readFailed(err error) error {
	if c.clock.timedOutInHead() {
		c.report(ErrorEvent{Code: http2.ErrCodeNo, Reason: "request header timeout"})
		c.closeNow()
		return fmt.Errorf("h2engine: request header timeout: %w", err)
	}
	c.closeNow()
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("h2engine: read: %w", err)
}

func (c *Conn) report(ev ErrorEvent) {
	if c.cfg.OnError != nil {
		c.cfg.OnError(ev)
	}
}

// connError sends GOAWAY with code and closes the connection.
func (c *Conn) connError(code http2.ErrCode, reason string) error {
	c.report(ErrorEvent{Code: code, Reason: reason})
	c.goAwayAndClose(code, reason)
	return fmt.Errorf("h2engine: connection error %v: %s", code, reason)
}

// streamError resets stream id with code (RST_STREAM), whatever its
// state; wasOpen: the stream was open or half-closed (its handler, if
// running, sees the reset).
func (c *Conn) streamError(id uint32, code http2.ErrCode, reason string) (wasOpen bool) {
	c.report(ErrorEvent{StreamID: id, Code: code, Reason: reason})
	c.mu.Lock()
	var f func()
	if st := c.lookup(id); st != nil {
		wasOpen = true
		f = st.resetLocked(streamResetError{code: code, byUs: true})
	} else {
		c.remember(id, true)
	}
	c.mu.Unlock()
	if f != nil {
		f()
	}
	c.queueCtrl(ctrlFrame{kind: ctrlRST, id: id, val: uint32(code)})
	c.kickCtrl()
	return wasOpen
}

// lookup returns the open or half-closed stream id (c.mu held).
func (c *Conn) lookup(id uint32) *Stream {
	for _, st := range c.streams {
		if st.id == id {
			return st
		}
	}
	return nil
}

// remember records a closed stream (c.mu held).
func (c *Conn) remember(id uint32, resetByUs bool) {
	c.recent[c.recentI] = recentStream{id: id, resetByUs: resetByUs}
	c.recentI = (c.recentI + 1) % len(c.recent)
}

// recentlyClosed reports whether id was closed lately and by whom (c.mu
// held).
func (c *Conn) recentlyClosed(id uint32) (found, resetByUs bool) {
	for _, r := range c.recent {
		if r.id == id {
			return true, r.resetByUs
		}
	}
	return false, false
}

// removeLocked takes st out of the open streams (c.mu held).
func (c *Conn) removeLocked(st *Stream) {
	for i, s := range c.streams {
		if s == st {
			last := len(c.streams) - 1
			c.streams[i] = c.streams[last]
			c.streams[last] = nil
			c.streams = c.streams[:last]
			return
		}
	}
}

// Shutdown starts a graceful close: GOAWAY with the last stream id
// processed, no new streams, and the connection closes once its streams
// are done. It does not wait; Serve returns when the connection ends.
// Called before Serve has written the server preface, it takes effect
// right after it.
func (c *Conn) Shutdown() {
	c.mu.Lock()
	if c.closing || c.goAwaySent {
		c.mu.Unlock()
		return
	}
	if !c.started {
		c.shutdownPending = true
		c.mu.Unlock()
		return
	}
	c.draining, c.goAwaySent, c.goAwayID = true, true, c.maxSeen
	id, idle := c.goAwayID, c.live == 0
	c.mu.Unlock()
	c.lockWrite()
	if c.werr == nil {
		_ = c.fr.WriteGoAway(id, http2.ErrCodeNo, nil)
	}
	_ = c.unlockWrite(true)
	if idle {
		c.closeNow()
	}
}

// Close ends the connection at once (revocation): every stream is reset
// and its handler's reads and writes fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	return c.nc.Close()
}

// goAwayAndClose sends GOAWAY(code) and closes the connection, spending
// at most a second (or the write timeout) on a peer that does not read.
func (c *Conn) goAwayAndClose(code http2.ErrCode, reason string) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.closing = true
	id := c.maxSeen
	if c.goAwaySent {
		id = min(id, c.goAwayID)
	}
	c.goAwaySent, c.goAwayID = true, id
	c.mu.Unlock()
	c.fixedDeadline.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(min(time.Second, c.cfg.WriteTimeout)))
	c.lockWrite()
	if c.werr == nil {
		var debug []byte
		if code != http2.ErrCodeNo {
			debug = []byte(reason)
		}
		_ = c.fr.WriteGoAway(id, code, debug)
	}
	c.unlockWriteFlush()
	_ = c.nc.Close()
}

// closeNow closes the connection after flushing what is buffered.
func (c *Conn) closeNow() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.fixedDeadline.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(min(time.Second, c.cfg.WriteTimeout)))
	c.lockWrite()
	c.unlockWriteFlush()
	_ = c.nc.Close()
}
