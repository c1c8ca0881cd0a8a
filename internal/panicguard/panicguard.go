// Package panicguard contains a panic in a goroutine that serves one
// connection or stream: the goroutine recovers at its entry point, closes
// only what it owns, and calls Report, which logs the stack once with the
// connection's identity and counts applistener_panics_total{where}. A
// panic is never swallowed silently, and it never ends the process.
//
// Each entry point also calls Point, a test-only hook (SetTestHook) that
// lets tests inject a panic there; without a hook Point does nothing.
//
// A control-plane loop (a supervisor's session, a discovery watch) runs
// each attempt through Call: a panic there ends that attempt only, as a
// failure the loop retries after its backoff.
//
// The goroutines of net/http's servers (admin, gateway) are not guarded
// here: net/http recovers a handler's panic per request itself. The h2c
// pool's connections (the listener's own HTTP/2 client) are: the frame
// loop (H2CConn, through h2client's Config.OnPanic), the connection's
// reads (H2CRead) and writes (H2CConn), and the request body that a
// stream's sender reads (RequestBody).
package panicguard

import (
	"errors"
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
	H2CRead      = "h2c_read"      // the reads of an h2c app connection (the connection under the read loop; a connector's may be ours)
	H2CConn      = "h2c_conn"      // an h2c app connection of the listener's own HTTP/2 client: its frame loop, and its writes
	RequestBody  = "request_body"  // the copy of one request's body to the app (HTTP/1.1 and HTTP/2)

	// Control-plane loops: a panic ends the one attempt (a session, a
	// watch, a request), which the loop retries after its backoff.
	SupervisorSession   = "supervisor_session"   // the supervisor's push session and polls
	SupervisorAdvertise = "supervisor_advertise" // the supervisor's advertisement of its installations
	DiscoveryWatch      = "discovery_watch"      // a discovery watch stream (the edge's, routes watch's)
	EdgeWatch           = "edge_watch"           // the edge's watch of one workspace
	EdgeExpiry          = "edge_expiry"          // the edge's loop that drops expired routes
)

// Where lists every entry point, for tests and documentation.
var Where = []string{ListenerConn, HTTP1Conn, H2Conn, H2Flusher, H2Stream, WebSocket, EdgeConn, EdgePipe, H2CRead, H2CConn, RequestBody,
	SupervisorSession, SupervisorAdvertise, DiscoveryWatch, EdgeWatch, EdgeExpiry}

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
	report(log, "panic recovered; closed only this connection or stream", where, r, attrs)
}

// report is Report with the log message.
func report(log *slog.Logger, msg, where string, r any, attrs []any) {
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
	log.Error(msg, args...)
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

// ErrPanic is what Call returns, wrapped, after a recovered panic.
var ErrPanic = errors.New("panic recovered")

// PanicError is a panic that Call recovered: where it happened and what
// was thrown. It matches ErrPanic (errors.Is).
type PanicError struct {
	Where string
	Value any
}

func (e *PanicError) Error() string { return fmt.Sprintf("%s: %s: %v", e.Where, ErrPanic, e.Value) }

// Is makes a *PanicError match ErrPanic.
func (e *PanicError) Is(target error) bool { return target == ErrPanic }

// Call runs f, one attempt of a loop that retries (a control-plane
// session or watch), behind the entry point where: Point(where, id)
// first, then f. A panic in f is reported (Report, with attrs) and
// returned as a *PanicError, which the loop treats as a failed attempt
// (its backoff applies, so a panic that repeats cannot spin). What f
// holds must be released by its own deferred calls, which run as the
// panic unwinds.
func Call(log *slog.Logger, where, id string, f func() error, attrs ...any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			report(log, "panic recovered; this attempt failed and is retried", where, r, attrs)
			err = &PanicError{Where: where, Value: r}
		}
	}()
	Point(where, id)
	return f()
}
