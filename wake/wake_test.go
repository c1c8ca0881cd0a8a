package wake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	itest "github.com/applistener/applistener/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// platform is a real HTTP server standing for the platform's wake hook.
type platform struct {
	srv    *httptest.Server
	calls  atomic.Int64
	mu     sync.Mutex
	bodies []hookRequest
	auth   []string
	// answer decides the answer of call n (1-based); nil: 202.
	answer func(n int64, w http.ResponseWriter, r *http.Request)
}

func newPlatform(t *testing.T, answer func(n int64, w http.ResponseWriter, r *http.Request)) *platform {
	t.Helper()
	p := &platform{answer: answer}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var req hookRequest
		_ = json.Unmarshal(body, &req)
		p.mu.Lock()
		p.bodies = append(p.bodies, req)
		p.auth = append(p.auth, r.Header.Get("Authorization"))
		p.mu.Unlock()
		if p.answer == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		p.answer(n, w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// newCoordinator returns a coordinator using a Hook to p, closed at the
// end of the test.
func newCoordinator(t *testing.T, p *platform, opts Options, hook HookOptions) (*Coordinator, *prometheus.Registry) {
	t.Helper()
	hook.URL = p.srv.URL + "/wake"
	if hook.Supervisor == "" {
		hook.Supervisor = "sup-1"
	}
	h, err := NewHook(hook)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Waker = h
	opts.Registerer = reg
	opts.Logger = slog.New(slog.DiscardHandler)
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, reg
}

var keyA = Key{Workspace: "team", Sandbox: "demo", Generation: "1"}

type result struct {
	t   Ticket
	err error
}

// 100 concurrent waiters for a sleeping instance cause exactly one hook
// call; all are released once the instance is active.
func TestHundredWaitersOneHookCall(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, nil)
	c, reg := newCoordinator(t, p, Options{}, HookOptions{Token: "s3cret"})
	const n = 100
	results := make(chan result, n)
	for range n {
		go func() {
			tk, err := c.Wait(context.Background(), keyA, 30*time.Second, nil)
			results <- result{tk, err}
		}()
	}
	itest.Eventually(t, 10*time.Second, "100 requests held", func() bool { return c.Held() == n })
	itest.Eventually(t, 10*time.Second, "the hook called", func() bool { return p.calls.Load() >= 1 })
	c.Active(keyA)
	coalesced := 0
	seen := map[int]bool{}
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("Wait: %v", r.err)
		}
		if r.t.Coalesced {
			coalesced++
		}
		seen[r.t.Released] = true
	}
	if got := p.calls.Load(); got != 1 {
		t.Fatalf("%d hook calls, want 1", got)
	}
	if coalesced != n-1 || len(seen) != n {
		t.Fatalf("%d coalesced (want %d), %d distinct release places (want %d)", coalesced, n-1, len(seen), n)
	}
	p.mu.Lock()
	body, auth := p.bodies[0], p.auth[0]
	p.mu.Unlock()
	if body != (hookRequest{"team", "demo", "1", "sup-1"}) || auth != "Bearer s3cret" {
		t.Fatalf("hook request %+v, Authorization %q", body, auth)
	}
	if c.Held() != 0 {
		t.Fatalf("%d still held", c.Held())
	}
	if v := testutil.ToFloat64(mustCounter(t, reg, "applistener_wake_coalesced_total")); v != n-1 {
		t.Fatalf("coalesced counter %v, want %d", v, n-1)
	}
	if v := testutil.ToFloat64(mustCounterVec(t, reg, "applistener_wake_total", "woken")); v != 1 {
		t.Fatalf("wake_total{woken} %v, want 1", v)
	}
}

