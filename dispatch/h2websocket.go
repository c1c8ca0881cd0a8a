package dispatch

import (
	"context"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // RFC 6455 defines Sec-WebSocket-Accept with SHA-1; it is no security boundary here.
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/internal/httpgrammar"
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
// The engine advertises SETTINGS_ENABLE_CONNECT_PROTOCOL unless
// Config.DisableHTTP2WebSockets is set; then it does not, and treats a
// request carrying :protocol as malformed (RST_STREAM PROTOCOL_ERROR, RFC
// 8441 §4), so clients keep using HTTP/1.1 for WebSockets. An extended
// CONNECT for another protocol gets 405.

// wsAcceptGUID is RFC 6455's key suffix for Sec-WebSocket-Accept.
const wsAcceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// wsAccept returns the Sec-WebSocket-Accept value for key.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsAcceptGUID)) //nolint:gosec // see the import
	return base64.StdEncoding.EncodeToString(h[:])
}

// reasonNoH2WebSocket is the 405 reason for an extended CONNECT that the
// listener does not accept.
const reasonNoH2WebSocket = "extended CONNECT is only accepted for WebSockets, and only when HTTP/2 WebSockets are on"

// serveWebSocket handles an extended CONNECT on this stream; it reports
// whether the stream must be reset. The caller has checked the route and
// the :authority.
func (st *h2Stream) serveWebSocket() bool {
	s := st.s
	if s.cfg.DisableHTTP2WebSockets || !httpgrammar.EqualFold(st.es.Protocol, "websocket") || st.es.Method != http.MethodConnect {
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
	if !st.admitFair(inst) {
		return false
	}
	defer st.releaseFair()
	st.rec.admitted(inst)
	s.m.streamsActive.Inc()
	defer s.m.streamsActive.Dec()
	return st.proxyWebSocket(req, key)
}

// buildWebSocketRequest converts the extended CONNECT into the HTTP/1.1
// upgrade sent to the app: GET of :path, with a Sec-WebSocket-Key made
// here (RFC 8441 §5: the HTTP/2 request carries none) and the client's
// Sec-WebSocket-Version (13 when absent), -Protocol and -Extensions.
func (st *h2Stream) buildWebSocketRequest() (*request, string, *parseError) {
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req, pe := st.buildRequest(http.MethodGet, key)
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
	s, hc := st.s, st.hc
	x := &st.x
	x.reset(s, hc.route, hc.sni, req, st)
	fi := s.forwardInfo(x.pool, hc.sni, hc.peer, hc.trusted, publicPortOf(st.host), st.rec.id.bytes())
	st.accessForwarding(&fi, x.pool.access)
	st.head = appendRequestHead(st.head[:0], req, &fi)
	s.countDropped(&fi, hc.route)
	if err := x.connect(context.Background(), st.head, true); err != nil {
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
	st.acc.echoSubprotocol(resp)
	fields := st.responseFields(resp, false, -1)
	kept := fields[:0]
	for _, f := range fields {
		if f.Name != "sec-websocket-accept" {
			kept = append(kept, f)
		}
	}
	err = st.es.WriteHeaders(http.StatusOK, kept, false)
	// From here the instance's usage counts the WebSocket as open.
	st.rec.upgraded(http.StatusOK, hc.route.Instance)
	st.rec.overH2 = true
	if err == nil {
		err = st.flush()
	}
	if err != nil {
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
		if httpgrammar.EqualFold(resp.fields[i].name, name) {
			return string(resp.fields[i].value)
		}
	}
	return ""
}

// relayRefusal relays the app's final non-101 answer to the upgrade; it
// reports whether the stream must be reset.
func (st *h2Stream) relayRefusal(x *exchange) bool {
	resp := &x.resp
	// As every other answer of the app (and a refusal on HTTP/1.1): the
	// CORS fields of an allowed origin, a swapped JWT's cookie.
	st.acc.addResponseFields(resp)
	length := int64(-1)
	if resp.body == bodyLength {
		length = resp.length
	}
	noBody := resp.body == bodyNone || (resp.body == bodyLength && resp.length == 0)
	err := st.es.WriteHeaders(resp.status, st.responseFields(resp, false, length), noBody)
	st.ended = noBody && err == nil
	st.rec.status, st.rec.outcome = resp.status, outcomeOK
	if err == nil {
		err = x.copyBody(st.es, nil, st.flushFn, false)
	}
	if err == nil && !st.ended {
		err = st.es.End()
		st.ended = err == nil
	}
	if err != nil {
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
	// whatever the WebSocket had left in the engine's buffer (its close
	// frame). Set before done is closed.
	flushed <-chan struct{}
}

// spliceWebSocket copies the WebSocket both ways until it ends; it
// reports whether the stream must be reset.
func (st *h2Stream) spliceWebSocket(bc *backendConn) bool {
	s, hc := st.s, st.hc
	cw := &h2WSConn{st: st, live: st}
	sp := newWSSplice(cw, cw, bc.conn, s.cfg.WebSocketCloseGrace)
	sp.log, sp.who = s.log, &hc.ci
	if s.cfg.Fair != nil {
		sp.fair, sp.flow = s.cfg.Fair, &hc.route.Instance.Fair
	}
	st.releaseFair()             // from here each chunk is admitted
	sp.limit = hc.route.Instance // byte rate (ratelimit.go)
	sp.act = st.rec.wsActivity
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
	// The stream's end (client reset, connection lost) ends the splice
	// (on a goroutine of its own: the engine's reader must not block).
	st.es.AfterReset(func() { go sp.closeBoth() })
	// An idle WebSocket is no stalled request body.
	st.es.SetReadTimeout(0)
	if cause := hc.addWebSocket(ws); cause != nil {
		sp.revoke(cause)
	}
	if d := hc.route.Instance.IdleTimeout(); d > 0 {
		sp.startIdleTimer(d)
	}
	go down.run()
	up.run()
	<-ws.done
	st.es.StopAfterReset()
	cw.detach()
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
// at once (bounded by the engine's write timeout, and by the write
// deadline when one is set), and Close ends both (reads return, a write
// in progress resets the stream). Only the splice uses it, while the
// stream's handler runs; detach cuts it from the stream before the
// handler returns.
type h2WSConn struct {
	st       *h2Stream
	deadline atomic.Int64 // unix nanos bounding writes; 0: none
	writing  atomic.Bool
	closed   atomic.Bool
	wmu      sync.Mutex // one write at a time; held by detach
	// mu guards live (st, nil once detached) for Close and abortWrite.
	mu   sync.Mutex
	live *h2Stream
}

// detach cuts c from the stream before its handler returns: it waits for
// a write in progress, and later calls fail.
func (c *h2WSConn) detach() {
	c.closed.Store(true)
	c.wmu.Lock()
	c.mu.Lock()
	c.live = nil
	c.mu.Unlock()
	c.wmu.Unlock()
}

func (c *h2WSConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	// Only the handler's goroutine reads: the stream outlives the read.
	return c.st.es.Read(p)
}

func (c *h2WSConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// writing is set before closed is checked, and Close sets closed
	// before it checks writing: a write racing Close either sees closed
	// or is aborted by it.
	c.writing.Store(true)
	defer c.writing.Store(false)
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	es := c.st.es
	if dl := c.deadline.Load(); dl != 0 {
		d := time.Until(time.Unix(0, dl))
		if d <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		t := time.AfterFunc(d, c.abortWrite)
		defer t.Stop()
	}
	n, err := es.Write(p)
	if err == nil {
		err = es.Flush()
	}
	return n, err
}

// abortWrite resets the stream when a write is in progress.
func (c *h2WSConn) abortWrite() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live != nil && c.writing.Load() {
		c.live.resetCancel()
	}
}

// Close ends the client's side: a read in progress returns, a write in
// progress is aborted by resetting the stream.
func (c *h2WSConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live == nil {
		return nil
	}
	c.live.es.CloseRead()
	if c.writing.Load() {
		c.live.resetCancel()
	}
	return nil
}

func (c *h2WSConn) LocalAddr() net.Addr  { return c.st.hc.raw.LocalAddr() }
func (c *h2WSConn) RemoteAddr() net.Addr { return c.st.hc.raw.RemoteAddr() }

// SetDeadline and SetReadDeadline are not supported: the stream's reads
// end with the WebSocket (Close).
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
