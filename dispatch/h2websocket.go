package dispatch

import (
	"context"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // RFC 6455 defines Sec-WebSocket-Accept with SHA-1; it is no security boundary here.
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	// Turns on x/net/http2's extended CONNECT before its init reads
	// GODEBUG (see the package doc for why the order holds).
	_ "github.com/applistener/applistener/internal/h2xconnect"
)

// WebSockets over HTTP/2 (RFC 8441). The client opens a stream with an
// extended CONNECT (:method CONNECT, :protocol websocket, :path the
// resource); the listener turns it into an HTTP/1.1 upgrade towards the app
// with a Sec-WebSocket-Key of its own, checks the app's 101 (Upgrade and
// Sec-WebSocket-Accept), answers 200 on the stream and then copies the
// WebSocket's bytes between the stream's DATA frames and the app
// connection, through the same splice as HTTP/1.1 upgrades (websocket.go):
// close frames 1008 on revocation, 1001 on shutdown and idle timeout, the
// instance's stream limit, the access log and the metrics. The handler's
// goroutine copies the client's direction (an HTTP/2 stream has no socket
// of its own to park on); the app's direction parks in the idle poller
// like an HTTP/1.1 WebSocket's.
//
// x/net/http2 advertises SETTINGS_ENABLE_CONNECT_PROTOCOL for the whole
// process once extended CONNECT is on (internal/h2xconnect). With
// Config.DisableHTTP2WebSockets the listener rewrites that setting to 0 in
// each connection's first SETTINGS frame (h2NetConn.Write) and refuses
// extended CONNECT streams with 405, so clients keep using HTTP/1.1 for
// WebSockets.

// wsAcceptGUID is RFC 6455's key suffix for Sec-WebSocket-Accept.
const wsAcceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// wsAccept returns the Sec-WebSocket-Accept value for key.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsAcceptGUID)) //nolint:gosec // see the import
	return base64.StdEncoding.EncodeToString(h[:])
}

// isExtendedConnect reports whether r opens an extended CONNECT stream
// (x/net passes :protocol as a header field).
func isExtendedConnect(r *http.Request) bool {
	return r.Method == http.MethodConnect && len(r.Header[":protocol"]) > 0
}

// reasonNoH2WebSocket is the 405 reason for an extended CONNECT that the
// listener does not accept.
const reasonNoH2WebSocket = "extended CONNECT is only accepted for WebSockets, and only when HTTP/2 WebSockets are on"

// serveWebSocket handles an extended CONNECT on this stream; it reports
// whether the stream must be reset. The caller has checked the route and
// the :authority.
func (st *h2Stream) serveWebSocket() bool {
	s, r := st.s, st.r
	if s.cfg.DisableHTTP2WebSockets || !strings.EqualFold(r.Header.Get(":protocol"), "websocket") {
		st.deny(denial{status: 405, reason: reasonNoH2WebSocket})
		return false
	}
	req, key, pe := st.buildWebSocketRequest()
	if pe != nil {
		st.deny(denyParse(pe))
		return false
	}
	inst := st.hc.route.Instance
	if !inst.Acquire() {
		st.deny(denyLimit)
		return false
	}
	defer inst.Release()
	inst.CountRequest()
	s.m.streamsActive.Inc()
	defer s.m.streamsActive.Dec()
	return st.proxyWebSocket(req, key)
}

// buildWebSocketRequest converts the extended CONNECT into the HTTP/1.1
// upgrade sent to the app: GET of :path, with a Sec-WebSocket-Key made
// here (RFC 8441 §5: the HTTP/2 request carries none) and the client's
// Sec-WebSocket-Version (13 when absent), -Protocol and -Extensions.
func (st *h2Stream) buildWebSocketRequest() (*request, string, *parseError) {
	r := st.r
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	h := r.Header
	delete(h, ":protocol")
	delete(h, "Sec-Websocket-Accept")
	h["Sec-Websocket-Key"] = []string{key}
	if len(h["Sec-Websocket-Version"]) == 0 {
		h["Sec-Websocket-Version"] = []string{"13"}
	}
	method := r.Method
	r.Method = http.MethodGet
	req, pe := st.buildRequest()
	r.Method = method
	if pe != nil {
		return nil, "", pe
	}
	// The stream's DATA frames are the WebSocket, not a request body.
	req.body, req.length, req.zeroLength = bodyNone, 0, false
	req.upgrade = true
	return req, key, nil
}

