package dispatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/routes"
)

// h2Stream is one request on an HTTP/2 connection.
type h2Stream struct {
	hc *h2Conn
	s  *Server
	w  http.ResponseWriter
	r  *http.Request
	rc *http.ResponseController
	// dog bounds each blocking read of the request body and each write to
	// the client by Config.BodyTimeout (x/net's own stream deadlines are
	// absolute: they would also fire between writes of an idle stream).
	dog h2Watchdogs
	// cancelStop stops the context.AfterFunc that closes the app
	// connection when the stream ends early (client reset, connection
	// closed).
	cancelStop func() bool
	x          exchange
	// rec is the stream's access-log record (accesslog.go).
	rec    accessRecord
	bodyIn atomic.Int64 // request body bytes sent to the app
}

// serve checks and forwards the request; it reports whether the stream
// must be reset.
func (st *h2Stream) serve() bool {
	hc, r := st.hc, st.r
	if hc.revokedErr() != nil || !hc.route.Usable() {
		// The connection is being closed: no new streams on it.
		st.deny(denyRevoked)
		return false
	}
	if !routes.HostMatches(r.Host, hc.sni) {
		st.deny(denyMisdirected)
		return false
	}
	if hc.route.Protocol == routes.ProtocolH2C {
		return st.serveH2C() // h2c.go
	}
	if isExtendedConnect(r) {
		return st.serveWebSocket() // RFC 8441 (h2websocket.go)
	}
	if r.Method == "CONNECT" || r.Method == "TRACE" {
		st.deny(denyMethod)
		return false
	}
	req, pe := st.buildRequest()
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
	inst.CountRequest()
	st.s.m.streamsActive.Inc()
	defer st.s.m.streamsActive.Dec()
	return st.proxy(req)
}

// buildRequest converts the HTTP/2 request into the parsed form that
// appendRequestHead sanitises, checking what HTTP/1.1 cannot carry.
func (st *h2Stream) buildRequest() (*request, *parseError) {
	r := st.r
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	if !isToken([]byte(r.Method)) {
		return nil, &parseError{400, "malformed request method"}
	}
	// Bytes that HTTP/2 allows in :path (a space, say) would break the
	// HTTP/1.1 request line.
	if !validTarget([]byte(target)) || (target[0] != '/' && (target != "*" || r.Method != "OPTIONS")) {
		return nil, &parseError{400, "malformed request target"}
	}
	n, size := 0, 0
	for name, vs := range r.Header {
		if name == "Cookie" && len(vs) > 1 {
			// RFC 9113 §8.2.3: cookie crumbs are joined with "; " (x/net
			// already does it; kept so that the app never sees several).
			vs = []string{strings.Join(vs, "; ")}
			r.Header["Cookie"] = vs
		}
		n += len(vs)
		for _, v := range vs {
			size += len(name) + len(v)
		}
	}
	if n > st.s.cfg.MaxHeaderFields {
		return nil, errHeadTooLarge
	}
	// One backing array for every name and value: it never grows, so the
	// slices stay valid.
	arena := make([]byte, 0, size+len(r.Method)+len(target)+len(r.Host))
	cut := func(s string) []byte {
		start := len(arena)
		arena = append(arena, s...)
		return arena[start:len(arena):len(arena)]
	}
	req := &request{
		method: cut(r.Method),
		path:   cut(target),
		fields: make([]headField, 0, n),
	}
	req.target = req.path
	// :authority (or Host) as the client sent it, port included.
	req.host = cut(r.Host)
	for name, vs := range r.Header {
		nb := cut(name)
		if !isToken(nb) {
			return nil, &parseError{400, "invalid header name"}
		}
		for _, v := range vs {
			vb := cut(v)
			if !validFieldValue(vb) {
				return nil, &parseError{400, "invalid byte in header value"}
			}
			req.fields = append(req.fields, headField{nb, vb})
			if asciiEqualFold(nb, "accept") {
				req.accept = vb
			}
		}
	}
	switch {
	case r.ContentLength > 0:
		req.body, req.length = bodyLength, r.ContentLength
	case r.ContentLength < 0:
		req.body = bodyChunked
	}
	return req, nil
}

// attach makes bc the stream's app connection: revocation and the end of
// the stream close it. False when the connection is revoked.
func (st *h2Stream) attach(bc *backendConn) bool {
	if !st.hc.addBackend(bc) {
		return false
	}
	st.cancelStop = context.AfterFunc(st.r.Context(), func() { _ = bc.conn.Close() })
	return true
}

// detach undoes attach; it reports whether bc is still usable (not closed
// because the stream ended).
func (st *h2Stream) detach(bc *backendConn) bool {
	st.hc.removeBackend(bc)
	ok := true
	if st.cancelStop != nil {
		ok = st.cancelStop()
		st.cancelStop = nil
	}
	return ok
}

// gone reports whether the stream or the connection has ended, in which
// case nobody is listening for an answer.
func (st *h2Stream) gone() bool {
	return st.r.Context().Err() != nil || st.hc.revokedErr() != nil
}

