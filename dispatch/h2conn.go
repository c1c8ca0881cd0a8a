package dispatch

import (
	"net"
	"net/netip"
	"sync"

	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/routes"
)

// h2Conn is one HTTP/2 client connection bound to one route. It is the
// handler of its streams and the routes.Stream attached to the
// route's lease.
type h2Conn struct {
	s       *Server
	raw     net.Conn
	sni     string
	route   *routes.Route
	peer    netip.Addr
	trusted bool
	ci      connInfo       // for the access log
	nc      *h2NetConn     // what the engine reads and writes
	ec      *h2engine.Conn // the engine serving the connection

	// keys are the key ids that authenticated the connection's requests
	// (access_conn.go).
	keys authKeys

	mu       sync.Mutex
	revoked  error
	backends map[*backendConn]struct{} // in use by a stream
	// websockets are the connection's WebSockets (h2websocket.go).
	websockets map[*h2WebSocket]struct{}
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

// shutdown starts a graceful close of the connection (GOAWAY; its
// streams in flight may finish).
func (hc *h2Conn) shutdown() { hc.ec.Shutdown() }

// panicked reports a panic recovered on one of the connection's
// goroutines with the connection's identity (h2engine.Config.OnPanic).
func (hc *h2Conn) panicked(where string, r any) {
	panicguard.Report(hc.s.log, where, r, "sni", hc.sni, "peer", hc.peer.String(), "route", routeName(hc.route))
}

// ServeStream handles one stream (the engine's Handler).
func (hc *h2Conn) ServeStream(es *h2engine.Stream) {
	var st *h2Stream
	defer func() {
		if r := recover(); r != nil {
			// The engine resets the stream, which is not ended, once this
			// returns; the connection and its other streams go on.
			st.abandon() // h2panic.go
			hc.panicked(panicguard.H2Stream, r)
		}
	}()
	panicguard.Point(panicguard.H2Stream, hc.sni)
	st = h2StreamPool.Get().(*h2Stream)
	st.start(hc, es)
	st.rec.begin(protoH2)
	st.rec.parsed = true
	st.rec.ms, st.rec.ps = es.Method, es.Path
	if !st.serve() {
		st.end()
	}
	// Otherwise the response was started and cannot be completed, or
	// the stream is gone: returning without ending it makes the engine
	// reset it, so that a client never takes a truncated body for a
	// complete one.
	st.rec.bytesIn = st.bodyIn.Load()
	hc.s.endRequest(&st.rec, &hc.ci)
	st.release()
}
