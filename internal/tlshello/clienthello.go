package tlshello

import (
	"errors"
	"io"
	"strings"
)

// DefaultMaxClientHelloBytes is the ClientHello body limit ReadClientHello
// applies when it is passed maxBytes <= 0. It equals crypto/tls's own limit
// for a handshake message, so anything crypto/tls would accept fits.
const DefaultMaxClientHelloBytes = 64 << 10

const (
	recordTypeAlert     = 21
	recordTypeHandshake = 22

	handshakeTypeClientHello = 1

	recordHeaderLen    = 5
	handshakeHeaderLen = 4
	maxPlaintext       = 16384 // RFC 8446 §5.1: a record body is at most 2^14 bytes

	// recordOverheadAllowance bounds the record headers ReadClientHello
	// accepts on top of the handshake message itself: room for 256 records,
	// far more than any real client splits its hello into (a 64 KiB hello
	// needs 5), while tiny-record fragmentation cannot make it read more than
	// maxBytes + 4 + 1280 bytes.
	recordOverheadAllowance = 256 * recordHeaderLen

	extServerName    = 0
	extALPN          = 16
	extPreSharedKey  = 41
	sniHostName      = 0
	maxHostNameBytes = 255
)

// ClientHello is what the listener and the edge need from a TLS ClientHello.
type ClientHello struct {
	ServerName string   // SNI host_name, as sent (not lower-cased), "" when absent
	ALPN       []string // offered protocols, in order
	Raw        []byte   // every byte read from the connection, to replay (whole TLS records)
}

var (
	// ErrNotTLS: the first record is not a TLS handshake record (for
	// example plain HTTP "GET / HTTP/1.1" or an SSLv2 hello). Nothing beyond
	// the first 5 bytes was read. The caller may answer it in its own way.
	ErrNotTLS = errors.New("listener: not a TLS handshake")
	// ErrClientHelloTooLarge: the ClientHello (or the records carrying it)
	// exceeds the configured limit. The oversized part was not read.
	ErrClientHelloTooLarge = errors.New("listener: TLS ClientHello too large")
	// ErrMalformedClientHello: the records or the ClientHello violate the
	// TLS specification.
	ErrMalformedClientHello = errors.New("listener: malformed TLS ClientHello")
)

// ClientHelloError is the error ReadClientHello returns for a ClientHello it
// refuses. errors.Is(err, ErrMalformedClientHello) or
// errors.Is(err, ErrClientHelloTooLarge) tells the two kinds apart; Alert is
// the alert description a server should answer with (see WriteAlert).
type ClientHelloError struct {
	Alert  uint8  // TLS alert description to send to the peer
	Reason string // what was wrong, for logs; never contains peer bytes
	kind   error  // ErrMalformedClientHello or ErrClientHelloTooLarge
}

func (e *ClientHelloError) Error() string { return e.kind.Error() + ": " + e.Reason }

// Unwrap returns ErrMalformedClientHello or ErrClientHelloTooLarge.
func (e *ClientHelloError) Unwrap() error { return e.kind }

func malformed(alert uint8, reason string) error {
	return &ClientHelloError{Alert: alert, Reason: reason, kind: ErrMalformedClientHello}
}

func decodeErr(reason string) error { return malformed(AlertDecodeError, reason) }

func tooLarge(reason string) error {
	return &ClientHelloError{Alert: AlertHandshakeFailure, Reason: reason, kind: ErrClientHelloTooLarge}
}

// maxReadFor is the most bytes ReadClientHello reads from its reader for a
// given maxBytes: the handshake message, its 4-byte header and the record
// headers allowance.
func maxReadFor(maxBytes int) int {
	return clampMax(maxBytes) + handshakeHeaderLen + recordOverheadAllowance
}

// clampMax applies the default to maxBytes <= 0 and caps it at the largest
// length a handshake message header can declare.
func clampMax(maxBytes int) int {
	if maxBytes <= 0 {
		return DefaultMaxClientHelloBytes
	}
	return min(maxBytes, 1<<24-1)
}

// helloAlloc puts the result, the first record header and a small ALPN
// array in one allocation.
type helloAlloc struct {
	ch   ClientHello
	alpn [4]string
	hdr  [recordHeaderLen]byte
}

