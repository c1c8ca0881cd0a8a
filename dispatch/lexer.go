package dispatch

import (
	"bytes"

	"github.com/applistener/applistener/internal/httpgrammar"
)

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
		if httpgrammar.IsOWS(line[0]) {
			return dst, badRequest("obsolete line folding is not allowed")
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return dst, badRequest("malformed header line")
		}
		name := line[:colon]
		if !httpgrammar.IsToken(name) {
			return dst, badRequest("invalid header name")
		}
		value := httpgrammar.TrimOWS(line[colon+1:])
		if !httpgrammar.ValidFieldValue(value) {
			return dst, badRequest("invalid byte in header value")
		}
		if len(dst) >= maxFields {
			return dst, errHeadTooLarge
		}
		dst = append(dst, headField{name, value})
	}
	return dst, nil
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
		if httpgrammar.EqualFold(httpgrammar.TrimOWS(part), token) {
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

// connectionOptions are the connection options a Connection field sets.
type connectionOptions struct {
	close, keepAlive, upgrade bool
}

// parseConnection reads a Connection field value: the close, keep-alive
// and upgrade options, and every other token appended to tokens (the
// names of fields that are hop-by-hop for this message). bad reports a
// token that is not a valid token.
func parseConnection(v []byte, tokens [][]byte) (opts connectionOptions, out [][]byte, bad bool) {
	for len(v) > 0 {
		var part []byte
		if j := bytes.IndexByte(v, ','); j >= 0 {
			part, v = httpgrammar.TrimOWS(v[:j]), v[j+1:]
		} else {
			part, v = httpgrammar.TrimOWS(v), nil
		}
		switch {
		case len(part) == 0:
		case httpgrammar.EqualFold(part, "close"):
			opts.close = true
		case httpgrammar.EqualFold(part, "keep-alive"):
			opts.keepAlive = true
		case httpgrammar.EqualFold(part, "upgrade"):
			opts.upgrade = true
		default:
			if !httpgrammar.IsToken(part) {
				bad = true
			}
			tokens = append(tokens, part)
		}
	}
	return opts, tokens, bad
}
