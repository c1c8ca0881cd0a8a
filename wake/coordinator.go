// Package wake coordinates the waking of sleeping sandbox instances: one
// wake per instance however many requests ask for it (single flight), a
// bounded number of held requests per instance and per process, a deadline
// per held request, release in arrival order once the instance is active,
// and a negative cache for instances the platform says it cannot wake.
//
// The Coordinator asks a Waker to wake an instance: a Hook (an HTTP POST
// to the platform, for `serve --wake-hook` and for the gateway) or the
// supervisor's gateway client (the gateway forwards to its own hook).
package wake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Key identifies one wake: the instance and its generation. A recreated
// sandbox (a new generation) is a new wake. Supervisor is "" in a
// supervisor's own coordinator (its hook knows its id) and names the
// instance's supervisor in the gateway's, which relays for all of them.
type Key struct {
	Workspace  string
	Sandbox    string
	Generation string
	Supervisor string
}

// String returns "workspace/sandbox" and the generation when it is set.
func (k Key) String() string {
	if k.Generation == "" {
		return k.Workspace + "/" + k.Sandbox
	}
	return k.Workspace + "/" + k.Sandbox + "@" + k.Generation
}

// Waker asks the platform to wake an instance. It returns nil once the
// platform accepted (the instance becomes active later, through the
// configuration), a *CannotWakeError when the platform refuses, and
// another error when it could not be asked. It must return when ctx ends.
type Waker interface {
	Wake(ctx context.Context, key Key) error
}

// WakerFunc adapts a function to Waker.
type WakerFunc func(ctx context.Context, key Key) error

// Wake calls f.
func (f WakerFunc) Wake(ctx context.Context, key Key) error { return f(ctx, key) }

// Errors of Wait and Request. A caller answers ErrOverflow, ErrFailed and a
// CannotWakeError with 503 and Retry-After (RetryAfter), and
// ErrHoldExpired with its "starting" answer.
var (
	// ErrOverflow: the bound of held requests of the instance or of the
	// process is reached; nothing was started.
	ErrOverflow = errors.New("wake: too many requests held")
	// ErrHoldExpired: the hold ended before the instance became active;
	// the wake goes on.
	ErrHoldExpired = errors.New("wake: instance not active within the hold")
	// ErrCannotWake matches every *CannotWakeError (errors.Is).
	ErrCannotWake = errors.New("wake: the platform cannot wake the instance")
	// ErrFailed: the platform could not be asked (every attempt failed).
	ErrFailed = errors.New("wake: the platform could not be asked")
	// ErrClosed: the coordinator is closed.
	ErrClosed = errors.New("wake: coordinator closed")
	// ErrNotSleeping: RequestWhile's condition no longer held when the
	// wake would have started; nothing was started.
	ErrNotSleeping = errors.New("wake: the instance is not sleeping any more")
)

// CannotWakeError is the platform's answer that an instance cannot be
// woken (Hook: 409 or 422), with its reason. The coordinator remembers it
// for the negative cache's TTL.
type CannotWakeError struct {
	// Reason is the platform's reason, one line, at most MaxReasonLen
	// bytes ("" when it gave none).
	Reason string
	// Until is when the coordinator asks again (zero from a Waker).
	Until time.Time
}

// Error says that the instance cannot be woken, and why.
func (e *CannotWakeError) Error() string {
	if e.Reason == "" {
		return ErrCannotWake.Error()
	}
	return ErrCannotWake.Error() + ": " + e.Reason
}

// Is makes errors.Is(err, ErrCannotWake) true.
func (e *CannotWakeError) Is(target error) bool { return target == ErrCannotWake }

// Defaults of Options.
const (
	DefaultMaxHeldPerInstance = 256
	DefaultMaxHeld            = 10000
	DefaultNegativeTTL        = 30 * time.Second
	// DefaultFlightTimeout is how long a wake the platform accepted may
	// take to make the instance active before the next request asks again:
	// longer than the longest hold (routes.MaxWakeHoldSeconds).
	DefaultFlightTimeout = 150 * time.Second
	// DefaultRetryAfter is the Retry-After of an overflow or a failure.
	DefaultRetryAfter = 2 * time.Second
)

