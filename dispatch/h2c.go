package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"

	"github.com/applistener/applistener/dispatch/internal/h2client"
	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/internal/panicguard"
)

// Services that declare "protocol": "h2c" (gRPC servers and other apps
// that speak HTTP/2 with prior knowledge) get each HTTP/2 stream of a
// client forwarded as an HTTP/2 stream of their own, through the route's
// h2cPool: the request and its body stream to the app as they arrive, the
// response and its body stream back, request and response trailers are
// carried through, a client's reset cancels the app's stream, and revoking
// the route closes both the client connections and the app connections.
// The checks, the stream limit, the forwarding fields, the metrics and the
// access log are those of every other request.
//
// HTTP/1.1 clients get 505 (denyH2COnly): see handleRequest.

// reasonH2COnly is the answer to an HTTP/1.1 request for an h2c service.
const reasonH2COnly = "this service speaks HTTP/2 only (gRPC): connect with HTTP/2"

// denyH2COnly refuses an HTTP/1.1 request for an h2c service. Every gRPC
// client speaks HTTP/2, and any TLS client that offers h2 in ALPN gets it,
// so only clients with HTTP/2 turned off reach this. Translating would
// hand them a response whose outcome travels in trailers that HTTP/1.1
// clients drop (a failed gRPC call would look like a 200), and WebSocket
// upgrades could not reach an app that only speaks HTTP/2; a clear refusal
// that names the fix is better.
var denyH2COnly = denial{status: 505, reason: reasonH2COnly, close: true}

// errH2CHeadTimeout: the app sent no response head within
// Config.ResponseHeaderTimeout of the end of the request body.
var errH2CHeadTimeout = errors.New("timed out waiting for the application's response head")

// reasonH2CWebSocket answers a WebSocket (an extended CONNECT) for an h2c
// service: its app would need RFC 8441 itself, which the listener does not
// forward.
const reasonH2CWebSocket = "WebSockets are not supported on an h2c service"

// serveH2C forwards the stream to the route's h2c app; it reports whether
// the stream must be reset. The caller has checked the route and the
// :authority.
func (st *h2Stream) serveH2C() bool {
	if st.es.Protocol != "" {
		st.deny(denial{status: 501, reason: reasonH2CWebSocket})
		return false
	}
	if st.es.Method == "CONNECT" || st.es.Method == "TRACE" {
		st.deny(denyMethod)
		return false
	}
	if pe := h2TargetError(st.es.Method, st.es.Path); pe != nil {
		st.deny(denyParse(pe))
		return false
	}
	if len(st.es.Header) > st.s.cfg.MaxHeaderFields {
		st.deny(denyParse(errHeadTooLarge))
		return false
	}
	for _, f := range st.es.Header {
		if pe := h2FieldError(f.Name, f.Value); pe != nil {
			st.deny(denyParse(pe))
			return false
		}
	}
	inst := st.hc.route.Instance
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
	return st.proxyH2C()
}