// proxyWebSocket sends the upgrade to the app and, once the app has
// switched protocols, splices the stream and the app connection until
// either side ends or the route is revoked; it reports whether the stream
// must be reset.
func (st *h2Stream) proxyWebSocket(req *request, key string) bool {
	s, r, hc := st.s, st.r, st.hc
	x := &st.x
	x.reset(s, hc.route, hc.sni, req, st)
	fi := s.forwardInfo(x.pool, hc.sni, hc.peer, hc.trusted)
	head := appendRequestHead(make([]byte, 0, 1024), req, &fi)
	s.countDropped(&fi, hc.route)
	if err := x.connect(r.Context(), head, true); err != nil {
		st.rec.timings(x)
		return st.exchangeFailed(x, err)
	}
	// 1xx answers before the 101 are dropped.
	err := x.readHead(func(*response) error { return nil })
	st.rec.timings(x)
	if err != nil {
		x.abort()
		if st.gone() {
			return true
		}
		return st.exchangeFailed(x, err)
	}
	resp := &x.resp
	switch {
	case resp.status != 101 && resp.status >= 300:
		// The app refused the WebSocket (403, 404, 426...): its answer
		// goes to the client as it is.
		return st.relayRefusal(x)
	case resp.status != 101:
		// A 2xx on an extended CONNECT tells the client that the
		// WebSocket is open: an app that did not switch must not say it.
		err = errors.New("the app did not switch protocols")
	case !resp.upgradeWS:
		err = errors.New("101 without Upgrade: websocket")
	case headerValue(resp, "sec-websocket-accept") != wsAccept(key):
		err = errors.New("101 with a wrong Sec-WebSocket-Accept")
	}
	if err != nil {
		x.abort()
		return st.exchangeFailed(x, &badResponseError{err})
	}
	bc := x.bc
	if !st.detach(bc) {
		// The stream ended while the app was answering.
		bc.close()
		return true
	}
	h := st.w.Header()
	st.copyResponseFields(h, resp, false)
	delete(h, "Sec-Websocket-Accept")
	st.w.WriteHeader(http.StatusOK)
	// From here the instance's usage counts the WebSocket as open.
	st.rec.upgraded(http.StatusOK, hc.route.Instance)
	st.rec.overH2 = true
	if err := st.flush(); err != nil {
		st.rec.outcome = outcomeAborted
		bc.close()
		return true
	}
	return st.spliceWebSocket(bc)
}

// headerValue returns the value of the first field name (lower case) in
// resp, or "".
func headerValue(resp *response, name string) string {
	for i := range resp.fields {
		if asciiEqualFold(resp.fields[i].name, name) {
			return string(resp.fields[i].value)
		}
	}
	return ""
}

// relayRefusal relays the app's final non-101 answer to the upgrade; it
// reports whether the stream must be reset.
func (st *h2Stream) relayRefusal(x *exchange) bool {
	resp := &x.resp
	h := st.w.Header()
	if !st.copyResponseFields(h, resp, false) {
		h["Content-Type"] = nil
	}
	if resp.body == bodyLength {
		h["Content-Length"] = []string{strconv.FormatInt(resp.length, 10)}
	}
	st.w.WriteHeader(resp.status)
	st.rec.status, st.rec.outcome = resp.status, outcomeOK
	if err := x.copyBody(h2BodyWriter{st}, nil, st.flush, false); err != nil {
		st.rec.outcome = outcomeAborted
		x.abort()
		return true
	}
	st.rec.bytesOut = x.bytesOut
	x.finish(st.hc.revokedErr() == nil)
	return false
}

// h2WebSocket is a WebSocket running on one stream of an h2Conn.
type h2WebSocket struct {
	sp   *wsSplice
	done chan struct{} // closed when both directions have ended
	// flushed is closed once a write to the connection that started
	// after the WebSocket ended has completed: that write carried
	// whatever the WebSocket had left in x/net's buffer (its close
	// frame). Set before done is closed.
	flushed <-chan struct{}
}

