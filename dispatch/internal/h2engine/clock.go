package h2engine

import (
	"errors"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// headClock is the reader under the connection's read buffer. It notes
// when bytes arrive (for PINGs) and bounds request heads in time as the
// HTTP/1.1 engine does: a header block (HEADERS and its CONTINUATION
// frames, a request's head or trailers) must arrive whole within
// HeaderTimeout of its first byte, and a new connection must complete its
// first header block within HeaderTimeout of the start. It follows the
// frame headers in the bytes read (payloads are skipped) and sets the
// connection's read deadline only when a read ends inside a header block,
// so a request whose HEADERS arrive in one read costs no timer update.
//
// Only the goroutine that reads the connection uses it.
type headClock struct {
	c       *Conn
	nc      net.Conn
	timeout time.Duration
	err     error // the last read error

	preface   int // bytes of the client preface still to skip
	hdr       [frameHeaderLen]byte
	hdrN      int    // bytes of the current frame header collected
	left      uint32 // payload bytes of the current frame still to come
	endsBlock bool   // the current frame ends its header block
	inBlock   bool   // a header block has started and not ended
	opened    bool   // a header block has completed
	armed     bool   // the read deadline is set
	expired   bool   // the deadline fired
}

func (k *headClock) init(c *Conn, nc net.Conn, timeout time.Duration) {
	k.c, k.nc, k.timeout, k.preface = c, nc, timeout, len(clientPreface)
	if timeout > 0 {
		k.armed = true
		_ = nc.SetReadDeadline(time.Now().Add(timeout))
	}
}

// Read reads from the connection for the read buffer.
func (k *headClock) Read(p []byte) (int, error) {
	n, err := k.nc.Read(p)
	if n > 0 {
		k.c.lastRead.Store(k.c.now())
		if k.timeout > 0 {
			k.observe(p[:n])
		}
	}
	if err != nil {
		k.err = err
		var ne net.Error
		if k.armed && !k.expired && errors.As(err, &ne) && ne.Timeout() {
			k.expired = true
		}
	}
	return n, err
}

// observe follows the frames in b and sets or clears the read deadline.
func (k *headClock) observe(b []byte) {
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
			switch http2.FrameType(k.hdr[3]) {
			case http2.FrameHeaders:
				k.inBlock = true
				k.endsBlock = k.hdr[4]&flagEndHeaders != 0
			case http2.FrameContinuation:
				k.endsBlock = k.hdr[4]&flagEndHeaders != 0
			default:
				k.endsBlock = false
			}
			k.left = uint32(k.hdr[0])<<16 | uint32(k.hdr[1])<<8 | uint32(k.hdr[2])
			if k.left == 0 {
				k.frameDone()
			}
		}
	}
	// A deadline runs while a header block is open, until the first one
	// has completed, and while a frame header is incomplete (it may start
	// a header block).
	want := k.inBlock || !k.opened || k.hdrN > 0
	switch {
	case want && !k.armed:
		k.armed = true
		_ = k.nc.SetReadDeadline(time.Now().Add(k.timeout))
	case !want && k.armed:
		k.armed = false
		_ = k.nc.SetReadDeadline(time.Time{})
	}
}

func (k *headClock) frameDone() {
	if k.endsBlock && k.inBlock {
		k.inBlock = false
		k.opened = true
	}
	k.endsBlock = false
}

// timedOutInHead reports whether the read deadline fired on a request
// head in progress (a connection that simply opened no stream in time is
// closed without a word, as browsers open connections ahead of use).
func (k *headClock) timedOutInHead() bool {
	return k.expired && (k.inBlock || k.hdrN > 0)
}

// The connection timer: one time.AfterFunc per connection that closes
// idle connections and sends PINGs. It reads clock values that the hot
// path only stores (lastRead, idleSince), so a request costs no timer
// update; each time it fires it works out when it must fire next.

func (c *Conn) startTimer() {
	if c.cfg.IdleTimeout <= 0 && c.cfg.PingInterval <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = time.AfterFunc(c.nextTickLocked(c.now()), c.tick)
}

// nextTickLocked returns how long until something may be due (c.mu held).
func (c *Conn) nextTickLocked(now int64) time.Duration {
	next := time.Hour
	if d := c.cfg.IdleTimeout; d > 0 {
		if c.live == 0 {
			next = min(next, d-time.Duration(now-c.idleSince))
		} else {
			next = min(next, d)
		}
	}
	if d := c.cfg.PingInterval; d > 0 {
		if c.pingSentAt != 0 {
			next = min(next, c.cfg.PingTimeout-time.Duration(now-c.pingSentAt))
		} else {
			next = min(next, d-time.Duration(now-c.lastRead.Load()))
		}
	}
	return max(next, time.Millisecond)
}

func (c *Conn) tick() {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	now := c.now()
	cfg := &c.cfg
	c.releaseWorkersLocked()
	if cfg.IdleTimeout > 0 && c.live == 0 && time.Duration(now-c.idleSince) >= cfg.IdleTimeout {
		c.mu.Unlock()
		c.goAwayAndClose(http2.ErrCodeNo, "idle timeout")
		return
	}
	ping := false
	if cfg.PingInterval > 0 {
		lastRead := c.lastRead.Load()
		if c.pingSentAt != 0 && lastRead > c.pingSentAt {
			c.pingSentAt = 0 // the peer is alive
		}
		switch {
		case c.pingSentAt != 0 && time.Duration(now-c.pingSentAt) >= cfg.PingTimeout:
			c.mu.Unlock()
			c.report(ErrorEvent{Code: http2.ErrCodeNo, Reason: "ping timeout"})
			c.closeNow()
			return
		case c.pingSentAt == 0 && time.Duration(now-lastRead) >= cfg.PingInterval:
			c.pingSentAt = now
			ping = true
		}
	}
	c.timer.Reset(c.nextTickLocked(now))
	c.mu.Unlock()
	if ping {
		c.queueCtrl(ctrlFrame{kind: ctrlPing, data: [8]byte{'h', '2', 'e', 'n', 'g', 'i', 'n', 'e'}})
		c.kickCtrl()
	}
}
