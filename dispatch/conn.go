package dispatch

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
)

// clientConn is one client connection bound to one route.
type clientConn struct {
	s       *Server
	conn    net.Conn // TLS
	raw     net.Conn
	batch   listener.WriteBatcher // nil: large writes are not batched
	sni     string
	route   *routes.Route
	peer    netip.Addr
	trusted bool
	in      inbuf
	bw      *bufio.Writer
	req     request
	x       exchange // the request in flight, reused from one to the next
	out     []byte   // scratch for heads
	pending []byte   // client bytes read by the watch in awaitResponse
	// detached holds what is still needed of a request head once its body
	// is being streamed (the body copy overwrites the head's buffer).
	detached *detachedHead
	body     deadlineReader
	one      [1]byte
	// release undoes admit; after an upgrade (handedOff) the WebSocket
	// calls it when it ends, not ServeConn.
	release   func()
	handedOff bool
	// slot is the instance whose max_streams slot the request in flight
	// holds, fair its fair admission (fair.go); a panic's abort releases
	// them (h1panic.go).
	slot *routes.Instance
	fair fairshare.Ticket
	// fairPaused: pauseFair gave fair back for the wait for the app;
	// resumeFair takes one again.
	fairPaused bool
	// rec is the request being handled, for the access log and the
	// latency histograms (accesslog.go); ci what the connection adds.
	rec    accessRecord
	ci     connInfo
	bodyIn atomic.Int64 // request body bytes sent to the app (the body copy's result)
	// Private services (access_conn.go): the request's decision, what its
	// forwarding removes and adds, the last token converted to a string,
	// and the key ids that authenticated the connection's requests.
	acc       accessDecision
	accFwd    accessForward
	lastToken string
	keys      authKeys

	mu      sync.Mutex
	idle    bool
	closing bool // closeIfIdle closed it: it must not park (idlepark.go)
	revoked error
	backend *backendConn
	ws      *wsSplice
	// While parked (idlepark.go): the poller registration, the timer of
	// the idle timeout and when it expires.
	parkID       uint64
	parkTimer    *time.Timer
	parkDeadline time.Time
	// pause is where body relays wait out the instance's byte rate
	// (ratelimit.go); Revoke ends it.
	pause throttlePause
}

// Revoke closes the connection because its route was revoked (or the
// server is shutting down). A WebSocket gets close frames first.
func (c *clientConn) Revoke(cause error) {
	c.mu.Lock()
	if c.revoked != nil {
		c.mu.Unlock()
		return
	}
	c.revoked = cause
	ws, be := c.ws, c.backend
	parked := c.unparkLocked()
	c.mu.Unlock()
	c.pause.cancel()
	if ws != nil {
		ws.revoke(cause)
		return
	}
	if c.ownParked(parked) {
		return
	}
	_ = c.raw.Close()
	if be != nil {
		_ = be.conn.Close()
	}
}

func (c *clientConn) closeIfIdle() {
	c.mu.Lock()
	idle := c.idle
	var parked uint64
	if idle {
		c.closing = true
		parked = c.unparkLocked()
	}
	c.mu.Unlock()
	if c.ownParked(parked) {
		return
	}
	if idle {
		_ = c.raw.Close()
	}
}

func (c *clientConn) setIdle(v bool) {
	c.mu.Lock()
	c.idle = v
	c.mu.Unlock()
}

func (c *clientConn) revokedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.revoked
}

// serve serves requests until the connection ends, is handed off to a
// WebSocket, or parks while idle (idlepark.go: it then returns without
// touching c again, and resume serves the next request in a new
// goroutine). When it ends, it closes the connection and releases it.
func (c *clientConn) serve() {
	parked := false
	defer func() {
		r := recover()
		if r != nil {
			c.abort() // this connection only: its socket and its app connection
		}
		if !parked && !c.handedOff { // else resume, or the WebSocket, ends the connection
			c.end()
		}
		if r != nil {
			panicguard.Report(c.s.log, panicguard.HTTP1Conn, r, c.identity()...)
		}
	}()
	panicguard.Point(panicguard.HTTP1Conn, c.sni)
	for {
		var head []byte
		var ok bool
		head, ok, parked = c.readHead()
		if !ok {
			return
		}
		if !c.handle(head) {
			return
		}
		if c.s.draining.Load() {
			return
		}
		c.yieldBeforeNextRequest() // keepalive.go
	}
}

