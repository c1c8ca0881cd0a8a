package h2engine

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Stream is one request stream. The request fields are set before
// ServeStream is called and stay valid until it returns. Read may be
// called concurrently with the write methods (a WebSocket's two
// directions); the write methods must not be called concurrently with
// each other. Done, Err, AfterReset and Reset may be called from any
// goroutine while ServeStream runs.
type Stream struct {
	c  *Conn
	id uint32

	// Method, Scheme, Authority, Path and Protocol are the request's
	// pseudo-header fields (":protocol" of an RFC 8441 extended CONNECT);
	// empty when absent.
	Method, Scheme, Authority, Path, Protocol string
	// Header holds the request's regular fields in order, names
	// lowercase; a cookie split in crumbs comes as several fields.
	Header []HeaderField
	// ContentLength is the request's content-length, -1 when absent and
	// a body may follow (0 when the HEADERS frame ended the stream). The
	// engine checks it against the DATA received.
	ContentLength int64
	// Trailer holds the request's trailers once Read has returned io.EOF.
	Trailer []HeaderField

	// Guarded by c.mu.
	remoteClosed bool // END_STREAM received
	localClosed  bool // END_STREAM sent
	closed       bool // out of the connection's streams
	resetErr     error
	recvBuf      []byte
	recvOff      int
	recvAvail    int64 // stream receive window left
	recvUnacked  int64
	recvTotal    int64
	sendWin      int64
	done         chan struct{}
	doneClosed   bool
	afterReset   func()
	readWaiting  bool
	writeWaiting bool
	readClosed   bool // CloseRead: reads fail with ErrReadClosed

	readWake, writeWake chan struct{}

	// readTimeout bounds one blocking Read (SetReadTimeout).
	readTimeout time.Duration

	// The handler's goroutine only.
	headersDone bool // final headers written
	ended       bool // END_STREAM written
	rst         atomic.Bool
	// unflushed is 1 + the connection's flush count when the stream last
	// left frames buffered (0: none); Read flushes them before waiting.
	unflushed atomic.Uint64
}

// streamResetError is the error of a stream that was reset (errors.Is
// matches it with ErrStreamReset): code, and whether the engine (or the
// handler) reset it rather than the client.
type streamResetError struct {
	code http2.ErrCode
	byUs bool
}

func (e streamResetError) Error() string {
	if e.byUs {
		return fmt.Sprintf("h2engine: stream reset (%v)", e.code)
	}
	return fmt.Sprintf("h2engine: stream reset by the client (%v)", e.code)
}

func (e streamResetError) Is(target error) bool { return target == ErrStreamReset }

var streamPool = sync.Pool{New: func() any {
	return &Stream{readWake: make(chan struct{}, 1), writeWake: make(chan struct{}, 1)}
}}

// newStream returns a pooled stream for id.
func newStream(c *Conn, id uint32) *Stream {
	st := streamPool.Get().(*Stream)
	st.c, st.id = c, id
	st.ContentLength = -1
	st.recvAvail = int64(c.cfg.InitialWindowSize)
	st.readTimeout = c.cfg.ReadTimeout
	return st
}

// SetReadTimeout replaces Config.ReadTimeout for this stream's reads (0:
// unbounded; a WebSocket, say). It must be called before the reads it
// bounds start, by the goroutine that starts them.
func (st *Stream) SetReadTimeout(d time.Duration) { st.readTimeout = d }

// CloseRead makes a Read in progress, and every later one, return
// ErrReadClosed without resetting the stream: the response may still be
// written and ended.
func (st *Stream) CloseRead() {
	c := st.c
	c.mu.Lock()
	st.readClosed = true
	st.wakeReader()
	c.mu.Unlock()
}

// Buffered returns how many request body bytes Read returns without
// waiting, and whether the body ends after them (END_STREAM received,
// and nothing makes Read fail first): a forwarder can send a body that is
// already whole together with the request head.
func (st *Stream) Buffered() (n int, ended bool) {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(st.recvBuf) - st.recvOff, st.remoteClosed && st.resetErr == nil && !st.readClosed && !c.closing
}

// Bounds on what a pooled stream keeps.
const (
	maxPooledFields = 128
	maxPooledBuf    = 64 << 10
)

