package dispatch

import "math/rand/v2"

// Request ids: every request gets one, in its access-log record, in the
// X-Request-Id sent to the app and in the X-Request-Id of the answer (the
// app's or the listener's own), on HTTP/1.1, HTTP/2, h2c and WebSockets.
//
// The listener generates it: 128 random bits as 32 lowercase hex digits,
// the shape of a W3C trace-context trace-id. The bits come from
// math/rand/v2's runtime source (ChaCha8, seeded from the system's entropy
// per thread): no system call, no lock, no allocation. A trusted peer
// (--trusted-proxies) that sent exactly one X-Request-Id of 1 to
// maxRequestIDLen bytes in the safe charset (validRequestID) has its id
// kept instead; any other X-Request-Id a client sent is replaced.

// maxRequestIDLen bounds a trusted peer's X-Request-Id (Heroku's router
// accepts up to 200; common ids are 26 to 36 characters).
const maxRequestIDLen = 128

// generatedIDLen is the length of an id the listener generates.
const generatedIDLen = 32

// requestID is a request's id, held in place (no allocation).
type requestID struct {
	n uint8
	b [maxRequestIDLen]byte
}

// generate sets id to a fresh random id.
func (id *requestID) generate() {
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := 15; i >= 0; i-- {
		id.b[i] = hexDigits[hi&0xf]
		id.b[16+i] = hexDigits[lo&0xf]
		hi >>= 4
		lo >>= 4
	}
	id.n = generatedIDLen
}

// bytes returns the id (valid while id is).
func (id *requestID) bytes() []byte { return id.b[:id.n] }

// validRequestID reports whether a trusted peer's X-Request-Id may be kept:
// 1 to maxRequestIDLen bytes of letters, digits and "-_.:+/=@" (UUIDs,
// ULIDs, hex and base64 ids, Heroku's and AWS's), nothing that needs
// quoting in a header or escaping in a log line beyond '='.
func validRequestID[T string | []byte](v T) bool {
	if len(v) == 0 || len(v) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if !requestIDByte[v[i]] {
			return false
		}
	}
	return true
}

var requestIDByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "-_.:+/=@" {
		t[c] = true
	}
	return t
}()

// isRequestIDField reports whether a field name (any case) is X-Request-Id.
func isRequestIDField[T string | []byte](name T) bool {
	const want = "x-request-id"
	if len(name) != len(want) {
		return false
	}
	for i := 0; i < len(want); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}