// Options configure a Coordinator.
type Options struct {
	// Waker asks the platform; required.
	Waker Waker
	// MaxHeldPerInstance bounds the requests held for one instance
	// (DefaultMaxHeldPerInstance when 0).
	MaxHeldPerInstance int
	// MaxHeld bounds the requests held in the process
	// (DefaultMaxHeld when 0).
	MaxHeld int
	// NegativeTTL is how long a platform's "cannot be woken" is
	// remembered (DefaultNegativeTTL when 0).
	NegativeTTL time.Duration
	// FlightTimeout ends a wake the platform accepted that did not make
	// the instance active (DefaultFlightTimeout when 0).
	FlightTimeout time.Duration
	// EndOnAccept ends a wake as soon as the platform accepted it, instead
	// of at Active: for a relay (the gateway) that coalesces concurrent
	// requests and caches refusals but never sees the instance wake.
	EndOnAccept bool
	// Registerer receives the metrics; nil: none.
	Registerer prometheus.Registerer
	// Logger logs wakes (slog.Default() when nil).
	Logger *slog.Logger
}

// Ticket describes a request released by Wait.
type Ticket struct {
	// Arrival is the request's place among the requests held for the same
	// wake (0 for the first).
	Arrival int
	// Released is the place in which it was released; it equals Arrival
	// unless a request before it left.
	Released int
	// Coalesced is true when the request joined a wake another started.
	Coalesced bool
	// Held is how long it was held.
	Held time.Duration
}

// Coordinator runs wakes. Its methods are safe for concurrent use.
type Coordinator struct {
	opts Options
	log  *slog.Logger
	m    *metrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// tracked is len(flights)+len(refused): Active returns at once,
	// without a lock, when it is 0.
	tracked atomic.Int64

	mu      sync.Mutex
	closed  bool
	held    int
	flights map[Key]*flight
	refused map[Key]*CannotWakeError // negative cache, until each one's Until
}

// flight is one wake in progress.
type flight struct {
	key       Key
	start     time.Time
	accepted  chan struct{} // closed when the Waker returned or the flight ended
	hookErr   error         // the Waker's answer, set before accepted is closed
	waiters   []*waiter     // arrival order
	held      int           // waiters still present
	released  bool          // active: the baton passes along waiters
	releasedN int           // waiters released so far
	failed    error         // set when the flight failed; every waiter gets it
	ended     bool
	timer     *time.Timer // FlightTimeout
}

// waiter is one held request.
type waiter struct {
	ch       chan struct{} // closed when its turn comes or the flight fails
	arrival  int
	released int
	signaled bool
	gone     bool
}

