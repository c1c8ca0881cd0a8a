package dispatch

import (
	"time"

	"github.com/applistener/applistener/routes"
)

// websocket relays the 101 response and splices the two connections until
// either side closes or the route is revoked.
func (c *clientConn) websocket(bc *backendConn, resp *response) bool {
	w := c.writer()
	c.out = appendResponseHead(c.out[:0], resp, bodyNone, false, false, c.rec.id.bytes())
	_, _ = w.Write(c.out)
	if err := c.flush(); err != nil {
		bc.close()
		return false
	}
	c.releaseWriter()
	_ = c.conn.SetDeadline(time.Time{})
	_ = bc.conn.SetDeadline(time.Time{})
	// One allocation holds what the WebSocket keeps while it lives (and
	// every GC cycle marks while it is parked): the splice, both
	// directions and the access-log record.
	h := &h1WebSocket{s: c.s, inst: c.route.Instance, release: c.release}
	sp := &h.sp
	sp.init(c.conn, c.raw, bc.conn, c.s.cfg.WebSocketCloseGrace)
	sp.log, sp.who = c.s.log, &c.ci
	if c.s.cfg.Fair != nil {
		sp.fair, sp.flow = c.s.cfg.Fair, &c.route.Instance.Fair
	}
	sp.limit = c.route.Instance // byte rate (ratelimit.go)

	// The record's method, path, user agent and referer become strings
	// before the buffer of the request head goes back to its pool below.
	c.rec.detach()

	// Bytes that arrived with the heads belong to the stream: those read
	// with the request head, then those the client watch read while the
	// 101 was awaited (awaitResponse), in that order.
	clientPending := append(append([]byte(nil), c.in.bytes()...), c.pending...)
	c.pending = c.pending[:0]
	c.in.r = c.in.w
	c.in.release()
	appPending := append([]byte(nil), bc.in.bytes()...)
	bc.in.r = bc.in.w
	bc.in.release()

	// From here the WebSocket owns the connection: this goroutine (with
	// the stack the TLS handshake grew) ends, and the two directions run
	// in goroutines of their own only while bytes flow. The last one to
	// end releases what handle and ServeConn would have released. All of
	// it is set up before the splice is published to Revoke.
	up, down := &h.up, &h.down
	*up = wsPump{w: sp, src: pumpSource{r: c.conn, conn: c.conn, raw: c.raw}, d: &sp.toApp,
		pending: clientPending, pool: &c.s.bufPool, poller: &c.s.idle}
	*down = wsPump{w: sp, src: pumpSource{r: bc.conn, conn: bc.conn, raw: bc.conn}, d: &sp.toClient,
		pending: appPending, pool: &c.s.bufPool, poller: &c.s.idle}
	sp.pumps = [2]*wsPump{up, down}
	sp.running.Store(2)
	// The WebSocket's access-log record: the upgrade request's (detached
	// above).
	h.rec, h.ci = c.rec, c.ci
	rec := &h.rec
	rec.upgraded(101, h.inst)
	sp.act = rec.wsActivity
	rec.timings(&c.x)
	sp.onDone = h.end
	c.s.m.websocketsActive.Inc()

	c.mu.Lock()
	revoked := c.revoked
	c.ws = sp
	c.mu.Unlock()
	c.shed()
	if revoked != nil {
		sp.revoke(revoked)
	}
	if d := c.route.Instance.IdleTimeout(); d > 0 {
		sp.startIdleTimer(d)
	}
	c.handedOff = true
	go down.run()
	go up.run()
	return false
}

// shed drops what c holds for serving requests once its connection is a
// WebSocket: the last request's head, fields and exchange (which reach the
// app connection's struct and the pooled buffers they were parsed from),
// scratch buffers and the access record (onDone has its own copy). The
// clientConn stays registered for revocation and drain as long as the
// WebSocket lives, and every garbage collection scans what it reaches:
// with thousands of idle WebSockets held, that is work for each cycle
// under handshake load. The caller still returns through proxy, which
// reads only its locals afterwards.
func (c *clientConn) shed() {
	c.req = request{}
	c.x = exchange{}
	c.out = nil
	c.pending = nil
	c.detached = nil
	c.rec = accessRecord{}
	c.in = inbuf{}
}

// h1WebSocket is an upgraded HTTP/1.1 connection: the splice, its two
// directions and the upgrade's access-log record in one allocation, and
// what its end releases.
type h1WebSocket struct {
	sp       wsSplice
	up, down wsPump
	rec      accessRecord
	ci       connInfo
	s        *Server
	inst     *routes.Instance
	release  func()
}

// end runs once both directions have ended: it writes the access-log
// record and releases the stream, the instance and the connection.
func (h *h1WebSocket) end() {
	h.rec.bytesIn, h.rec.bytesOut = h.up.total, h.down.total
	h.s.endRequest(&h.rec, &h.ci)
	m := h.s.m
	m.websocketsActive.Dec()
	m.bytesToApp.Add(float64(h.up.total))
	m.bytesToClient.Add(float64(h.down.total))
	m.request(101)
	m.streamsActive.Dec()
	h.inst.Release()
	if h.release != nil {
		h.release()
	}
}
