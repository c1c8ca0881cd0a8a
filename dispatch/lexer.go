package dispatch

import (
	"bytes"
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

// validFieldValue accepts HTAB, SP, VCHAR and obs-text; it rejects CTLs and
// DEL. HTTP/1.1 heads (bytes) and HTTP/2 fields (strings) share it.
func validFieldValue[T ~string | ~[]byte](p T) bool {
	for i := 0; i < len(p); i++ {
		if c := p[i]; (c < 0x20 && c != '\t') || c == 0x7f {
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
			part, v = trimOWS(v[:j]), v[j+1:]
		} else {
			part, v = trimOWS(v), nil
		}
		switch {
		case len(part) == 0:
		case asciiEqualFold(part, "close"):
			opts.close = true
		case asciiEqualFold(part, "keep-alive"):
			opts.keepAlive = true
		case asciiEqualFold(part, "upgrade"):
			opts.upgrade = true
		default:
			if !isToken(part) {
				bad = true
			}
			tokens = append(tokens, part)
		}
	}
	return opts, tokens, bad
}