// spliceWebSocket copies the WebSocket both ways until it ends; it
// reports whether the stream must be reset.
func (st *h2Stream) spliceWebSocket(bc *backendConn) bool {
	s, hc := st.s, st.hc
	cw := &h2WSConn{st: st}
	sp := newWSSplice(cw, cw, bc.conn, s.cfg.WebSocketCloseGrace)
	_ = bc.conn.SetDeadline(time.Time{})
	// Bytes the app sent right behind its 101 belong to the stream.
	appPending := append([]byte(nil), bc.in.bytes()...)
	bc.in.r = bc.in.w
	bc.in.release()
	// The client's direction reads the stream in this goroutine and never
	// parks (no socket of its own); the app's parks while idle.
	up := &wsPump{w: sp, src: pumpSource{r: cw}, d: &sp.toApp, pool: &s.bufPool}
	down := &wsPump{w: sp, src: pumpSource{r: bc.conn, conn: bc.conn, raw: bc.conn}, d: &sp.toClient,
		pending: appPending, pool: &s.bufPool, poller: &s.idle}
	sp.pumps = [2]*wsPump{up, down}
	sp.running.Store(2)
	ws := &h2WebSocket{sp: sp, done: make(chan struct{})}
	sp.onDone = func() {
		ws.flushed = hc.nc.afterNextWrite()
		close(ws.done)
	}
	s.m.websocketsActive.Inc()
	// The stream's end (client reset, connection lost) ends the splice.
	stop := context.AfterFunc(st.r.Context(), sp.closeBoth)
	if cause := hc.addWebSocket(ws); cause != nil {
		sp.revoke(cause)
	}
	if d := hc.route.Instance.IdleTimeout(); d > 0 {
		sp.startIdleTimer(d)
	}
	go down.run()
	up.run()
	<-ws.done
	stop()
	hc.removeWebSocket(ws)
	s.m.websocketsActive.Dec()
	s.m.bytesToApp.Add(float64(up.total))
	s.m.bytesToClient.Add(float64(down.total))
	s.m.request(http.StatusOK)
	st.bodyIn.Store(up.total)
	st.rec.bytesOut = down.total
	return false
}

// h2WSConn is the client's side of an HTTP/2 WebSocket as the splice sees
// it: reads come from the stream's DATA frames, each write is sent as DATA
// at once (bounded by Config.BodyTimeout, or by the write deadline when
// one is set), and Close ends both (a write in progress resets the
// stream). Only the splice uses it, while the stream's handler runs.
type h2WSConn struct {
	st       *h2Stream
	deadline atomic.Int64 // unix nanos bounding writes; 0: none
	writing  atomic.Bool
	closed   atomic.Bool
}

func (c *h2WSConn) Read(p []byte) (int, error) { return c.st.r.Body.Read(p) }

func (c *h2WSConn) Write(p []byte) (int, error) {
	// writing is set before closed is checked, and Close sets closed
	// before it checks writing: a write racing Close either sees closed
	// or is aborted by it.
	c.writing.Store(true)
	defer c.writing.Store(false)
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	st := c.st
	d := st.s.cfg.BodyTimeout
	if dl := c.deadline.Load(); dl != 0 {
		d = min(d, time.Until(time.Unix(0, dl)))
	}
	st.dog.armWriteFor(st.rc, max(d, time.Nanosecond))
	n, err := st.w.Write(p)
	if err == nil {
		err = st.rc.Flush()
	}
	st.dog.disarmWrite()
	return n, err
}

// Close ends the client's side: a read in progress returns, a write in
// progress is aborted by resetting the stream.
func (c *h2WSConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	_ = c.st.r.Body.Close()
	if c.writing.Load() {
		_ = c.st.rc.SetWriteDeadline(time.Now().Add(-time.Second))
	}
	return nil
}

func (c *h2WSConn) LocalAddr() net.Addr  { return c.st.hc.raw.LocalAddr() }
func (c *h2WSConn) RemoteAddr() net.Addr { return c.st.hc.raw.RemoteAddr() }

// SetDeadline and SetReadDeadline are not supported: x/net's read deadline
// would end the stream's body for good.
func (c *h2WSConn) SetDeadline(time.Time) error     { return nil }
func (c *h2WSConn) SetReadDeadline(time.Time) error { return nil }

func (c *h2WSConn) SetWriteDeadline(t time.Time) error {
	var v int64
	if !t.IsZero() {
		v = t.UnixNano()
	}
	c.deadline.Store(v)
	return nil
}

