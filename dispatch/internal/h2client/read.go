package h2client

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/panicguard"
)

// goAwayTimeout bounds the write of the GOAWAY that tells a peer which
// protocol error ends its connection.
const goAwayTimeout = time.Second

// readLoop reads the peer's frames until the connection ends; it never
// writes (the control loop writes what it queues).
func (c *Conn) readLoop() {
	err := c.readFramesGuarded()
	c.mu.Lock()
	if !c.closed {
		var ce http2.ConnectionError
		var pe *ProtocolError
		code := http2.ErrCode(0)
		switch {
		case errors.As(err, &pe):
			code = pe.Code
		case errors.As(err, &ce):
			code = http2.ErrCode(ce)
			reason := "invalid frame"
			if d := c.rfr.ErrorDetail(); d != nil {
				reason = d.Error()
			}
			err = &ProtocolError{Code: code, Reason: reason}
		case errors.Is(err, io.EOF):
			err = fmt.Errorf("%w: the peer closed it", ErrConnClosed)
		default:
			err = fmt.Errorf("h2client: reading from the peer: %w", err)
		}
		if code != 0 && !c.writing {
			// Best effort: the peer learns why, in a write bounded by
			// goAwayTimeout (no other write is in progress, and what is
			// queued is whole frames).
			_ = c.wfr.WriteGoAway(0, code, nil)
			buf := c.out
			c.out, c.writing = nil, true
			c.mu.Unlock()
			_ = c.nc.SetWriteDeadline(time.Now().Add(goAwayTimeout))
			_, _ = c.nc.Write(buf)
			c.mu.Lock()
			c.writing = false
		}
		c.closeLocked(err)
	}
	c.mu.Unlock()
	c.runHook()
	close(c.readDone)
}

// readFrames handles frames until an error that ends the connection.
// readFramesGuarded is readFrames with a panic recovered: reported to
// Config.OnPanic, the connection closed, ErrPanicked returned (readLoop
// then fails the streams). Every section of the loop that holds mu
// releases it in a deferred call, so that the unwinding leaves it free.
func (c *Conn) readFramesGuarded() (err error) {
	defer func() {
		if r := recover(); r != nil {
			if c.cfg.OnPanic != nil {
				c.cfg.OnPanic(r)
			}
			_ = c.nc.Close()
			err = fmt.Errorf("%w: %v", ErrPanicked, r)
		}
	}()
	return c.readFrames()
}

func (c *Conn) readFrames() error {
	for {
		f, err := c.rfr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.framesRead.Add(1)
				if err := c.streamError(se); err != nil {
					return err
				}
				continue
			}
			return err
		}
		c.framesRead.Add(1)
		hook, err := c.handleFrame(f)
		if hook {
			c.runHook()
		}
		if err != nil {
			return err
		}
	}
}

// handleFrame applies a frame the peer sent (mu taken, and released by a
// deferred call: a panic in it leaves mu free for readLoop's close). It
// reports whether the connection's state hook is due.
func (c *Conn) handleFrame(f http2.Frame) (hook bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	panicguard.Point(panicguard.H2CConn, c.peer)
	queued := len(c.out)
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		err = c.onHeaders(f)
	case *http2.DataFrame:
		err = c.onData(f)
	case *http2.SettingsFrame:
		if !f.IsAck() {
			err = c.applySettingsLocked(f)
			if err == nil {
				_ = c.wfr.WriteSettingsAck()
				c.kickCtrl()
			}
		}
	case *http2.WindowUpdateFrame:
		err = c.onWindowUpdate(f)
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = c.wfr.WritePing(true, f.Data)
			c.kickCtrl()
		}
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			s.abortLocked(&StreamResetError{Code: f.ErrCode}, false)
		} else if f.StreamID >= c.nextID {
			err = &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("RST_STREAM on idle stream %d", f.StreamID)}
		}
	case *http2.GoAwayFrame:
		c.onGoAway(f)
		hook = true
	case *http2.PushPromiseFrame:
		err = &ProtocolError{Code: http2.ErrCodeProtocol, Reason: "PUSH_PROMISE, which this client disabled"}
	}
	if ferr := c.readQueuedLocked(queued); err == nil {
		err = ferr
	}
	return hook, err
}

// readQueuedLocked counts what the read loop queued since out held
// before bytes, and fails when the peer asks for more answers than the
// writes take (mu held; the read loop never shrinks out).
func (c *Conn) readQueuedLocked(before int) error {
	c.readQueued += len(c.out) - before
	if c.readQueued > maxReadQueued {
		return &ProtocolError{Code: http2.ErrCodeEnhanceYourCalm, Reason: fmt.Sprintf("more than %d bytes of answers queued for a peer that does not read them", maxReadQueued)}
	}
	return nil
}

