package h2client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Request is one request: its pseudo-header fields, its regular fields
// (names lowercase; a field marked Sensitive is never indexed by HPACK,
// which also keeps values unique to one request, such as a request id,
// out of the connection's table), and its body.
type Request struct {
	Method, Scheme, Authority, Path string
	Header                          []hpack.HeaderField
	// Body is the request body, nil for none. It is read until io.EOF
	// (from its own goroutine while the response is read), and closed
	// (perhaps more than once) when the stream ends; Close must make a
	// Read in progress return. No Read runs after RoundTrip has failed
	// or the response body's Close has returned.
	// A Body that implements BufferedReader and has bytes at hand when
	// RoundTrip is called has them sent with the HEADERS, in one write.
	Body io.ReadCloser
	// Trailer, if set, is called once Body has returned io.EOF; the
	// fields it returns go out as the request's trailers.
	Trailer func() []hpack.HeaderField
	// WroteHeaders, if set, is called once the HEADERS are queued.
	WroteHeaders func()
}

// BufferedReader is a request body that can tell what it holds: n bytes
// that a Read returns without waiting, and whether the body ends after
// them.
type BufferedReader interface {
	Buffered() (n int, ended bool)
}

// Response is a response's head; Body reads the rest.
type Response struct {
	Status int
	// Header holds the regular fields in order, names lowercase.
	Header []hpack.HeaderField
	// ContentLength is the declared length, -1 when unknown (0 when the
	// HEADERS frame ended the stream without declaring one).
	ContentLength int64
	// Body reads the response body; closing it before its end resets the
	// stream.
	Body *Body
	// Trailer holds the response's trailers once Body.Read has returned
	// io.EOF.
	Trailer []hpack.HeaderField
}

// stream is one request's state; its fields are guarded by c.mu.
type stream struct {
	c    *Conn
	id   uint32
	req  *Request
	resp *Response

	sendWin     int64
	recvAvail   int64 // receive window left
	recvUnacked int64
	bytesRemain int64 // of a declared content-length, -1 when none

	localEnded  bool // END_STREAM sent (or the stream reset)
	remoteEnded bool // END_STREAM received (or the stream reset)
	done        bool // out of c.streams
	reset       bool
	err         error // the stream's failure; nil while it has none
	num1xx      int

	respReady chan struct{}
	gotResp   bool

	recvBuf     []byte
	recvOff     int
	readWaiting bool
	readWake    chan struct{}
	bodyClosed  bool
	stopCtx     func() bool
	// sent is closed when the request body's goroutine (if any) is done.
	sent chan struct{}
}

var bodyBufPool = sync.Pool{New: func() any {
	b := make([]byte, 16<<10)
	return &b
}}