// ReadClientHello reads TLS records from r until the complete ClientHello
// handshake message has been read, parses it, and returns it.
//
// It reads a record header and then exactly that record's body, and stops
// at the record that completes the ClientHello, so everything after it is
// still unread in r; Raw holds the bytes read, record framing included, to
// replay to a TLS server (see NewPrefixConn). maxBytes limits the
// ClientHello body (<= 0 means DefaultMaxClientHelloBytes; values above
// 2^24-1 mean 2^24-1); at most
// maxBytes + 4 + 1280 bytes are read in total.
//
// Errors: ErrNotTLS when the first record is not a handshake record;
// a *ClientHelloError matching ErrClientHelloTooLarge or
// ErrMalformedClientHello; io.EOF when r ends before the first byte and
// io.ErrUnexpectedEOF when it ends inside the hello; any other read error
// as returned by r.
func ReadClientHello(r io.Reader, maxBytes int) (*ClientHello, error) {
	maxBytes = clampMax(maxBytes)
	maxRead := maxReadFor(maxBytes)

	a := new(helloAlloc)
	if _, err := io.ReadFull(r, a.hdr[:]); err != nil {
		return nil, err
	}
	h := &a.hdr
	if h[0] != recordTypeHandshake || h[1] != 3 {
		return nil, ErrNotTLS
	}
	if h[2] > 4 {
		return nil, malformed(AlertProtocolVersion, "unknown record version")
	}
	n := int(h[3])<<8 | int(h[4])
	if err := checkRecordLen(n); err != nil {
		return nil, err
	}
	if recordHeaderLen+n > maxRead {
		return nil, tooLarge("record exceeds the limit")
	}
	// The common case is a hello in one record: this buffer is then exact.
	buf := make([]byte, recordHeaderLen+n)
	copy(buf, h[:])
	if _, err := io.ReadFull(r, buf[recordHeaderLen:]); err != nil {
		return nil, unexpectedEOF(err)
	}

	// msg collects the handshake message across records. It aliases buf
	// while the message is in one record, and is a separate copy otherwise.
	msg := buf[recordHeaderLen:]
	single := true
	need := -1 // total handshake message length (header included), once known
	for {
		if need < 0 && len(msg) >= handshakeHeaderLen {
			if msg[0] != handshakeTypeClientHello {
				return nil, malformed(AlertUnexpectedMessage, "first handshake message is not a ClientHello")
			}
			l := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if l > maxBytes {
				return nil, tooLarge("ClientHello length exceeds the limit")
			}
			need = handshakeHeaderLen + l
		}
		if need >= 0 {
			if len(msg) == need {
				break
			}
			if len(msg) > need {
				// A client sends nothing else until the server answers.
				return nil, malformed(AlertUnexpectedMessage, "data after the ClientHello in its last record")
			}
		}

		// Another record is needed.
		if len(buf)+recordHeaderLen > maxRead {
			return nil, tooLarge("records exceed the limit")
		}
		if single {
			// Switch to a separate message buffer sized for the message.
			single = false
			c := handshakeHeaderLen + maxBytes
			if need >= 0 {
				c = need
			} else if c > 2*len(msg)+64 {
				c = 2*len(msg) + 64
			}
			m := make([]byte, len(msg), c)
			copy(m, msg)
			msg = m
		}
		hdrAt := len(buf)
		buf = growHelloBuf(buf, recordHeaderLen, need, msg, maxRead)
		if _, err := io.ReadFull(r, buf[hdrAt:]); err != nil {
			return nil, unexpectedEOF(err)
		}
		rh := buf[hdrAt:]
		if rh[0] != recordTypeHandshake {
			return nil, malformed(AlertUnexpectedMessage, "non-handshake record before the ClientHello is complete")
		}
		if rh[1] != 3 || rh[2] > 4 {
			return nil, malformed(AlertProtocolVersion, "unknown record version")
		}
		n := int(rh[3])<<8 | int(rh[4])
		if err := checkRecordLen(n); err != nil {
			return nil, err
		}
		if need >= 0 && len(msg)+n > need {
			return nil, malformed(AlertUnexpectedMessage, "data after the ClientHello in its last record")
		}
		if len(buf)+n > maxRead {
			return nil, tooLarge("records exceed the limit")
		}
		bodyAt := len(buf)
		buf = growHelloBuf(buf, n, need, msg, maxRead)
		if _, err := io.ReadFull(r, buf[bodyAt:]); err != nil {
			return nil, unexpectedEOF(err)
		}
		msg = append(msg, buf[bodyAt:]...)
	}

	p, err := parseClientHelloBody(msg[handshakeHeaderLen:])
	if err != nil {
		return nil, err
	}
	a.ch.Raw = buf
	p.fill(a)
	return &a.ch, nil
}

func checkRecordLen(n int) error {
	if n == 0 {
		return malformed(AlertUnexpectedMessage, "empty handshake record")
	}
	if n > maxPlaintext {
		return malformed(AlertRecordOverflow, "record longer than 16384 bytes")
	}
	return nil
}

