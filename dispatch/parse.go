package dispatch

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

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

// headField is one header line, slices into the connection's buffer.
type headField struct {
	name, value []byte
}

// parseError is a request the listener refuses; status and reason are
// what the client is told.
type parseError struct {
	status int
	reason string
}

func (e *parseError) Error() string { return e.reason }

func badRequest(reason string) error { return &parseError{400, reason} }

var errHeadTooLarge = &parseError{431, "request header fields too large"}

// findHeadEnd returns the length of the head including the final CRLFCRLF,
// or -1 when it is not complete.
func findHeadEnd(p []byte) int {
	i := bytes.Index(p, crlfcrlf)
	if i < 0 {
		return -1
	}
	return i + 4
}

// bareLineBreak reports whether p, from index from on, holds an LF not
// preceded by CR or a CR not followed by LF (a CR that ends p is
// undecided until more bytes arrive).
func bareLineBreak(p []byte, from int) bool {
	for i := from; i < len(p); i++ {
		switch p[i] {
		case '\n':
			if i == 0 || p[i-1] != '\r' {
				return true
			}
		case '\r':
			if i+1 < len(p) && p[i+1] != '\n' {
				return true
			}
		}
	}
	return false
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	crlf     = []byte("\r\n")
)

// tokenTable marks RFC 9110 tchar bytes.
var tokenTable = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for _, c := range p {
		if !tokenTable[c] {
			return false
		}
	}
	return true
}

// validFieldValue accepts HTAB, SP, VCHAR and obs-text; it rejects CTLs and DEL.
func validFieldValue(p []byte) bool {
	for _, c := range p {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget accepts visible ASCII only.
func validTarget(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for _, c := range p {
		if c <= 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

func trimOWS(p []byte) []byte {
	for len(p) > 0 && (p[0] == ' ' || p[0] == '\t') {
		p = p[1:]
	}
	for len(p) > 0 && (p[len(p)-1] == ' ' || p[len(p)-1] == '\t') {
		p = p[:len(p)-1]
	}
	return p
}

// parseFields parses header lines (without the final empty line) into
// fields, appending to dst. It rejects obs-fold, whitespace before the
// colon, invalid names and values, bare CR or LF, and more than maxFields.
func parseFields(dst []headField, p []byte, maxFields int) ([]headField, error) {
	for len(p) > 0 {
		i := bytes.Index(p, crlf)
		if i < 0 {
			return dst, badRequest("malformed header line")
		}
		line := p[:i]
		p = p[i+2:]
		if len(line) == 0 {
			return dst, badRequest("malformed header section")
		}
		if line[0] == ' ' || line[0] == '\t' {
			return dst, badRequest("obsolete line folding is not allowed")
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return dst, badRequest("malformed header line")
		}
		name := line[:colon]
		if !isToken(name) {
			return dst, badRequest("invalid header name")
		}
		value := trimOWS(line[colon+1:])
		if !validFieldValue(value) {
			return dst, badRequest("invalid byte in header value")
		}
		if len(dst) >= maxFields {
			return dst, errHeadTooLarge
		}
		dst = append(dst, headField{name, value})
	}
	return dst, nil
}

// asciiEqualFold reports whether a equals the lower-case ASCII string b,
// ignoring ASCII case in a.
func asciiEqualFold(a []byte, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		c := a[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != b[i] {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v contains token
// (lower case), ignoring case and optional whitespace.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var part []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			part, v = v[:i], v[i+1:]
		} else {
			part, v = v, nil
		}
		if asciiEqualFold(trimOWS(part), token) {
			return true
		}
	}
	return false
}

// parseContentLength parses a Content-Length value: 1 to 18 digits.
func parseContentLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