// RoundTrip sends req on a stream reserved by Reserve or WaitReserve and
// returns the response head once it arrives. Cancelling ctx before the
// response body ends resets the stream.
func (c *Conn) RoundTrip(ctx context.Context, req *Request) (*Response, error) {
	s := &stream{c: c, req: req, respReady: make(chan struct{}), readWake: make(chan struct{}, 1), bytesRemain: -1}
	var bufp *[]byte
	var pend []byte
	eof := req.Body == nil
	if br, ok := req.Body.(BufferedReader); ok {
		if n, ended := br.Buffered(); n > 0 || ended {
			bufp = bodyBufPool.Get().(*[]byte)
			m := min(n, len(*bufp))
			k, err := io.ReadFull(req.Body, (*bufp)[:m])
			pend = (*bufp)[:k]
			if err == nil && ended && k == n {
				_, err = req.Body.Read((*bufp)[k:k])
			}
			switch {
			case err == io.EOF:
				eof = true
			case err != nil:
				bodyBufPool.Put(bufp)
				_ = req.Body.Close()
				c.Unreserve()
				return nil, err
			}
		}
	}
	var trailers []hpack.HeaderField
	if eof && req.Trailer != nil {
		trailers = req.Trailer()
	}

	c.mu.Lock()
	if c.reserved <= 0 {
		c.mu.Unlock()
		if bufp != nil {
			bodyBufPool.Put(bufp)
		}
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, ErrNoSlot
	}
	c.reserved--
	if c.err != nil {
		err := c.err
		if errors.Is(err, ErrGoAway) {
			err = fmt.Errorf("%w: %w", ErrNotProcessed, err)
		}
		c.slotFreedLocked()
		c.mu.Unlock()
		if bufp != nil {
			bodyBufPool.Put(bufp)
		}
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	s.id = c.nextID
	c.nextID += 2
	c.streams[s.id] = s
	s.sendWin = c.peerInitWindow
	s.recvAvail = int64(c.cfg.StreamWindow)
	headersEnd := eof && len(pend) == 0 && len(trailers) == 0
	c.writeHeadersLocked(s.id, headersEnd, true, req.Method, req.Scheme, req.Authority, req.Path, req.Header)
	if headersEnd {
		s.localEnded = true
	}
	for len(pend) > 0 {
		n := int(min(int64(len(pend)), s.sendWin, c.sendWindow, int64(c.peerMaxFrame)))
		if n <= 0 {
			break
		}
		last := eof && n == len(pend) && len(trailers) == 0
		_ = c.wfr.WriteData(s.id, last, pend[:n])
		s.sendWin -= int64(n)
		c.sendWindow -= int64(n)
		pend = pend[n:]
		s.localEnded = last
	}
	if eof && len(pend) == 0 && !s.localEnded {
		c.writeHeadersLocked(s.id, true, false, "", "", "", "", trailers)
		s.localEnded = true
	}
	c.kickSoonLocked()
	if s.err == nil && !s.done {
		s.stopCtx = context.AfterFunc(ctx, func() { s.cancel(ctx.Err()) })
	}
	localEnded := s.localEnded
	c.mu.Unlock()
	if req.WroteHeaders != nil {
		req.WroteHeaders()
	}
	if localEnded {
		if bufp != nil {
			bodyBufPool.Put(bufp)
		}
		if req.Body != nil {
			_ = req.Body.Close()
		}
	} else {
		if bufp == nil {
			bufp = bodyBufPool.Get().(*[]byte)
		}
		s.sent = make(chan struct{})
		go s.sendBody(bufp, pend, eof)
	}

	<-s.respReady
	c.mu.Lock()
	resp, err := s.resp, s.err
	c.mu.Unlock()
	if resp == nil {
		s.awaitSent()
		return nil, err
	}
	return resp, nil
}

// writeHeadersLocked encodes a header block and queues it as HEADERS
// (and CONTINUATION) frames: a request head when pseudo, else trailers.
func (c *Conn) writeHeadersLocked(id uint32, end, pseudo bool, method, scheme, authority, path string, fields []hpack.HeaderField) {
	c.hbuf.Reset()
	if pseudo {
		_ = c.henc.WriteField(hpack.HeaderField{Name: ":method", Value: method})
		_ = c.henc.WriteField(hpack.HeaderField{Name: ":scheme", Value: scheme})
		_ = c.henc.WriteField(hpack.HeaderField{Name: ":authority", Value: authority})
		_ = c.henc.WriteField(hpack.HeaderField{Name: ":path", Value: path})
	}
	for _, f := range fields {
		_ = c.henc.WriteField(f)
	}
	block := c.hbuf.Bytes()
	max := int(c.peerMaxFrame)
	first := block
	if len(first) > max {
		first = block[:max]
	}
	block = block[len(first):]
	_ = c.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: end, EndHeaders: len(block) == 0})
	for len(block) > 0 {
		chunk := block
		if len(chunk) > max {
			chunk = chunk[:max]
		}
		block = block[len(chunk):]
		_ = c.wfr.WriteContinuation(id, len(block) == 0, chunk)
	}
}

// sendBody streams the rest of the request body: pend first, then what
// Body reads, then the trailers.
func (s *stream) sendBody(bufp *[]byte, pend []byte, eof bool) {
	req := s.req
	defer func() {
		bodyBufPool.Put(bufp)
		_ = req.Body.Close()
		close(s.sent)
	}()
	buf := *bufp
	for {
		if len(pend) == 0 && !eof {
			n, err := req.Body.Read(buf)
			pend = buf[:n]
			switch {
			case err == io.EOF:
				eof = true
			case err != nil:
				s.cancel(err)
				return
			}
			if n == 0 && !eof {
				continue
			}
		}
		var trailers []hpack.HeaderField
		if eof && req.Trailer != nil {
			trailers = req.Trailer()
		}
		if err := s.writeData(pend, eof, trailers); err != nil || eof {
			return
		}
		pend = nil
	}
}

// awaitSent waits for the request body's goroutine, which the stream's
// end has stopped.
func (s *stream) awaitSent() {
	if s.sent != nil {
		<-s.sent
	}
}

// writeData queues p as DATA frames as the windows allow (and, with end,
// the trailers or END_STREAM), waiting for window and for buffer room.
func (s *stream) writeData(p []byte, end bool, trailers []hpack.HeaderField) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if s.err != nil {
			return s.err
		}
		if s.localEnded {
			return ErrConnClosed
		}
		if c.closed {
			return c.err
		}
		if c.writing && len(c.out) >= maxBuffered {
			c.cond.Wait()
			continue
		}
		if len(p) > 0 {
			n := int(min(int64(len(p)), s.sendWin, c.sendWindow, int64(c.peerMaxFrame)))
			if n <= 0 {
				c.kickLocked() // what is queued may be what the peer needs to see
				if !c.closed && s.err == nil && min(s.sendWin, c.sendWindow) <= 0 {
					c.cond.Wait()
				}
				continue
			}
			last := end && n == len(p) && len(trailers) == 0
			_ = c.wfr.WriteData(s.id, last, p[:n])
			s.sendWin -= int64(n)
			c.sendWindow -= int64(n)
			p = p[n:]
			if last {
				s.localEnded = true
				s.maybeDoneLocked()
			}
			if len(p) > 0 {
				continue
			}
		}
		if end && !s.localEnded {
			if len(trailers) > 0 {
				c.writeHeadersLocked(s.id, true, false, "", "", "", "", trailers)
			} else {
				_ = c.wfr.WriteData(s.id, true, nil)
			}
			s.localEnded = true
			s.maybeDoneLocked()
		}
		c.kickSoonLocked()
		return nil
	}
}

