// Package panicguard contains a panic in a goroutine that serves one
// connection or stream: the goroutine recovers at its entry point, closes
// only what it owns, and calls Report, which logs the stack once with the
// connection's identity and counts applistener_panics_total{where}. A
// panic is never swallowed silently, and it never ends the process.
//
// Each entry point also calls Point, a test-only hook (SetTestHook) that
// lets tests inject a panic there; without a hook Point does nothing.
//
// The goroutines of net/http's servers (admin, gateway) are not guarded
// here: net/http recovers a handler's panic per request itself.
package panicguard

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The entry points (the label where of applistener_panics_total).
const (
	ListenerConn = "listener_conn" // the listener's per-connection goroutine (PROXY header, ClientHello, handshake)
	HTTP1Conn    = "http1_conn"    // dispatch's HTTP/1.1 connection loop (also a resumed parked connection)
	H2Conn       = "h2_conn"       // the HTTP/2 engine's connection (frame reading) goroutine
	H2Flusher    = "h2_flusher"    // the HTTP/2 engine's flusher goroutine
	H2Stream     = "h2_stream"     // an HTTP/2 stream's handler goroutine
	WebSocket    = "websocket"     // a WebSocket splice direction (also a resumed parked one)
	EdgeConn     = "edge_conn"     // the edge's per-connection goroutine
	EdgePipe     = "edge_pipe"     // a direction of a connection the edge splices
)

// Where lists every entry point, for tests and documentation.
var Where = []string{ListenerConn, HTTP1Conn, H2Conn, H2Flusher, H2Stream, WebSocket, EdgeConn, EdgePipe}

var panics = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "applistener_panics_total",
	Help: "Panics recovered in a goroutine serving one connection or stream, by entry point; each closed only its own connection or stream.",
}, []string{"where"})

// counts mirrors the counter for Count, by entry point.
var counts = map[string]*atomic.Uint64{}

func init() {
	for _, w := range Where {
		panics.WithLabelValues(w) // every series exists from the start (rate() and alerts see the first one)
		counts[w] = new(atomic.Uint64)
	}
}

// Collector is applistener_panics_total, for a command's registry. It is
// process-wide: register it once per registry.
func Collector() prometheus.Collector { return panics }

// Count returns how many panics were recovered at where so far.
func Count(where string) float64 {
	if c := counts[where]; c != nil {
		return float64(c.Load())
	}
	return 0
}

// Report logs recovered panic value r with the stack of the panicking
// goroutine and attrs (the connection's identity: SNI, peer, route), and
// counts it. It must be called from the deferred function that called
// recover(), so that the stack is still the panicking one; the caller has
// closed, or then closes, only its own connection or stream.
func Report(log *slog.Logger, where string, r any, attrs ...any) {
	if log == nil {
		log = slog.Default()
	}
	panics.WithLabelValues(where).Inc()
	if c := counts[where]; c != nil {
		c.Add(1)
	}
	args := make([]any, 0, len(attrs)+6)
	args = append(args, "where", where, "panic", fmt.Sprint(r))
	args = append(args, attrs...)
	args = append(args, "stack", string(debug.Stack()))
	log.Error("panic recovered; closed only this connection or stream", args...)
}

// hook is the test hook Point calls; nil outside tests.
var hook atomic.Pointer[func(where, id string)]

// SetTestHook makes Point call f (which may panic) at every entry point,
// with the entry point and the identity of the connection (the SNI,
// else the peer's address). It is for tests only; restore puts the
// previous hook back.
func SetTestHook(f func(where, id string)) (restore func()) {
	prev := hook.Swap(&f)
	return func() { hook.Store(prev) }
}

// Point is an entry point's injection point: it calls the test hook, if
// one is set (SetTestHook), else does nothing.
func Point(where, id string) {
	if h := hook.Load(); h != nil {
		(*h)(where, id)
	}
}
