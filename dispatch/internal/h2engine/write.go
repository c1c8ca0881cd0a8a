package h2engine

import (
	"errors"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/internal/panicguard"
)

// The write path. Every goroutine that writes (stream handlers, the
// control flusher) encodes its frames into the connection's buffer under
// wmu; there is no writer goroutine to hand frames to. pending counts the
// writers holding or waiting for wmu, and the one that leaves last
// flushes, so that the frames of concurrent streams go out in one write.

// writeBufferSize is the write buffer, taken from a pool while frames are
// pending and returned once flushed.
const writeBufferSize = 32 << 10

var writeBufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, writeBufferSize)
	return &b
}}

// outBuf is the connection's write buffer; the Framer writes into it too.
type outBuf struct {
	c   *Conn
	buf *[]byte
}

// Write appends p (wmu held), writing out first when it would not fit.
func (o *outBuf) Write(p []byte) (int, error) {
	c := o.c
	if c.werr != nil {
		return 0, c.werr
	}
	if o.buf == nil {
		o.buf = writeBufPool.Get().(*[]byte)
	}
	b := *o.buf
	if len(b)+len(p) > cap(b) {
		if err := o.flush(); err != nil {
			return 0, err
		}
		b = *o.buf
		if len(p) > cap(b) {
			return c.writeConn(p)
		}
	}
	*o.buf = append(b, p...)
	return len(p), nil
}

// flush writes the buffer to the connection (wmu held).
func (o *outBuf) flush() error {
	o.c.flushOwed.Store(false)
	if o.buf == nil || len(*o.buf) == 0 {
		return o.c.werr
	}
	_, err := o.c.writeConn(*o.buf)
	*o.buf = (*o.buf)[:0]
	o.c.flushes.Add(1)
	return err
}

// release returns an empty buffer to the pool (wmu held, or no writer
// left).
func (o *outBuf) release() {
	if o.buf != nil && len(*o.buf) == 0 {
		writeBufPool.Put(o.buf)
		o.buf = nil
	}
}

// writeConn writes p to the connection (wmu held). The write deadline is
// moved forward only when less than half the write timeout is left, which
// spares a timer update per write; a write blocked for between half and
// all of WriteTimeout fails, and the connection is closed.
func (c *Conn) writeConn(p []byte) (int, error) {
	if c.werr != nil {
		return 0, c.werr
	}
	if !c.fixedDeadline.Load() {
		now := time.Now()
		if c.wdeadline.Sub(now) < c.cfg.WriteTimeout/2 {
			c.wdeadline = now.Add(c.cfg.WriteTimeout)
			_ = c.nc.SetWriteDeadline(c.wdeadline)
		}
	}
	n, err := c.nc.Write(p)
	if err != nil {
		c.werr = err
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !c.fixedDeadline.Load() {
			c.report(ErrorEvent{Code: http2.ErrCodeNo, Reason: "write timeout: the client reads nothing"})
		}
		_ = c.nc.Close()
	}
	return n, err
}

// lockWrite takes the write lock, counting the writer as pending. The
// control frames queued so far go into the buffer first, ahead of the
// writer's frames (a SETTINGS acknowledgement before the DATA that uses
// the new settings).
func (c *Conn) lockWrite() {
	c.pending.Add(1)
	c.wmu.Lock()
	if c.ctrlN.Load() > 0 {
		c.drainCtrlLocked()
	}
}

// unlockWrite releases the write lock. flush asks for the buffered frames
// to be written; the last pending writer does it. It returns ErrConnClosed
// once the connection can no longer be written.
func (c *Conn) unlockWrite(flush bool) error {
	if flush {
		c.needFlush = true
	}
	if c.ctrlN.Load() > 0 {
		c.drainCtrlLocked()
	}
	if c.pending.Add(-1) == 0 && c.needFlush {
		c.needFlush = false
		_ = c.out.flush()
		c.out.release()
	}
	err := c.werr
	c.wmu.Unlock()
	if c.ctrlN.Load() > 0 {
		c.kickCtrl()
	}
	if err != nil {
		return ErrConnClosed
	}
	return nil
}

// unlockWriteFlush releases the write lock after writing out whatever is
// buffered and queued, whoever else is pending.
func (c *Conn) unlockWriteFlush() {
	c.drainCtrlLocked()
	_ = c.out.flush()
	c.needFlush = false
	c.pending.Add(-1)
	c.wmu.Unlock()
}