// cancel resets the stream (CANCEL) unless it is done; err is its failure.
func (s *stream) cancel(err error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.done {
		return
	}
	s.abortLocked(err, true)
	c.kickLocked()
}

// abortLocked ends the stream with err, resetting it (CANCEL) when sendRST.
func (s *stream) abortLocked(err error, sendRST bool) {
	s.abortCodeLocked(err, sendRST, http2.ErrCodeCancel)
}

func (s *stream) abortCodeLocked(err error, sendRST bool, code http2.ErrCode) {
	c := s.c
	if s.done {
		return
	}
	if s.err == nil {
		s.err = err
	}
	s.reset = true
	if sendRST && !c.closed {
		_ = c.wfr.WriteRSTStream(s.id, code)
	}
	s.localEnded, s.remoteEnded = true, true
	// The window of what was received and will not be read is the
	// connection's again.
	if unread := len(s.recvBuf) - s.recvOff; unread > 0 {
		c.giveBackLocked(nil, int64(unread))
	}
	s.recvBuf, s.recvOff = nil, 0
	s.maybeDoneLocked()
	if s.req.Body != nil {
		// Unblocks a sendBody in Read; closing twice is allowed.
		_ = s.req.Body.Close()
	}
}

// maybeDoneLocked removes a stream closed both ways from the connection,
// freeing its slot, and wakes whoever waits on it.
func (s *stream) maybeDoneLocked() {
	c := s.c
	if !s.gotResp && s.err != nil {
		s.gotResp = true
		close(s.respReady)
	}
	if s.readWaiting {
		s.readWaiting = false
		select {
		case s.readWake <- struct{}{}:
		default:
		}
	}
	c.cond.Broadcast()
	if s.done || !s.localEnded || !s.remoteEnded {
		return
	}
	s.done = true
	if s.stopCtx != nil {
		s.stopCtx()
	}
	delete(c.streams, s.id)
	c.slotFreedLocked()
}

// giveBackLocked returns n bytes of receive window (of s too, if not nil)
// to the peer once enough has been taken to be worth a frame.
func (c *Conn) giveBackLocked(s *stream, n int64) {
	c.recvUnacked += n
	if c.recvUnacked >= int64(c.cfg.ConnWindow)/4 && !c.closed {
		_ = c.wfr.WriteWindowUpdate(0, uint32(c.recvUnacked))
		c.recvAvail += c.recvUnacked
		c.recvUnacked = 0
	}
	if s == nil || s.remoteEnded {
		return
	}
	s.recvUnacked += n
	if s.recvUnacked >= int64(c.cfg.StreamWindow)/4 && !c.closed {
		_ = c.wfr.WriteWindowUpdate(s.id, uint32(s.recvUnacked))
		s.recvAvail += s.recvUnacked
		s.recvUnacked = 0
	}
}

// Body reads a response body.
type Body struct {
	s *stream
}

// Read reads the body; it returns io.EOF at its end (Response.Trailer is
// then set) and the stream's failure if it failed. What is read is given
// back to the peer as window.
func (b *Body) Read(p []byte) (int, error) {
	s := b.s
	c := s.c
	c.mu.Lock()
	for {
		if avail := len(s.recvBuf) - s.recvOff; avail > 0 {
			n := copy(p, s.recvBuf[s.recvOff:])
			s.recvOff += n
			if s.recvOff == len(s.recvBuf) {
				s.recvBuf, s.recvOff = s.recvBuf[:0], 0
			}
			before := len(c.out)
			c.giveBackLocked(s, int64(n))
			if len(c.out) != before {
				c.kickLocked()
			}
			c.mu.Unlock()
			return n, nil
		}
		if s.err != nil {
			err := s.err
			c.mu.Unlock()
			return 0, err
		}
		if s.remoteEnded || s.bodyClosed {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if len(p) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		s.readWaiting = true
		c.mu.Unlock()
		<-s.readWake
		c.mu.Lock()
	}
}

// Buffered returns how many body bytes Read returns without waiting, and
// whether the body ends after them (the response's END_STREAM, trailers
// included, has arrived): a relay flushes only when neither holds.
func (b *Body) Buffered() (n int, ended bool) {
	c := b.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(b.s.recvBuf) - b.s.recvOff, b.s.remoteEnded || b.s.err != nil
}

// Close ends the body: a stream not yet closed both ways is reset
// (CANCEL), which also stops a request body still being sent.
func (b *Body) Close() error {
	s := b.s
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	s.bodyClosed = true
	if !s.done {
		s.abortLocked(errBodyClosed, true)
		c.kickLocked()
	}
	c.mu.Unlock()
	s.awaitSent()
	c.mu.Lock()
	return nil
}

var errBodyClosed = errors.New("h2client: response body closed")