// Waiters are released in the order they arrived, skipping one that left.
func TestReleaseInArrivalOrder(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, nil)
	c, _ := newCoordinator(t, p, Options{}, HookOptions{})
	const n = 20
	type arrived struct {
		i int
		r result
	}
	results := make(chan arrived, n)
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	for i := range n {
		ctx := context.Background()
		if i == 3 {
			ctx = ctx3
		}
		go func() {
			tk, err := c.Wait(ctx, keyA, 30*time.Second, nil)
			results <- arrived{i, result{tk, err}}
		}()
		itest.Eventually(t, 10*time.Second, "request held", func() bool { return c.Held() == i+1 })
	}
	cancel3()
	r3 := <-results
	if r3.i != 3 || !errors.Is(r3.r.err, context.Canceled) {
		t.Fatalf("the request that left got %+v", r3)
	}
	c.Active(keyA)
	var order []int
	for range n - 1 {
		a := <-results
		if a.r.err != nil {
			t.Fatalf("request %d: %v", a.i, a.r.err)
		}
		if a.r.t.Arrival != a.i {
			t.Fatalf("request %d arrived as %d", a.i, a.r.t.Arrival)
		}
		want := a.i
		if a.i > 3 {
			want--
		}
		if a.r.t.Released != want {
			t.Fatalf("request %d released as %d, want %d", a.i, a.r.t.Released, want)
		}
		order = append(order, a.i)
	}
	// Each request passes the baton to the next when it leaves Wait: the
	// returns themselves come in arrival order but for a request whose
	// goroutine is descheduled between the pass and its send.
	inversions := 0
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			inversions++
		}
	}
	t.Logf("return order %v (%d inversions)", order, inversions)
}

// A wake slower than the hold: the held request gets ErrHoldExpired at the
// deadline, the wake goes on (a later request joins it without a second
// hook call) and the next request after Active is not held at all.
func TestHoldDeadline(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, nil)
	c, _ := newCoordinator(t, p, Options{}, HookOptions{})
	start := time.Now()
	_, err := c.Wait(context.Background(), keyA, 300*time.Millisecond, nil)
	if !errors.Is(err, ErrHoldExpired) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("Wait = %v after %v, want ErrHoldExpired after the 300 ms hold", err, time.Since(start))
	}
	tk, err := c.Wait(context.Background(), keyA, 0, nil)
	if !errors.Is(err, ErrHoldExpired) || !tk.Coalesced {
		t.Fatalf("hold 0: %+v %v, want a coalesced ErrHoldExpired", tk, err)
	}
	done := make(chan result, 1)
	go func() {
		tk, err := c.Wait(context.Background(), keyA, 30*time.Second, nil)
		done <- result{tk, err}
	}()
	itest.Eventually(t, 10*time.Second, "request held", func() bool { return c.Held() == 1 })
	c.Active(keyA)
	if r := <-done; r.err != nil || !r.t.Coalesced {
		t.Fatalf("after Active: %+v", r)
	}
	if got := p.calls.Load(); got != 1 {
		t.Fatalf("%d hook calls, want 1", got)
	}
}

// A hook that does not answer: each attempt ends at the timeout, the
// attempts are bounded, and the held requests fail with ErrFailed.
func TestHookTimeout(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, func(_ int64, _ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	c, reg := newCoordinator(t, p, Options{}, HookOptions{Timeout: 200 * time.Millisecond, Attempts: 2, Backoff: 50 * time.Millisecond})
	start := time.Now()
	_, err := c.Wait(context.Background(), keyA, 30*time.Second, nil)
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Wait = %v, want ErrFailed", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond || d > 20*time.Second {
		t.Fatalf("failed after %v, want two 200 ms attempts", d)
	}
	if got := p.calls.Load(); got != 2 {
		t.Fatalf("%d attempts, want 2", got)
	}
	if v := testutil.ToFloat64(mustCounterVec(t, reg, "applistener_wake_total", "failed")); v != 1 {
		t.Fatalf("wake_total{failed} %v", v)
	}
	if RetryAfter(err) != DefaultRetryAfter {
		t.Fatalf("RetryAfter = %v", RetryAfter(err))
	}
}

