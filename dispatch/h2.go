package dispatch

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// HTTP/2 settings of the client side. The app is always spoken to in
// HTTP/1.1 through the same per-route backend pool as HTTP/1.1 clients.
const (
	// H2MaxConcurrentStreams is SETTINGS_MAX_CONCURRENT_STREAMS.
	H2MaxConcurrentStreams = 250
	// H2ReadIdleTimeout: a connection with no frame read for this long is
	// sent a PING ...
	H2ReadIdleTimeout = 60 * time.Second
	// H2PingTimeout: ... and closed when the PING is not answered in time.
	H2PingTimeout = 15 * time.Second
	// h2MaxResponseFields bounds the header fields of an app's response
	// (the same bound as the HTTP/1.1 path).
	h2MaxResponseFields = 200
)

// h2State is the Server's HTTP/2 machinery, created on first use.
//
// It is x/net's HTTP/2 server driven one connection at a time through
// Server.ServeConn. x/net marks that API deprecated in favour of net/http's
// own HTTP/2 (http.Server.Protocols and Serve), but net/http cannot serve a
// single connection accepted, handshaken and routed by someone else:
// ServeH2 hands over a connection whose Close closes the raw TCP connection
// (h2NetConn, which net/http would not take for TLS and so not for h2),
// and returns when that connection ends. Hence the SA1019 exceptions below.
type h2State struct {
	once sync.Once
	srv  *http2.Server //nolint:staticcheck // SA1019: ServeConn has no net/http equivalent, see h2State.
	// base carries the settings x/net takes from an http.Server
	// (MaxHeaderBytes → MAX_HEADER_LIST_SIZE, IdleTimeout, ErrorLog, the
	// HTTP2 settings) and, through http2.ConfigureServer, the graceful
	// shutdown hook: its Shutdown makes every connection served with it
	// send GOAWAY.
	base *http.Server
	used atomic.Bool // srv and base exist

	// byIdle holds a server (and its base) per instance idle timeout
	// (limits.idle_timeout_seconds): x/net takes the idle timeout from the
	// server, not per connection. At most maxH2IdleVariants; further
	// values get the default.
	mu     sync.Mutex
	byIdle map[time.Duration]h2Variant
}

// h2Variant is an HTTP/2 server and its base for one idle timeout.
type h2Variant struct {
	srv  *http2.Server //nolint:staticcheck // SA1019: see h2State.
	base *http.Server
}

// maxH2IdleVariants bounds the distinct per-instance idle timeouts that get
// an HTTP/2 server of their own.
const maxH2IdleVariants = 32

// h2Server returns the http2.Server and its base configuration.
func (s *Server) h2Server() (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	s.h2.once.Do(func() {
		s.h2.srv, s.h2.base = s.newH2Server(s.cfg.IdleTimeout)
		s.h2.used.Store(true)
	})
	return s.h2.srv, s.h2.base
}

// h2ServerFor returns the HTTP/2 server for a connection whose instance
// has idle timeout idle (0: the server's).
func (s *Server) h2ServerFor(idle time.Duration) (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	srv, base := s.h2Server()
	if idle <= 0 || idle == s.cfg.IdleTimeout {
		return srv, base
	}
	s.h2.mu.Lock()
	defer s.h2.mu.Unlock()
	if v, ok := s.h2.byIdle[idle]; ok {
		return v.srv, v.base
	}
	if len(s.h2.byIdle) >= maxH2IdleVariants {
		return srv, base
	}
	if s.h2.byIdle == nil {
		s.h2.byIdle = make(map[time.Duration]h2Variant)
	}
	v := h2Variant{}
	v.srv, v.base = s.newH2Server(idle)
	s.h2.byIdle[idle] = v
	return v.srv, v.base
}

// newH2Server builds an HTTP/2 server whose connections close after idle
// without streams.
func (s *Server) newH2Server(idle time.Duration) (*http2.Server, *http.Server) { //nolint:staticcheck // SA1019: see h2State.
	base := &http.Server{
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
		IdleTimeout:    idle,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		// x/net reads these from the base server and lets them take
		// precedence over its own (deprecated) fields.
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: H2MaxConcurrentStreams,
			SendPingTimeout:      H2ReadIdleTimeout,
			PingTimeout:          H2PingTimeout,
			// A peer that reads nothing for this long loses the connection.
			WriteByteTimeout: s.cfg.BodyTimeout,
		},
	}
	// Its idle timeout is base's (ConfigureServer copies it).
	srv := &http2.Server{} //nolint:staticcheck // SA1019: see h2State.
	// ConfigureServer fails only for a TLSConfig with an unusable
	// cipher suite list; base has none.
	if err := http2.ConfigureServer(base, srv); err != nil { //nolint:staticcheck // SA1019: the GOAWAY-on-Shutdown hook for ServeConn, see h2State.
		s.log.Error("http2 configuration failed", "err", err)
	}
	return srv, base
}

