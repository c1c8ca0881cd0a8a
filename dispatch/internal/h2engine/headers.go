package h2engine

import (
	"encoding/binary"
	"io"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/internal/httpgrammar"
)

// What a header block is for.
type blockKind uint8

const (
	blockRequest  blockKind = iota + 1 // opens a new stream
	blockTrailers                      // a request's trailers
	blockIgnore                        // decoded only to keep HPACK in step
)

// Pseudo-header fields seen in a request, as bits.
const (
	pseudoMethod = 1 << iota
	pseudoScheme
	pseudoAuthority
	pseudoPath
	pseudoProtocol
)

// headerBlock is the header block being decoded (HEADERS and its
// CONTINUATION frames). Only the reading goroutine touches it.
type headerBlock struct {
	kind      blockKind
	id        uint32
	st        *Stream // blockRequest: the stream being built
	endStream bool
	frames    int
	size      int // compressed bytes
	listSize  int // decoded size (RFC 9113 6.5.2)
	tooLarge  bool
	bad       string // why the request is malformed
	regular   bool   // a regular field was decoded
	pseudo    uint8
	hosts     int    // host fields in the request
	host      string // the first one's value
	selfDep   bool
	// err is the stream error to send once the block is decoded.
	err      *streamError
	trailers []HeaderField // blockTrailers: the fields, reused
}

// readHeaders reads a HEADERS frame's payload and acts on it (the
// Framer's ReadFrameHeader has checked its size and place). The payload is
// parsed where it lies in the read buffer and decoded before the buffer
// moves on, which spares the HeadersFrame the Framer allocates for every
// request; the checks are the Framer's (parseHeadersFrame). A payload
// larger than the read buffer, which only a MaxFrameSize above 16 KiB
// lets in, is read into a buffer of its own and parsed the same way.
func (c *Conn) readHeaders(fh http2.FrameHeader) error {
	if !c.sawSettings {
		return errNoSettings
	}
	n := int(fh.Length)
	if n > c.br.Size() {
		p := make([]byte, n)
		if _, err := io.ReadFull(&c.br, p); err != nil {
			return err // a read error (c.clock.err)
		}
		return c.parseHeaders(fh, p)
	}
	p, err := c.br.Peek(n)
	if err != nil {
		return err // a read error (c.clock.err)
	}
	err = c.parseHeaders(fh, p)
	c.br.Discard(n)
	return err
}

// parseHeaders parses a HEADERS frame's payload p and acts on it.
func (c *Conn) parseHeaders(fh http2.FrameHeader, p []byte) error {
	if fh.StreamID == 0 {
		return connError{http2.ErrCodeProtocol, "HEADERS frame with stream ID 0"}
	}
	pad := 0
	if fh.Flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return errShortHeaders
		}
		pad, p = int(p[0]), p[1:]
	}
	var dep uint32
	prio := fh.Flags.Has(http2.FlagHeadersPriority)
	if prio {
		if len(p) < 5 {
			return errShortHeaders
		}
		dep = binary.BigEndian.Uint32(p) & 0x7fffffff
		p = p[5:]
	}
	if len(p) < pad {
		return connError{http2.ErrCodeProtocol, "malformed HEADERS frame"}
	}
	return c.processHeaders(fh.StreamID, fh.Flags, prio && dep == fh.StreamID, p[:len(p)-pad])
}

// errShortHeaders: a HEADERS frame too short for its padding or priority
// fields (the error the Framer's parsing gives, as handleError words it).
var errShortHeaders = connError{http2.ErrCodeProtocol, "malformed frame: " + io.ErrUnexpectedEOF.Error()}