// Frame layout (RFC 9113 4.1).
const (
	frameHeaderLen = 9
	flagEndStream  = 0x1
	flagEndHeaders = 0x4
)

func (c *Conn) writeFrameHeader(length int, typ http2.FrameType, flags http2.Flags, id uint32) {
	o := &c.out
	if o.buf == nil || len(*o.buf)+frameHeaderLen > cap(*o.buf) {
		if _, err := o.Write(nil); err != nil { // takes or flushes the buffer
			return
		}
		if len(*o.buf)+frameHeaderLen > cap(*o.buf) && o.flush() != nil {
			return
		}
	}
	*o.buf = append(*o.buf,
		byte(length>>16), byte(length>>8), byte(length),
		byte(typ), byte(flags),
		byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
}

// writeDataFrame writes one DATA frame (wmu held).
func (c *Conn) writeDataFrame(id uint32, p []byte, end bool) {
	var flags http2.Flags
	if end {
		flags = flagEndStream
	}
	c.writeFrameHeader(len(p), http2.FrameData, flags, id)
	if len(p) > 0 {
		_, _ = c.out.Write(p)
	}
}

// writeHeaderBlock writes block as HEADERS and CONTINUATION frames of at
// most the peer's frame size (wmu held).
func (c *Conn) writeHeaderBlock(id uint32, block []byte, end bool) {
	max := int(c.peerMaxFrame.Load())
	typ := http2.FrameHeaders
	var flags http2.Flags
	if end {
		flags = flagEndStream
	}
	for {
		n := min(len(block), max)
		f := flags
		if n == len(block) {
			f |= flagEndHeaders
		}
		c.writeFrameHeader(n, typ, f, id)
		_, _ = c.out.Write(block[:n])
		block = block[n:]
		if len(block) == 0 {
			return
		}
		typ, flags = http2.FrameContinuation, 0
	}
}

// applyTableSize applies the peer's SETTINGS_HEADER_TABLE_SIZE to the
// encoder (wmu held).
func (c *Conn) applyTableSize() {
	if v := c.encTableSize.Load(); v >= 0 {
		c.encTableSize.Store(-1)
		c.enc.SetMaxDynamicTableSizeLimit(uint32(v))
	}
}

// encodeFields HPACK-encodes response fields into hbuf, lowercasing names
// and dropping pseudo-header and connection-specific fields (wmu held).
func (c *Conn) encodeFields(fields []HeaderField) {
	for _, f := range fields {
		if f.Name == "" || f.Name[0] == ':' {
			continue
		}
		f.Name = httpgrammar.ToLower(f.Name)
		switch f.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			continue
		}
		_ = c.enc.WriteField(f)
	}
}