// h2GoAway asks every HTTP/2 connection to finish gracefully: GOAWAY, then
// in-flight streams may complete. It is idempotent per connection and is
// called repeatedly while draining (a connection registers with x/net only
// once it starts being served).
func (s *Server) h2GoAway() {
	if !s.h2.used.Load() {
		return // no HTTP/2 connection was ever served
	}
	_, base := s.h2Server()
	// With no listener and no HTTP/1 connection of its own, Shutdown runs
	// the registered hooks and returns at once.
	_ = base.Shutdown(context.Background())
	s.h2.mu.Lock()
	variants := make([]*http.Server, 0, len(s.h2.byIdle))
	for _, v := range s.h2.byIdle {
		variants = append(variants, v.base)
	}
	s.h2.mu.Unlock()
	for _, b := range variants {
		_ = b.Shutdown(context.Background())
	}
}

// routePool returns the route's backend pool, shared by its HTTP/1.1 and
// HTTP/2 clients; it is created on first use and closed with the route.
func (s *Server) routePool(route *routes.Route) *backendPool {
	return route.Data(func() any {
		conn, err := s.cfg.NewConnector(route.Connector)
		if err != nil {
			s.log.Error("connector unavailable", "host", route.Host, "err", err)
			conn = failingConnector{err}
		}
		p := newBackendPool(conn, route.Port, s.cfg.MaxIdlePerRoute, s.cfg.BackendIdleTimeout, &s.bufPool, route.Lease)
		p.onStale = s.m.staleConns.Inc
		// The Host the app sees unless PreserveHost: its own loopback
		// address, what dev servers accept.
		host := routes.DefaultConnectorHost
		if route.Connector.Type == "tcp" && route.Connector.Host != "" {
			host = route.Connector.Host
		}
		p.hostHeader = net.JoinHostPort(host, strconv.Itoa(route.Port))
		return p
	}).(*backendPool)
}

// ServeH2 serves HTTP/2 on lc.Conn, a TLS connection that negotiated ALPN
// "h2" and whose SNI named lc.Route. Revocation closes lc.Raw, the TCP
// connection under it (never the TLS connection, whose Close can block on
// a stalled peer), which ends every stream of the connection. Each request
// is checked (route still usable, :authority names the SNI, method,
// instance limit) and forwarded to the app over HTTP/1.1; a request for
// another host (a browser coalescing connections under the wildcard
// certificate) gets 421 on its stream only. ServeH2 returns, after calling
// lc.Done, when the connection is closed and every stream handler has
// returned.
func (s *Server) ServeH2(lc listener.Conn) {
	if lc.Done != nil {
		defer lc.Done()
	}
	conn, raw, sni, route := lc.Conn, lc.Raw, lc.SNI, lc.Route
	tc, ok := conn.(*tls.Conn)
	if !ok {
		_ = raw.Close()
		return
	}
	hc := &h2Conn{s: s, raw: raw, sni: sni, route: route}
	hc.peer, hc.trusted = s.peerOf(raw)
	release, ok := admit(s, &s.h2conns, hc, raw, route)
	if !ok {
		return
	}
	defer release()

	// The instance's idle timeout, as it is when the connection starts.
	srv, base := s.h2ServerFor(route.Instance.IdleTimeout())
	// Deadlines left by the handshake would end the connection; x/net
	// keeps its own timers (idle, ping, write-byte).
	_ = conn.SetDeadline(time.Time{})
	nc := &h2NetConn{Conn: tc, raw: raw, onHeadTimeout: hc.headTimedOut}
	nc.heads.start(tc, s.cfg.HeaderTimeout)
	//nolint:staticcheck // SA1019: no net/http equivalent, see h2State.
	srv.ServeConn(nc, &http2.ServeConnOpts{
		BaseConfig: base,
		Handler:    hc,
	})
	_ = raw.Close()
	hc.endAndWait()
}