// abort closes the client connection and the app connection in use, if
// any, after a panic in the connection's goroutine.
func (c *clientConn) abort() {
	c.mu.Lock()
	be := c.backend
	c.mu.Unlock()
	_ = c.raw.Close()
	if be != nil {
		_ = be.conn.Close()
	}
	c.releaseSlot() // h1panic.go
}

// identity is the connection's identity for a panic's log line.
func (c *clientConn) identity() []any {
	return []any{"sni", c.sni, "peer", c.peer.String(), "route", routeName(c.route)}
}

// routeName names r in a panic's log line: workspace/sandbox/service:port.
func routeName(r *routes.Route) string {
	if r == nil {
		return ""
	}
	return r.Workspace + "/" + r.Sandbox + "/" + r.Service + ":" + strconv.Itoa(r.Port)
}

// end closes the connection and releases it (c.release).
func (c *clientConn) end() {
	c.stopParkTimer()
	if c.revokedErr() == nil {
		// A normal end sends close_notify, so that a client can tell a
		// close-delimited response from a truncated one.
		_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.conn.Close()
	}
	_ = c.raw.Close()
	c.in.r = c.in.w
	c.in.release()
	c.releaseWriter()
	c.release()
}

// readHead waits for the next request and returns its head (ending with
// CRLFCRLF), or false when the connection should end or has parked
// (parked: the caller must return without touching c).
func (c *clientConn) readHead() (head []byte, ok, parked bool) {
	// Nothing of the previous request may answer for this one (a denial
	// before the new head is parsed reads c.req).
	c.req.reset()
	if len(c.pending) > 0 {
		// Bytes the client watch read while a response was pending.
		c.in.acquire()
		c.in.compact()
		n := copy(c.in.buf[c.in.w:], c.pending)
		c.in.w += n
		if n < len(c.pending) {
			c.reject(errHeadTooLarge)
			return nil, false, false
		}
		c.pending = c.pending[:0]
	}
	if c.in.buffered() == 0 {
		// Park without a buffer: read one byte into the connection itself.
		c.in.release()
		c.releaseWriter()
		c.setIdle(true)
		if c.s.draining.Load() {
			return nil, false, false
		}
		idle := c.s.cfg.IdleTimeout
		if d := c.route.Instance.IdleTimeout(); d > 0 {
			idle = d
		}
		n, parked := c.waitIdle(idle)
		if parked {
			return nil, false, true
		}
		c.setIdle(false)
		if n == 0 {
			return nil, false, false
		}
		c.in.acquire()
		c.in.buf[0] = c.one[0]
		c.in.r, c.in.w = 0, 1
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(c.s.cfg.HeaderTimeout))
	max := c.s.cfg.MaxHeaderBytes
	scanned := 0 // bytes of p already checked for bare CR or LF
	for {
		p := c.in.bytes()
		// Ignore empty lines before a request line (RFC 9112 §2.2).
		for len(p) >= 2 && p[0] == '\r' && p[1] == '\n' {
			c.in.r += 2
			p = p[2:]
			scanned = 0
		}
		if end := findHeadEnd(p); end >= 0 {
			if end > max {
				c.reject(errHeadTooLarge)
				return nil, false, false
			}
			c.in.r += end
			return p[:end], true, false
		}
		// A head that ends its lines with a bare LF (or holds a bare CR)
		// never completes: refuse it now rather than at the head timeout.
		if bareLineBreak(p, scanned) {
			c.reject(&parseError{400, "bare CR or LF in the request head"})
			return nil, false, false
		}
		scanned = len(p) - 1
		if scanned < 0 {
			scanned = 0
		}
		if len(p) > max {
			c.reject(errHeadTooLarge)
			return nil, false, false
		}
		err := c.in.fill()
		if errors.Is(err, errBufferFull) {
			c.in.compact()
			err = c.in.fill()
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && c.in.buffered() > 0 {
				c.deny(denyReqTimeout.closing())
			}
			return nil, false, false
		}
	}
}