// proxyH2C sends the request to the app as an HTTP/2 stream and relays its
// response, flushing each piece of the body as it arrives (gRPC messages
// are not held back), then its trailers.
func (st *h2Stream) proxyH2C() bool {
	s, es, hc := st.s, st.es, st.hc
	bp := s.routePool(hc.route)
	pool := s.h2cPoolOf(hc.route, bp)
	fi := s.forwardInfo(bp, hc.sni, hc.peer, hc.trusted, publicPortOf(st.host), st.rec.id.bytes())
	appPath := st.accessForwarding(&fi, bp.access)
	var declared []string // the request trailers forwarded
	if es.ContentLength != 0 {
		declared = h2cDeclaredTrailers(es.Header, &fi)
	}
	reqFields := h2cRequestFields(make([]hpack.HeaderField, 0, len(es.Header)+10), es.Header, &fi, es.ContentLength, declared)
	s.countDropped(&fi, hc.route)
	authority := bp.hostHeader
	if fi.preserve {
		authority = string(fi.appendAppHost(nil, []byte(st.host)))
	}

	// The app's stream is cancelled when the client's ends early (a
	// reset, the connection closed), not when the handler returns after
	// a complete exchange (a reset of a stream the app has ended is
	// useless, and gRPC servers count resets and PINGs against their
	// client: too many, and they close the connection).
	ctx, cancel := context.WithCancelCause(context.Background())
	var complete atomic.Bool
	es.AfterReset(func() {
		if !complete.Load() {
			cancel(context.Canceled)
		}
	})
	defer func() {
		es.StopAfterReset()
		if !complete.Load() {
			cancel(context.Canceled)
		}
	}()
	var clock h2cHeadClock
	defer clock.stop()
	startClock := func() {
		clock.start(s.cfg.ResponseHeaderTimeout, func() { cancel(errH2CHeadTimeout) })
	}
	start := time.Now()
	var sentAt atomic.Int64 // unix nanoseconds: the request head was written
	out := &h2client.Request{
		Method:       es.Method,
		Scheme:       "http",
		Authority:    authority,
		Path:         appPath,
		WroteHeaders: func() { sentAt.Store(time.Now().UnixNano()) },
	}
	if out.Path == "" {
		out.Path = "/"
	}
	if es.ContentLength == 0 {
		startClock()
	} else {
		body := &h2cBody{st: st, onEnd: startClock, access: fi.access}
		out.Body = body
		if len(declared) > 0 {
			// Declared request trailers: the values are copied when the
			// body ends.
			body.trailer = make(http.Header, len(declared))
			for _, k := range declared {
				body.trailer[k] = nil
			}
			out.Trailer = body.trailerFields
		}
	}
	out.Header = reqFields

	resp, err := st.h2cRoundTrip(ctx, pool, out)
	clock.stop()
	if sent := sentAt.Load(); sent != 0 {
		st.rec.connect = time.Unix(0, sent).Sub(start)
		if err == nil {
			st.rec.firstByte = time.Since(time.Unix(0, sent))
		}
	}
	if err == nil && !validStatus(resp.Status) {
		// (1xx answers are interim: the client reads past them.)
		_ = resp.Body.Close()
		err = &badResponseError{fmt.Errorf("status %d", resp.Status)}
	}
	if err != nil {
		return st.h2cFailed(err, context.Cause(ctx))
	}
	defer func() { _ = resp.Body.Close() }()
	publicPort := hostPort([]byte(st.host))
	fields := s.h2cClientFields(st.out[:0], resp.Header, false, hc.sni, publicPort, bp)
	fields = st.acc.appendH2Fields(fields)
	// The request's id in place of the app's (as for HTTP/1.1 apps),
	// never indexed (see responseFields).
	fields = append(fields, h2engine.HeaderField{Name: "x-request-id", Value: string(st.rec.id.bytes()), Sensitive: true})
	st.out = fields
	rw := h2cResponse{st: st, status: resp.Status, fields: fields}
	st.rec.status, st.rec.outcome = resp.Status, outcomeOK
	s.m.request(resp.Status)
	if resp.ContentLength != 0 {
		// A body follows, possibly much later (a stream): the client
		// gets the head now, unless more of the response is already at
		// hand (a unary gRPC answer: head, message and trailers go out
		// in one write). A response without a body (a gRPC
		// trailers-only answer) goes out as one HEADERS frame with
		// END_STREAM.
		err := rw.head()
		if n, ended := resp.Body.Buffered(); err == nil && n == 0 && !ended {
			err = st.flush()
		}
		if err != nil {
			st.rec.outcome = outcomeAborted
			return true
		}
	}
	n, rerr, werr := rw.copyBody(resp.Body)
	complete.Store(rerr == nil && werr == nil)
	st.rec.bytesOut = n
	s.m.bytesToClient.Add(float64(n))
	switch {
	case werr != nil:
		// The client went away or stopped reading.
		st.rec.outcome = outcomeAborted
		return true
	case rerr != nil:
		st.rec.outcome = outcomeAborted
		if st.gone() && hc.route.Lease.Live() {
			return true // nobody is listening
		}
		s.log.Warn("app stream failed", "class_uid", 4001, "host", hc.route.Host, "port", hc.route.Port, "err", rerr)
		if isGRPC(resp.Header) && !h2cHasTrailer(resp, "grpc-status") {
			// End the call as a gRPC server whose connection was lost
			// would: UNAVAILABLE, in trailers.
			return rw.end([]h2engine.HeaderField{
				{Name: "grpc-status", Value: "14"},
				{Name: "grpc-message", Value: "the application's stream ended unexpectedly"},
			}) != nil
		}
		if !rw.headed {
			// Nothing relayed yet (a response declared empty whose
			// stream then failed): answered as any failed app is.
			return st.h2cFailed(rerr, context.Cause(ctx))
		}
		return true
	}
	var trailers []h2engine.HeaderField
	if len(resp.Trailer) > 0 {
		// After the head's fields, in the same array: the head may
		// not have been written yet (a response without a body).
		all := s.h2cClientFields(fields, resp.Trailer, true, hc.sni, publicPort, bp)
		trailers = all[len(fields):]
	}
	if err := rw.end(trailers); err != nil {
		st.rec.outcome = outcomeAborted
		return true
	}
	return false
}