// 5xx and 429 are retried (honouring Retry-After), other 4xx are not.
func TestHookRetries(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	h, err := NewHook(HookOptions{URL: p.srv.URL, Supervisor: "s", Backoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.Wake(context.Background(), keyA); err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if p.calls.Load() != 3 || time.Since(start) < time.Second {
		t.Fatalf("%d calls in %v, want 3 with a 1 s Retry-After", p.calls.Load(), time.Since(start))
	}

	bad := newPlatform(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	h, _ = NewHook(HookOptions{URL: bad.srv.URL, Backoff: 10 * time.Millisecond})
	if err := h.Wake(context.Background(), keyA); err == nil || errors.Is(err, ErrCannotWake) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	if bad.calls.Load() != 1 {
		t.Fatalf("404 tried %d times, want once", bad.calls.Load())
	}
	for _, u := range []string{"", "ftp://x/", "https://user:pw@x/", "/wake", "https://x/#f"} {
		if _, err := NewHook(HookOptions{URL: u}); err == nil {
			t.Errorf("NewHook(%q) accepted", u)
		}
	}
}

// "Cannot be woken" (409 or 422) fails the held requests with the
// platform's reason and is remembered: requests within the TTL are refused
// without a hook call; after it the hook is asked again; Active forgets it.
func TestNegativeCache(t *testing.T) {
	itest.VerifyNone(t)
	for _, code := range []int{http.StatusConflict, http.StatusUnprocessableEntity} {
		p := newPlatform(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = w.Write([]byte(`{"reason":"sandbox deleted\nby its owner"}`))
		})
		c, reg := newCoordinator(t, p, Options{NegativeTTL: time.Second}, HookOptions{})
		_, err := c.Wait(context.Background(), keyA, 30*time.Second, nil)
		var cw *CannotWakeError
		if !errors.As(err, &cw) || cw.Reason != "sandbox deleted by its owner" || !errors.Is(err, ErrCannotWake) {
			t.Fatalf("%d: Wait = %v, want the platform's reason on one line", code, err)
		}
		_, err = c.Wait(context.Background(), keyA, 30*time.Second, nil)
		if !errors.As(err, &cw) || cw.Reason != "sandbox deleted by its owner" {
			t.Fatalf("%d: cached: %v", code, err)
		}
		if ra := RetryAfter(err); ra < time.Second || ra > 2*time.Second {
			t.Fatalf("RetryAfter = %v, want the rest of the 1 s TTL, rounded up", ra)
		}
		if err := c.Request(context.Background(), keyA); !errors.Is(err, ErrCannotWake) {
			t.Fatalf("Request while cached: %v", err)
		}
		if p.calls.Load() != 1 {
			t.Fatalf("%d hook calls within the TTL, want 1", p.calls.Load())
		}
		if v := testutil.ToFloat64(mustCounter(t, reg, "applistener_wake_refused_cached_total")); v != 2 {
			t.Fatalf("refused_cached %v, want 2", v)
		}
		other := Key{Workspace: "team", Sandbox: "other"}
		if _, err := c.Wait(context.Background(), other, 0, nil); !errors.Is(err, ErrHoldExpired) {
			t.Fatalf("another instance: %v", err)
		}
		itest.Eventually(t, 10*time.Second, "the hook asked for the other instance", func() bool { return p.calls.Load() == 2 })
		time.Sleep(time.Second) // the TTL under test passes
		if _, err := c.Wait(context.Background(), keyA, 30*time.Second, nil); !errors.Is(err, ErrCannotWake) {
			t.Fatalf("after the TTL: %v", err)
		}
		if p.calls.Load() != 3 {
			t.Fatalf("after the TTL: %d hook calls, want 3", p.calls.Load())
		}
		c.Active(keyA) // forgets the refusal
		c.Active(other)
		if n := c.tracked.Load(); n != 0 {
			t.Fatalf("%d tracked after Active, want 0", n)
		}
	}
}

// Overflow of the per-instance or per-process bound answers at once and
// starts nothing; other instances are unaffected by one's bound.
func TestOverflow(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, nil)
	c, reg := newCoordinator(t, p, Options{MaxHeldPerInstance: 3, MaxHeld: 5}, HookOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	hold := func(k Key) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.Wait(ctx, k, 30*time.Second, nil)
		}()
	}
	for i := range 3 {
		hold(keyA)
		itest.Eventually(t, 10*time.Second, "held", func() bool { return c.Held() == i+1 })
	}
	start := time.Now()
	if _, err := c.Wait(context.Background(), keyA, 30*time.Second, nil); !errors.Is(err, ErrOverflow) || time.Since(start) > time.Second {
		t.Fatalf("4th request for one instance: %v after %v, want ErrOverflow at once", err, time.Since(start))
	}
	b := Key{Workspace: "team", Sandbox: "b"}
	hold(b)
	hold(b)
	itest.Eventually(t, 10*time.Second, "5 held", func() bool { return c.Held() == 5 })
	cKey := Key{Workspace: "team", Sandbox: "c"}
	if _, err := c.Wait(context.Background(), cKey, 30*time.Second, nil); !errors.Is(err, ErrOverflow) {
		t.Fatalf("6th request in the process: %v, want ErrOverflow", err)
	}
	itest.Eventually(t, 10*time.Second, "two hook calls", func() bool { return p.calls.Load() == 2 })
	c.Active(b) // room again
	itest.Eventually(t, 10*time.Second, "b released", func() bool { return c.Held() == 3 })
	done := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background(), cKey, 30*time.Second, nil)
		done <- err
	}()
	itest.Eventually(t, 10*time.Second, "c held", func() bool { return c.Held() == 4 })
	// The hook is asked from a goroutine of its own: made active before
	// that, c's wake would end without a call.
	itest.Eventually(t, 10*time.Second, "c's hook call", func() bool { return p.calls.Load() == 3 })
	c.Active(cKey)
	if err := <-done; err != nil {
		t.Fatalf("c after room: %v", err)
	}
	if p.calls.Load() != 3 {
		t.Fatalf("%d hook calls, want 3 (a, b, c; none for an overflow)", p.calls.Load())
	}
	if v := testutil.ToFloat64(mustCounter(t, reg, "applistener_wake_overflow_total")); v != 2 {
		t.Fatalf("overflow counter %v, want 2", v)
	}
}