// reject answers a request that cannot be processed and closes.
func (c *clientConn) reject(pe *parseError) {
	c.deny(denyParse(pe).closing())
}

// deny answers a request with the listener's own answer; it reports
// whether the connection may continue.
func (c *clientConn) deny(d denial) bool {
	// A refusal outside handle (a head too large or too slow) is a
	// request of its own for the access log.
	outside := !c.rec.open
	if outside {
		c.rec.begin(protoH1)
	}
	c.rec.denied(d)
	if c.req.body != bodyNone || c.req.close || c.s.draining.Load() {
		// An unread body leaves the connection unusable; a client that
		// asked to close gets it, and so does every client while the
		// server drains.
		d.close = true
	}
	c.s.m.denied(d.status)
	c.logDenial(d.status, d.reason)
	accept, navigate := c.req.accept, c.req.navigate
	if c.detached != nil {
		accept, navigate = c.detached.accept, c.detached.navigate
	}
	c.out = appendErrorResponse(c.out[:0], d, accept, navigate, c.rec.id.bytes())
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	_, _ = c.conn.Write(c.out)
	if outside {
		c.s.endRequest(&c.rec, &c.ci)
	}
	return !d.close
}

func (c *clientConn) logDenial(status int, reason string) {
	if !c.s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := []slog.Attr{
		slog.Int("class_uid", 4002),
		slog.String("rule", "app-listener"),
		slog.Int("status", status),
		slog.String("reason", reason),
		slog.String("sni", c.sni),
		slog.String("src", c.peer.String()),
		slog.String("request_id", string(c.rec.id.bytes())),
	}
	switch {
	case c.detached != nil:
		attrs = append(attrs, slog.String("method", c.detached.method), slog.String("path", c.detached.path))
	case len(c.req.method) > 0:
		attrs = append(attrs, slog.String("method", string(c.req.method)), slog.String("path", pathOnly(c.req.path)))
	}
	c.s.log.LogAttrs(context.Background(), slog.LevelInfo, "request denied", attrs...)
}

// pathOnly drops the query string: logs never carry it.
func pathOnly(p []byte) string {
	for i, b := range p {
		if b == '?' || b == '#' {
			return string(p[:i])
		}
	}
	return string(p)
}

// handle processes one request and ends its record (an upgraded
// WebSocket's when it ends); it reports whether the connection continues.
func (c *clientConn) handle(head []byte) bool {
	c.rec.begin(protoH1)
	c.bodyIn.Store(0)
	keep := c.handleRequest(head)
	if !c.handedOff {
		c.rec.bytesIn = c.bodyIn.Load()
		c.s.endRequest(&c.rec, &c.ci)
	}
	c.detached = nil
	return keep
}