// New returns a Coordinator; Close stops it.
func New(opts Options) (*Coordinator, error) {
	if opts.Waker == nil {
		return nil, errors.New("wake: a Waker is required")
	}
	if opts.MaxHeldPerInstance <= 0 {
		opts.MaxHeldPerInstance = DefaultMaxHeldPerInstance
	}
	if opts.MaxHeld <= 0 {
		opts.MaxHeld = DefaultMaxHeld
	}
	if opts.NegativeTTL <= 0 {
		opts.NegativeTTL = DefaultNegativeTTL
	}
	if opts.FlightTimeout <= 0 {
		opts.FlightTimeout = DefaultFlightTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Coordinator{
		opts:    opts,
		log:     opts.Logger,
		m:       newMetrics(opts.Registerer),
		flights: make(map[Key]*flight),
		refused: make(map[Key]*CannotWakeError),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Wait holds the caller until the instance of key is active (Active,
// Sync, or woken closed), for at most hold. The first request for a
// sleeping instance starts the wake (the Waker is called once, whoever
// leaves); later ones join it. Requests are released in arrival order.
//
// woken, when not nil, is closed when the instance wakes: the data plane
// passes its route's (routes.Route.Woken). It releases the wake as Active
// does, so that a change the coordinator was not told of yet (Sync runs
// after every table change) releases the held requests at once. ctx
// ending (the client gone, the route withdrawn) gives up the caller's
// place.
//
// It returns ErrOverflow at once when the bounds are reached, a
// *CannotWakeError while the negative cache holds a refusal,
// ErrHoldExpired when hold passes first (hold 0 starts or joins the wake
// and returns it at once), ErrFailed when the platform could not be asked,
// ErrClosed, or ctx's error.
func (c *Coordinator) Wait(ctx context.Context, key Key, hold time.Duration, woken <-chan struct{}) (Ticket, error) {
	start := time.Now()
	c.mu.Lock()
	f, coalesced, err := c.flightLocked(key, start, hold > 0)
	if err != nil {
		c.mu.Unlock()
		return Ticket{}, err
	}
	if hold <= 0 {
		c.mu.Unlock()
		return Ticket{Coalesced: coalesced}, ErrHoldExpired
	}
	if coalesced {
		c.m.coalesced.Inc()
	}
	w := &waiter{ch: make(chan struct{}), arrival: len(f.waiters)}
	f.waiters = append(f.waiters, w)
	f.held++
	c.held++
	c.m.held.Inc()
	c.mu.Unlock()

	timer := time.NewTimer(hold)
	defer timer.Stop()
	var cause error
wait:
	for {
		select {
		case <-w.ch:
			break wait
		case <-woken:
			woken = nil
			c.mu.Lock()
			if c.flights[key] == f {
				c.activeLocked(key)
			}
			c.mu.Unlock()
		case <-timer.C:
			cause = ErrHoldExpired
			break wait
		case <-ctx.Done():
			cause = ctx.Err()
			break wait
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f.held--
	c.held--
	c.m.held.Dec()
	switch {
	case f.failed != nil:
		return Ticket{}, f.failed
	case w.signaled:
		// Released (perhaps just as the hold ended): pass the baton on.
		c.passLocked(f, w.arrival+1)
		return Ticket{Arrival: w.arrival, Released: w.released, Coalesced: coalesced, Held: time.Since(start)}, nil
	default:
		w.gone = true
		if !errors.Is(cause, ErrHoldExpired) {
			c.m.gone.Inc()
		}
		return Ticket{}, cause
	}
}

// Request asks for the wake of key without holding a request: it starts
// or joins the wake and returns the Waker's answer (nil: accepted), a
// *CannotWakeError from the negative cache, or ctx's error.
func (c *Coordinator) Request(ctx context.Context, key Key) error {
	return c.RequestWhile(ctx, key, nil)
}

// RequestWhile is Request, but a wake is started only if sleeping (when
// not nil) still reports true, asked under the lock that Active and Sync
// take: a caller that read the instance as sleeping just before it turned
// active, and whose wake Sync has already ended, gets ErrNotSleeping
// instead of asking the platform a second time. Joining a wake in progress
// does not ask. sleeping must not call back into the Coordinator.
func (c *Coordinator) RequestWhile(ctx context.Context, key Key, sleeping func() bool) error {
	c.mu.Lock()
	if sleeping != nil && c.flights[key] == nil && !sleeping() {
		c.mu.Unlock()
		return ErrNotSleeping
	}
	f, coalesced, err := c.flightLocked(key, time.Now(), false)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if coalesced {
		c.m.coalesced.Inc()
	}
	select {
	case <-f.accepted:
		c.mu.Lock()
		defer c.mu.Unlock()
		return f.hookErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flightLocked returns the wake in progress for key, starting it when
// there is none; with hold, it first checks that one more request may be
// held (ErrOverflow starts nothing).
func (c *Coordinator) flightLocked(key Key, now time.Time, hold bool) (*flight, bool, error) {
	if c.closed {
		return nil, false, ErrClosed
	}
	if cw, ok := c.refused[key]; ok {
		if now.Before(cw.Until) {
			c.m.cached.Inc()
			return nil, false, cw
		}
		delete(c.refused, key)
		c.tracked.Add(-1)
	}
	f := c.flights[key]
	if hold && (c.held >= c.opts.MaxHeld || f != nil && f.held >= c.opts.MaxHeldPerInstance) {
		c.m.overflow.Inc()
		return nil, false, ErrOverflow
	}
	if f != nil {
		return f, true, nil
	}
	f = &flight{key: key, start: now, accepted: make(chan struct{})}
	c.flights[key] = f
	c.tracked.Add(1)
	c.m.inFlight.Inc()
	c.wg.Add(1)
	go c.ask(f)
	return f, false, nil
}

// ask calls the Waker for f and records its answer.
func (c *Coordinator) ask(f *flight) {
	defer c.wg.Done()
	err := c.opts.Waker.Wake(c.ctx, f.key)
	c.mu.Lock()
	defer c.mu.Unlock()
	f.hookErr = err
	close(f.accepted)
	if f.ended { // woken (or closed) before the platform answered
		return
	}
	var cw *CannotWakeError
	switch {
	case err == nil && c.opts.EndOnAccept:
		c.endLocked(f, nil, "accepted")
	case err == nil:
		c.log.Info("wake accepted by the platform", "instance", f.key.String(), "waiting", f.held)
		f.timer = time.AfterFunc(c.opts.FlightTimeout, func() { c.flightTimedOut(f) })
	case errors.As(err, &cw):
		cw = &CannotWakeError{Reason: cw.Reason, Until: time.Now().Add(c.opts.NegativeTTL)}
		f.hookErr = cw
		if _, ok := c.refused[f.key]; !ok {
			c.tracked.Add(1)
		}
		c.refused[f.key] = cw
		c.log.Warn("the platform cannot wake the instance", "instance", f.key.String(), "reason", cw.Reason,
			"asking_again_after", c.opts.NegativeTTL)
		c.endLocked(f, cw, "refused")
	case c.closed:
		c.endLocked(f, ErrClosed, "")
	default:
		c.log.Warn("wake failed: the platform could not be asked", "instance", f.key.String(), "err", err)
		f.hookErr = fmt.Errorf("%w: %w", ErrFailed, err)
		c.endLocked(f, f.hookErr, "failed")
	}
}

// flightTimedOut ends a wake the platform accepted that did not make the
// instance active within FlightTimeout.
func (c *Coordinator) flightTimedOut(f *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.ended {
		return
	}
	c.log.Warn("wake timed out: the platform accepted it but the instance did not become active",
		"instance", f.key.String(), "after", c.opts.FlightTimeout)
	c.endLocked(f, ErrHoldExpired, "timeout")
}

// endLocked ends flight f: released (err nil and result "woken"),
// failed (err not nil: every waiter gets it), or forgotten (result "").
func (c *Coordinator) endLocked(f *flight, err error, result string) {
	if f.ended {
		return
	}
	f.ended = true
	if c.flights[f.key] == f {
		delete(c.flights, f.key)
		c.tracked.Add(-1)
	}
	c.m.inFlight.Dec()
	if f.timer != nil {
		f.timer.Stop()
	}
	if result != "" {
		c.m.total.WithLabelValues(result).Inc()
	}
	if result == "woken" {
		c.m.seconds.Observe(time.Since(f.start).Seconds())
	}
	if err != nil {
		f.failed = err
		for _, w := range f.waiters {
			if !w.gone && !w.signaled {
				w.signaled = true
				close(w.ch)
			}
		}
		return
	}
	if result == "woken" {
		f.released = true
		c.passLocked(f, 0)
	}
}

// passLocked releases the first waiter of f still present at or after
// index from: the baton passes from each released request to the next.
func (c *Coordinator) passLocked(f *flight, from int) {
	if f.failed != nil {
		return
	}
	for _, w := range f.waiters[from:] {
		if w.gone || w.signaled {
			continue
		}
		w.signaled = true
		w.released = f.releasedN
		f.releasedN++
		close(w.ch)
		return
	}
}

// Active tells that the instance of key is active: its held requests are
// released in arrival order and a refusal in the negative cache is
// forgotten. It takes no lock and allocates nothing while no wake is in
// progress and nothing is cached.
func (c *Coordinator) Active(key Key) {
	if c.tracked.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.activeLocked(key)
}

func (c *Coordinator) activeLocked(key Key) {
	if _, ok := c.refused[key]; ok {
		delete(c.refused, key)
		c.tracked.Add(-1)
	}
	if f := c.flights[key]; f != nil {
		c.log.Info("instance woken", "instance", key.String(), "after", time.Since(f.start).Round(time.Millisecond), "held", f.held)
		c.endLocked(f, nil, "woken")
	}
}

// Sync calls Active for every key with a wake in progress or a cached
// refusal for which active reports true: the data plane calls it after
// each change of its route table. active is called without the
// coordinator's lock held.
func (c *Coordinator) Sync(active func(Key) bool) {
	if c.tracked.Load() == 0 {
		return
	}
	c.mu.Lock()
	keys := make([]Key, 0, len(c.flights)+len(c.refused))
	for k := range c.flights {
		keys = append(keys, k)
	}
	for k := range c.refused {
		if c.flights[k] == nil {
			keys = append(keys, k)
		}
	}
	c.mu.Unlock()
	for _, k := range keys {
		if active(k) {
			c.Active(k)
		}
	}
}

// Held returns the number of requests held now.
func (c *Coordinator) Held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

// Close fails every held request with ErrClosed, cancels the Waker calls
// in progress and waits for them to return.
func (c *Coordinator) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, f := range c.flights {
		c.endLocked(f, ErrClosed, "")
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}

// RetryAfter is the Retry-After to answer with for an error of Wait or
// Request: until a cached refusal expires, DefaultRetryAfter otherwise.
func RetryAfter(err error) time.Duration {
	var cw *CannotWakeError
	if errors.As(err, &cw) && !cw.Until.IsZero() {
		if d := time.Until(cw.Until); d > 0 {
			return d.Round(time.Second) + time.Second
		}
	}
	return DefaultRetryAfter
}
