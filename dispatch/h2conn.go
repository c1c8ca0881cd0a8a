package dispatch

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/applistener/applistener/routes"
)

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
	ci      connInfo   // for the access log
	nc      *h2NetConn // what x/net writes to

	mu       sync.Mutex
	revoked  error
	backends map[*backendConn]struct{} // in use by a stream
	// websockets are the connection's WebSockets (h2websocket.go).
	websockets map[*h2WebSocket]struct{}
	active     int  // stream handlers running
	ended      bool // x/net stopped serving
	allDone    chan struct{}
}

// Revoke closes the connection (all of its streams end) and every app
// connection its streams are using; WebSockets get close frames first.
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
	for _, bc := range bcs {
		_ = bc.conn.Close()
	}
	hc.closeRevoked(cause)
}

// headTimedOut records a connection closed because a request head (or the
// first one) did not arrive within the head timeout.
func (hc *h2Conn) headTimedOut() {
	s := hc.s
	s.m.denied(408)
	s.ocsfConnDenied(&hc.ci, denyReqTimeout, protoH2)
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
	st.rec.begin(protoH2)
	st.rec.parsed = true
	st.rec.ms, st.rec.ps = r.Method, r.RequestURI
	reset := st.serve()
	st.rec.bytesIn = st.bodyIn.Load()
	hc.s.endRequest(&st.rec, &hc.ci)
	if reset {
		// The response was started and cannot be completed, or the
		// stream is gone: reset it, so that a client never takes a
		// truncated body for a complete one (returning without a word
		// would make x/net answer an empty 200).
		panic(http.ErrAbortHandler)
	}
}