// recycle returns st to the pool; nothing may refer to it any more.
func (st *Stream) recycle() {
	clear(st.Header)
	clear(st.Trailer)
	header, trailer, buf := st.Header[:0], st.Trailer[:0], st.recvBuf[:0]
	if cap(header) > maxPooledFields {
		header = nil
	}
	if cap(trailer) > maxPooledFields {
		trailer = nil
	}
	if cap(buf) > maxPooledBuf {
		buf = nil
	}
	done := st.done
	if st.doneClosed {
		done = nil
	}
	select {
	case <-st.readWake:
	default:
	}
	select {
	case <-st.writeWake:
	default:
	}
	*st = Stream{Header: header, Trailer: trailer, recvBuf: buf, done: done,
		readWake: st.readWake, writeWake: st.writeWake}
	streamPool.Put(st)
}

func (st *Stream) wakeReader() {
	if st.readWaiting {
		st.readWaiting = false
		select {
		case st.readWake <- struct{}{}:
		default:
		}
	}
}

func (st *Stream) wakeWriter() {
	if st.writeWaiting {
		st.writeWaiting = false
		select {
		case st.writeWake <- struct{}{}:
		default:
		}
	}
}

// appendBody buffers request body bytes (c.mu held); the stream window
// bounds them.
func (st *Stream) appendBody(p []byte) {
	if st.recvOff > 0 && len(st.recvBuf)+len(p) > cap(st.recvBuf) {
		n := copy(st.recvBuf, st.recvBuf[st.recvOff:])
		st.recvBuf, st.recvOff = st.recvBuf[:n], 0
	}
	st.recvBuf = append(st.recvBuf, p...)
}

// endRemoteLocked records the client's END_STREAM (c.mu held).
func (st *Stream) endRemoteLocked() {
	st.remoteClosed = true
	if st.localClosed {
		st.closeLocked(false)
	}
}

// endLocalLocked records the END_STREAM sent (c.mu held).
func (st *Stream) endLocalLocked() {
	st.localClosed = true
	if st.remoteClosed {
		st.closeLocked(false)
	}
}

// closeLocked takes st out of the connection's streams and gives the
// window of unread body back (c.mu held).
func (st *Stream) closeLocked(byUs bool) {
	if st.closed {
		return
	}
	st.closed = true
	c := st.c
	c.removeLocked(st)
	c.remember(st.id, byUs)
	if n := len(st.recvBuf) - st.recvOff; n > 0 {
		c.creditConnLocked(int64(n))
	}
	st.recvBuf, st.recvOff = st.recvBuf[:0], 0
}

// resetLocked resets st with err (c.mu held): its reads and writes fail
// and Done is closed. It returns the AfterReset function to run, once
// c.mu is released.
func (st *Stream) resetLocked(err error) func() {
	if st.resetErr != nil || st.closed {
		return nil
	}
	st.resetErr = err
	st.rst.Store(true)
	byUs := true
	if re, ok := err.(streamResetError); ok {
		byUs = re.byUs
	}
	st.closeLocked(byUs)
	if st.done != nil && !st.doneClosed {
		close(st.done)
	}
	st.doneClosed = true
	st.wakeReader()
	st.wakeWriter()
	f := st.afterReset
	st.afterReset = nil
	return f
}

// Done returns a channel closed when the stream is reset (by the client,
// by Reset, or by the engine) or the connection ends before the stream
// completed.
func (st *Stream) Done() <-chan struct{} {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.done == nil {
		st.done = make(chan struct{})
		if st.doneClosed {
			close(st.done)
		}
	}
	return st.done
}

// Err returns why the stream was reset (an error matching ErrStreamReset
// that tells the code and who reset it, or ErrConnClosed), nil while it
// is not.
func (st *Stream) Err() error {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return st.resetErr
}

// AfterReset arranges for f to run once, on another goroutine's behalf,
// when the stream is reset or its connection ends (closing an upstream
// connection, say); at once if it already was. One function at a time:
// a second call replaces the first.
func (st *Stream) AfterReset(f func()) {
	c := st.c
	c.mu.Lock()
	if st.resetErr != nil {
		c.mu.Unlock()
		f()
		return
	}
	st.afterReset = f
	c.mu.Unlock()
}

// StopAfterReset cancels the AfterReset function; false when it has run
// (or is running) or none was set.
func (st *Stream) StopAfterReset() bool {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.afterReset == nil {
		return false
	}
	st.afterReset = nil
	return true
}