// statusTexts holds the :status values, to spare a conversion per
// response.
var statusTexts = func() (t [1000]string) {
	for i := 100; i < len(t); i++ {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func statusText(code int) string { return statusTexts[code] }

// Control frames, queued by the reading goroutine (which never writes to
// the connection itself: a peer that does not read must not stop it from
// reading) and written by the next writer or by the control flusher.
type ctrlKind uint8

const (
	ctrlSettingsAck ctrlKind = iota + 1
	ctrlPingAck
	ctrlPing
	ctrlRST
	ctrlWindowUpdate
	ctrl431
)

type ctrlFrame struct {
	kind ctrlKind
	end  bool // ctrl431: the request had ended
	id   uint32
	val  uint32 // error code or window increment
	data [8]byte
}

// queueCtrl queues f; false when MaxControlFrames are already queued (the
// peer reads nothing while asking for answers: a flood).
func (c *Conn) queueCtrl(f ctrlFrame) bool {
	c.ctrlMu.Lock()
	if len(c.ctrl) >= c.cfg.MaxControlFrames {
		c.ctrlMu.Unlock()
		c.ctrlFlood.Store(true)
		return false
	}
	c.ctrl = append(c.ctrl, f)
	c.ctrlN.Store(int32(len(c.ctrl)))
	c.ctrlMu.Unlock()
	return true
}

// errCtrlFlood is the connection error for a full control queue.
var errCtrlFlood = connError{http2.ErrCodeEnhanceYourCalm, "too many control frames queued for a client that reads nothing (SETTINGS or PING flood)"}

// queueCtrlFromReader queues f for the reading goroutine and has it
// written.
func (c *Conn) queueCtrlFromReader(f ctrlFrame) error {
	if !c.queueCtrl(f) {
		return errCtrlFlood
	}
	c.kickCtrl()
	return nil
}

// kickCtrl makes sure queued control frames get written: by the control
// flusher, a goroutine started when needed.
func (c *Conn) kickCtrl() {
	if c.ctrlN.Load() == 0 {
		return
	}
	c.startFlusher()
}

// kickFlush has the flusher write the frames buffered by the end of a
// response (flushOwed).
func (c *Conn) kickFlush() {
	if !c.flushOwed.Load() {
		return
	}
	c.startFlusher()
}

// startFlusher starts the flusher goroutine unless it runs.
func (c *Conn) startFlusher() {
	if !c.flusherOn.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.flusherOn.Store(false)
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	// A spare goroutine (workers.go) has the stack the TLS write needs.
	select {
	case spareWorkers <- spareJob{c: c}:
	default:
		go runWorker(c, nil)
	}
}

// runFlusher writes the queued control frames and the frames owed a
// flush. It first lets the goroutines that are ready to run do so
// (runtime.Gosched): stream handlers whose answers are ready add their
// frames to the buffer meanwhile, and one write carries them all.
func (c *Conn) runFlusher() {
	defer c.wg.Done()
	defer func() {
		if r := recover(); r != nil {
			_ = c.nc.Close() // the reader then ends the connection
			c.panicked(panicguard.H2Flusher, r)
		}
	}()
	panicguard.Point(panicguard.H2Flusher, c.cfg.Identity)
	for {
		runtime.Gosched()
		c.lockWrite()
		_ = c.unlockWrite(true)
		c.flusherOn.Store(false)
		if (c.ctrlN.Load() == 0 && !c.flushOwed.Load()) || !c.flusherOn.CompareAndSwap(false, true) {
			return
		}
	}
}

// drainCtrlLocked writes the queued control frames (wmu held).
func (c *Conn) drainCtrlLocked() {
	c.ctrlMu.Lock()
	q := c.ctrl
	c.ctrl = c.ctrlSpare[:0]
	c.ctrlN.Store(0)
	c.ctrlMu.Unlock()
	for i := range q {
		c.writeCtrl(&q[i])
	}
	c.ctrlSpare = q[:0]
	c.needFlush = true
}

func (c *Conn) writeCtrl(f *ctrlFrame) {
	fr := c.fr
	switch f.kind {
	case ctrlSettingsAck:
		_ = fr.WriteSettingsAck()
	case ctrlPingAck:
		_ = fr.WritePing(true, f.data)
	case ctrlPing:
		_ = fr.WritePing(false, f.data)
	case ctrlRST:
		_ = fr.WriteRSTStream(f.id, http2.ErrCode(f.val))
	case ctrlWindowUpdate:
		_ = fr.WriteWindowUpdate(f.id, f.val)
	case ctrl431:
		c.applyTableSize()
		c.hbuf.Reset()
		_ = c.enc.WriteField(HeaderField{Name: ":status", Value: "431"})
		_ = c.enc.WriteField(HeaderField{Name: "content-length", Value: "0"})
		c.writeHeaderBlock(f.id, c.hbuf.Bytes(), true)
		if !f.end {
			_ = fr.WriteRSTStream(f.id, http2.ErrCodeNo)
		}
	}
}

// writePreface sends the server's SETTINGS and opens the connection
// window.
func (c *Conn) writePreface() {
	cfg := &c.cfg
	settings := []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: cfg.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: cfg.InitialWindowSize},
		{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxHeaderListSize},
	}
	if cfg.MaxFrameSize != minFrameSize {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxFrameSize, Val: cfg.MaxFrameSize})
	}
	if cfg.EnableConnectProtocol {
		settings = append(settings, http2.Setting{ID: http2.SettingEnableConnectProtocol, Val: 1})
	}
	c.lockWrite()
	_ = c.fr.WriteSettings(settings...)
	if d := cfg.ConnWindowSize - initialWindow; d > 0 {
		_ = c.fr.WriteWindowUpdate(0, d)
	}
	_ = c.unlockWrite(true)
}
