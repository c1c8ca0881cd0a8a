package dispatch

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/routes"
)

// exchange is one request forwarded to its route's app: the steps that an
// HTTP/1.1 connection (proxy in server.go) and an HTTP/2 stream (proxy in
// h2.go) share, so that the retry rule, the reuse of app connections and
// the answers to failures live in one place. The client side drives it:
//
//	connect   – an app connection from the route's pool or a new one, the
//	            request head written on it, the retry rule applied (retry.go)
//	sendBody  – the request body streamed in a goroutine of its own
//	readHead  – response heads read until the final one (1xx relayed)
//	copyBody  – the response body relayed as the app frames it
//	finish    – the app connection back to the pool, or closed
//
// and failure maps whatever went wrong to the client's answer.
type exchange struct {
	s      *Server
	route  *routes.Route
	pool   *backendPool
	cl     exchangeClient
	sni    string
	req    *request
	isHead bool
	bc     *backendConn // the app connection, once connected
	resp   response
	// publicPort is the port the client named in Host (0: none or 443),
	// for redirects rewritten to the public origin (redirect.go).
	publicPort int

	body      chan error // the request body copy's result; nil when none runs
	stopCopy  func()     // makes a running body copy return at once
	bodyEnded bool       // the body copy has returned (bodyErr is its result)
	bodyErr   error
	hw        headWait // when the response-head timeout starts (headwait.go)
	// awaitFor, when positive, makes connect wait up to that long after
	// writing the request for the answer to be readable (appwait.go): for
	// a caller that reads the answer next and has nothing else to do.
	awaitFor time.Duration
	// awaitUntil is when connect's wait for the answer ends (its read
	// deadline, taken before the write): after it, the wait ran out.
	awaitUntil time.Time
	// deadlinesCleared: copyBody cleared bc's deadlines (no body copy
	// writes on it), finish need not.
	deadlinesCleared bool
	// fairErr is why the exchange could not take its fair-admission slot
	// back after waiting for the app (resumeFair): readHead returns it.
	fairErr error

	// Timings and counts for the access log and the latency histograms
	// (accesslog.go), the same for both protocols.
	sentAt       time.Time     // the request head was written to the app
	connectDur   time.Duration // connect: getting an app connection and writing the head (-1: none)
	firstByteDur time.Duration // sentAt to the final response head (-1: none)
	bytesOut     int64         // response body bytes relayed to the client
}

// exchangeClient is what an exchange needs from its client side.
type exchangeClient interface {
	// attach makes bc the request's app connection: revoking the client
	// connection (or the end of the stream) closes it. False when the
	// client connection is already revoked.
	attach(bc *backendConn) bool
	// detach undoes attach; it reports false when bc was closed meanwhile
	// because the client side ended.
	detach(bc *backendConn) bool
	// gone reports whether nobody is waiting for the answer any more (the
	// client went away, or its connection was revoked). It does not block.
	gone() bool
	// pauseFair gives back the request's fair-admission slot while it
	// waits for the app's answer (fair.go); resumeFair takes one again,
	// in the instance's turn, and fails when the client side ended or
	// its route was revoked while it queued.
	pauseFair()
	resumeFair() error
	// answerSpin is how long connect polls for the app's answer before it
	// parks (0: it parks at once); see fair.go.
	answerSpin() time.Duration
}

// dialContexter is a client side whose dials have a context of their own,
// made only when a dial happens (HTTP/2: cancelled by the stream's reset).
type dialContexter interface {
	dialContext() (ctx context.Context, done func())
}

// reset prepares x for the exchange of req on route for cl, reached with
// sni. The response's slices are kept for reuse (an HTTP/1.1 connection
// reuses one exchange for all its requests).
func (x *exchange) reset(s *Server, route *routes.Route, sni string, req *request, cl exchangeClient) {
	resp := x.resp
	resp.reset()
	*x = exchange{s: s, route: route, pool: s.routePool(route), cl: cl, sni: sni, req: req,
		isHead: string(req.method) == "HEAD", resp: resp, connectDur: -1, firstByteDur: -1,
		publicPort: hostPort(req.host)}
}

