package dispatch

import (
	"bytes"
	"errors"
	"io"
	"strconv"

	"github.com/applistener/applistener/internal/httpgrammar"
)

var (
	errBadChunk   = badRequest("malformed chunked body")
	errLineTooBig = badRequest("chunk line too long")
)

// readLine returns the next CRLF-terminated line (without CRLF) from in,
// reading more as needed, rejecting lines longer than max and bare LF.
func (b *inbuf) readLine(max int) ([]byte, error) {
	for {
		p := b.bytes()
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			if i > max+1 {
				return nil, errLineTooBig
			}
			if i == 0 || p[i-1] != '\r' {
				return nil, errBadChunk
			}
			b.r += i + 1
			return p[:i-1], nil
		}
		if len(p) > max {
			return nil, errLineTooBig
		}
		if b.r == b.w {
			b.r, b.w = 0, 0
		}
		if err := b.fill(); err != nil {
			if errors.Is(err, errBufferFull) {
				b.compact()
				if err = b.fill(); err == nil {
					continue
				}
			}
			return nil, eofIsUnexpected(err)
		}
	}
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// maxTLSRecord is the largest plaintext of one TLS record.
const maxTLSRecord = 16 << 10

// copyN copies exactly n bytes from in to w, using in's own buffer, and
// calls flush (when set) whenever in runs dry: the app has nothing more
// for now.
func copyN(w io.Writer, in *inbuf, n int64, flush func() error) (int64, error) {
	return copyExactly(w, in, n, flush, true)
}

// copyWhole is copyN for a whole response body: it does not flush after the
// last byte, since the caller ends the response (over HTTP/2 the last DATA
// frame then carries END_STREAM, rather than an empty frame of its own
// written with one more system call).
func copyWhole(w io.Writer, in *inbuf, n int64, flush func() error) (int64, error) {
	return copyExactly(w, in, n, flush, false)
}

func copyExactly(w io.Writer, in *inbuf, n int64, flush func() error, flushLast bool) (int64, error) {
	var done int64
	for done < n {
		if in.buffered() == 0 {
			if err := in.fillRecords(); err != nil {
				return done, eofIsUnexpected(err)
			}
		}
		p := in.bytes()
		if int64(len(p)) > n-done {
			p = p[:n-done]
		}
		m, err := w.Write(p)
		in.r += m
		done += int64(m)
		if err != nil {
			return done, err
		}
		if flush != nil && in.buffered() == 0 && (done < n || flushLast) {
			if err := flush(); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// copyUntilEOF copies everything until src ends (a close-delimited body).
func copyUntilEOF(w io.Writer, in *inbuf, flush func() error) (int64, error) {
	var done int64
	for {
		if in.buffered() == 0 {
			if err := in.fillRecords(); err != nil {
				if err == io.EOF {
					return done, nil
				}
				return done, err
			}
		}
		m, err := w.Write(in.bytes())
		in.r += m
		done += int64(m)
		if err != nil {
			return done, err
		}
		if flush != nil && in.buffered() == 0 {
			if err := flush(); err != nil {
				return done, err
			}
		}
	}
}

const maxChunkLine = 4096

// copyChunked decodes a chunked body from in and writes it to w, re-encoded
// as chunked when encode is true (chunk extensions and trailers are
// dropped; trailer fields are not forwarded). It returns the decoded size.
// With flush, what was written is flushed whenever the copy is about to
// wait for the app (a live stream's events go out as they arrive).
func copyChunked(w io.Writer, in *inbuf, encode bool, flush func() error) (int64, error) {
	var total int64
	var hdr [20]byte
	for {
		if err := flushBeforeLine(in, flush); err != nil {
			return total, err
		}
		line, err := in.readLine(maxChunkLine)
		if err != nil {
			return total, err
		}
		size, ok := parseChunkSize(line)
		if !ok {
			return total, errBadChunk
		}
		if size == 0 {
			// Trailer section: header lines until an empty line.
			for n := 0; ; n++ {
				tl, err := in.readLine(maxChunkLine)
				if err != nil {
					return total, err
				}
				if len(tl) == 0 {
					break
				}
				if n > 64 || httpgrammar.IsOWS(tl[0]) || bytes.IndexByte(tl, ':') <= 0 || !httpgrammar.ValidFieldValue(tl) {
					return total, errBadChunk
				}
			}
			if encode {
				if _, err := io.WriteString(w, "0\r\n\r\n"); err != nil {
					return total, err
				}
			}
			if flush != nil {
				if err := flush(); err != nil {
					return total, err
				}
			}
			return total, nil
		}
		if encode {
			h := strconv.AppendInt(hdr[:0], size, 16)
			h = append(h, '\r', '\n')
			if _, err := w.Write(h); err != nil {
				return total, err
			}
		}
		n, err := copyN(w, in, size, flush)
		total += n
		if err != nil {
			return total, err
		}
		end, err := in.readLine(2)
		if errors.Is(err, errLineTooBig) {
			err = errBadChunk // data longer than its chunk size
		}
		if err != nil {
			return total, err
		}
		if len(end) != 0 {
			return total, errBadChunk
		}
		if encode {
			if _, err := w.Write(crlf); err != nil {
				return total, err
			}
		}
	}
}

// flushBeforeLine flushes (when flush is set) unless a whole line is
// already buffered in in: reading the next one would wait for the app.
func flushBeforeLine(in *inbuf, flush func() error) error {
	if flush == nil || bytes.IndexByte(in.bytes(), '\n') >= 0 {
		return nil
	}
	return flush()
}

// parseChunkSize parses "HEX[;ext...]" strictly: 1 to 15 hex digits, no
// whitespace before the extension.
func parseChunkSize(line []byte) (int64, bool) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		if !httpgrammar.ValidFieldValue(line[i+1:]) {
			return 0, false
		}
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range line {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	return n, true
}
