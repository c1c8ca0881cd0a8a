package dispatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/routes"
)

// h2Stream is one request on an HTTP/2 connection: the adapter between an
// engine stream (h2engine.Stream: the request's fields, its body, the
// response's frames) and the exchange with the app. It is pooled, with
// the buffers it reuses: the request's parsed form and head, and the
// response's fields.
type h2Stream struct {
	hc *h2Conn
	s  *Server
	es *h2engine.Stream
	// host is :authority, or the host field when it is absent.
	host string
	x    exchange
	// rec is the stream's access-log record (accesslog.go).
	rec    accessRecord
	bodyIn atomic.Int64 // request body bytes sent to the app
	// ended: the response was ended (END_STREAM written).
	ended bool
	// expect: the request carries Expect: 100-continue.
	expect bool
	// noReuse: onReset may still be running (the stream was reset while
	// an app connection was attached); st must not go back to the pool.
	noReuse bool

	// acc is the request's access decision and accFwd what its
	// forwarding removes and adds (access_conn.go).
	acc    accessDecision
	accFwd accessForward

	req   request
	head  []byte                 // the request head sent to the app
	arena []byte                 // the request's names and values
	out   []h2engine.HeaderField // response fields
	outB  []byte                 // their names and values, before the one string

	// attached is the app connection the stream's reset closes; onReset
	// and flushFn are made once per pooled h2Stream.
	attached atomic.Pointer[backendConn]
	onReset  func()
	flushFn  func() error
	// bodyW writes the response body (writeBody); bodyLeft is what is
	// left of a body of known length (-1: unknown).
	bodyW    io.Writer
	bodyLeft int64
	// fair is the stream's fair admission (fair.go); fairPaused:
	// pauseFair gave it back for the wait for the app, resumeFair takes
	// one again.
	fair       fairshare.Ticket
	fairPaused bool
}

// h2BodyWriter is an h2Stream's writeBody as an io.Writer.
type h2BodyWriter struct{ st *h2Stream }

func (w h2BodyWriter) Write(p []byte) (int, error) { return w.st.writeBody(p) }

// writeBody writes response body bytes; the last ones of a body of known
// length end the response.
func (st *h2Stream) writeBody(p []byte) (int, error) {
	st.throttleBytes(len(p), nil) // ratelimit.go
	if st.bodyLeft < 0 || int64(len(p)) < st.bodyLeft {
		n, err := st.es.Write(p)
		if st.bodyLeft > 0 {
			st.bodyLeft -= int64(n)
		}
		return n, err
	}
	if err := st.es.WriteLast(p); err != nil {
		return 0, err
	}
	st.bodyLeft = 0
	st.ended = true
	return len(p), nil
}

var h2StreamPool = sync.Pool{New: func() any {
	st := &h2Stream{}
	st.onReset = st.closeAttached
	st.flushFn = st.flush
	st.bodyW = h2BodyWriter{st}
	return st
}}

// Bounds on what a pooled h2Stream keeps.
const (
	h2MaxPooledBuf    = 16 << 10
	h2MaxPooledFields = 64
)

// start prepares st for es on hc.
func (st *h2Stream) start(hc *h2Conn, es *h2engine.Stream) {
	st.hc, st.s, st.es = hc, hc.s, es
	st.host = es.Authority
	if st.host == "" {
		st.host = fieldValue(es.Header, "host")
	}
	st.bodyIn.Store(0)
	st.ended, st.expect = false, false
}

// release returns st to the pool once its handler is done.
func (st *h2Stream) release() {
	if st.noReuse {
		return
	}
	st.hc, st.s, st.es, st.host = nil, nil, nil, ""
	resp := st.x.resp
	st.x = exchange{resp: resp}
	st.rec = accessRecord{}
	st.acc, st.accFwd = accessDecision{}, accessForward{}
	st.attached.Store(nil)
	st.req.reset()
	st.req.fields = st.req.fields[:0]
	clear(st.out)
	st.out = st.out[:0]
	if cap(st.head) > h2MaxPooledBuf {
		st.head = nil
	}
	if cap(st.arena) > h2MaxPooledBuf {
		st.arena = nil
	}
	if cap(st.outB) > h2MaxPooledBuf {
		st.outB = nil
	}
	if cap(st.out) > h2MaxPooledFields {
		st.out = nil
	}
	if cap(st.req.fields) > h2MaxPooledFields {
		st.req.fields = nil
	}
	h2StreamPool.Put(st)
}

