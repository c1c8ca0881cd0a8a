package dispatch

import (
	"net"
	"time"
)

// h2HeadClock bounds HTTP/2 request heads in time as readHead bounds
// HTTP/1.1 ones: a header block (HEADERS and its CONTINUATION frames, a
// request's head or trailers) must arrive whole within the head timeout of
// its first byte, and a new connection must complete its first header
// block within the head timeout of the start. Otherwise the read fails and
// x/net closes the connection. It watches the bytes x/net reads (frame
// headers only; payloads are skipped) and owns the connection's read
// deadline, which x/net itself does not use (no ReadTimeout is set).
//
// Only the goroutine that reads the connection calls it.
type h2HeadClock struct {
	conn    net.Conn // the connection whose read deadline it sets
	timeout time.Duration

	preface   int // bytes of the client preface still to skip
	hdr       [9]byte
	hdrN      int    // bytes of the current frame header collected
	left      uint32 // payload bytes of the current frame still to come
	endsBlock bool   // the current frame ends its header block (END_HEADERS)
	inBlock   bool   // a header block has started and not ended
	opened    bool   // a header block has completed: a stream was opened
	armed     bool   // the read deadline is set
	expired   bool   // the deadline fired
}

const (
	h2FrameHeaders      = 0x1
	h2FrameContinuation = 0x9
	h2FlagEndHeaders    = 0x4
	h2ClientPrefaceLen  = 24 // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// start arms the clock for a new connection: its first header block must
// be complete within the timeout.
func (k *h2HeadClock) start(conn net.Conn, timeout time.Duration) {
	k.conn, k.timeout, k.preface = conn, timeout, h2ClientPrefaceLen
	k.armed = true
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
}

// observe follows the frames in b, bytes just read, and sets or clears the
// read deadline accordingly.
func (k *h2HeadClock) observe(b []byte) {
	for len(b) > 0 {
		switch {
		case k.preface > 0:
			n := min(k.preface, len(b))
			k.preface -= n
			b = b[n:]
		case k.left > 0:
			n := uint32(min(uint64(k.left), uint64(len(b))))
			k.left -= n
			b = b[n:]
			if k.left == 0 {
				k.frameDone()
			}
		default:
			n := copy(k.hdr[k.hdrN:], b)
			k.hdrN += n
			b = b[n:]
			if k.hdrN < len(k.hdr) {
				continue
			}
			k.hdrN = 0
			switch k.hdr[3] {
			case h2FrameHeaders:
				k.inBlock = true
				k.endsBlock = k.hdr[4]&h2FlagEndHeaders != 0
			case h2FrameContinuation:
				k.endsBlock = k.hdr[4]&h2FlagEndHeaders != 0
			default:
				k.endsBlock = false
			}
			k.left = uint32(k.hdr[0])<<16 | uint32(k.hdr[1])<<8 | uint32(k.hdr[2])
			if k.left == 0 {
				k.frameDone()
			}
		}
	}
	// A deadline runs while a header block is open, until the first
	// stream is opened, and while a frame header is incomplete (it may be
	// the start of a header block).
	want := k.inBlock || !k.opened || k.hdrN > 0
	switch {
	case want && !k.armed:
		k.armed = true
		_ = k.conn.SetReadDeadline(time.Now().Add(k.timeout))
	case !want && k.armed:
		k.armed = false
		_ = k.conn.SetReadDeadline(time.Time{})
	}
}

func (k *h2HeadClock) frameDone() {
	if k.endsBlock && k.inBlock {
		k.inBlock = false
		k.opened = true
	}
	k.endsBlock = false
}

// timedOut reports whether err is the clock's deadline firing on a
// request head in progress (a header block, or a frame header that may
// start one); it reports it once. A connection that simply opened no
// stream in time is closed without a word, as an idle HTTP/1.1 connection
// is (browsers open connections ahead of use).
func (k *h2HeadClock) timedOut(err error) bool {
	if !k.armed || k.expired || !isTimeout(err) {
		return false
	}
	k.expired = true
	return k.inBlock || k.hdrN > 0
}