// h2cResponse writes an h2c app's response on the client's stream: the
// head as soon as a body is coming (or when the response ends), the body
// flushed piece by piece, then the trailers; a response with neither
// body nor trailers is one HEADERS frame with END_STREAM.
type h2cResponse struct {
	st     *h2Stream
	status int
	fields []h2engine.HeaderField
	headed bool
}

func (w *h2cResponse) head() error {
	if w.headed {
		return nil
	}
	w.headed = true
	return w.st.es.WriteHeaders(w.status, w.fields, false)
}

// end ends the response with trailers (none: END_STREAM).
func (w *h2cResponse) end(trailers []h2engine.HeaderField) error {
	st := w.st
	if !w.headed && len(trailers) == 0 {
		w.headed = true
		err := st.es.WriteHeaders(w.status, w.fields, true)
		st.ended = err == nil
		return err
	}
	if err := w.head(); err != nil {
		return err
	}
	err := st.es.WriteTrailers(trailers)
	st.ended = err == nil
	return err
}

// h2cRoundTrip sends out through pool. A dial the app refuses (nothing
// listens on the port yet) is retried with backoff for up to the route's
// start grace, as for HTTP/1.1 apps (appstart.go); nothing of the request
// has been read then, so sending it again is safe.
func (st *h2Stream) h2cRoundTrip(ctx context.Context, pool *h2cPool, out *h2client.Request) (*h2client.Response, error) {
	resp, err := pool.roundTrip(ctx, out)
	var de *dialError
	if err == nil || !errors.As(err, &de) || !refusedByApp(de.err) {
		return resp, err
	}
	s, route := st.s, st.hc.route
	x := &exchange{s: s, route: route} // for the start grace and its log
	start := time.Now()
	grace := x.startGrace()
	if grace <= 0 {
		return nil, &notListeningError{port: route.Port, err: de.err}
	}
	s.m.startWaiting.Inc()
	defer s.m.startWaiting.Dec()
	deadline := start.Add(grace)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff, attempts, last := startBackoffMin, 1, de.err
	end := func(outcome string, err error) error {
		s.m.startWaits.WithLabelValues(outcome).Inc()
		x.logStartWait(outcome, time.Since(start), attempts, err)
		return err
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, end(startTimeout, &notListeningError{port: route.Port, waited: time.Since(start), err: last})
		}
		timer.Reset(min(jitter(backoff), left))
		select {
		case <-timer.C:
		case <-ctx.Done():
		case <-route.Lease.Done():
		case <-s.stopping:
		}
		switch {
		case !route.Lease.Live():
			return nil, end(startRevoked, errClientRevoked)
		case s.draining.Load():
			return nil, end(startShutdown, &notListeningError{port: route.Port, waited: time.Since(start), err: last})
		case ctx.Err() != nil:
			return nil, end(startClientGone, errClientGone)
		}
		resp, err = pool.roundTrip(ctx, out)
		attempts++
		switch {
		case err == nil:
			_ = end(startReady, nil)
			return resp, nil
		case !errors.As(err, &de):
			return nil, err // the app accepted; the exchange failed
		case !refusedByApp(de.err):
			return nil, end(startError, err)
		}
		last = de.err
		backoff = min(2*backoff, startBackoffMax)
	}
}