// fieldValue returns the value of the first field name (lowercase) in
// fields, or "".
func fieldValue(fields []h2engine.HeaderField, name string) string {
	for i := range fields {
		if fields[i].Name == name {
			return fields[i].Value
		}
	}
	return ""
}

// serve checks and forwards the request; it reports whether the stream
// must be reset.
func (st *h2Stream) serve() bool {
	hc, es := st.hc, st.es
	st.noteRequest()
	if hc.revokedErr() != nil || !hc.route.Usable() {
		// The connection is being closed: no new streams on it.
		st.deny(denyRevoked)
		return false
	}
	if !routes.HostMatches(st.host, hc.sni) {
		st.deny(denyMisdirected)
		return false
	}
	if ar := st.s.routePool(hc.route).access; ar != nil && !st.checkAccess(ar) {
		return false
	}
	if !st.allowRate() { // ratelimit.go
		return false
	}
	if hc.route.Sleeping() && !st.holdSleeping() { // sleep.go
		return false
	}
	if hc.route.Protocol == routes.ProtocolH2C {
		return st.serveH2C() // h2c.go
	}
	if es.Protocol != "" {
		return st.serveWebSocket() // RFC 8441 (h2websocket.go)
	}
	if es.Method == "CONNECT" || es.Method == "TRACE" {
		st.deny(denyMethod)
		return false
	}
	req, pe := st.buildRequest(es.Method, "")
	if pe != nil {
		st.deny(denyParse(pe))
		return false
	}
	inst := hc.route.Instance
	if !inst.Acquire() {
		st.deny(denyLimit)
		return false
	}
	defer inst.Release()
	if !st.admitFair(inst) {
		return false
	}
	defer st.releaseFair()
	st.rec.admitted(inst)
	st.s.m.streamsActive.Inc()
	defer st.s.m.streamsActive.Dec()
	return st.proxy(req)
}

// noteRequest records the request's User-Agent and Referer for the
// access log, and makes a trusted peer's X-Request-Id (exactly one, valid)
// the request's id.
func (st *h2Stream) noteRequest() {
	ids := 0
	var id string
	for i := range st.es.Header {
		f := &st.es.Header[i]
		switch f.Name {
		case "user-agent":
			st.rec.uas = f.Value
		case "referer":
			st.rec.refs = f.Value
		case "x-request-id":
			id = f.Value
			ids++
		}
	}
	if ids == 1 && st.hc.trusted {
		st.rec.keepRequestIDString(id)
	}
}

