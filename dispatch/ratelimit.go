package dispatch

import (
	"net/http"
	"sync"
	"time"
)

// Per-instance rate limits (routes.Instance.AllowRequest, ThrottleBytes):
// a request over limits.requests_per_second is answered 429 with
// Retry-After before it can wake a sleeping instance or take a stream
// slot; bytes over limits.bytes_per_second are relayed later, never cut.

// reasonRateLimited is the access log's reason of a 429.
const reasonRateLimited = "rate limited: limits.requests_per_second"

// rateLimitedPage is the 429 page of a navigation; %d is the seconds to
// wait.
const rateLimitedPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>429 Too Many Requests</title>
<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;color:#222}</style></head>
<body><h1>Too many requests</h1>
<p>This app receives more requests than its limit allows. Try again in %d seconds.</p>
</body></html>
`

// rateLimitedAnswer is the 429 for a request of intent, retry from now
// admitted again: an HTML page for a navigation, grpc-status 8
// (RESOURCE_EXHAUSTED) for gRPC, {"error":"rate_limited","retry_after":N}
// otherwise; always with Retry-After in whole seconds, at least 1.
func rateLimitedAnswer(intent accessIntent, retry time.Duration) accessAnswer {
	n := seconds(retry)
	a := accessAnswer{status: http.StatusTooManyRequests}
	switch intent {
	case intentGRPC:
		// gRPC clients read the status from the trailers-only answer;
		// an HTTP 429 would become UNAVAILABLE.
		a.status = http.StatusOK
		a.fields = append(a.fields, [2]string{"content-type", "application/grpc"},
			[2]string{"grpc-status", "8"}, [2]string{"grpc-message", "rate limited"})
	case intentNavigate:
		a.body = sprintfPage(rateLimitedPage, n)
		a.fields = append(a.fields, [2]string{"content-type", "text/html; charset=utf-8"})
	default:
		a.body = `{"error":"rate_limited","retry_after":` + n + "}\n"
		a.fields = append(a.fields, [2]string{"content-type", "application/json"})
	}
	a.fields = append(a.fields, [2]string{"retry-after", n}, [2]string{"cache-control", "no-store"},
		[2]string{"x-content-type-options", "nosniff"})
	return a
}

// noteRateLimited records a 429 (or gRPC's RESOURCE_EXHAUSTED) in the
// access log and the denial metrics.
func (s *Server) noteRateLimited(rec *accessRecord) {
	rec.denied(denial{status: http.StatusTooManyRequests, reason: reasonRateLimited})
	s.m.denied(http.StatusTooManyRequests)
}

// allowRate admits the request under its instance's request rate or
// answers it 429; it reports whether the request goes on and, when not,
// whether the connection continues (keep-alive unless the request's
// body is unread or the client or the server asked to close).
func (c *clientConn) allowRate() (proceed, keep bool) {
	inst := c.route.Instance
	if !inst.LimitsRequests() {
		return true, true
	}
	ok, retry := inst.AllowRequest(time.Now())
	if ok {
		return true, true
	}
	req := &c.req
	in := sleepFieldsH1(req)
	a := rateLimitedAnswer(in.intent(), retry)
	c.s.noteRateLimited(&c.rec)
	closeConn := req.body != bodyNone || req.close || c.s.draining.Load()
	c.out = appendAccessAnswer(c.out[:0], &a, string(req.method) == "HEAD", closeConn, c.rec.id.bytes())
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	if _, err := c.conn.Write(c.out); err != nil {
		return false, false
	}
	return false, !closeConn
}

// allowRate is clientConn.allowRate for an HTTP/2 stream: it reports
// whether the request goes on (else it was answered).
func (st *h2Stream) allowRate() bool {
	inst := st.hc.route.Instance
	if !inst.LimitsRequests() {
		return true
	}
	ok, retry := inst.AllowRequest(time.Now())
	if ok {
		return true
	}
	es := st.es
	var in accessInput[string]
	in.method, in.path, in.websocket = es.Method, "", es.Protocol != ""
	for i := range es.Header {
		in.field(es.Header[i].Name, es.Header[i].Value, false)
	}
	a := rateLimitedAnswer(in.intent(), retry)
	st.s.noteRateLimited(&st.rec)
	st.ended = writeH2AccessAnswer(es, &a, es.Method == "HEAD", st.rec.id.bytes()) == nil
	return false
}

// throttlePause ends the byte-rate pauses of one connection (HTTP/1.1),
// one request body or one WebSocket early: cancel (revocation, an aborted
// body copy, close) ends every pause in progress and every later one.
// Each pause is a timer owned by the waiting goroutine. The zero value is
// ready; the channel is made only once a pause needs it.
type throttlePause struct {
	mu      sync.Mutex
	stop    chan struct{} // closed by cancel
	stopped bool
}

// done returns a channel closed by cancel.
func (p *throttlePause) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop == nil {
		p.stop = make(chan struct{})
		if p.stopped {
			close(p.stop)
		}
	}
	return p.stop
}

// cancel ends every pause in progress and every later one.
func (p *throttlePause) cancel() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	if p.stop != nil {
		close(p.stop)
	}
}

// reset makes a cancelled pause usable again (a new request body).
func (p *throttlePause) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		p.stop, p.stopped = nil, false
	}
}

// pauseFor waits d, or until a or b (nil: none) is closed.
func pauseFor(d time.Duration, a, b <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-a:
	case <-b:
	}
}

// throttleResponse waits before n bytes of the response body are relayed
// to the client, as long as the instance's byte rate asks; what is
// buffered for the client goes out first. Revoke ends the wait.
func (c *clientConn) throttleResponse(n int) {
	inst := c.route.Instance
	if !inst.LimitsBytes() {
		return
	}
	if wait := inst.ThrottleBytes(n, time.Now()); wait > 0 {
		if c.bw != nil && c.bw.Buffered() > 0 {
			_ = c.flush()
		}
		pauseFor(wait, c.pause.done(), nil)
	}
}

// throttleRequest is throttleResponse for n bytes of the request body
// (the body copy's goroutine); Revoke and the copy's abort end the wait.
func (c *clientConn) throttleRequest(n int) {
	inst := c.route.Instance
	if !inst.LimitsBytes() {
		return
	}
	if wait := inst.ThrottleBytes(n, time.Now()); wait > 0 {
		pauseFor(wait, c.pause.done(), c.body.pause.done())
	}
}

// throttleBytes is clientConn.throttleResponse for an HTTP/2 stream's
// response body (body: nil) or request body (body: the copy's pause,
// cancelled when the copy is stopped); the stream's end (reset, the
// connection closed by a revocation) ends the wait too.
func (st *h2Stream) throttleBytes(n int, body *throttlePause) {
	inst := st.hc.route.Instance
	if !inst.LimitsBytes() {
		return
	}
	wait := inst.ThrottleBytes(n, time.Now())
	if wait <= 0 {
		return
	}
	var stop <-chan struct{}
	if body != nil {
		stop = body.done()
	} else {
		_ = st.es.Flush() // what is buffered goes out before the pause
	}
	pauseFor(wait, st.es.Done(), stop)
}

// throttle waits before the WebSocket relays n bytes read at now, as long
// as its instance's byte rate asks; revoke and closeBoth end the wait.
// The WebSocket counts as active meanwhile: its idle timeout measures
// silence, not the pause.
func (p *wsPump) throttle(n int, now time.Time) {
	inst := p.w.limit
	if inst == nil || !inst.LimitsBytes() {
		return
	}
	wait := inst.ThrottleBytes(n, now)
	if wait <= 0 {
		return
	}
	until := now.Add(wait).UnixNano()
	for {
		last := p.w.activity.Load()
		if last >= until || p.w.activity.CompareAndSwap(last, until) {
			break
		}
	}
	pauseFor(wait, p.w.pause.done(), nil)
}