// copyBody relays the app's response body, flushing whenever the app's
// stream has nothing more at hand (what it has buffered goes out in one
// write to the client, however many messages it holds, and a response
// whose end has arrived is flushed by its end); rerr is a
// failure reading from the app, werr one writing to the client.
func (w *h2cResponse) copyBody(src *h2client.Body) (n int64, rerr, werr error) {
	st := w.st
	bufp := st.s.bufPool.Get().(*[]byte)
	defer st.s.bufPool.Put(bufp)
	buf := *bufp
	for {
		m, err := src.Read(buf)
		if m > 0 {
			if werr = w.head(); werr == nil {
				if _, werr = st.es.Write(buf[:m]); werr == nil {
					if more, ended := src.Buffered(); more == 0 && !ended {
						// Soon, not now: the other streams' messages
						// that are ready go out in the same write.
						werr = st.es.FlushSoon()
					}
				}
			}
			if werr != nil {
				return n, nil, werr
			}
			n += int64(m)
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// h2cFailed answers a request whose response head never came, or came
// invalid (cause is the cancellation cause of the request's context); it
// reports whether the stream must be reset instead. What is not the
// h2c path's own (the head timeout, the client's body, the route's pool
// closed) is answered and logged as for every other app (exchange.failure).
func (st *h2Stream) h2cFailed(err, cause error) bool {
	s, route := st.s, st.hc.route
	x := &exchange{s: s, route: route} // for the logs and the OCSF record
	var ce *h2ClientBodyError
	switch {
	case errors.Is(cause, errH2CHeadTimeout):
		s.log.Warn("app connection failed", "class_uid", 4001, "host", route.Host, "port", route.Port, "err", cause)
		x.ocsfAppFailed(cause)
		st.deny(denyRespTimeout)
		return false
	case st.es.Err() != nil || errors.Is(err, errClientGone):
		return true // the client reset the stream or went away
	case !route.Lease.Live() || errors.Is(err, errH2CPoolClosed) || errors.Is(err, errClientRevoked):
		st.deny(denyRevoked)
		return false
	case errors.As(err, &ce):
		// The client's body failed: the app's answer no longer matters.
		// A body that stopped arriving is answered as on every path.
		if ce.timeout {
			st.deny(denyReqTimeout)
			return false
		}
		return true
	}
	st.deny(x.failure(err))
	return false
}

// h2cBody is the request body handed to the app's client: the client's
// body, counted, with its declared trailers copied when it ends.
type h2cBody struct {
	st      *h2Stream
	trailer http.Header    // the declared trailers (values once the body ended), or nil
	access  *accessForward // the route's credential rules (nil: none)
	onEnd   func()         // the body has been read whole
	n       int64
	ended   bool
}

// Read reads the client's request body for h2client's sender goroutine.
// A panic is recovered (panicguard RequestBody): that stream fails (the
// client's stream is reset), the app connection and its other streams
// go on.
func (b *h2cBody) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			b.st.hc.panicked(panicguard.RequestBody, r)
			n, err = 0, &panicguard.PanicError{Where: panicguard.RequestBody, Value: r}
		}
	}()
	panicguard.Point(panicguard.RequestBody, b.st.hc.sni)
	n, err = b.st.es.Read(p)
	if n > 0 {
		b.n += int64(n)
		b.st.bodyIn.Store(b.n)
		b.st.s.m.bytesToApp.Add(float64(n))
	}
	switch {
	case err == io.EOF && !b.ended:
		b.ended = true
		for k := range b.trailer {
			b.trailer[k] = nil
		}
		for _, f := range b.st.es.Trailer {
			k := http.CanonicalHeaderKey(f.Name)
			if _, ok := b.trailer[k]; !ok || !httpgrammar.ValidFieldValue(f.Value) {
				continue
			}
			if v, keep := b.access.trailerValue(f.Name, f.Value); keep {
				b.trailer[k] = append(b.trailer[k], v)
			}
		}
		b.onEnd()
	case err != nil && err != io.EOF:
		err = &h2ClientBodyError{err: err, timeout: errors.Is(err, h2engine.ErrReadTimeout)}
	}
	return n, err
}

func (b *h2cBody) Close() error {
	b.st.es.CloseRead()
	return nil
}

// Buffered reports what the client's body holds now (h2client sends a
// body that is whole with the request head, in one write).
func (b *h2cBody) Buffered() (int, bool) { return b.st.es.Buffered() }

// trailerFields returns the declared trailers' values as fields, once
// Read has returned io.EOF.
func (b *h2cBody) trailerFields() []hpack.HeaderField {
	var out []hpack.HeaderField
	for k, vv := range b.trailer {
		name := httpgrammar.ToLower(k)
		for _, v := range vv {
			out = append(out, hpack.HeaderField{Name: name, Value: v})
		}
	}
	return out
}

// h2cHeadClock bounds the wait for the app's response head: it starts when
// the request body has been sent whole (a client-streaming gRPC call may
// send for as long as it likes first) and stops when the head arrives.
type h2cHeadClock struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func (c *h2cHeadClock) start(d time.Duration, fire func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped && c.t == nil {
		c.t = time.AfterFunc(d, fire)
	}
}