// buildRequest converts the HTTP/2 request into the parsed form that
// appendRequestHead sanitises, checking what HTTP/1.1 cannot carry. Names
// are given their canonical form (Content-Type) as HTTP/1.1 apps commonly
// see them; cookie crumbs are joined with "; " (RFC 9113 8.2.3). wsKey,
// when set, makes it the WebSocket upgrade of an extended CONNECT: the
// client's Sec-WebSocket-Key and -Accept are replaced by wsKey, and
// Sec-WebSocket-Version is 13 when absent.
func (st *h2Stream) buildRequest(method, wsKey string) (*request, *parseError) {
	es := st.es
	target := es.Path
	if pe := h2TargetError(method, target); pe != nil {
		return nil, pe
	}
	n, size, cookies := 0, 0, 0
	hasVersion := false
	for i := range es.Header {
		f := &es.Header[i]
		if wsKey != "" && (f.Name == "sec-websocket-key" || f.Name == "sec-websocket-accept") {
			continue
		}
		if f.Name == "cookie" {
			if cookies > 0 {
				size += len(f.Value) + 2
				cookies++
				continue
			}
			cookies++
		}
		if f.Name == "sec-websocket-version" {
			hasVersion = true
		}
		n++
		size += len(f.Name) + len(f.Value)
	}
	if wsKey != "" {
		n++
		size += len("Sec-Websocket-Key") + len(wsKey)
		if !hasVersion {
			n++
			size += len("Sec-Websocket-Version") + 2
		}
	}
	if n > st.s.cfg.MaxHeaderFields {
		return nil, errHeadTooLarge
	}
	// One backing array for every name and value: it never grows, so the
	// slices stay valid.
	need := size + len(method) + len(target) + len(st.host)
	if cap(st.arena) < need {
		st.arena = make([]byte, 0, need)
	}
	arena := st.arena[:0]
	cut := func(s string) []byte {
		start := len(arena)
		arena = append(arena, s...)
		return arena[start:len(arena):len(arena)]
	}
	req := &st.req
	req.reset()
	req.method = cut(method)
	req.path = cut(target)
	req.target = req.path
	// :authority (or Host) as the client sent it, port included.
	req.host = cut(st.host)
	joined := false
	for i := range es.Header {
		f := &es.Header[i]
		if wsKey != "" && (f.Name == "sec-websocket-key" || f.Name == "sec-websocket-accept") {
			continue
		}
		if f.Name == "cookie" && joined {
			continue // joined to the first crumb
		}
		start := len(arena)
		arena = appendCanonical(arena, f.Name)
		nb := arena[start:len(arena):len(arena)]
		if !httpgrammar.IsToken(nb) {
			return nil, &parseError{400, "invalid header name"}
		}
		vstart := len(arena)
		arena = append(arena, f.Value...)
		if f.Name == "cookie" && cookies > 1 {
			joined = true
			for j := i + 1; j < len(es.Header); j++ {
				if es.Header[j].Name == "cookie" {
					arena = append(arena, "; "...)
					arena = append(arena, es.Header[j].Value...)
				}
			}
		}
		vb := arena[vstart:len(arena):len(arena)]
		if !httpgrammar.ValidFieldValue(vb) {
			return nil, &parseError{400, "invalid byte in header value"}
		}
		req.fields = append(req.fields, headField{nb, vb})
		switch f.Name {
		case "accept":
			req.accept = vb
		case "expect":
			st.expect = httpgrammar.EqualFold(vb, "100-continue")
		}
	}
	if wsKey != "" {
		req.fields = append(req.fields, headField{cut("Sec-Websocket-Key"), cut(wsKey)})
		if !hasVersion {
			req.fields = append(req.fields, headField{cut("Sec-Websocket-Version"), cut("13")})
		}
	}
	st.arena = arena
	switch {
	case es.ContentLength > 0:
		req.body, req.length = bodyLength, es.ContentLength
	case es.ContentLength < 0:
		req.body = bodyChunked
	}
	return req, nil
}

// appendCanonical appends name (lowercase, as HTTP/2 carries it) in its
// canonical form: the first letter and each one after a hyphen in upper
// case.
func appendCanonical(dst []byte, name string) []byte {
	up := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if up && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		up = c == '-'
		dst = append(dst, c)
	}
	return dst
}

// attach makes bc the stream's app connection: revocation and the end of
// the stream close it. False when the connection is revoked.
func (st *h2Stream) attach(bc *backendConn) bool {
	if !st.hc.addBackend(bc) {
		return false
	}
	st.attached.Store(bc)
	st.es.AfterReset(st.onReset)
	return true
}

// closeAttached closes the attached app connection (the stream was reset
// or its connection ended).
func (st *h2Stream) closeAttached() {
	if bc := st.attached.Load(); bc != nil {
		_ = bc.conn.Close()
	}
}

// detach undoes attach; it reports whether bc is still usable (not closed
// because the stream ended).
func (st *h2Stream) detach(bc *backendConn) bool {
	st.hc.removeBackend(bc)
	ok := st.es.StopAfterReset()
	if !ok {
		st.noReuse = true
	} else {
		st.attached.Store(nil)
	}
	return ok
}

// gone reports whether the stream or the connection has ended, in which
// case nobody is listening for an answer.
func (st *h2Stream) gone() bool {
	return st.es.Err() != nil || st.hc.revokedErr() != nil
}

