package dispatch

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/wake"
)

// Sleeping instances (issue 27; docs/operations.md, "Sleeping and
// waking"). A request for a route whose instance sleeps is decided after
// the access policy (a request it denies never gets here, so it never
// wakes anything): one that may wake the instance is held by the wake
// coordinator (Config.Wakes) until the instance is active, then goes on
// as any request (the start-grace dial loop waits for the app to listen);
// the others are answered 503 with Retry-After and {"state":"sleeping"}.
// WebSocket handshakes, SSE requests (Accept: text/event-stream) and CORS
// preflights never wake: a reconnect loop must not keep a sandbox awake.
// Nothing is dialled for a sleeping route.

// Answers to a request for a sleeping instance.
const (
	sleepingBody = `{"state":"sleeping"}`
	// sleepingRetryAfter is the Retry-After of a request that does not
	// wake the instance.
	sleepingRetryAfter = 5 * time.Second
	// startingRetryAfter is the Retry-After (and refresh) of a request
	// whose hold ended while the instance wakes.
	startingRetryAfter = 2 * time.Second
)

// startingPage is the page of a navigation whose hold ended while the
// instance wakes; it reloads itself (%d: seconds).
const startingPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="refresh" content="%d">
<title>Starting…</title>
<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;color:#222}</style></head>
<body><h1>Starting…</h1>
<p>This sandbox was asleep and is waking up. This page reloads by itself.</p>
</body></html>
`

// mayWake reports whether a request with these fields may wake its
// sleeping instance under policy p.
func mayWake[T string | []byte](in *accessInput[T], p *routes.WakePolicy) bool {
	intent := in.intent()
	switch {
	case intent == intentPreflight, intent == intentWebSocket, containsFold(in.accept, "text/event-stream"):
		return false
	}
	switch p.Mode() {
	case routes.WakeAny:
		return true
	case routes.WakeNavigation:
		return intent == intentNavigate
	}
	return false
}

// How a request for a sleeping instance fared, as its access-log line
// ("wake") and OCSF record (unmapped.wake) name it; wakeNames.
const (
	wakeNone     uint8 = iota // the instance was not sleeping
	wakeWoken                 // held, then went on to the app
	wakeTimeout               // held for hold_seconds: answered "starting"
	wakeStarting              // released, but its route still sleeps: answered "starting"
	wakeOverflow              // not held: the bound of held requests was reached
	wakeRefused               // the platform cannot wake it, or could not be asked
	wakeNotWoken              // a request that may not wake it (or no coordinator): 503 sleeping
	wakeGone                  // the client or the route went away while held
	wakeShutdown              // the listener shut down while it was held
	wakeTooLarge              // a body too large to hold: 503 at once, the wake started
	numWakeOutcomes
)

var wakeNames = [numWakeOutcomes]string{"", "woken", "timeout", "starting", "overflow", "refused", "not_woken",
	"client_gone", "shutdown", "body_too_large"}

// sleepOutcome is how a request for a sleeping instance ended: held and
// released (go on), or answered with a.
type sleepOutcome struct {
	proceed bool
	answer  accessAnswer
	reason  string // the denial reason of the access log and metrics
	gone    bool   // the client or the route went away: answer nothing
	wake    uint8  // wakeWoken...
	held    time.Duration
}

// noteWake records in rec how the request fared with its sleeping
// instance and how long it was held.
func (rec *accessRecord) noteWake(o *sleepOutcome) {
	rec.wake, rec.wakeHeld = o.wake, o.held
}

// holdSleeping decides a request with fields in for sleeping route r:
// holds it while the instance wakes or answers it. done ends the hold
// with no answer (the client or the route gone); Shutdown ends it with
// 503.
//
// hangup, when not nil, watches the client's connection until its stop
// channel is closed and closes hung when the client hangs up (an
// HTTP/1.1 connection: clientConn.watchHangup); its place is then given
// up at once.
//
// A request whose body is too large to hold (tooLarge,
// bodyTooLargeToHold) is not held: it starts or joins the wake and is
// answered "starting" at once, before anything of its body is read.
func (s *Server) holdSleeping(r *routes.Route, in *accessInput[string], done <-chan struct{}, hangup func(stop <-chan struct{}, hung chan<- struct{}), tooLarge bool) sleepOutcome {
	policy := r.Wake()
	wakes := s.cfg.Wakes
	if wakes == nil || !mayWake(in, policy) {
		o := sleepingOutcome(sleepingRetryAfter, "sleeping")
		o.wake = wakeNotWoken
		return o
	}
	if tooLarge {
		// Hold 0: the wake starts (or is joined), nothing waits for it.
		_, err := wakes.Wait(context.Background(), wake.KeyOf(r), 0, nil)
		switch {
		case errors.Is(err, wake.ErrHoldExpired):
			o := startingOutcome(in.intent() == intentNavigate, startingRetryAfter)
			o.reason, o.wake = "sleeping: body too large to hold", wakeTooLarge
			return o
		case errors.Is(err, wake.ErrCannotWake):
			o := sleepingOutcome(wake.RetryAfter(err), "sleeping: the platform cannot wake it")
			o.wake = wakeRefused
			return o
		}
		o := sleepingOutcome(wake.RetryAfter(err), "sleeping: wake failed")
		o.wake = wakeRefused
		return o
	}
	start := time.Now()
	o := s.holdSleepingFor(r, in, done, hangup, wakes, policy)
	o.held = time.Since(start)
	return o
}

// holdSleepingFor is holdSleeping for a request that may wake r's
// instance.
func (s *Server) holdSleepingFor(r *routes.Route, in *accessInput[string], done <-chan struct{},
	hangup func(stop <-chan struct{}, hung chan<- struct{}), wakes *wake.Coordinator, policy *routes.WakePolicy) sleepOutcome {
	// The hold ends when the client or the route goes (done, or hung
	// from the hang-up watch) or the server shuts down; one goroutine,
	// ended with the hold, merges them.
	ctx, cancel := context.WithCancel(context.Background())
	var merged sync.WaitGroup
	defer merged.Wait()
	defer cancel()
	var hung chan struct{}
	if hangup != nil {
		hung = make(chan struct{})
		merged.Go(func() { hangup(ctx.Done(), hung) })
	}
	merged.Go(func() {
		select {
		case <-hung:
		case <-done:
		case <-s.stopping:
		case <-ctx.Done():
		}
		cancel()
	})
	_, err := wakes.Wait(ctx, wake.KeyOf(r), policy.Hold(), r.Woken())
	stopping := false
	select {
	case <-s.stopping:
		stopping = true
	default:
	}
	var o sleepOutcome
	switch {
	case err != nil && stopping:
		o = sleepingOutcome(sleepingRetryAfter, "sleeping: shutting down")
		o.wake = wakeShutdown
	case err == nil && !r.Sleeping():
		o = sleepOutcome{proceed: true, wake: wakeWoken}
	case err == nil:
		// Released, but this route still sleeps (the instance woke at
		// another generation or left the table): the client asks again.
		o = startingOutcome(in.intent() == intentNavigate, startingRetryAfter)
		o.wake = wakeStarting
	case errors.Is(err, wake.ErrHoldExpired):
		o = startingOutcome(in.intent() == intentNavigate, startingRetryAfter)
		o.wake = wakeTimeout
	case errors.Is(err, wake.ErrOverflow):
		o = sleepingOutcome(wake.RetryAfter(err), "sleeping: too many requests held")
		o.wake = wakeOverflow
	case errors.Is(err, wake.ErrCannotWake):
		o = sleepingOutcome(wake.RetryAfter(err), "sleeping: the platform cannot wake it")
		o.wake = wakeRefused
	case errors.Is(err, context.Canceled) && closed(hung):
		o = sleepOutcome{gone: true, reason: "sleeping: client hung up while held", wake: wakeGone}
	case errors.Is(err, context.Canceled):
		o = sleepOutcome{gone: true, reason: "sleeping: client or route gone while held", wake: wakeGone}
	default:
		o = sleepingOutcome(wake.RetryAfter(err), "sleeping: wake failed")
		o.wake = wakeRefused
	}
	return o
}

// maxHeldBody is the largest declared request body (Content-Length) a
// request may carry and be held while its instance wakes. Held, its body
// waits unread, in the kernel's buffers (HTTP/1.1) or the stream's
// flow-control window (HTTP/2), and a larger upload would stall for up to
// hold_seconds, past many clients' upload timeouts: it is refused at once
// instead, and its retry finds the instance awake or waking.
const maxHeldBody = 64 << 10

// bodyTooLargeToHold reports whether a request body of length (0: none;
// -1: known only at its end, chunked or an HTTP/2 stream without
// content-length) is too large to hold: declared longer than maxHeldBody,
// unless the client waits for 100 Continue before sending it (expect),
// which the app answers once it is there. A body of unknown length is
// held (gRPC calls, streamed uploads): what of it arrives unread is
// bounded by the socket's receive buffer (HTTP/1.1) or the stream's
// flow-control window (HTTP/2), and the client stalls beyond.
func bodyTooLargeToHold(length int64, expect bool) bool {
	return !expect && length > maxHeldBody
}

// closed reports whether ch is closed (false for nil).
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// hangupPoll is how often a held HTTP/1.1 request whose client has sent
// bytes nobody reads yet (a body, a pipelined request, a TLS alert) is
// checked for a hang-up. A client that sent nothing more is noticed at
// once: its socket turns readable at the hang-up.
const hangupPoll = 100 * time.Millisecond

// watchHangup closes hung when the client of c hangs up (FIN or reset,
// sock.PeerHungUp) before stop is closed; it reads nothing. It waits for
// the socket to turn readable (sock.WaitReadable), and polls once bytes
// are waiting. The caller has cleared the read deadline; stop sets it to
// now to end the wait, and the caller clears it again.
func (c *clientConn) watchHangup(stop <-chan struct{}, hung chan<- struct{}) {
	raw := c.raw
	ended := make(chan struct{})
	var stopper sync.WaitGroup
	defer stopper.Wait() // no deadline is set after the watch returns
	defer close(ended)
	stopper.Go(func() { // ends the wait for readable at stop
		select {
		case <-stop:
			_ = raw.SetReadDeadline(time.Now())
		case <-ended:
		}
	})
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		if tick == nil {
			err := sock.WaitReadable(raw)
			if closed(stop) {
				return
			}
			if err != nil && !isTimeout(err) {
				close(hung) // the connection failed
				return
			}
		}
		if sock.PeerHungUp(raw) {
			close(hung)
			return
		}
		if tick == nil {
			// Readable without a hang-up: bytes wait to be read (or no
			// socket to wait on). From here, poll.
			tick = time.NewTicker(hangupPoll)
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// sleepingOutcome is 503 {"state":"sleeping"} with Retry-After.
func sleepingOutcome(retry time.Duration, reason string) sleepOutcome {
	a := accessAnswer{status: http.StatusServiceUnavailable, body: sleepingBody}
	a.fields = append(a.fields, [2]string{"content-type", "application/json"}, [2]string{"retry-after", seconds(retry)},
		[2]string{"cache-control", "no-store"})
	return sleepOutcome{answer: a, reason: reason}
}

// startingOutcome is the answer of a request whose hold ended while the
// instance wakes: a page that reloads itself for a navigation, 503
// {"state":"starting","retry_after":N} otherwise.
func startingOutcome(navigate bool, retry time.Duration) sleepOutcome {
	n := seconds(retry)
	a := accessAnswer{status: http.StatusServiceUnavailable}
	if navigate {
		a.body = sprintfPage(startingPage, n)
		a.fields = append(a.fields, [2]string{"content-type", "text/html; charset=utf-8"})
	} else {
		a.body = `{"state":"starting","retry_after":` + n + `}`
		a.fields = append(a.fields, [2]string{"content-type", "application/json"})
	}
	a.fields = append(a.fields, [2]string{"retry-after", n}, [2]string{"cache-control", "no-store"})
	return sleepOutcome{answer: a, reason: "starting"}
}

// seconds is d rounded up to whole seconds, at least 1, as a decimal.
func seconds(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// sprintfPage puts n (digits) where the page has %d.
func sprintfPage(page, n string) string {
	for i := 0; i+1 < len(page); i++ {
		if page[i] == '%' && page[i+1] == 'd' {
			return page[:i] + n + page[i+2:]
		}
	}
	return page
}

// noteSleep records an answered request for a sleeping instance.
func (s *Server) noteSleep(rec *accessRecord, o *sleepOutcome) {
	rec.denied(denial{status: o.answer.status, reason: o.reason})
	s.m.denied(o.answer.status)
}

// sleepFieldsH1 collects what mayWake reads of an HTTP/1.1 request.
func sleepFieldsH1(req *request) accessInput[string] {
	var in accessInput[string]
	in.method, in.path, in.websocket = string(req.method), "", req.upgrade
	for i := range req.fields {
		f := &req.fields[i]
		in.field(string(f.name), string(f.value), false)
	}
	return in
}

// holdSleeping handles a request for the connection's sleeping route; it
// reports whether the request goes on to the app and, when not (the
// answer was written), whether the connection continues.
func (c *clientConn) holdSleeping() (proceed, keep bool) {
	req := &c.req
	in := sleepFieldsH1(req)
	var hangup func(<-chan struct{}, chan<- struct{})
	if c.raw != nil {
		// The head's read deadline would end the watch's wait.
		_ = c.raw.SetReadDeadline(time.Time{})
		hangup = c.watchHangup
	}
	length := int64(0)
	switch req.body {
	case bodyLength:
		length = req.length
	case bodyChunked:
		length = -1
	}
	o := c.s.holdSleeping(c.route, &in, c.route.Lease.Done(), hangup, bodyTooLargeToHold(length, req.expect))
	if c.raw != nil {
		_ = c.raw.SetReadDeadline(time.Time{}) // the watch's stop set it
	}
	c.rec.noteWake(&o)
	if o.proceed {
		return true, true
	}
	if o.gone {
		c.rec.denied(denial{status: 499, reason: o.reason})
		return false, false
	}
	c.s.noteSleep(&c.rec, &o)
	closeConn := req.body != bodyNone || req.close || c.s.draining.Load()
	c.out = appendAccessAnswer(c.out[:0], &o.answer, string(req.method) == "HEAD", closeConn, c.rec.id.bytes())
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	if _, err := c.conn.Write(c.out); err != nil {
		return false, false
	}
	return false, !closeConn
}

// holdSleeping is clientConn.holdSleeping for an HTTP/2 stream; it
// reports whether the request goes on (else it was answered).
func (st *h2Stream) holdSleeping() bool {
	es := st.es
	var in accessInput[string]
	in.method, in.path, in.websocket = es.Method, "", es.Protocol != ""
	expect := false
	for i := range es.Header {
		f := &es.Header[i]
		in.field(f.Name, f.Value, false)
		if f.Name == "expect" && httpgrammar.EqualFold(f.Value, "100-continue") {
			expect = true
		}
	}
	tooLarge := es.Protocol == "" && bodyTooLargeToHold(es.ContentLength, expect)
	o := st.s.holdSleeping(st.hc.route, &in, es.Done(), nil, tooLarge)
	st.rec.noteWake(&o)
	if o.proceed {
		return true
	}
	if o.gone {
		st.rec.denied(denial{status: 499, reason: o.reason})
		return false
	}
	st.s.noteSleep(&st.rec, &o)
	st.ended = writeH2AccessAnswer(es, &o.answer, es.Method == "HEAD", st.rec.id.bytes()) == nil
	return false
}