// Failures of an exchange, mapped to answers by failure.
var (
	// errClientRevoked: the client connection was revoked while connecting.
	errClientRevoked = errors.New("client connection revoked")
	// errClientGone: the client went away while the app was answering.
	errClientGone = errors.New("client went away while the app was answering")
)

// dialError is a failure to open an app connection.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// appError is a failure on an open app connection; sent: the request head
// had been written (a timeout then is the app's slowness).
type appError struct {
	err  error
	sent bool
}

func (e *appError) Error() string { return e.err.Error() }
func (e *appError) Unwrap() error { return e.err }

// badResponseError is a response head the listener refuses to relay.
type badResponseError struct{ err error }

func (e *badResponseError) Error() string { return "invalid response: " + e.err.Error() }
func (e *badResponseError) Unwrap() error { return e.err }

// connect writes head (the request head, with the whole body when
// bodyInMemory) on an idle pooled app connection, or a new one, and keeps
// it as x.bc. It sends the request a second time only as the retry rule
// allows (retry.go). A new connection that the app refuses is waited for
// while the app may be starting (appstart.go). ctx bounds the dial (or the
// client's dialContext, when it has one).
func (x *exchange) connect(ctx context.Context, head []byte, bodyInMemory bool) error {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		var bc *backendConn
		if attempt == 0 {
			// A retry always dials: another idle connection may be as
			// stale as the first.
			bc = x.pool.get()
		}
		fresh := bc == nil
		if fresh {
			dctx, done := ctx, func() {}
			if dc, ok := x.cl.(dialContexter); ok {
				dctx, done = dc.dialContext()
			}
			var err error
			bc, err = x.dialApp(dctx)
			done()
			if err != nil {
				return err
			}
		}
		if !x.cl.attach(bc) {
			bc.close()
			return errClientRevoked
		}
		now := time.Now()
		_ = bc.conn.SetWriteDeadline(now.Add(x.s.cfg.BodyTimeout))
		var n int
		var err error
		if x.awaitFor > 0 {
			x.awaitUntil = now.Add(x.awaitFor)
			_ = bc.conn.SetReadDeadline(x.awaitUntil)
			// The wait for the answer gives the fair-admission slot
			// back (fair.go); a failure to take it again ends the
			// exchange in readHead.
			x.cl.pauseFair()
			spin := x.cl.answerSpin()
			var spun bool
			n, now, err, spun = bc.wait.WriteAwaitSpin(head, spin)
			if spin > 0 && err == nil {
				outcome := 0 // parked
				if spun {
					outcome = 1 // answered
				}
				x.s.m.answerSpins[outcome].Inc()
			}
			x.fairErr = x.cl.resumeFair()
		} else {
			n, err = bc.conn.Write(head)
			now = time.Now()
		}
		if err == nil {
			x.bc = bc
			x.sentAt = now
			x.connectDur = x.sentAt.Sub(start)
			return nil
		}
		x.cl.detach(bc)
		bc.close()
		if !mayRetry(x.req.method, bodyInMemory, !fresh, writeFailure(n), attempt) {
			return &appError{err: err}
		}
	}
}

// sendBody streams the request body to the app in a goroutine of its own:
// copy does the work, stop makes it return at once (the exchange closes
// the app connection as well). A panic in it ends this exchange only: the
// client's body is stopped, the app connection closed (the response-head
// read fails), and the copy's result is the *panicguard.PanicError.
func (x *exchange) sendBody(copyBody func(bc *backendConn) error, stop func()) {
	x.body = make(chan error, 1)
	x.stopCopy = stop
	bc := x.bc
	go func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				panicguard.Report(x.s.log, panicguard.RequestBody, r, "sni", x.sni, "route", routeName(x.route), "connector", x.pool.connector.String(), "port", x.pool.port)
				stop()
				_ = bc.conn.Close()
				err = &panicguard.PanicError{Where: panicguard.RequestBody, Value: r}
			}
			x.body <- err
		}()
		panicguard.Point(panicguard.RequestBody, x.sni)
		err = copyBody(bc)
		x.bodyCopied(bc) // the response-head timeout starts now (headwait.go)
	}()
}