// streamError resets the stream the framer found at fault.
func (c *Conn) streamError(se http2.StreamError) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	queued := len(c.out)
	reason := se.Error()
	if d := c.rfr.ErrorDetail(); d != nil {
		reason = d.Error()
	}
	if s := c.streams[se.StreamID]; s != nil {
		s.abortCodeLocked(&ProtocolError{StreamID: se.StreamID, Code: se.Code, Reason: reason}, true, se.Code)
	} else {
		_ = c.wfr.WriteRSTStream(se.StreamID, se.Code)
	}
	c.kickCtrl()
	return c.readQueuedLocked(queued)
}

// resetStreamLocked resets s for a fault of the peer's.
func (c *Conn) resetStreamLocked(s *stream, code http2.ErrCode, reason string) {
	s.abortCodeLocked(&ProtocolError{StreamID: s.id, Code: code, Reason: reason}, true, code)
	c.kickCtrl()
}

// knownStreamLocked returns the stream id names, and an error when the id
// is one this client never opened.
func (c *Conn) knownStreamLocked(id uint32, what string) (*stream, error) {
	if s := c.streams[id]; s != nil {
		return s, nil
	}
	if id%2 == 0 || id >= c.nextID {
		return nil, &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("%s on stream %d, which was never opened", what, id)}
	}
	return nil, nil
}

func (c *Conn) onHeaders(f *http2.MetaHeadersFrame) error {
	s, err := c.knownStreamLocked(f.StreamID, "HEADERS")
	if s == nil {
		return err
	}
	if s.remoteEnded {
		c.resetStreamLocked(s, http2.ErrCodeStreamClosed, "HEADERS after END_STREAM")
		return nil
	}
	if f.Truncated {
		c.resetStreamLocked(s, http2.ErrCodeProtocol, fmt.Sprintf("response header list larger than %d bytes", c.cfg.MaxResponseHeaderBytes))
		return nil
	}
	if s.gotResp {
		// Trailers.
		if !f.StreamEnded() {
			return &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("a second HEADERS without END_STREAM on stream %d", s.id)}
		}
		if len(f.PseudoFields()) > 0 {
			return &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("pseudo-header field in trailers on stream %d", s.id)}
		}
		s.resp.Trailer = f.RegularFields()
		c.remoteEndLocked(s)
		return nil
	}
	status := f.PseudoValue("status")
	if status == "" {
		c.resetStreamLocked(s, http2.ErrCodeProtocol, "response without :status")
		return nil
	}
	code, perr := strconv.Atoi(status)
	if perr != nil {
		c.resetStreamLocked(s, http2.ErrCodeProtocol, fmt.Sprintf("non-numeric :status %q", status))
		return nil
	}
	if code >= 100 && code <= 199 {
		s.num1xx++
		switch {
		case code == 101:
			c.resetStreamLocked(s, http2.ErrCodeProtocol, "status 101 over HTTP/2")
		case f.StreamEnded():
			c.resetStreamLocked(s, http2.ErrCodeProtocol, "interim response with END_STREAM")
		case s.num1xx > max1xx:
			c.resetStreamLocked(s, http2.ErrCodeProtocol, "too many interim responses")
		}
		return nil
	}
	resp := &Response{Status: code, Header: f.RegularFields(), ContentLength: -1, Body: &Body{s: s}}
	ncl := 0
	for _, hf := range resp.Header {
		if hf.Name == "content-length" {
			ncl++
			if cl, err := strconv.ParseUint(hf.Value, 10, 63); err == nil {
				resp.ContentLength = int64(cl)
			}
		}
	}
	if ncl > 1 {
		resp.ContentLength = -1
	}
	if f.StreamEnded() && resp.ContentLength < 0 {
		resp.ContentLength = 0
	}
	s.bytesRemain = resp.ContentLength
	s.resp = resp
	s.gotResp = true
	close(s.respReady)
	if f.StreamEnded() {
		c.remoteEndLocked(s)
	}
	return nil
}

// remoteEndLocked marks the end of the response (END_STREAM); a body
// shorter than its declared length fails.
func (c *Conn) remoteEndLocked(s *stream) {
	if s.bytesRemain > 0 && s.err == nil {
		s.err = fmt.Errorf("h2client: response body %d bytes short of its content-length: %w", s.bytesRemain, io.ErrUnexpectedEOF)
	}
	s.remoteEnded = true
	if !s.localEnded {
		// The response is complete: the rest of the request is not
		// needed (RFC 9113 8.1).
		s.localEnded = true
		_ = c.wfr.WriteRSTStream(s.id, http2.ErrCodeCancel)
		c.kickCtrl()
		if s.req.Body != nil {
			_ = s.req.Body.Close()
		}
	}
	s.maybeDoneLocked()
}

