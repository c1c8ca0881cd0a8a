package tlshello

import (
	"errors"
	"net"
	"sync"
)

// PrefixConn is a net.Conn whose Read returns a prefix (the ClientHello
// records ReadClientHello consumed) before reading from the connection, so
// that crypto/tls, or a backend, sees the stream from its first byte.
//
// As the transport under crypto/tls it can also hold writes: crypto/tls
// writes every record (at most 16 KiB) with a Write of its own, so a
// 64 KiB chunk of a download costs four system calls; between HoldWrites
// and FlushWrites the records are collected and written with one.
// All other methods are the embedded connection's.
type PrefixConn struct {
	net.Conn
	prefix []byte

	// mu guards held and is held across every Write to the connection, so
	// that a record written by another goroutine (crypto/tls answering a
	// KeyUpdate) can never overtake the held ones.
	mu   sync.Mutex
	held *[]byte // writes collected since HoldWrites; nil when not holding
}

// heldPool holds the buffers of held writes.
var heldPool = sync.Pool{New: func() any { b := make([]byte, 0, 80<<10); return &b }}

// HoldWrites collects the following Writes until FlushWrites.
func (p *PrefixConn) HoldWrites() {
	p.mu.Lock()
	if p.held == nil {
		p.held = heldPool.Get().(*[]byte)
	}
	p.mu.Unlock()
}

// FlushWrites writes what was collected since HoldWrites in one Write and
// stops holding.
func (p *PrefixConn) FlushWrites() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := p.held
	p.held = nil
	if held == nil {
		return nil
	}
	var err error
	if len(*held) > 0 {
		_, err = p.Conn.Write(*held)
	}
	if cap(*held) <= 256<<10 {
		*held = (*held)[:0]
		heldPool.Put(held)
	}
	return err
}

// Write writes b, or collects it while writes are held.
func (p *PrefixConn) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		*p.held = append(*p.held, b...)
		return len(b), nil
	}
	return p.Conn.Write(b)
}

// NewPrefixConn returns a *PrefixConn that replays prefix and then reads
// from c. The prefix is not copied; it must not change while in use.
func NewPrefixConn(c net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		prefix = nil
	}
	return &PrefixConn{Conn: c, prefix: prefix}
}

// Read drains the prefix first (never mixing it with connection bytes in
// one call), then reads from the connection. The prefix is released as soon
// as it has been consumed.
func (p *PrefixConn) Read(b []byte) (int, error) {
	if p.prefix == nil {
		return p.Conn.Read(b)
	}
	if len(b) == 0 {
		return 0, nil
	}
	n := copy(b, p.prefix)
	p.prefix = p.prefix[n:]
	if len(p.prefix) == 0 {
		p.prefix = nil
	}
	return n, nil
}

// Buffered reports how many prefix bytes have not been read yet.
func (p *PrefixConn) Buffered() int { return len(p.prefix) }

// NetConn returns the wrapped connection. Reading from it directly skips
// the prefix bytes that are still buffered.
func (p *PrefixConn) NetConn() net.Conn { return p.Conn }

// CloseWrite half-closes the wrapped connection when it supports that
// (*net.TCPConn, *net.UnixConn), and returns errors.ErrUnsupported otherwise.
func (p *PrefixConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