// processHeaders starts a header block: a new request, trailers, or one
// decoded only to keep the HPACK state in step. selfDep: the frame's
// priority makes the stream depend on itself.
func (c *Conn) processHeaders(id uint32, flags http2.Flags, selfDep bool, frag []byte) error {
	if id%2 == 0 {
		return connError{http2.ErrCodeProtocol, "HEADERS with an even stream id"}
	}
	hb := &c.hb
	*hb = headerBlock{id: id, endStream: flags.Has(http2.FlagHeadersEndStream), trailers: hb.trailers[:0]}
	hb.selfDep = selfDep
	endHeaders := flags.Has(http2.FlagHeadersEndHeaders)
	c.mu.Lock()
	st := c.lookup(id)
	switch {
	case st != nil:
		switch {
		case st.remoteClosed:
			hb.kind = blockIgnore
			hb.err = &streamError{id, http2.ErrCodeStreamClosed, "HEADERS after END_STREAM"}
		case !hb.endStream:
			hb.kind = blockIgnore
			hb.err = &streamError{id, http2.ErrCodeProtocol, "trailers without END_STREAM"}
		default:
			hb.kind = blockTrailers
		}
	case id <= c.maxSeen:
		found, byUs := c.recentlyClosed(id)
		c.mu.Unlock()
		switch {
		case found && byUs:
			hb.kind = blockIgnore
		case found:
			return connError{http2.ErrCodeStreamClosed, "HEADERS on a closed stream"}
		default:
			return connError{http2.ErrCodeProtocol, "stream id not above the previous ones"}
		}
		return c.feedBlock(frag, endHeaders)
	default:
		c.maxSeen = id
		if c.goAwaySent && id > c.goAwayID {
			hb.kind = blockIgnore // after GOAWAY: not processed
		} else {
			hb.kind = blockRequest
			hb.st = newStream(c, id)
		}
	}
	c.mu.Unlock()
	return c.feedBlock(frag, endHeaders)
}

// feedBlock decodes one fragment of the current header block, bounding
// the block in frames and bytes (CONTINUATION flood).
func (c *Conn) feedBlock(frag []byte, end bool) error {
	hb := &c.hb
	if hb.kind == 0 || (hb.kind == blockRequest && hb.st == nil) {
		return connError{http2.ErrCodeProtocol, "CONTINUATION without a header block"}
	}
	hb.frames++
	hb.size += len(frag)
	if hb.frames > c.cfg.MaxHeaderBlockFrames || hb.size > maxBlockBytes(&c.cfg) {
		c.dropBlock()
		return connError{http2.ErrCodeEnhanceYourCalm, "header block too large or in too many frames (CONTINUATION flood)"}
	}
	if _, err := c.dec.Write(frag); err != nil {
		c.dropBlock()
		if err == hpack.ErrStringLength {
			return connError{http2.ErrCodeEnhanceYourCalm, "header field larger than the header list limit"}
		}
		return connError{http2.ErrCodeCompression, "HPACK: " + err.Error()}
	}
	if !end {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		c.dropBlock()
		return connError{http2.ErrCodeCompression, "HPACK: " + err.Error()}
	}
	c.dec.SetEmitEnabled(true)
	err := c.endBlock()
	hb.kind = 0
	return err
}

// maxBlockBytes bounds the compressed size of a header block: twice the
// header list limit and a frame (a list within the limit compresses to
// less than that).
func maxBlockBytes(cfg *Config) int { return 2*int(cfg.MaxHeaderListSize) + minFrameSize }

// dropBlock discards the block's stream.
func (c *Conn) dropBlock() {
	if c.hb.st != nil {
		c.hb.st.recycle()
		c.hb.st = nil
	}
}

// onField receives each decoded field of the current block.
func (c *Conn) onField(f hpack.HeaderField) {
	hb := &c.hb
	hb.listSize += len(f.Name) + len(f.Value) + 32
	if hb.listSize > int(c.cfg.MaxHeaderListSize) {
		hb.tooLarge = true
		c.dec.SetEmitEnabled(false)
		return
	}
	if hb.bad != "" || hb.kind == blockIgnore {
		return
	}
	if len(f.Name) > 0 && f.Name[0] == ':' {
		if hb.kind == blockTrailers {
			hb.bad = "pseudo-header field in trailers"
			return
		}
		if hb.regular {
			hb.bad = "pseudo-header field after a regular field"
			return
		}
		if !httpgrammar.ValidFieldValue(f.Value) {
			hb.bad = "invalid byte in pseudo-header field value"
			return
		}
		hb.bad = c.pseudoField(hb, f)
		return
	}
	hb.regular = true
	if bad := checkField(f.Name, f.Value); bad != "" {
		hb.bad = bad
		return
	}
	if hb.kind == blockTrailers {
		if !validTrailerName(f.Name) {
			hb.bad = "field not allowed in trailers: " + f.Name
			return
		}
		hb.trailers = append(hb.trailers, HeaderField{Name: f.Name, Value: f.Value})
		return
	}
	st := hb.st
	if f.Name == "host" {
		if hb.hosts == 0 {
			hb.host = f.Value
		}
		hb.hosts++
	}
	if f.Name == "content-length" {
		n, ok := parseLength(f.Value)
		if !ok || (st.ContentLength >= 0 && st.ContentLength != n) {
			hb.bad = "invalid content-length"
			return
		}
		st.ContentLength = n
	}
	st.Header = append(st.Header, HeaderField{Name: f.Name, Value: f.Value})
}