func (c *Conn) onData(f *http2.DataFrame) error {
	size := int64(f.Length)
	// The connection's window, whatever becomes of the stream.
	if size > c.recvAvail {
		return &ProtocolError{Code: http2.ErrCodeFlowControl, Reason: "DATA beyond the connection's window"}
	}
	c.recvAvail -= size
	s, err := c.knownStreamLocked(f.StreamID, "DATA")
	data := f.Data()
	if s == nil || s.done {
		if err != nil {
			return err
		}
		c.giveBackLocked(nil, size)
		c.kickCtrl()
		return nil
	}
	if !s.gotResp {
		c.giveBackLocked(nil, size)
		c.resetStreamLocked(s, http2.ErrCodeProtocol, "DATA before the response head")
		return nil
	}
	if s.remoteEnded {
		c.giveBackLocked(nil, size)
		c.resetStreamLocked(s, http2.ErrCodeStreamClosed, "DATA after END_STREAM")
		return nil
	}
	if size > s.recvAvail {
		c.giveBackLocked(nil, size)
		c.resetStreamLocked(s, http2.ErrCodeFlowControl, "DATA beyond the stream's window")
		return nil
	}
	s.recvAvail -= size
	if pad := size - int64(len(data)); pad > 0 {
		c.giveBackLocked(s, pad)
	}
	if s.bytesRemain >= 0 {
		if int64(len(data)) > s.bytesRemain {
			c.giveBackLocked(nil, int64(len(data)))
			c.resetStreamLocked(s, http2.ErrCodeProtocol, "response body longer than its content-length")
			return nil
		}
		s.bytesRemain -= int64(len(data))
	}
	if s.bodyClosed {
		c.giveBackLocked(nil, int64(len(data)))
	} else if len(data) > 0 {
		s.recvBuf = append(s.recvBuf, data...)
	}
	if f.StreamEnded() {
		c.remoteEndLocked(s)
	} else {
		s.maybeDoneLocked() // wakes the reader
	}
	if len(c.out) > 0 {
		c.kickCtrl()
	}
	return nil
}

func (c *Conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWindow+inc > 1<<31-1 {
			return &ProtocolError{Code: http2.ErrCodeFlowControl, Reason: "connection window beyond 2^31-1"}
		}
		c.sendWindow += inc
		c.cond.Broadcast()
		return nil
	}
	s, err := c.knownStreamLocked(f.StreamID, "WINDOW_UPDATE")
	if s == nil {
		return err
	}
	if s.sendWin+inc > 1<<31-1 {
		c.resetStreamLocked(s, http2.ErrCodeFlowControl, "stream window beyond 2^31-1")
		return nil
	}
	s.sendWin += inc
	c.cond.Broadcast()
	return nil
}

// applySettingsLocked applies the peer's SETTINGS.
func (c *Conn) applySettingsLocked(f *http2.SettingsFrame) error {
	sawMax := false
	err := f.ForeachSetting(func(st http2.Setting) error {
		if err := st.Valid(); err != nil {
			return &ProtocolError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf("invalid setting %v: %v", st, err)}
		}
		switch st.ID {
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxStreams = min(st.Val, maxStreamsUnlimited)
			sawMax = true
		case http2.SettingInitialWindowSize:
			delta := int64(st.Val) - c.peerInitWindow
			for _, s := range c.streams {
				if s.sendWin+delta > 1<<31-1 {
					return &ProtocolError{Code: http2.ErrCodeFlowControl, Reason: "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream's window"}
				}
			}
			for _, s := range c.streams {
				s.sendWin += delta
			}
			c.peerInitWindow = int64(st.Val)
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = st.Val
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(st.Val)
		case http2.SettingEnablePush:
			if st.Val != 0 {
				return &ProtocolError{Code: http2.ErrCodeProtocol, Reason: "a server's SETTINGS_ENABLE_PUSH must be 0"}
			}
		}
		return nil
	})
	_ = sawMax
	if err != nil {
		return err
	}
	c.cond.Broadcast()
	if c.slotWaiters > 0 {
		close(c.slotWake)
		c.slotWake = make(chan struct{})
	}
	return nil
}

// onGoAway fails the streams the peer will not process and admits no new
// ones; the connection closes once its last stream ends.
func (c *Conn) onGoAway(f *http2.GoAwayFrame) {
	reason := fmt.Errorf("%w (%v, last stream %d)", ErrGoAway, f.ErrCode, f.LastStreamID)
	if c.err == nil {
		c.err = reason
	}
	c.goAway = true
	for id, s := range c.streams {
		if id > f.LastStreamID {
			s.abortLocked(fmt.Errorf("%w: %w", ErrNotProcessed, reason), false)
		}
	}
	if c.slotWaiters > 0 {
		close(c.slotWake)
		c.slotWake = make(chan struct{})
	}
	if len(c.streams) == 0 && c.reserved == 0 {
		c.closeLocked(reason)
	}
}