func (c *clientConn) handleRequest(head []byte) bool {
	if err := parseRequestHead(&c.req, head, c.s.cfg.MaxHeaderFields); err != nil {
		var pe *parseError
		if errors.As(err, &pe) {
			if pe.status == 421 {
				return c.deny(denyMisdirected)
			}
			c.reject(pe)
		}
		return false
	}
	c.rec.parsed = true
	c.rec.mb, c.rec.pb = c.req.method, c.req.path
	c.rec.uab, c.rec.refb = c.req.userAgent, c.req.referer
	if c.trusted && c.req.requestIDs == 1 {
		c.rec.keepRequestID(c.req.requestID)
	}
	if c.revokedErr() != nil || !c.route.Usable() {
		c.deny(denyRevoked)
		return false
	}
	if !routes.HostMatches(c.req.host, c.sni) {
		return c.deny(denyMisdirected)
	}
	if string(c.req.method) == "CONNECT" || string(c.req.method) == "TRACE" {
		return c.deny(denyMethod)
	}
	if c.route.Protocol == routes.ProtocolH2C {
		return c.deny(denyH2COnly) // h2c.go
	}
	c.acc = accessDecision{}
	if ar := c.s.routePool(c.route).access; ar != nil {
		if proceed, keep := c.checkAccess(ar); !proceed {
			return keep
		}
	}
	if proceed, keep := c.allowRate(); !proceed { // ratelimit.go
		return keep
	}
	if c.route.Sleeping() { // sleep.go
		if proceed, keep := c.holdSleeping(); !proceed {
			return keep
		}
	}
	inst := c.route.Instance
	if !inst.Acquire() {
		return c.deny(denyLimit)
	}
	// Fair admission (fair.go): the queue is bounded by max_streams above.
	fair, ok := c.s.admitFair(inst, c.route.Lease.Done())
	if !ok {
		inst.Release()
		return c.deny(denyRevoked)
	}
	c.slot, c.fair, c.fairPaused = inst, fair, false
	c.rec.admitted(inst) // counted, its arrival the last request (accesslog.go)
	c.s.m.streamsActive.Inc()
	keep := c.proxy()
	c.slot = nil
	c.s.cfg.Fair.Release(c.fair) // a WebSocket's chunks are admitted one by one
	c.fair = fairshare.Ticket{}
	c.s.pollParked(inst) // fairpoll.go
	if c.handedOff {
		return false // the WebSocket releases its stream when it ends
	}
	c.s.m.streamsActive.Dec()
	inst.Release()
	return keep
}

func (c *clientConn) setBackend(bc *backendConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backend = bc
	return c.revoked == nil
}

func (c *clientConn) writer() *bufio.Writer {
	if c.bw == nil {
		c.bw = c.s.bwPool.Get().(*bufio.Writer)
		c.bw.Reset(c.conn)
	}
	return c.bw
}

func (c *clientConn) releaseWriter() {
	if c.bw != nil {
		c.bw.Reset(nil)
		c.s.bwPool.Put(c.bw)
		c.bw = nil
	}
}

// bigBody is the response length from which the body is read from the app
// in bigBodyBuf chunks and written to the client with one system call per
// chunk (heldWriter), instead of one per 16 KiB TLS record.
const (
	bigBody    = 64 << 10
	bigBodyBuf = 64 << 10
)

// heldWriter returns the writer of a large response body: through the
// client writer, with the TLS records of each large write collected into
// one system call when the transport allows.
func (c *clientConn) heldWriter() io.Writer {
	if c.batch == nil {
		return clientBodyWriter{c}
	}
	return holdingWriter{c}
}

// clientBodyWriter writes a response body into the client writer. A write
// that goes past the buffer reaches the connection at once, so it gets a
// fresh write deadline first: the deadline of the last flush may have
// passed while a live stream was quiet (BodyTimeout bounds each write's
// progress, never the silence of the app).
type clientBodyWriter struct{ c *clientConn }

func (cw clientBodyWriter) Write(p []byte) (int, error) {
	cw.c.throttleResponse(len(p)) // ratelimit.go
	if len(p) > cw.c.bw.Available() {
		_ = cw.c.conn.SetWriteDeadline(time.Now().Add(cw.c.s.cfg.BodyTimeout))
	}
	return cw.c.bw.Write(p)
}

type holdingWriter struct{ c *clientConn }

func (hw holdingWriter) Write(p []byte) (int, error) {
	if len(p) < 2*maxTLSRecord {
		return clientBodyWriter(hw).Write(p)
	}
	c := hw.c
	c.throttleResponse(len(p)) // ratelimit.go
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	c.batch.HoldWrites()
	n, err := c.bw.Write(p)
	if ferr := c.batch.FlushWrites(); err == nil {
		err = ferr
	}
	return n, err
}

func (c *clientConn) flush() error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	return c.bw.Flush()
}