// growHelloBuf extends buf by n bytes. When it must reallocate, it sizes the new
// buffer for the rest of the hello where that is known (one more header per
// 16 KiB) and doubles otherwise, never beyond maxRead.
func growHelloBuf(buf []byte, n, need int, msg []byte, maxRead int) []byte {
	l := len(buf) + n
	if l <= cap(buf) {
		return buf[:l]
	}
	c := 2 * cap(buf)
	if need >= 0 {
		rest := need - len(msg) // message bytes still to read, headers excluded
		if n == recordHeaderLen {
			e := len(buf) + rest + recordHeaderLen*((rest+maxPlaintext-1)/maxPlaintext)
			if e > c {
				c = e
			}
		}
	}
	if c < l {
		c = l
	}
	if c > maxRead {
		c = maxRead
	}
	nb := make([]byte, l, c)
	copy(nb, buf)
	return nb
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parsedHello holds the parts of a ClientHello body that the caller wants,
// as sub-slices of the body.
type parsedHello struct {
	serverName []byte
	alpn       helloCursor // the validated protocol_name_list, nil if absent
	alpnCount  int
	alpnBytes  int
}

// fill copies the parsed names into a.ch with one allocation for all the
// strings, and none for the ALPN slice when it holds at most 4 names.
func (p *parsedHello) fill(a *helloAlloc) {
	total := len(p.serverName) + p.alpnBytes
	if total == 0 {
		return
	}
	var sb strings.Builder
	sb.Grow(total)
	sb.Write(p.serverName)
	l := p.alpn
	for l.len() > 0 {
		name, _ := l.vec8()
		sb.Write(name)
	}
	s := sb.String()
	a.ch.ServerName = s[:len(p.serverName)]
	if p.alpnCount == 0 {
		return
	}
	if p.alpnCount <= len(a.alpn) {
		a.ch.ALPN = a.alpn[:p.alpnCount:p.alpnCount]
	} else {
		a.ch.ALPN = make([]string, p.alpnCount)
	}
	off := len(p.serverName)
	l = p.alpn
	for i := range a.ch.ALPN {
		name, _ := l.vec8()
		a.ch.ALPN[i] = s[off : off+len(name)]
		off += len(name)
	}
}

// parseClientHelloBody parses the body of a ClientHello message (after the
// 4-byte handshake header), RFC 8446 §4.1.2, strictly.
func parseClientHelloBody(body []byte) (parsedHello, error) {
	var p parsedHello
	s := helloCursor(body)
	var (
		ver   uint16
		skip  []byte
		vec   helloCursor
		ok    bool
		exts  helloCursor
		extOK bool
	)
	if ver, ok = s.u16(); !ok {
		return p, decodeErr("truncated legacy_version")
	}
	if ver>>8 != 3 {
		return p, malformed(AlertProtocolVersion, "legacy_version is not 3.x")
	}
	if skip, ok = s.bytes(32); !ok || len(skip) != 32 {
		return p, decodeErr("truncated random")
	}
	if vec, ok = s.vec8(); !ok {
		return p, decodeErr("truncated legacy_session_id")
	}
	if vec.len() > 32 {
		return p, decodeErr("legacy_session_id longer than 32 bytes")
	}
	if vec, ok = s.vec16(); !ok {
		return p, decodeErr("truncated cipher_suites")
	}
	if vec.len() < 2 || vec.len()%2 != 0 {
		return p, decodeErr("cipher_suites length is odd or zero")
	}
	if vec, ok = s.vec8(); !ok {
		return p, decodeErr("truncated legacy_compression_methods")
	}
	if vec.len() < 1 {
		return p, decodeErr("empty legacy_compression_methods")
	}
	if s.len() == 0 {
		return p, nil // a TLS 1.0-1.2 hello may end here
	}
	if exts, extOK = s.vec16(); !extOK || s.len() != 0 {
		return p, decodeErr("extensions length does not match the ClientHello")
	}

	var seen extSet
	for exts.len() > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec16()
		if !ok1 || !ok2 {
			return p, decodeErr("truncated extension")
		}
		if seen.add(typ) {
			return p, decodeErr("duplicate extension")
		}
		switch typ {
		case extServerName:
			name, err := parseSNI(data)
			if err != nil {
				return p, err
			}
			p.serverName = name
		case extALPN:
			if err := p.parseALPN(data); err != nil {
				return p, err
			}
		case extPreSharedKey:
			if exts.len() != 0 {
				return p, malformed(AlertIllegalParameter, "pre_shared_key is not the last extension")
			}
		}
	}
	return p, nil
}