// Read reads the request body. It returns io.EOF at its end (Trailer is
// then set), the reset error when the stream is reset, and ErrReadTimeout
// when nothing arrives within Config.ReadTimeout. Reading gives flow-
// control window back to the client.
func (st *Stream) Read(p []byte) (int, error) {
	c := st.c
	var timer *time.Timer
	c.mu.Lock()
	for {
		if len(st.recvBuf)-st.recvOff > 0 {
			n := copy(p, st.recvBuf[st.recvOff:])
			st.recvOff += n
			if st.recvOff == len(st.recvBuf) {
				st.recvBuf, st.recvOff = st.recvBuf[:0], 0
			}
			st.creditLocked(int64(n))
			c.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			if c.ctrlN.Load() > 0 {
				c.lockWrite()
				_ = c.unlockWrite(true)
			}
			return n, nil
		}
		var err error
		switch {
		case st.resetErr != nil:
			err = st.resetErr
		case st.readClosed:
			err = ErrReadClosed
		case st.remoteClosed:
			err = io.EOF
		case c.closing:
			err = ErrConnClosed
		}
		if err != nil || len(p) == 0 {
			c.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return 0, err
		}
		st.readWaiting = true
		c.mu.Unlock()
		if g := st.unflushed.Load(); g != 0 && c.flushes.Load() == g-1 {
			// The client may wait for our frames before it sends more.
			c.lockWrite()
			_ = c.unlockWrite(true)
		}
		if st.readTimeout > 0 {
			if timer == nil {
				timer = time.NewTimer(st.readTimeout)
			}
			select {
			case <-st.readWake:
			case <-timer.C:
				c.mu.Lock()
				st.readWaiting = false
				c.mu.Unlock()
				return 0, ErrReadTimeout
			}
		} else {
			<-st.readWake
		}
		c.mu.Lock()
	}
}

// writableLocked reports why frames can no longer be written on st (wmu
// held).
func (st *Stream) writableLocked() error {
	c := st.c
	if c.werr != nil {
		return ErrConnClosed
	}
	if st.rst.Load() {
		c.mu.Lock()
		err := st.resetErr
		c.mu.Unlock()
		return err
	}
	return nil
}

// WriteHeaders writes the response headers: status and fields (names
// lowercase; connection-specific fields are dropped). A 1xx status may
// precede the final one. Without endStream the frames are buffered until
// the next Flush, the end of the response, or a write by another stream.
func (st *Stream) WriteHeaders(status int, fields []HeaderField, endStream bool) error {
	if st.headersDone {
		return ErrHeadersWritten
	}
	info := status < 200
	if status < 100 || status > 999 || (info && endStream) {
		return fmt.Errorf("h2engine: invalid response status %d", status)
	}
	c := st.c
	c.lockWrite()
	if err := st.writableLocked(); err != nil {
		_ = c.unlockWrite(false)
		return err
	}
	c.applyTableSize()
	c.hbuf.Reset()
	_ = c.enc.WriteField(HeaderField{Name: ":status", Value: statusText(status)})
	c.encodeFields(fields)
	c.writeHeaderBlock(st.id, c.hbuf.Bytes(), endStream)
	if !info {
		st.headersDone = true
	}
	if endStream {
		return st.endAndFlush()
	}
	st.noteBuffered(info)
	return c.unlockWrite(info)
}

// noteBuffered records whether the stream leaves frames buffered (wmu
// held).
func (st *Stream) noteBuffered(flushing bool) {
	if flushing {
		st.unflushed.Store(0)
		return
	}
	st.unflushed.Store(st.c.flushes.Load() + 1)
}

// endLocal records the END_STREAM just written (wmu held). It reports
// whether other streams of the connection are running handlers.
func (st *Stream) endLocal() (others bool) {
	st.ended = true
	c := st.c
	c.mu.Lock()
	st.endLocalLocked()
	others = c.live > 1
	c.mu.Unlock()
	return others
}