// h2NetConn is the connection handed to x/net: closing it closes the raw
// TCP connection. HTTP/2 ends connections with GOAWAY, so no close_notify
// is needed, and a stalled peer cannot block the close.
type h2NetConn struct {
	*tls.Conn
	raw   net.Conn
	heads h2HeadClock
	// onHeadTimeout runs once when a request head took too long.
	onHeadTimeout func()
}

func (c *h2NetConn) Close() error { return c.raw.Close() }

// Read reads for x/net, bounding request heads in time (h2HeadClock).
func (c *h2NetConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heads.observe(p[:n])
	}
	if err != nil && c.heads.timedOut(err) && c.onHeadTimeout != nil {
		c.onHeadTimeout()
	}
	return n, err
}

// h2Conn is one HTTP/2 client connection bound to one route. It is the
// http.Handler of its streams and the routes.Stream attached to the
// route's lease.
type h2Conn struct {
	s       *Server
	raw     net.Conn
	sni     string
	route   *routes.Route
	peer    netip.Addr
	trusted bool

	mu       sync.Mutex
	revoked  error
	backends map[*backendConn]struct{} // in use by a stream
	active   int                       // stream handlers running
	ended    bool                      // x/net stopped serving
	allDone  chan struct{}
}

// Revoke closes the connection (all of its streams end) and every app
// connection its streams are using.
func (hc *h2Conn) Revoke(cause error) {
	hc.mu.Lock()
	if hc.revoked != nil {
		hc.mu.Unlock()
		return
	}
	hc.revoked = cause
	bcs := make([]*backendConn, 0, len(hc.backends))
	for bc := range hc.backends {
		bcs = append(bcs, bc)
	}
	hc.mu.Unlock()
	_ = hc.raw.Close()
	for _, bc := range bcs {
		_ = bc.conn.Close()
	}
}

// headTimedOut records a connection closed because a request head (or the
// first one) did not arrive within the head timeout.
func (hc *h2Conn) headTimedOut() {
	s := hc.s
	s.m.requests.WithLabelValues(statusClass(408)).Inc()
	s.m.denials.WithLabelValues("408").Inc()
	if s.log.Enabled(context.Background(), slog.LevelInfo) {
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "request denied",
			slog.Int("class_uid", 4002),
			slog.String("rule", "app-listener"),
			slog.Int("status", 408),
			slog.String("reason", reasonReqTimeout),
			slog.String("sni", hc.sni),
			slog.String("src", hc.peer.String()),
			slog.String("protocol", "HTTP/2.0"))
	}
}

func (hc *h2Conn) revokedErr() error {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.revoked
}

// addBackend records an app connection in use; false when revoked.
func (hc *h2Conn) addBackend(bc *backendConn) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.revoked != nil {
		return false
	}
	if hc.backends == nil {
		hc.backends = make(map[*backendConn]struct{})
	}
	hc.backends[bc] = struct{}{}
	return true
}

func (hc *h2Conn) removeBackend(bc *backendConn) {
	hc.mu.Lock()
	delete(hc.backends, bc)
	hc.mu.Unlock()
}

// enter counts a running stream handler; false once the connection ended.
func (hc *h2Conn) enter() bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.ended {
		return false
	}
	hc.active++
	return true
}

func (hc *h2Conn) leave() {
	hc.mu.Lock()
	hc.active--
	if hc.active == 0 && hc.allDone != nil {
		close(hc.allDone)
		hc.allDone = nil
	}
	hc.mu.Unlock()
}