// Request coalesces concurrent callers on one hook call and returns its
// answer; with EndOnAccept the next Request asks again.
func TestRequestRelay(t *testing.T) {
	itest.VerifyNone(t)
	release := make(chan struct{})
	p := newPlatform(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
	c, _ := newCoordinator(t, p, Options{EndOnAccept: true}, HookOptions{})
	errs := make(chan error, 10)
	for range 10 {
		go func() { errs <- c.Request(context.Background(), keyA) }()
	}
	itest.Eventually(t, 10*time.Second, "the hook called", func() bool { return p.calls.Load() == 1 })
	// Every request has joined before the platform answers (one that
	// started only after the answer would rightly ask again).
	itest.Eventually(t, 10*time.Second, "the other nine requests joined the wake", func() bool {
		return testutil.ToFloat64(c.m.coalesced) == 9
	})
	close(release)
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatalf("Request: %v", err)
		}
	}
	if err := c.Request(context.Background(), keyA); err != nil || p.calls.Load() != 2 {
		t.Fatalf("after accept: %v, %d calls (want 2)", err, p.calls.Load())
	}
}

// Close fails held requests and cancels a hook call in progress.
func TestClose(t *testing.T) {
	itest.VerifyNone(t)
	p := newPlatform(t, func(_ int64, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	c, _ := newCoordinator(t, p, Options{}, HookOptions{Timeout: time.Minute})
	done := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background(), keyA, time.Minute, nil)
		done <- err
	}()
	itest.Eventually(t, 10*time.Second, "hook called", func() bool { return p.calls.Load() == 1 })
	c.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
	if _, err := c.Wait(context.Background(), keyA, time.Second, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait on a closed coordinator: %v", err)
	}
}