func (c *h2cHeadClock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.t != nil {
		c.t.Stop()
	}
}

// h2cDeclaredTrailers returns the request trailers a client declared
// (Trailer) that are forwarded to an h2c app, canonical and once each, in
// the order declared.
func h2cDeclaredTrailers(src []h2engine.HeaderField, fi *forwardInfo) []string {
	var declared []string
	for i := range src {
		if src[i].Name != "trailer" {
			continue
		}
		for k := range strings.SplitSeq(src[i].Value, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			if k != "" && h2FieldError(k, "") == nil && fi.trailerForwarded([]byte(k)) && !slices.Contains(declared, k) {
				declared = append(declared, k)
			}
		}
	}
	return declared
}

// h2cRequestFields appends to dst the request fields sent to an h2c app,
// from the client's (src: HTTP/2 fields, lowercase names) in their order:
// sanitised by the rules every app protocol shares (forwardClaims.keep:
// hop-by-hop fields, '_' names, untrusted forwarding claims and the
// listener's credentials dropped), except that "TE: trailers" passes
// (gRPC servers may require it); cookie crumbs joined with "; " (RFC 9113
// 8.2.3) and, on a route with an access policy, the listener's cookie and
// token subprotocol taken out (accessForward.rewriteField); then the
// listener's X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host,
// X-Forwarded-Port, Forwarded, X-Request-Id and X-Forwarded-User, as
// appendRequestHead writes them for HTTP/1.1 apps; the body's
// content-length when the client declared one, and the trailers the
// request will carry. Fields whose values are unique to one request (its
// id, a gRPC deadline) are never indexed, so that they do not churn the
// app connection's HPACK table. No User-Agent is added when the client
// sent none.
func h2cRequestFields(dst []hpack.HeaderField, src []h2engine.HeaderField, fi *forwardInfo, contentLength int64, trailers []string) []hpack.HeaderField {
	var claims forwardClaims
	tes, teOK := 0, false
	cookies := 0
	for i := range src {
		if src[i].Name == "cookie" {
			cookies++
		}
	}
	for i := range src {
		name, value := src[i].Name, src[i].Value
		switch name {
		case "te":
			tes++
			teOK = httpgrammar.EqualFold(httpgrammar.TrimOWS(value), "trailers")
			continue
		case "cookie":
			if cookies == 0 {
				continue // joined into the first crumb's field
			}
			if cookies > 1 {
				value = h2cJoinCookies(src[i:])
			}
			cookies = 0
		}
		nb, vb := []byte(name), []byte(value)
		if !claims.keep(fi, nb, vb) {
			continue
		}
		if fi.access != nil {
			out, drop := fi.access.rewriteField(nb, vb)
			if drop {
				continue
			}
			if len(out) != len(value) {
				value = string(out)
			}
		}
		dst = append(dst, hpack.HeaderField{Name: name, Value: value, Sensitive: name == "grpc-timeout"})
	}
	if tes == 1 && teOK {
		dst = append(dst, hpack.HeaderField{Name: "te", Value: "trailers"})
	}

	// The listener's own values, made in one buffer and one string.
	var buf [512]byte
	b := buf[:0]
	var ends [4]int
	b = claims.appendForwardedFor(b, fi)
	ends[0] = len(b)
	if !claims.haveHost {
		b = claims.appendPublicHost(b, fi)
	}
	ends[1] = len(b)
	b = claims.appendForwarded(b, fi)
	ends[2] = len(b)
	b = append(b, fi.requestID...)
	ends[3] = len(b)
	port := claims.forwardedPort(fi)
	if port > 0 {
		b = strconv.AppendInt(b, int64(port), 10)
	}
	all := string(b)
	dst = append(dst, hpack.HeaderField{Name: "x-forwarded-for", Value: all[:ends[0]]})
	if !claims.haveProto {
		dst = append(dst, hpack.HeaderField{Name: "x-forwarded-proto", Value: "https"})
	}
	if !claims.haveHost {
		dst = append(dst, hpack.HeaderField{Name: "x-forwarded-host", Value: all[ends[0]:ends[1]]})
	}
	if port > 0 {
		dst = append(dst, hpack.HeaderField{Name: "x-forwarded-port", Value: all[ends[3]:]})
	}
	dst = append(dst, hpack.HeaderField{Name: "forwarded", Value: all[ends[1]:ends[2]]})
	if ends[3] > ends[2] {
		dst = append(dst, hpack.HeaderField{Name: "x-request-id", Value: all[ends[2]:ends[3]], Sensitive: true})
	}
	if fi.access != nil && fi.access.user != "" {
		dst = append(dst, hpack.HeaderField{Name: "x-forwarded-user", Value: fi.access.user})
	}
	if contentLength > 0 {
		dst = append(dst, hpack.HeaderField{Name: "content-length", Value: strconv.FormatInt(contentLength, 10)})
	}
	if len(trailers) > 0 {
		dst = append(dst, hpack.HeaderField{Name: "trailer", Value: strings.Join(trailers, ",")})
	}
	return dst
}

