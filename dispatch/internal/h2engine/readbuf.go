package h2engine

import (
	"io"
	"sync"
)

// readBufferSize is the connection's read buffer (frames are read from
// it).
const readBufferSize = 16 << 10

// waitReadSize is the small read that waits for a client with nothing
// buffered.
const waitReadSize = 64

var readBufPool = sync.Pool{New: func() any {
	b := make([]byte, readBufferSize)
	return &b
}}

// readBuf is the connection's read buffer: the Framer reads frames from
// it, readHeaders peeks at HEADERS payloads in it. Its 16 KiB come from a
// pool while bytes are buffered and go back once every buffered byte has
// been consumed; the read that then waits for the client is made into a
// small array of its own, so a connection waiting for its client (idle,
// or holding only a WebSocket) keeps no read buffer. Only the goroutine
// running Serve uses it.
type readBuf struct {
	src  io.Reader
	buf  *[]byte // nil while released
	r, w int     // unread bytes: (*buf)[r:w]
	wait [waitReadSize]byte
}

// Size is the most Peek can return.
func (b *readBuf) Size() int { return readBufferSize }

// Buffered returns the number of bytes that can be read without reading
// from the connection.
func (b *readBuf) Buffered() int { return b.w - b.r }

// Read reads up to len(p) buffered bytes, reading from the connection
// only when none are buffered.
func (b *readBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r == b.w {
		if err := b.fill(1); err != nil {
			return 0, err
		}
	}
	n := copy(p, (*b.buf)[b.r:b.w])
	b.consume(n)
	return n, nil
}

// Peek returns the next n bytes (n ≤ Size) without consuming them; they
// stay valid until the next call. Peek(0) returns nothing and reads
// nothing (a frame's payload can be empty while the buffer is released).
func (b *readBuf) Peek(n int) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	if b.w-b.r < n {
		if err := b.fill(n); err != nil {
			return nil, err
		}
	}
	return (*b.buf)[b.r : b.r+n], nil
}

// Discard consumes n buffered bytes (n ≤ Buffered).
func (b *readBuf) Discard(n int) { b.consume(n) }

// consume consumes n buffered bytes and releases the buffer once none are
// left.
func (b *readBuf) consume(n int) {
	b.r += n
	if b.r == b.w {
		b.release()
	}
}

// release returns the buffer to the pool.
func (b *readBuf) release() {
	if b.buf != nil {
		readBufPool.Put(b.buf)
		b.buf = nil
	}
	b.r, b.w = 0, 0
}

// fill reads from the connection until at least n bytes (n ≤ Size) are
// buffered. With none buffered, the first read, the one that may wait for
// the client, goes to the small array; the buffer is taken once bytes
// have arrived.
func (b *readBuf) fill(n int) error {
	if b.buf == nil {
		m, err := b.src.Read(b.wait[:])
		if m == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return err
		}
		b.buf = readBufPool.Get().(*[]byte)
		b.r, b.w = 0, copy(*b.buf, b.wait[:m])
	}
	buf := *b.buf
	if b.r > 0 && len(buf)-b.r < n {
		b.w = copy(buf, buf[b.r:b.w])
		b.r = 0
	}
	for b.w-b.r < n {
		m, err := b.src.Read(buf[b.w:])
		b.w += m
		if m == 0 && err == nil {
			err = io.ErrNoProgress
		}
		if err != nil {
			if b.w-b.r >= n {
				return nil
			}
			if b.r == b.w {
				b.release()
			}
			return err
		}
	}
	return nil
}