// proxy forwards the parsed request and relays the response (an
// exchange, exchange.go); it reports whether the client connection
// continues.
func (c *clientConn) proxy() bool {
	req := &c.req
	x := &c.x
	x.reset(c.s, c.route, c.sni, req, c)
	defer c.rec.timings(x)
	fi := c.s.forwardInfo(x.pool, c.sni, c.peer, c.trusted, publicPortOf(req.host), c.rec.id.bytes())
	c.accessForwarding(&fi, x.pool.access)
	c.out = appendRequestHead(c.out[:0], req, &fi)
	c.s.countDropped(&fi, c.route)
	// A small body that has fully arrived goes out with the head.
	inline := req.body == bodyNone
	if req.body == bodyLength && req.length <= int64(c.in.buffered()) && req.length <= 64<<10 {
		c.out = append(c.out, c.in.bytes()[:req.length]...)
		c.in.r += int(req.length)
		inline = true
	}
	if inline {
		c.bodyIn.Store(req.length)
		// The answer is read next: connect waits for it without a read
		// that finds nothing (sock.ReplyWait); awaitResponse takes it from there.
		x.awaitFor = min(c.s.cfg.ResponseHeaderTimeout, watchAfter)
	}
	if err := x.connect(context.Background(), c.out, inline); err != nil {
		if errors.Is(err, errClientGone) {
			return false // it hung up while the app was starting
		}
		return c.exchangeFailed(x, err)
	}
	defer c.setBackend(nil)
	if inline {
		// Wait for the first response bytes here, watching the client
		// meanwhile. A failure now is never retried (retry.go): the app
		// may have read the request.
		if err := c.awaitResponse(x.bc); err != nil {
			x.abort()
			if errors.Is(err, errClientGone) {
				return false
			}
			return c.exchangeFailed(x, &appError{err: err, sent: true})
		}
	} else {
		// Stream the request body alongside reading the response. From
		// here on the body copy reuses the buffer that holds the request
		// head: what is still needed of the head is copied out first.
		c.detached = &detachedHead{
			accept:   append([]byte(nil), req.accept...),
			navigate: req.navigate,
			method:   string(req.method),
			path:     pathOnly(req.path),
		}
		// The head's bytes are about to be overwritten (handle clears
		// detached once the request is logged).
		c.rec.mb, c.rec.pb = nil, nil
		c.rec.ms, c.rec.ps = c.detached.method, c.detached.path
		c.rec.detach() // User-Agent and Referer
		c.body.start(c.conn, c.s.cfg.BodyTimeout)
		c.in.src = &c.body
		x.sendBody(c.copyRequestBody, c.body.abort)
	}

	wroteHead := false // a 1xx went to the client: no other answer is possible
	err := x.readHead(func(resp *response) error {
		// 100 Continue, 103 Early Hints: relayed to HTTP/1.1 clients.
		if req.http10 {
			return nil
		}
		c.out = appendResponseHead(c.out[:0], resp, bodyNone, false, false, nil)
		_, _ = c.writer().Write(c.out)
		if err := c.flush(); err != nil {
			return errClientGone
		}
		wroteHead = true
		return nil
	})
	if err != nil {
		berr := x.stopBody()
		x.abort()
		var pe *parseError
		switch {
		case errors.Is(err, errClientGone), wroteHead:
			return false
		case errors.As(berr, &pe):
			// A malformed request body (bad chunking): the body copy
			// closed the app connection to end the wait here.
			c.reject(pe)
			return false
		case berr != nil && !isAppWriteError(berr):
			// The client went away or stalled mid-body.
			return false
		}
		return c.exchangeFailed(x, err)
	}
	resp := &x.resp
	if resp.status == 101 {
		if !req.upgrade || !resp.upgradeWS {
			x.abort()
			return c.exchangeFailed(x, &badResponseError{errors.New("101 without a WebSocket upgrade")})
		}
		c.acc.echoSubprotocol(resp)
		return c.websocket(x.bc, resp)
	}
	c.acc.addResponseFields(resp)
	// Frame the body towards the client.
	out := resp.body
	closeClient := req.close || c.s.draining.Load()
	if out == bodyChunked && req.http10 {
		out = bodyUntilClose
	}
	if out == bodyUntilClose {
		closeClient = true
	}
	w := c.writer()
	c.out = appendResponseHead(c.out[:0], resp, out, closeClient, x.isHead, c.rec.id.bytes())
	_, _ = w.Write(c.out)
	c.rec.status, c.rec.outcome = resp.status, outcomeOK
	var big io.Writer // large bodies: TLS records batched per write
	if resp.body == bodyLength && resp.length >= bigBody && !x.isHead {
		big = c.heldWriter()
	}
	err = x.copyBody(clientBodyWriter{c}, big, c.flush, out == bodyChunked)
	if err == nil {
		err = c.flush()
	}
	if err != nil {
		c.rec.outcome = outcomeAborted
		x.abort()
		return false
	}
	// The app answered before the request body was complete: the rest of
	// it is never read, so neither connection can be reused.
	bodySent := x.bodySent()
	x.finish(true)
	return bodySent && !closeClient
}