// dialContext returns the context of an app dial for this request:
// cancelled when the stream is reset or its connection ends. It is made
// only when the exchange dials (most requests take a pooled connection);
// done must be called once the dial is over.
func (st *h2Stream) dialContext() (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	es := st.es
	es.AfterReset(cancel)
	return ctx, func() {
		es.StopAfterReset()
		cancel()
	}
}

// proxy forwards the request to the app and relays the response (an
// exchange, exchange.go); it reports whether the stream must be reset.
func (st *h2Stream) proxy(req *request) bool {
	s, es := st.s, st.es
	x := &st.x
	x.reset(s, st.hc.route, st.hc.sni, req, st)
	defer st.rec.timings(x)
	hasBody := req.body != bodyNone
	fi := s.forwardInfo(x.pool, st.hc.sni, st.hc.peer, st.hc.trusted, publicPortOf(st.host), st.rec.id.bytes())
	st.accessForwarding(&fi, x.pool.access)
	st.head = appendRequestHead(st.head[:0], req, &fi)
	s.countDropped(&fi, st.hc.route)
	if !hasBody {
		// The answer is read next, with nothing to do meanwhile: connect
		// waits for it without a read that finds nothing (sock.ReplyWait).
		x.awaitFor = s.cfg.ResponseHeaderTimeout
	}
	if err := x.connect(context.Background(), st.head, !hasBody); err != nil {
		return st.exchangeFailed(x, err)
	}

	// Stream the request body alongside reading the response (its state
	// is allocated only when there is a body).
	var bs *h2BodyCopy
	if hasBody {
		bs = &h2BodyCopy{}
		x.sendBody(func(bc *backendConn) error {
			err := st.copyRequestBody(bc, req, &bs.pause)
			var cbe *h2ClientBodyError
			if errors.As(err, &cbe) && !bs.aborted.Load() {
				// The client's body failed: the app, waiting for the
				// rest, must not keep us waiting for its answer.
				bs.clientErr = cbe
				_ = bc.conn.Close()
			}
			return err
		}, func() {
			bs.aborted.Store(true)
			bs.pause.cancel()
			es.CloseRead()
		})
	}

	var err error
	if x.awaitFor > 0 && x.awaitRanOut() {
		// The wait ran out without an answer: the response-head timeout,
		// counted from the request's write as readHead would.
		err = &appError{err: os.ErrDeadlineExceeded, sent: true}
	} else {
		err = x.readHead(st.interim)
	}
	if err == nil && x.resp.status == 101 {
		// No upgrades over HTTP/2 (and none was asked for: the request
		// carried no Upgrade).
		err = &badResponseError{errors.New("101 Switching Protocols on an HTTP/2 request")}
	}
	if err != nil {
		x.abort() // waits for the body copy: clientErr is settled
		if st.gone() {
			return true
		}
		if bs != nil && bs.clientErr != nil {
			if bs.clientErr.timeout {
				st.deny(denyReqTimeout)
				return false
			}
			return true
		}
		return st.exchangeFailed(x, err)
	}

	resp := &x.resp
	st.acc.addResponseFields(resp)
	length := int64(-1)
	if resp.body == bodyLength {
		length = resp.length
	}
	fields := st.responseFields(resp, x.isHead || resp.status == 304, length)
	noBody := resp.body == bodyNone || (resp.body == bodyLength && resp.length == 0)
	err = es.WriteHeaders(resp.status, fields, noBody)
	st.ended = noBody && err == nil
	st.rec.status, st.rec.outcome = resp.status, outcomeOK
	if err == nil && !noBody && x.bc.in.buffered() == 0 {
		// Nothing of the body is here yet (a stream of events, say): let
		// the client have the head now.
		err = st.flush()
	}
	if err == nil {
		// A body of known length ends with its last DATA frame
		// (END_STREAM on it, no empty frame of its own).
		st.bodyLeft = -1
		if resp.body == bodyLength && !x.isHead {
			st.bodyLeft = resp.length
		}
		err = x.copyBody(st.bodyW, nil, st.flushFn, false)
	} else {
		s.m.request(resp.status)
	}
	if err == nil && !st.ended {
		err = es.End()
		st.ended = err == nil
	}
	if err != nil {
		st.rec.outcome = outcomeAborted
		x.abort()
		return true
	}
	x.finish(st.hc.revokedErr() == nil)
	return false
}