// Active on an instance with nothing pending takes no lock and allocates
// nothing (the data plane may call it on every table change).
func TestActiveAllocatesNothing(t *testing.T) {
	c, err := New(Options{Waker: WakerFunc(func(context.Context, Key) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := testing.AllocsPerRun(1000, func() { c.Active(keyA) }); n != 0 {
		t.Fatalf("Active allocates %v times", n)
	}
	calls := 0
	c.Sync(func(Key) bool { calls++; return true })
	if calls != 0 {
		t.Fatalf("Sync with nothing pending asked %d times", calls)
	}
}

// Sync releases the wakes whose instance is active.
func TestSync(t *testing.T) {
	itest.VerifyNone(t)
	c, err := New(Options{Waker: WakerFunc(func(context.Context, Key) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := Key{Workspace: "team", Sandbox: "b"}
	res := make(chan error, 2)
	for _, k := range []Key{keyA, b} {
		go func() {
			_, err := c.Wait(context.Background(), k, 30*time.Second, nil)
			res <- err
		}()
	}
	itest.Eventually(t, 10*time.Second, "two held", func() bool { return c.Held() == 2 })
	c.Sync(func(k Key) bool { return k == b })
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if c.Held() != 1 {
		t.Fatalf("%d held, want 1 (a still sleeping)", c.Held())
	}
	c.Sync(func(Key) bool { return true })
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered(t, reg, name, "")
}

func mustCounterVec(t *testing.T, reg *prometheus.Registry, name, result string) prometheus.Collector {
	t.Helper()
	return gathered(t, reg, name, result)
}

// gathered returns a collector of the value of metric name (with
// result="result" when result is set) as gathered from reg.
func gathered(t *testing.T, reg *prometheus.Registry, name, result string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if result != "" {
				match := false
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == result {
						match = true
					}
				}
				if !match {
					continue
				}
			}
			if m.GetCounter() != nil {
				v += m.GetCounter().GetValue()
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	g.Set(v)
	return g
}

// RequestWhile starts no wake once its condition says the instance is no
// longer sleeping (the gateway read it sleeping, then it turned active and
// Sync ended the wake), yet joins a wake in progress without asking.
func TestRequestWhileNotSleeping(t *testing.T) {
	itest.VerifyNone(t)
	release := make(chan struct{})
	p := newPlatform(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
	c, reg := newCoordinator(t, p, Options{EndOnAccept: true}, HookOptions{})
	asked := 0
	awake := func() bool { asked++; return false }
	if err := c.RequestWhile(context.Background(), keyA, awake); !errors.Is(err, ErrNotSleeping) {
		t.Fatalf("RequestWhile with the instance awake: %v, want ErrNotSleeping", err)
	}
	if asked != 1 || p.calls.Load() != 0 {
		t.Fatalf("condition asked %d times, %d hook calls; want 1 and 0", asked, p.calls.Load())
	}
	first := make(chan error, 1)
	go func() { first <- c.RequestWhile(context.Background(), keyA, func() bool { return true }) }()
	itest.Eventually(t, 10*time.Second, "the hook called", func() bool { return p.calls.Load() == 1 })
	joined := make(chan error, 1)
	go func() { joined <- c.RequestWhile(context.Background(), keyA, func() bool { return false }) }()
	itest.Eventually(t, 10*time.Second, "the second request joined", func() bool {
		return testutil.ToFloat64(mustCounter(t, reg, "applistener_wake_coalesced_total")) == 1
	})
	close(release)
	for _, ch := range []chan error{first, joined} {
		if err := <-ch; err != nil {
			t.Fatalf("RequestWhile: %v", err)
		}
	}
	if p.calls.Load() != 1 {
		t.Fatalf("%d hook calls, want 1", p.calls.Load())
	}
}