// pseudoField records a request pseudo-header field; it returns why the
// request is malformed, if it is.
func (c *Conn) pseudoField(hb *headerBlock, f hpack.HeaderField) string {
	st := hb.st
	var bit uint8
	var dst *string
	switch f.Name {
	case ":method":
		bit, dst = pseudoMethod, &st.Method
	case ":scheme":
		bit, dst = pseudoScheme, &st.Scheme
	case ":authority":
		bit, dst = pseudoAuthority, &st.Authority
	case ":path":
		bit, dst = pseudoPath, &st.Path
	case ":protocol":
		bit, dst = pseudoProtocol, &st.Protocol
	default:
		return "unknown pseudo-header field " + f.Name
	}
	if hb.pseudo&bit != 0 {
		return "duplicated pseudo-header field " + f.Name
	}
	hb.pseudo |= bit
	*dst = f.Value
	return ""
}

// checkField validates a regular field (RFC 9113 8.2): lowercase token
// name, no control byte but HTAB in the value (NUL, CR and LF by RFC 9113
// 8.2.1, the others as x/net's server refused them) and no whitespace
// around it, and no connection-specific field (8.2.2).
func checkField(name, value string) string {
	if name == "" {
		return "empty header field name"
	}
	if !httpgrammar.IsLowerToken(name) {
		return "invalid header field name"
	}
	if !httpgrammar.ValidFieldValue(value) {
		return "invalid byte in header field value"
	}
	if n := len(value); n > 0 && (httpgrammar.IsOWS(value[0]) || httpgrammar.IsOWS(value[n-1])) {
		return "whitespace around a header field value"
	}
	switch name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		return "connection-specific header field " + name
	case "te":
		if value != "trailers" {
			return "te other than trailers"
		}
	}
	return ""
}

// validTrailerName reports whether a field may be sent as a trailer
// (httpguts.ValidTrailerHeader, for a lowercase name): not one that
// framing, routing, authentication, request modifiers or the response's
// caching depend on (RFC 9110 6.5.1).
func validTrailerName(name string) bool {
	switch name {
	case "authorization", "cache-control", "connection", "content-encoding",
		"content-length", "content-range", "content-type", "expect", "host",
		"keep-alive", "max-forwards", "pragma", "proxy-authenticate",
		"proxy-authorization", "proxy-connection", "range", "realm", "te",
		"trailer", "transfer-encoding", "www-authenticate":
		return false
	}
	return !strings.HasPrefix(name, "if-")
}

// parseLength parses a content-length value.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// endBlock acts on a complete header block.
func (c *Conn) endBlock() error {
	hb := &c.hb
	switch hb.kind {
	case blockIgnore:
		if hb.err != nil {
			return *hb.err
		}
		return nil
	case blockTrailers:
		return c.endTrailers()
	}
	st := hb.st
	if hb.bad == "" && !hb.tooLarge {
		hb.bad = c.checkRequest(hb)
	}
	hb.st = nil
	if hb.tooLarge {
		st.recycle()
		c.report(ErrorEvent{StreamID: hb.id, Status: 431, Reason: "request header list too large"})
		c.mu.Lock()
		c.remember(hb.id, true)
		c.mu.Unlock()
		return c.queueCtrlFromReader(ctrlFrame{kind: ctrl431, id: hb.id, end: hb.endStream})
	}
	if hb.bad != "" {
		st.recycle()
		if !c.chargeReset() {
			return errRapidReset
		}
		return streamError{hb.id, http2.ErrCodeProtocol, "malformed request: " + hb.bad}
	}
	return c.startStream(st, hb.endStream)
}