// interim relays the app's 1xx answers that the client may use: 103 Early
// Hints, and 100 Continue when the request asked for it; others are
// dropped.
func (st *h2Stream) interim(resp *response) error {
	if resp.status == 103 || (resp.status == 100 && st.expect) {
		_ = st.es.WriteHeaders(resp.status, st.responseFields(resp, false, -1), false)
	}
	return nil
}

// exchangeFailed answers a failed exchange (exchange.failure) on this
// stream; it reports whether the stream must be reset instead (nobody is
// listening any more).
func (st *h2Stream) exchangeFailed(x *exchange, err error) bool {
	if st.gone() && !errors.Is(err, errClientRevoked) {
		return true
	}
	st.deny(x.failure(err))
	return false
}

// responseFields returns the app's response fields for the client:
// lowercase, without hop-by-hop fields and those named by Connection, with
// content-length when length ≥ 0, and x-request-id, the request's id, in
// place of the app's. keepLength keeps the app's
// Content-Length (HEAD and 304 answers: it describes the representation).
// The names and values share one string (the engine's HPACK table may
// keep them).
func (st *h2Stream) responseFields(resp *response, keepLength bool, length int64) []h2engine.HeaderField {
	b := st.outB[:0]
	hasLength := false
	type span struct {
		name, value [2]int
		sensitive   bool
	}
	var spans [32]span
	sp := spans[:0]
	for i := range resp.fields {
		f := &resp.fields[i]
		isLength := httpgrammar.EqualFold(f.name, "content-length")
		if hopByHop(f.name) || connectionNamed(f.name, resp.connTokens) {
			if !keepLength || !isLength {
				continue
			}
		}
		if isLength {
			if hasLength {
				continue
			}
			hasLength = true
		}
		if isRequestIDField(f.name) {
			continue
		}
		var s span
		s.name[0] = len(b)
		for _, c := range f.name {
			b = append(b, httpgrammar.Lower(c))
		}
		s.name[1] = len(b)
		s.value[0] = len(b)
		b = append(b, f.value...)
		s.value[1] = len(b)
		sp = append(sp, s)
	}
	if length >= 0 && !hasLength {
		var s span
		s.name[0] = len(b)
		b = append(b, "content-length"...)
		s.name[1] = len(b)
		s.value[0] = len(b)
		b = strconv.AppendInt(b, length, 10)
		s.value[1] = len(b)
		sp = append(sp, s)
	}
	if id := st.rec.id.bytes(); len(id) > 0 {
		var s span
		s.name[0] = len(b)
		b = append(b, "x-request-id"...)
		s.name[1] = len(b)
		s.value[0] = len(b)
		b = append(b, id...)
		s.value[1] = len(b)
		// Never indexed: a value unique to each response would only
		// churn the connection's HPACK table (an insert and an eviction
		// per response), for both ends.
		s.sensitive = true
		sp = append(sp, s)
	}
	st.outB = b
	all := string(b)
	out := st.out[:0]
	for _, s := range sp {
		out = append(out, h2engine.HeaderField{Name: all[s.name[0]:s.name[1]], Value: all[s.value[0]:s.value[1]], Sensitive: s.sensitive})
	}
	st.out = out
	return out
}

// flush sends what the stream has buffered.
func (st *h2Stream) flush() error { return st.es.Flush() }

// end ends a response that serve answered but did not end (a denial's
// body was written in full, say); a failure leaves it to the engine's
// reset.
func (st *h2Stream) end() {
	if !st.ended {
		if st.es.End() == nil {
			st.ended = true
		}
	}
}

