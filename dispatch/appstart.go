package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/applistener/applistener/connector"
)

// Apps that are still starting. A sandbox's app is often reached before it
// listens (a dev server compiling, a container booting): a dial the app
// refuses is then not answered at once. The request waits, redialling
// with a short jittered backoff (startBackoffMin doubling to
// startBackoffMax), for up to the route's start grace (the service's
// start_grace_seconds, else Config.AppStartGrace). Redialling is safe
// whatever the request: nothing of it has been sent (retry.go's rule is
// about requests the app may have read).
//
// The wait is bounded: the request holds its instance's stream slot
// (max_streams) throughout, and it ends at once when the client goes away
// (HTTP/2: the stream's context; HTTP/1.1: the client's socket hung up,
// checked at each redial), when the route is revoked or when the server
// shuts down. It uses one timer and no goroutine. When the grace runs
// out, the client gets 502 with a body saying that nothing listens on
// that port yet (denyNotListening): a self-refreshing page for browser
// navigations, JSON otherwise, and Retry-After.

// Backoff between redials of an app that is not listening yet.
const (
	startBackoffMin = 50 * time.Millisecond
	startBackoffMax = 500 * time.Millisecond
)

// Outcomes of a wait for an app to listen
// (applistener_app_start_waits_total{outcome}).
const (
	startReady      = "ready"       // the app accepted a connection
	startTimeout    = "timeout"     // the grace ran out: 502 not listening
	startClientGone = "client_gone" // the client went away
	startRevoked    = "revoked"     // the route was revoked
	startShutdown   = "shutdown"    // the server is shutting down: 502 not listening
	startError      = "error"       // a redial failed otherwise (timeout, instance gone)
)

// startOutcomes lists every outcome, for the metric's series.
var startOutcomes = []string{startReady, startTimeout, startClientGone, startRevoked, startShutdown, startError}

// notListeningError: the app refused connections on port until the wait
// for it ended (or at once, with no grace).
type notListeningError struct {
	port   int
	waited time.Duration
	err    error // the last dial's
}

func (e *notListeningError) Error() string {
	return fmt.Sprintf("nothing listening on port %d after %v: %v", e.port, e.waited.Round(time.Millisecond), e.err)
}

func (e *notListeningError) Unwrap() error { return e.err }

// refusedByApp reports whether a dial failed because nothing listens on
// the port yet: the connection was refused (tcp, netns), or a unix
// connector's socket does not exist in its existing directory. An instance
// that is gone (connector.ErrUnavailable) is not an app starting.
func refusedByApp(err error) bool {
	if errors.Is(err, connector.ErrUnavailable) {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// startGrace is how long the exchange may wait for its app to listen.
func (x *exchange) startGrace() time.Duration {
	if d, ok := x.route.StartGrace(); ok {
		return d
	}
	return max(x.s.cfg.AppStartGrace, 0)
}

// dialApp opens a new app connection. A dial the app refuses is retried
// while the app may still be starting (awaitListening).
func (x *exchange) dialApp(ctx context.Context) (*backendConn, error) {
	bc, err := x.dialOnce(ctx)
	switch {
	case err == nil:
		return bc, nil
	case refusedByApp(err):
		return x.awaitListening(ctx, err)
	}
	return nil, &dialError{err}
}

// dialOnce makes one dial, bounded by the dial timeout, and counts it.
func (x *exchange) dialOnce(ctx context.Context) (*backendConn, error) {
	dctx, cancel := context.WithTimeout(ctx, x.s.cfg.DialTimeout)
	bc, err := x.pool.dial(dctx)
	cancel()
	x.s.m.dials.WithLabelValues(dialResult(err)).Inc()
	return bc, err
}

// awaitListening redials with backoff after the app refused the first
// dial (first), until it accepts or the start grace has passed since the
// first dial, and ends early as the package comment above says.
func (x *exchange) awaitListening(ctx context.Context, first error) (*backendConn, error) {
	start := time.Now()
	grace := x.startGrace()
	if grace <= 0 {
		return nil, &notListeningError{port: x.route.Port, err: first}
	}
	m := x.s.m
	m.startWaiting.Inc()
	defer m.startWaiting.Dec()
	deadline := start.Add(grace)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff, attempts, last := startBackoffMin, 1, first
	end := func(outcome string, err error) error {
		m.startWaits.WithLabelValues(outcome).Inc()
		x.logStartWait(outcome, time.Since(start), attempts, err)
		return err
	}
	notListening := func() error {
		return &notListeningError{port: x.route.Port, waited: time.Since(start), err: last}
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, end(startTimeout, notListening())
		}
		timer.Reset(min(jitter(backoff), left))
		select {
		case <-timer.C:
		case <-ctx.Done():
		case <-x.route.Lease.Done():
		case <-x.s.stopping:
		}
		// A revocation also closes the client side: it is told first.
		switch {
		case !x.route.Lease.Live():
			return nil, end(startRevoked, errClientRevoked)
		case x.s.draining.Load():
			return nil, end(startShutdown, notListening())
		case ctx.Err() != nil || x.cl.gone():
			return nil, end(startClientGone, errClientGone)
		}
		bc, err := x.dialOnce(ctx)
		attempts++
		switch {
		case err == nil:
			_ = end(startReady, nil)
			return bc, nil
		case !refusedByApp(err):
			return nil, end(startError, &dialError{err})
		}
		last = err
		backoff = min(2*backoff, startBackoffMax)
	}
}

// jitter spreads d over [0.75d, 1.25d), so that requests held for one app
// do not redial in step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2)
}

// logStartWait logs how a wait for the app to listen ended: one record per
// wait (network activity, like the connector's other records).
func (x *exchange) logStartWait(outcome string, waited time.Duration, attempts int, err error) {
	level, msg := slog.LevelInfo, "app started listening"
	switch outcome {
	case startTimeout:
		level, msg = slog.LevelWarn, "app not listening"
	case startReady:
	default:
		msg = "wait for app to listen ended"
	}
	if !x.s.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.Int("class_uid", 4001),
		slog.String("host", x.route.Host),
		slog.Int("port", x.route.Port),
		slog.String("outcome", outcome),
		slog.Duration("waited", waited),
		slog.Int("dials", attempts),
	}
	if err != nil && outcome != startClientGone && outcome != startRevoked {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	x.s.log.LogAttrs(context.Background(), level, msg, attrs...)
}