// exchangeFailed answers a failed exchange (exchange.failure): nothing when
// the connection was revoked meanwhile; the connection ends after the
// answer, as the state of a half-sent request cannot be trusted.
func (c *clientConn) exchangeFailed(x *exchange, err error) bool {
	if c.revokedErr() != nil && !errors.Is(err, errClientRevoked) {
		return false
	}
	d := x.failure(err)
	if errors.As(err, new(*appError)) || errors.As(err, new(*badResponseError)) {
		d = d.closing()
	}
	return c.deny(d)
}

// attach and detach make clientConn an exchangeClient: Revoke closes the
// app connection of the request in flight.
func (c *clientConn) attach(bc *backendConn) bool { return c.setBackend(bc) }

func (c *clientConn) detach(*backendConn) bool {
	c.setBackend(nil)
	return true
}

// gone reports whether the connection was revoked or the client hung up
// (sock.PeerHungUp: bytes it sent meanwhile are neither read nor lost).
func (c *clientConn) gone() bool {
	return c.revokedErr() != nil || sock.PeerHungUp(c.raw)
}

// watchAfter is how long a response may take before the client connection
// is watched for a disconnect (so fast requests start no goroutine).
const watchAfter = time.Second

// awaitResponse waits for the app's first response bytes. If they take
// longer than watchAfter, the client connection is watched meanwhile: a
// client that goes away aborts the request (the app connection is closed
// and the instance's stream slot is freed) instead of holding it until the
// response-header timeout.
func (c *clientConn) awaitResponse(bc *backendConn) error {
	// Both deadlines count from the request's write. The first is the
	// read deadline connect set for its wait for the answer
	// (exchange.awaitFor: min(ResponseHeaderTimeout, watchAfter) from just
	// before the write), which still holds.
	sent := c.x.sentAt
	deadline := sent.Add(c.s.cfg.ResponseHeaderTimeout)
	err := bc.in.fill()
	if err == nil || !isTimeout(err) || !time.Now().Before(deadline) {
		return err
	}
	gone := make(chan struct{})
	done := make(chan struct{})
	var got []byte
	_ = c.conn.SetReadDeadline(time.Time{})
	go func() {
		defer close(done)
		var b [512]byte
		n, rerr := c.conn.Read(b[:])
		if n > 0 {
			// A pipelined request: the client is alive; keep its bytes.
			got = append(got, b[:n]...)
			return
		}
		if rerr != nil && !isTimeout(rerr) {
			close(gone)
			_ = bc.conn.Close()
		}
	}()
	_ = bc.conn.SetReadDeadline(deadline)
	err = bc.in.fill()
	_ = c.conn.SetReadDeadline(time.Now())
	<-done
	c.pending = append(c.pending, got...)
	select {
	case <-gone:
		return errClientGone
	default:
	}
	return err
}