// checkRequest checks the pseudo-header fields (RFC 9113 8.3.1, RFC 8441
// 4); it returns why the request is malformed, if it is.
func (c *Conn) checkRequest(hb *headerBlock) string {
	st := hb.st
	if hb.selfDep {
		return "stream depends on itself"
	}
	if hb.pseudo&pseudoMethod == 0 || st.Method == "" {
		return "missing :method"
	}
	if hb.endStream && st.ContentLength > 0 {
		return "content-length without DATA"
	}
	switch {
	case hb.pseudo&pseudoProtocol != 0:
		if !c.cfg.EnableConnectProtocol {
			return ":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL"
		}
		if st.Method != "CONNECT" {
			return ":protocol on a method other than CONNECT"
		}
		if hb.pseudo&(pseudoScheme|pseudoPath|pseudoAuthority) != pseudoScheme|pseudoPath|pseudoAuthority || st.Path == "" {
			return "extended CONNECT without :scheme, :path and :authority"
		}
	case st.Method == "CONNECT":
		if hb.pseudo&(pseudoScheme|pseudoPath) != 0 || hb.pseudo&pseudoAuthority == 0 {
			return "CONNECT must carry :authority and neither :scheme nor :path"
		}
	default:
		if hb.pseudo&pseudoScheme == 0 {
			return "missing :scheme"
		}
		if st.Scheme != "https" && st.Scheme != "http" {
			return ":scheme other than http or https"
		}
		if hb.pseudo&pseudoPath == 0 || st.Path == "" {
			return "missing or empty :path"
		}
	}
	if st.Method != "CONNECT" || st.Protocol != "" {
		if bad := checkPath(st.Method, st.Path); bad != "" {
			return bad
		}
	}
	return c.checkAuthority(hb)
}

// checkAuthority checks :authority and the host field (RFC 9113 8.3.1):
// at most one host field, equal to :authority when both are present
// (ASCII case aside: host names are case-insensitive), no userinfo, and
// only the bytes a host and port may hold (httpguts.ValidHostHeader). The
// fold is ASCII's only, so a host field equal to a valid :authority is
// valid too.
func (c *Conn) checkAuthority(hb *headerBlock) string {
	st := hb.st
	authority := st.Authority
	switch {
	case hb.hosts > 1:
		return "more than one host field"
	case hb.hosts == 1 && hb.pseudo&pseudoAuthority != 0 && !httpgrammar.EqualFold(hb.host, authority):
		return "host field differs from :authority"
	case hb.hosts == 1 && hb.pseudo&pseudoAuthority == 0:
		authority = hb.host
	}
	if strings.IndexByte(authority, '@') >= 0 {
		return "userinfo in :authority"
	}
	if !httpguts.ValidHostHeader(authority) {
		return "invalid :authority"
	}
	return ""
}

// checkPath checks :path (RFC 9113 8.3.1, RFC 3986): an absolute path,
// or "*" for OPTIONS, whose percent-encodings are complete (as
// url.ParseRequestURI, which x/net's server used, requires).
func checkPath(method, path string) string {
	if path == "*" {
		if method != "OPTIONS" {
			return ":path * on a method other than OPTIONS"
		}
		return ""
	}
	if path[0] != '/' {
		return ":path neither an absolute path nor *"
	}
	p, _, _ := strings.Cut(path, "?")
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && (i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2])) {
			return "invalid percent-encoding in :path"
		}
	}
	return ""
}

func isHex(b byte) bool {
	return ('0' <= b && b <= '9') || ('a' <= b && b <= 'f') || ('A' <= b && b <= 'F')
}

// endTrailers completes a request with its trailers.
func (c *Conn) endTrailers() error {
	hb := &c.hb
	if hb.tooLarge {
		return streamError{hb.id, http2.ErrCodeProtocol, "trailers too large"}
	}
	if hb.bad != "" {
		return streamError{hb.id, http2.ErrCodeProtocol, "malformed trailers: " + hb.bad}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.lookup(hb.id)
	if st == nil || st.remoteClosed {
		return nil // reset meanwhile
	}
	if st.ContentLength >= 0 && st.recvTotal != st.ContentLength {
		return streamError{hb.id, http2.ErrCodeProtocol, "less DATA than content-length"}
	}
	st.Trailer = append(st.Trailer[:0], hb.trailers...)
	st.endRemoteLocked()
	st.wakeReader()
	return nil
}