// parseSNI parses the server_name extension (RFC 6066 §3) and returns the
// host_name, nil when the list holds no host_name entry.
func parseSNI(data helloCursor) ([]byte, error) {
	list, ok := data.vec16()
	if !ok || data.len() != 0 {
		return nil, decodeErr("server_name extension length mismatch")
	}
	if list.len() == 0 {
		return nil, decodeErr("empty server_name_list")
	}
	var host []byte
	for list.len() > 0 {
		typ, ok1 := list.u8()
		name, ok2 := list.vec16()
		if !ok1 || !ok2 {
			return nil, decodeErr("truncated server_name_list")
		}
		if name.len() == 0 {
			return nil, decodeErr("empty server name")
		}
		if typ != sniHostName {
			continue // unknown name types are skipped, as crypto/tls does
		}
		if host != nil {
			// RFC 6066: at most one name per name_type. crypto/tls refuses
			// it too, so taking the first would route a hello the TLS
			// server (or an edge backend) then rejects or reads otherwise.
			return nil, decodeErr("more than one host_name in server_name")
		}
		if name.len() > maxHostNameBytes {
			return nil, malformed(AlertUnrecognizedName, "host_name longer than 255 bytes")
		}
		for _, c := range name {
			if c <= ' ' || c >= 0x7f || c == '/' || c == '\\' {
				return nil, malformed(AlertUnrecognizedName, "host_name contains a byte that is not printable ASCII, or / or \\")
			}
		}
		host = name
	}
	return host, nil
}

// parseALPN validates the application_layer_protocol_negotiation extension
// (RFC 7301 §3.1) and records where its names are.
func (p *parsedHello) parseALPN(data helloCursor) error {
	list, ok := data.vec16()
	if !ok || data.len() != 0 {
		return decodeErr("ALPN extension length mismatch")
	}
	if list.len() == 0 {
		return decodeErr("empty ALPN protocol_name_list")
	}
	p.alpn = list
	for list.len() > 0 {
		name, ok := list.vec8()
		if !ok {
			return decodeErr("truncated ALPN protocol name")
		}
		if name.len() == 0 {
			return decodeErr("empty ALPN protocol name")
		}
		p.alpnCount++
		p.alpnBytes += name.len()
	}
	return nil
}

// extSet records extension types seen in one ClientHello. Types below 256
// (all the IANA-assigned ones but a few) live in a bitmap, the others
// (GREASE, renegotiation_info, ECH, ...) in a short array; a hello with more
// than 32 of those switches to a full 64 Ki-bit map, so that duplicate
// detection stays linear however many extensions a peer sends.
type extSet struct {
	low   [4]uint64
	high  [32]uint16
	nHigh int
	all   *[1024]uint64
}

// add records t and reports whether it was already present.
func (s *extSet) add(t uint16) bool {
	if s.all != nil {
		return testAndSet(s.all[:], t)
	}
	if t < 256 {
		return testAndSet(s.low[:], t)
	}
	for _, h := range s.high[:s.nHigh] {
		if h == t {
			return true
		}
	}
	if s.nHigh < len(s.high) {
		s.high[s.nHigh] = t
		s.nHigh++
		return false
	}
	s.all = new([1024]uint64)
	copy(s.all[:], s.low[:])
	for _, h := range s.high {
		testAndSet(s.all[:], h)
	}
	return testAndSet(s.all[:], t)
}

func testAndSet(bits []uint64, t uint16) bool {
	w, b := t/64, uint64(1)<<(t%64)
	had := bits[w]&b != 0
	bits[w] |= b
	return had
}

// helloCursor reads big-endian TLS vectors from a byte slice; every method
// checks bounds and consumes nothing on failure.
type helloCursor []byte

func (c *helloCursor) len() int { return len(*c) }

func (c *helloCursor) u8() (uint8, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := (*c)[0]
	*c = (*c)[1:]
	return v, true
}

func (c *helloCursor) u16() (uint16, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := uint16((*c)[0])<<8 | uint16((*c)[1])
	*c = (*c)[2:]
	return v, true
}

func (c *helloCursor) bytes(n int) ([]byte, bool) {
	if n < 0 || len(*c) < n {
		return nil, false
	}
	v := (*c)[:n:n]
	*c = (*c)[n:]
	return v, true
}

// vec8 reads a vector with a 1-byte length prefix.
func (c *helloCursor) vec8() (helloCursor, bool) {
	if len(*c) < 1 {
		return nil, false
	}
	n := int((*c)[0])
	if len(*c) < 1+n {
		return nil, false
	}
	v := (*c)[1 : 1+n : 1+n]
	*c = (*c)[1+n:]
	return v, true
}

// vec16 reads a vector with a 2-byte length prefix.
func (c *helloCursor) vec16() (helloCursor, bool) {
	if len(*c) < 2 {
		return nil, false
	}
	n := int((*c)[0])<<8 | int((*c)[1])
	if len(*c) < 2+n {
		return nil, false
	}
	v := (*c)[2 : 2+n : 2+n]
	*c = (*c)[2+n:]
	return v, true
}
