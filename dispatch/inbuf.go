package dispatch

import (
	"errors"
	"io"
	"sync"
)

var _ io.Reader = (*inbuf)(nil)

// inbuf is a read buffer over a connection whose backing array comes from
// a pool and is given back while the connection is idle.
type inbuf struct {
	src  io.Reader
	buf  []byte
	bufp *[]byte // the pooled slice buf came from; nil for a grown buffer
	r, w int
	pool *sync.Pool
	big  *sync.Pool // where bufp goes back to after enlarge; nil: pool
}

// putBuf gives the pooled slice back to the pool it came from.
func (b *inbuf) putBuf() {
	if b.bufp == nil {
		return
	}
	if b.big != nil {
		b.big.Put(b.bufp)
		b.big = nil
	} else {
		b.pool.Put(b.bufp)
	}
	b.bufp = nil
}

// enlarge swaps the buffer for a larger one from big, keeping the buffered
// bytes, for a large body: fewer, larger reads. release gives it back.
func (b *inbuf) enlarge(big *sync.Pool) {
	if b.big != nil || b.buf == nil {
		return
	}
	bp := big.Get().(*[]byte)
	if len(*bp) <= len(b.buf) {
		big.Put(bp)
		return
	}
	n := copy(*bp, b.buf[b.r:b.w])
	b.putBuf()
	b.bufp, b.buf, b.r, b.w, b.big = bp, *bp, 0, n, big
}

func (b *inbuf) buffered() int { return b.w - b.r }

func (b *inbuf) bytes() []byte { return b.buf[b.r:b.w] }

func (b *inbuf) acquire() {
	if b.buf == nil {
		b.bufp = b.pool.Get().(*[]byte)
		b.buf = *b.bufp
		b.r, b.w = 0, 0
	}
}

// grow replaces a full buffer with a larger one of at most max bytes (not
// pooled); it reports false when the buffer is already that large.
func (b *inbuf) grow(max int) bool {
	if len(b.buf) >= max {
		return false
	}
	nb := make([]byte, min(2*len(b.buf), max))
	b.w = copy(nb, b.buf[b.r:b.w])
	b.r = 0
	b.putBuf()
	b.buf = nb
	return true
}

// release gives the buffer back when it holds no unread bytes.
func (b *inbuf) release() {
	if b.buf != nil && b.r == b.w {
		b.putBuf()
		b.buf = nil
		b.r, b.w = 0, 0
	}
}

// fill reads more bytes, compacting first when the buffer is full.
func (b *inbuf) fill() error {
	b.acquire()
	if b.r == b.w {
		b.r, b.w = 0, 0
	}
	if b.r > 0 && b.w == len(b.buf) {
		copy(b.buf, b.buf[b.r:b.w])
		b.w -= b.r
		b.r = 0
	}
	if b.w == len(b.buf) {
		return errBufferFull
	}
	n, err := b.src.Read(b.buf[b.w:])
	b.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// fillRecords reads into the emptied buffer at most a whole number of TLS
// records' worth of bytes (when it holds at least one record), so that
// relaying them to a TLS client makes full records: the 17 KiB buffer
// would otherwise send a 16 KiB and a 1 KiB record, two write(2), per read.
func (b *inbuf) fillRecords() error {
	b.acquire()
	b.r, b.w = 0, 0
	size := len(b.buf)
	if size > maxTLSRecord {
		size -= size % maxTLSRecord
	}
	n, err := b.src.Read(b.buf[:size])
	b.w = n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// compact moves unread bytes to the front.
func (b *inbuf) compact() {
	if b.r > 0 {
		copy(b.buf, b.buf[b.r:b.w])
		b.w -= b.r
		b.r = 0
	}
}

// Read implements io.Reader, serving buffered bytes first.
func (b *inbuf) Read(p []byte) (int, error) {
	if b.r < b.w {
		n := copy(p, b.buf[b.r:b.w])
		b.r += n
		return n, nil
	}
	return b.src.Read(p)
}

var errBufferFull = errors.New("buffer full")