// proxy forwards the request to the app and relays the response (an
// exchange, exchange.go); it reports whether the stream must be reset.
func (st *h2Stream) proxy(req *request) bool {
	s, r := st.s, st.r
	x := &st.x
	x.reset(s, st.hc.route, st.hc.sni, req, st)
	defer st.rec.timings(x)
	hasBody := req.body != bodyNone
	fi := s.forwardInfo(x.pool, st.hc.sni, st.hc.peer, st.hc.trusted)
	head := appendRequestHead(make([]byte, 0, 1024), req, &fi)
	s.countDropped(&fi, st.hc.route)
	if err := x.connect(r.Context(), head, !hasBody); err != nil {
		return st.exchangeFailed(x, err)
	}

	// Stream the request body alongside reading the response.
	var bodyAborted atomic.Bool
	var clientErr *h2ClientBodyError // set before the body copy returns
	if hasBody {
		x.sendBody(func(bc *backendConn) error {
			err := st.copyRequestBody(bc, req)
			var cbe *h2ClientBodyError
			if errors.As(err, &cbe) && !bodyAborted.Load() {
				// The client's body failed: the app, waiting for the
				// rest, must not keep us waiting for its answer.
				clientErr = cbe
				_ = bc.conn.Close()
			}
			return err
		}, func() {
			bodyAborted.Store(true)
			_ = r.Body.Close()
		})
	}

	err := x.readHead(func(resp *response) error {
		// 100 Continue is x/net's business (it answers Expect itself);
		// 103 Early Hints is relayed; other 1xx are dropped.
		if resp.status == 103 {
			h := st.w.Header()
			st.copyResponseFields(h, resp, false)
			st.w.WriteHeader(103)
			clear(h)
		}
		return nil
	})
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
		if clientErr != nil {
			if clientErr.timeout {
				st.deny(denyReqTimeout)
				return false
			}
			return true
		}
		return st.exchangeFailed(x, err)
	}

	resp := &x.resp
	h := st.w.Header()
	if !st.copyResponseFields(h, resp, x.isHead || resp.status == 304) {
		// Never let x/net sniff a Content-Type the app did not send.
		h["Content-Type"] = nil
	}
	if resp.body == bodyLength {
		h.Set("Content-Length", strconv.FormatInt(resp.length, 10))
	}
	if s.draining.Load() {
		// x/net turns this into a GOAWAY for the connection.
		h.Set("Connection", "close")
	}
	st.w.WriteHeader(resp.status)
	st.rec.status, st.rec.outcome = resp.status, outcomeOK
	if resp.body != bodyNone && x.bc.in.buffered() == 0 && (resp.body != bodyLength || resp.length != 0) {
		// Nothing of the body is here yet (a stream of events, say): let
		// the client have the head now.
		err = st.flush()
	}
	if err == nil {
		err = x.copyBody(h2BodyWriter{st}, nil, st.flush, false)
	} else {
		s.m.request(resp.status)
	}
	if err != nil {
		st.rec.outcome = outcomeAborted
		x.abort()
		return true
	}
	x.finish(st.hc.revokedErr() == nil)
	return false
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

// copyResponseFields copies the app's response fields into h, without
// hop-by-hop fields and those named by Connection. keepLength keeps the
// app's Content-Length (HEAD and 304 answers: it describes the
// representation). It reports whether a Content-Type was copied.
func (st *h2Stream) copyResponseFields(h http.Header, resp *response, keepLength bool) bool {
	hasType := false
	for i := range resp.fields {
		f := &resp.fields[i]
		if hopByHop(f.name) || connectionNamed(f.name, resp.connTokens) {
			if !keepLength || !asciiEqualFold(f.name, "content-length") {
				continue
			}
		}
		key := textproto.CanonicalMIMEHeaderKey(string(f.name))
		if key == "Content-Type" {
			hasType = true
		}
		h[key] = append(h[key], string(f.value))
	}
	return hasType
}

// flush sends what the ResponseWriter holds, bounded by BodyTimeout.
func (st *h2Stream) flush() error {
	st.dog.armWrite(st.rc)
	err := st.rc.Flush()
	st.dog.disarmWrite()
	return err
}

// h2BodyWriter writes the response body, each write bounded by BodyTimeout.
type h2BodyWriter struct{ st *h2Stream }

func (w h2BodyWriter) Write(p []byte) (int, error) {
	w.st.dog.armWrite(w.st.rc)
	n, err := w.st.w.Write(p)
	w.st.dog.disarmWrite()
	return n, err
}

// copyRequestBody streams the request body to the app: Content-Length
// framing when the length is known, chunked otherwise. Each read of the
// client's body and each write to the app is bounded by BodyTimeout.
func (st *h2Stream) copyRequestBody(bc *backendConn, req *request) error {
	s := st.s
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
		st.dog.armRead(st.r.Body)
		m, rerr := st.r.Body.Read(p)
		st.dog.disarmRead()
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
			return &h2ClientBodyError{err: rerr, timeout: st.dog.readTimedOut()}
		}
	}
}

// h2ClientBodyError is a failure to read the client's request body;
// timeout: the read watchdog fired.
type h2ClientBodyError struct {
	err     error
	timeout bool
}

func (e *h2ClientBodyError) Error() string { return "request body: " + e.err.Error() }

func (e *h2ClientBodyError) Unwrap() error { return e.err }

// deny answers a request the listener refuses, on this stream only unless
// d.close (then x/net sends GOAWAY and the connection ends once its
// streams are done).
func (st *h2Stream) deny(d denial) {
	st.rec.denied(d)
	st.s.m.denied(d.status)
	st.logDenial(d.status, d.reason)
	if st.s.draining.Load() {
		d.close = true
	}
	writeH2Error(st.w, d, st.r.Header.Get("Accept"), strings.EqualFold(st.r.Header.Get("Sec-Fetch-Mode"), "navigate"))
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
		slog.String("method", st.r.Method),
		slog.String("path", pathOnly([]byte(st.r.RequestURI))),
	)
}