// stopBody makes a running body copy return and reports how it ended.
func (x *exchange) stopBody() error {
	if x.body == nil || x.bodyEnded {
		return x.bodyErr
	}
	x.stopCopy()
	_ = x.bc.conn.Close()
	return x.waitBody()
}

// waitBody waits for the body copy and reports how it ended.
func (x *exchange) waitBody() error {
	if x.body != nil && !x.bodyEnded {
		x.bodyErr = <-x.body
		x.bodyEnded = true
	}
	return x.bodyErr
}

// bodySent reports, without waiting, whether the whole request body has
// reached the app (true when there was none to stream).
func (x *exchange) bodySent() bool {
	if x.body == nil {
		return true
	}
	if !x.bodyEnded {
		select {
		case x.bodyErr = <-x.body:
			x.bodyEnded = true
		default:
			return false
		}
	}
	return x.bodyErr == nil
}

// awaitRanOut reports whether connect's wait for the answer ended by its
// deadline. It compares with the deadline itself, not with sentAt plus
// awaitFor: sentAt is taken after the write, a little later than the
// deadline's start, so that sum would still lie ahead when the wait has
// already run out, and the head would wait a second full timeout.
func (x *exchange) awaitRanOut() bool {
	return !time.Now().Before(x.awaitUntil)
}

// readHead reads response heads into x.resp until a final one (status 200
// or more, or 101), handing each other 1xx to interim.
func (x *exchange) readHead(interim func(*response) error) error {
	// After connect's wait for the answer ended early, the answer is
	// there: no pause for it.
	answered := x.awaitFor > 0 && !x.awaitRanOut()
	for {
		if !answered || x.body != nil || x.awaitFor < x.s.cfg.ResponseHeaderTimeout {
			x.armHeadTimeout()
		}
		// (Else the wait ended with the answer, and its read deadline
		// stands: the response-head timeout from the request's write.)
		if x.fairErr != nil {
			return x.fairErr
		}
		var head []byte
		var err error
		if answered {
			answered = false
			head, err = readAppResponseHead(x.bc)
		} else {
			// Waiting for the app is not the listener's work: the slot
			// goes to another instance's request meanwhile (fair.go).
			x.cl.pauseFair()
			head, err = readAppResponseHead(x.bc)
			if x.fairErr = x.cl.resumeFair(); x.fairErr != nil {
				return x.fairErr
			}
		}
		if err != nil {
			return &appError{err: err, sent: true}
		}
		if err := parseResponseHead(&x.resp, head, x.isHead, maxResponseFields); err != nil {
			return &badResponseError{err}
		}
		x.s.scopeCookies(&x.resp, x.sni, x.pool)
		x.s.rewriteRedirects(&x.resp, x.pool, x.sni, x.publicPort)
		if x.resp.status == 101 {
			// The connection becomes a WebSocket's, never pooled again.
			x.bc.hangups.unwatch(x.bc)
		}
		if x.resp.status == 101 || x.resp.status >= 200 {
			x.firstByteDur = time.Since(x.sentAt)
			return nil
		}
		if err := interim(&x.resp); err != nil {
			return err
		}
	}
}

// maxResponseFields bounds the header fields of an app's response.
const maxResponseFields = 200