// armWriteFor arms the write watchdog for d instead of the body timeout.
func (d *h2Watchdogs) armWriteFor(rc *http.ResponseController, timeout time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rc = rc
	if d.write == nil {
		d.write = time.AfterFunc(timeout, d.fireWrite)
		return
	}
	d.write.Reset(timeout)
}

// addWebSocket registers ws for revocation; it returns the revocation
// cause when the connection is already revoked.
func (hc *h2Conn) addWebSocket(ws *h2WebSocket) error {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.revoked != nil {
		return hc.revoked
	}
	if hc.websockets == nil {
		hc.websockets = make(map[*h2WebSocket]struct{})
	}
	hc.websockets[ws] = struct{}{}
	return nil
}

func (hc *h2Conn) removeWebSocket(ws *h2WebSocket) {
	hc.mu.Lock()
	delete(hc.websockets, ws)
	hc.mu.Unlock()
}

// h2FlushWait bounds the wait for a revoked connection's WebSockets to
// end and their close frames to reach the socket, beyond the close grace.
const h2FlushWait = 250 * time.Millisecond

// closeRevoked closes a revoked connection. Its WebSockets are sent close
// frames first (1008, or 1001 on shutdown) and the connection is closed
// once those are written, or after the close grace and h2FlushWait; without
// WebSockets it is closed at once.
func (hc *h2Conn) closeRevoked(cause error) {
	hc.mu.Lock()
	wss := make([]*h2WebSocket, 0, len(hc.websockets))
	for ws := range hc.websockets {
		wss = append(wss, ws)
	}
	hc.mu.Unlock()
	if len(wss) == 0 {
		_ = hc.raw.Close()
		return
	}
	for _, ws := range wss {
		ws.sp.revoke(cause)
	}
	go func() {
		t := time.NewTimer(hc.s.cfg.WebSocketCloseGrace + h2FlushWait)
		defer t.Stop()
		defer func() { _ = hc.raw.Close() }()
		for _, ws := range wss {
			select {
			case <-ws.done:
			case <-t.C:
				return
			}
			select {
			case <-ws.flushed:
			case <-t.C:
				return
			}
		}
	}()
}

// afterNextWrite returns a channel closed when a write to the connection
// that starts after this call has returned.
func (c *h2NetConn) afterNextWrite() <-chan struct{} {
	for {
		if ch := c.nextWrite.Load(); ch != nil {
			return *ch
		}
		ch := make(chan struct{})
		if c.nextWrite.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// Write writes x/net's frames. With hideXConnect the first frame (the
// server's SETTINGS) has SETTINGS_ENABLE_CONNECT_PROTOCOL rewritten to 0.
func (c *h2NetConn) Write(p []byte) (int, error) {
	waiting := c.nextWrite.Swap(nil)
	if c.hideXConnect && !c.settings.done {
		p = c.settings.rewrite(p)
	}
	n, err := c.Conn.Write(p)
	if waiting != nil {
		close(*waiting)
	}
	return n, err
}

// settingsRewriter follows the first frame a server writes, its SETTINGS
// frame, and sets the value of every SETTINGS_ENABLE_CONNECT_PROTOCOL
// entry to 0 (RFC 8441 §3: 0 says extended CONNECT is not supported). It
// copies what it changes and may see the frame across several writes.
type settingsRewriter struct {
	off  int // bytes of the frame seen
	size int // the frame's payload length, once its header is seen
	hdr  [9]byte
	id   uint16 // the current setting's identifier
	done bool
}

func (w *settingsRewriter) rewrite(p []byte) []byte {
	var out []byte
	for i := 0; i < len(p) && !w.done; i++ {
		b := p[i]
		if w.off < len(w.hdr) {
			w.hdr[w.off] = b
			w.off++
			if w.off == len(w.hdr) {
				w.size = int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
				// Only a SETTINGS frame (type 4) is rewritten.
				w.done = w.hdr[3] != 0x4 || w.size == 0
			}
			continue
		}
		pos := (w.off - len(w.hdr)) % 6
		switch pos {
		case 0:
			w.id = uint16(b) << 8
		case 1:
			w.id |= uint16(b)
		default:
			if w.id == 0x8 && b != 0 {
				if out == nil {
					out = append([]byte(nil), p...)
				}
				out[i] = 0
			}
		}
		w.off++
		if w.off == len(w.hdr)+w.size {
			w.done = true
		}
	}
	if out != nil {
		return out
	}
	return p
}