// h2cJoinCookies returns the values of the cookie fields among fields
// joined with "; " (RFC 9113 8.2.3).
func h2cJoinCookies(fields []h2engine.HeaderField) string {
	var sb strings.Builder
	for i := range fields {
		if fields[i].Name != "cookie" {
			continue
		}
		if sb.Len() > 0 {
			sb.WriteString("; ")
		}
		sb.WriteString(fields[i].Value)
	}
	return sb.String()
}

// h2cClientFields appends to dst an h2c app's response header fields
// (or, with trailer, its trailer fields) as the client gets them, in the
// app's order, by the rules of every app protocol: hop-by-hop fields and
// those the app's Connection names dropped (Content-Length stays in the
// head: HTTP/2 frames the body the same way on both sides), the head's
// Trailer declaration dropped, the app's X-Request-Id dropped (the caller
// adds the request's own id to the head; in trailers it would contradict
// it), Host dropped from trailers, cookies made host-only (scopeCookies)
// and redirects to the app's loopback origin made public
// (rewriteRedirects), in trailers as in the head. Names are lowercase
// (HTTP/2's).
func (s *Server) h2cClientFields(dst []h2engine.HeaderField, src []hpack.HeaderField, trailer bool, host string, publicPort int, bp *backendPool) []h2engine.HeaderField {
	var adjust response // the fields that cookies.go and redirect.go may rewrite
	// The fields the app's Connection names are its hop-by-hop fields
	// too (RFC 9110 7.6.1), as for HTTP/1.1 apps.
	var named [][]byte
	for _, f := range src {
		if httpgrammar.EqualFold(f.Name, "connection") {
			_, named, _ = parseConnection([]byte(f.Value), named)
		}
	}
	for _, f := range src {
		name := httpgrammar.ToLower(f.Name)
		if len(named) > 0 && connectionNamed([]byte(name), named) {
			continue
		}
		switch name {
		case "set-cookie", "location", "content-location", "refresh":
			adjust.fields = append(adjust.fields, headField{name: []byte(name), value: []byte(f.Value)})
			continue
		case "x-request-id":
			continue
		case "host":
			if trailer {
				continue
			}
		}
		if hopByHop([]byte(name)) && (trailer || name != "content-length") {
			continue
		}
		dst = append(dst, h2engine.HeaderField{Name: name, Value: f.Value})
	}
	if len(adjust.fields) > 0 {
		s.scopeCookies(&adjust, host, bp)
		s.rewriteRedirects(&adjust, bp, host, publicPort)
		for _, f := range adjust.fields {
			dst = append(dst, h2engine.HeaderField{Name: string(f.name), Value: string(f.value)})
		}
	}
	return dst
}

// hasField reports whether fields hold one named name (lowercase).
func hasField(fields []h2engine.HeaderField, name string) bool {
	for _, f := range fields {
		if f.Name == name {
			return true
		}
	}
	return false
}

// isGRPC reports whether a response head is a gRPC one.
func isGRPC(fields []hpack.HeaderField) bool {
	for _, f := range fields {
		if f.Name == "content-type" {
			ct := f.Value
			return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
		}
	}
	return false
}

// h2cHasTrailer reports whether an app's response declared (in its Trailer
// field) or sent the trailer name (lowercase).
func h2cHasTrailer(resp *h2client.Response, name string) bool {
	for _, f := range resp.Trailer {
		if httpgrammar.EqualFold(f.Name, name) {
			return true
		}
	}
	for _, f := range resp.Header {
		if f.Name != "trailer" {
			continue
		}
		for t := range strings.SplitSeq(f.Value, ",") {
			if httpgrammar.EqualFold(strings.TrimSpace(t), name) {
				return true
			}
		}
	}
	return false
}