// endAndFlush records the END_STREAM just written and releases the write
// lock (wmu held). Alone on its connection, the stream has its frames
// written at once, as every writer does. While other streams are running,
// it leaves them to the flusher goroutine (runFlusher), which lets the
// goroutines that are ready run first: other streams whose answers are
// ready add their frames meanwhile, and one write (one TLS record, one
// system call) carries them all, where writing at once costs one per
// response. A pending writer may still write them first.
func (st *Stream) endAndFlush() error {
	c := st.c
	st.unflushed.Store(0)
	if !st.endLocal() {
		return c.unlockWrite(true)
	}
	c.flushOwed.Store(true)
	err := c.unlockWrite(false)
	c.kickFlush()
	return err
}

// Write writes response body bytes as DATA frames, waiting for flow-
// control window (at most Config.WriteTimeout, then the stream is reset
// and ErrWriteTimeout returned). The frames are buffered until the next
// Flush, the end of the response, or a write by another stream.
func (st *Stream) Write(p []byte) (int, error) { return st.writeData(p, false) }

// WriteLast writes the last bytes of the response body and ends the
// response (END_STREAM).
func (st *Stream) WriteLast(p []byte) error {
	_, err := st.writeData(p, true)
	return err
}

// End ends the response (an empty DATA frame with END_STREAM).
func (st *Stream) End() error { return st.WriteLast(nil) }

func (st *Stream) writeData(p []byte, end bool) (int, error) {
	if !st.headersDone {
		return 0, ErrNoHeaders
	}
	if st.ended {
		return 0, ErrStreamClosed
	}
	c := st.c
	total := 0
	for len(p) > 0 || end {
		n := 0
		if len(p) > 0 {
			var err error
			if n, err = st.reserve(len(p)); err != nil {
				return total, err
			}
		}
		last := end && n == len(p)
		c.lockWrite()
		if err := st.writableLocked(); err != nil {
			_ = c.unlockWrite(false)
			c.giveBack(st, n)
			return total, err
		}
		c.writeDataFrame(st.id, p[:n], last)
		var err error
		if last {
			err = st.endAndFlush()
		} else {
			st.noteBuffered(false)
			err = c.unlockWrite(false)
		}
		if err != nil {
			return total, err
		}
		total += n
		p = p[n:]
		if last {
			break
		}
	}
	return total, nil
}

// WriteTrailers ends the response with trailers (fields without pseudo-
// header fields); with none it just ends it.
func (st *Stream) WriteTrailers(fields []HeaderField) error {
	if !st.headersDone {
		return ErrNoHeaders
	}
	if st.ended {
		return ErrStreamClosed
	}
	if len(fields) == 0 {
		return st.End()
	}
	c := st.c
	c.lockWrite()
	if err := st.writableLocked(); err != nil {
		_ = c.unlockWrite(false)
		return err
	}
	c.applyTableSize()
	c.hbuf.Reset()
	c.encodeFields(fields)
	c.writeHeaderBlock(st.id, c.hbuf.Bytes(), true)
	return st.endAndFlush()
}

// Flush sends what the connection has buffered, this stream's frames
// included (once no other writer is about to add more).
func (st *Stream) Flush() error {
	c := st.c
	c.lockWrite()
	return c.unlockWrite(true)
}

// FlushSoon has what the connection has buffered written soon: at once
// when the stream is alone on its connection, else by the flusher
// goroutine, which first lets the other streams whose writes are ready
// add theirs, so that one write carries them all, as at the end of a
// response (endAndFlush). For a relay of small messages on many streams
// (gRPC streaming), which costs a system call and a TLS record per
// message when each is flushed at once.
func (st *Stream) FlushSoon() error {
	c := st.c
	c.lockWrite()
	st.unflushed.Store(0)
	c.mu.Lock()
	others := c.live > 1
	c.mu.Unlock()
	if !others {
		return c.unlockWrite(true)
	}
	c.flushOwed.Store(true)
	err := c.unlockWrite(false)
	c.kickFlush()
	return err
}

// Reset resets the stream with code (RST_STREAM) unless it is already
// closed; reads and writes fail from then on.
func (st *Stream) Reset(code http2.ErrCode) {
	c := st.c
	c.mu.Lock()
	if st.closed {
		c.mu.Unlock()
		return
	}
	f := st.resetLocked(streamResetError{code: code, byUs: true})
	c.mu.Unlock()
	if f != nil {
		f()
	}
	c.queueCtrl(ctrlFrame{kind: ctrlRST, id: st.id, val: uint32(code)})
	c.lockWrite()
	_ = c.unlockWrite(true)
}