// copyBody relays the response body to w as the app frames it: a chunked
// body is re-chunked when chunkedOut (HTTP/1.1 clients), otherwise only its
// data is written. A large body with a known length is read in larger
// chunks and written through big (nil: w). It counts the bytes and the
// answered request.
func (x *exchange) copyBody(w, big io.Writer, flush func() error, chunkedOut bool) error {
	bc, resp := x.bc, &x.resp
	if x.body == nil {
		// Nothing else writes on bc: both deadlines are cleared at once,
		// as finish would.
		_ = bc.conn.SetDeadline(time.Time{})
		x.deadlinesCleared = true
	} else {
		_ = bc.conn.SetReadDeadline(time.Time{})
	}
	var n int64
	var err error
	switch resp.body {
	case bodyLength:
		if big != nil && resp.length >= bigBody && !x.isHead {
			bc.in.enlarge(&x.s.bigPool)
			w = big
		}
		n, err = copyWhole(w, &bc.in, resp.length, flush)
	case bodyChunked:
		n, err = copyChunked(w, &bc.in, chunkedOut, flush)
	case bodyUntilClose:
		n, err = copyUntilEOF(w, &bc.in, flush)
	}
	x.bytesOut = n
	x.s.m.bytesToClient.Add(float64(n))
	x.s.m.request(resp.status)
	return err
}

// finish ends the exchange. The app connection goes back to the route's
// pool when reusable and nothing argues against it: the response was
// complete and framed, the request body was sent whole (an app that
// answers early never reads the rest), and the client side did not close
// it meanwhile. Otherwise it is closed. It reports whether it was reused.
func (x *exchange) finish(reusable bool) bool {
	bc := x.bc
	// The body copy is settled first, whatever the reuse decision: it
	// must not outlive the exchange (it reads the client's buffer).
	sent := x.bodySent()
	if !sent {
		_ = x.stopBody()
	}
	reusable = reusable && sent && !x.resp.close && x.resp.body != bodyUntilClose
	if !x.cl.detach(bc) {
		reusable = false
	}
	if !reusable {
		bc.close()
		return false
	}
	if !x.deadlinesCleared {
		_ = bc.conn.SetDeadline(time.Time{})
	}
	x.pool.put(bc)
	return true
}

// abort ends a failed exchange: the body copy is stopped and the app
// connection closed.
func (x *exchange) abort() {
	if x.bc == nil {
		return
	}
	_ = x.stopBody()
	x.cl.detach(x.bc)
	x.bc.close()
}

// failure logs what went wrong towards the app and returns the answer
// for it.
func (x *exchange) failure(err error) denial {
	var de *dialError
	var be *badResponseError
	var ae *appError
	var nl *notListeningError
	switch {
	case errors.Is(err, errClientRevoked):
		return denyRevoked
	case errors.As(err, &nl):
		// Logged when the wait ended (appstart.go), or here when there
		// was none.
		if nl.waited == 0 {
			x.logStartWait(startTimeout, 0, 1, nl)
		}
		x.ocsfAppFailed(nl)
		return denyNotListening(nl.port)
	case errors.As(err, &de):
		x.s.log.Warn("connector dial failed", "class_uid", 4001, "host", x.route.Host, "port", x.route.Port, "err", de.err)
		x.ocsfAppFailed(de.err)
		if isTimeout(de.err) {
			return denyDialTimeout
		}
		return denyDialRefused
	case errors.As(err, &be):
		x.s.log.Warn("invalid response from app", "class_uid", 4001, "host", x.route.Host, "err", be.err)
		x.ocsfAppFailed(be.err)
		return denyBadResponse
	}
	x.s.log.Warn("app connection failed", "class_uid", 4001, "host", x.route.Host, "port", x.route.Port, "err", err)
	x.ocsfAppFailed(err)
	if errors.As(err, &ae) && ae.sent && isTimeout(err) {
		return denyRespTimeout
	}
	return denyBadResponse
}

func dialResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case isTimeout(err):
		return "timeout"
	}
	return "error"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