// copyRequestBody streams the request body to the app: Content-Length
// framing when the length is known, chunked otherwise. Each read of the
// client's body (the engine's read timeout) and each write to the app is
// bounded by BodyTimeout; a write waits out the instance's byte rate
// first, a wait that pause (cancelled when the copy is stopped) ends.
func (st *h2Stream) copyRequestBody(bc *backendConn, req *request, pause *throttlePause) error {
	s, es := st.s, st.es
	bufp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bufp)
	buf := *bufp
	chunked := req.body == bodyChunked
	// Chunked: room for the size line before the data and CRLF after it.
	const pre = 18
	remaining := req.length
	var sent int64
	defer func() {
		s.m.bytesToApp.Add(float64(sent))
		st.bodyIn.Store(sent)
	}()
	write := func(p []byte) error {
		_ = bc.conn.SetWriteDeadline(time.Now().Add(s.cfg.BodyTimeout))
		_, err := bc.conn.Write(p)
		return err
	}
	for {
		var p []byte
		if chunked {
			p = buf[pre : len(buf)-2]
		} else {
			if remaining == 0 {
				return nil
			}
			p = buf[:min(int64(len(buf)), remaining)]
		}
		m, rerr := es.Read(p)
		if m > 0 {
			var out []byte
			if chunked {
				var hex [pre]byte
				h := strconv.AppendInt(hex[:0], int64(m), 16)
				h = append(h, '\r', '\n')
				start := pre - len(h)
				copy(buf[start:], h)
				buf[pre+m], buf[pre+m+1] = '\r', '\n'
				out = buf[start : pre+m+2]
			} else {
				out = p[:m]
				remaining -= int64(m)
			}
			st.throttleBytes(m, pause) // ratelimit.go
			if err := write(out); err != nil {
				return err
			}
			sent += int64(m)
		}
		if rerr == io.EOF {
			if chunked {
				return write([]byte("0\r\n\r\n"))
			}
			if remaining > 0 {
				return &h2ClientBodyError{err: io.ErrUnexpectedEOF}
			}
			return nil
		}
		if rerr != nil {
			return &h2ClientBodyError{err: rerr, timeout: errors.Is(rerr, h2engine.ErrReadTimeout)}
		}
	}
}

// h2BodyCopy is the state of a request body copy: aborted, the exchange
// stopped it; clientErr, set before the copy returns, the client's body
// failed.
type h2BodyCopy struct {
	aborted   atomic.Bool
	clientErr *h2ClientBodyError
	pause     throttlePause // the body's byte-rate pauses (ratelimit.go)
}

// h2ClientBodyError is a failure to read the client's request body;
// timeout: nothing arrived within the body timeout.
type h2ClientBodyError struct {
	err     error
	timeout bool
}

func (e *h2ClientBodyError) Error() string { return "request body: " + e.err.Error() }

func (e *h2ClientBodyError) Unwrap() error { return e.err }

// deny answers a request the listener refuses, on this stream only; with
// d.close (or while draining) the connection is then shut down gracefully
// (GOAWAY, its other streams may finish).
func (st *h2Stream) deny(d denial) {
	st.rec.denied(d)
	st.s.m.denied(d.status)
	st.logDenial(d.status, d.reason)
	if st.s.draining.Load() {
		d.close = true
	}
	es := st.es
	accept := fieldValue(es.Header, "accept")
	navigate := httpgrammar.EqualFold([]byte(fieldValue(es.Header, "sec-fetch-mode")), "navigate")
	st.ended = writeH2Error(es, d, accept, navigate, es.Method == "HEAD", st.rec.id.bytes()) == nil
	if d.close {
		st.hc.shutdown()
	}
}

func (st *h2Stream) logDenial(status int, reason string) {
	s := st.s
	if !s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "request denied",
		slog.Int("class_uid", 4002),
		slog.String("rule", "app-listener"),
		slog.Int("status", status),
		slog.String("reason", reason),
		slog.String("sni", st.hc.sni),
		slog.String("src", st.hc.peer.String()),
		slog.String("protocol", "HTTP/2.0"),
		slog.String("method", st.es.Method),
		slog.String("path", pathOnly([]byte(st.es.Path))),
		slog.String("request_id", string(st.rec.id.bytes())),
	)
}

// resetCancel resets the stream (CANCEL): a write in progress fails.
func (st *h2Stream) resetCancel() { st.es.Reset(http2.ErrCodeCancel) }