// endAndWait marks the connection ended and waits for running handlers
// (the closed connection unblocks them: their contexts are cancelled,
// which closes their app connections).
func (hc *h2Conn) endAndWait() {
	hc.mu.Lock()
	hc.ended = true
	if hc.active == 0 {
		hc.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	hc.allDone = ch
	hc.mu.Unlock()
	<-ch
}

// ServeHTTP handles one stream.
func (hc *h2Conn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !hc.enter() {
		// The connection has ended: never let x/net answer for us.
		panic(http.ErrAbortHandler)
	}
	defer hc.leave()
	st := &h2Stream{hc: hc, s: hc.s, w: w, r: r, rc: http.NewResponseController(w)}
	st.dog.init(hc.s.cfg.BodyTimeout)
	defer st.dog.stop()
	if st.serve() {
		// The response was started and cannot be completed, or the
		// stream is gone: reset it, so that a client never takes a
		// truncated body for a complete one (returning without a word
		// would make x/net answer an empty 200).
		panic(http.ErrAbortHandler)
	}
}

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
	if r.Method == "CONNECT" || r.Method == "TRACE" {
		// Extended CONNECT (RFC 8441) is CONNECT too; x/net refuses it
		// anyway unless GODEBUG=http2xconnect=1.
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
	arena := make([]byte, 0, size+len(r.Method)+len(target))
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
	if resp.body != bodyNone && x.bc.in.buffered() == 0 && (resp.body != bodyLength || resp.length != 0) {
		// Nothing of the body is here yet (a stream of events, say): let
		// the client have the head now.
		err = st.flush()
	}
	if err == nil {
		err = x.copyBody(h2BodyWriter{st}, nil, st.flush, false)
	} else {
		s.m.requests.WithLabelValues(statusClass(resp.status)).Inc()
	}
	if err != nil {
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
	defer func() { s.m.bytesToApp.Add(float64(sent)) }()
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

// readAppResponseHead reads the app's response head (ending with
// CRLFCRLF), growing the buffer up to 64 KiB for a large head; the HTTP/1.1
// and HTTP/2 paths share it.
func readAppResponseHead(bc *backendConn) ([]byte, error) {
	const maxResponseHead = 64 << 10
	for {
		p := bc.in.bytes()
		if end := findHeadEnd(p); end >= 0 {
			bc.in.r += end
			return p[:end], nil
		}
		if len(p) > maxResponseHead {
			return nil, errors.New("response head too large")
		}
		err := bc.in.fill()
		if errors.Is(err, errBufferFull) {
			bc.in.compact()
			if err = bc.in.fill(); errors.Is(err, errBufferFull) && bc.in.grow(maxResponseHead+4) {
				err = bc.in.fill()
			}
		}
		if err != nil {
			return nil, err
		}
	}
}

// deny answers a request the listener refuses, on this stream only unless
// d.close (then x/net sends GOAWAY and the connection ends once its
// streams are done).
func (st *h2Stream) deny(d denial) {
	st.s.m.requests.WithLabelValues(statusClass(d.status)).Inc()
	st.s.m.denials.WithLabelValues(strconv.Itoa(d.status)).Inc()
	st.logDenial(d.status, d.reason)
	if st.s.draining.Load() {
		d.close = true
	}
	writeH2Error(st.w, d, st.r.Header.Get("Accept"))
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

// h2Watchdogs bound one blocking read of the request body and one
// blocking write to the client. A watchdog that fires closes the request
// body (the read fails) or resets the stream (the write fails). Each is
// armed only around the blocking call, so an idle stream (server-sent
// events) is never cut.
type h2Watchdogs struct {
	timeout time.Duration
	mu      sync.Mutex
	stopped bool
	readTO  bool // the read watchdog fired
	read    *time.Timer
	write   *time.Timer
	body    io.Closer
	rc      *http.ResponseController
}

func (d *h2Watchdogs) init(timeout time.Duration) { d.timeout = timeout }

func (d *h2Watchdogs) armRead(body io.Closer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.body = body
	if d.read == nil {
		d.read = time.AfterFunc(d.timeout, d.fireRead)
		return
	}
	d.read.Reset(d.timeout)
}

func (d *h2Watchdogs) disarmRead() {
	d.mu.Lock()
	d.read.Stop()
	d.mu.Unlock()
}

func (d *h2Watchdogs) armWrite(rc *http.ResponseController) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rc = rc
	if d.write == nil {
		d.write = time.AfterFunc(d.timeout, d.fireWrite)
		return
	}
	d.write.Reset(d.timeout)
}

func (d *h2Watchdogs) disarmWrite() {
	d.mu.Lock()
	d.write.Stop()
	d.mu.Unlock()
}

func (d *h2Watchdogs) fireRead() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		d.readTO = true
		_ = d.body.Close()
	}
}

func (d *h2Watchdogs) readTimedOut() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.readTO
}

func (d *h2Watchdogs) fireWrite() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		// A deadline in the past resets the stream at once.
		_ = d.rc.SetWriteDeadline(time.Now().Add(-time.Second))
	}
}

// stop disables both for good; it returns after a running one has finished
// (the ResponseWriter must not be used once the handler has returned).
func (d *h2Watchdogs) stop() {
	d.mu.Lock()
	d.stopped = true
	if d.read != nil {
		d.read.Stop()
	}
	if d.write != nil {
		d.write.Stop()
	}
	d.mu.Unlock()
}
