package testutil

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTB records what a helper reports instead of failing the test that
// runs it. Unlike a real one, its Fatalf returns. Methods it does not
// define panic (the embedded testing.TB is nil).
type fakeTB struct {
	testing.TB

	mu       sync.Mutex
	fatals   []string
	errors   []string
	cleanups []func()
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Error(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprint(args...))
}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// runCleanups runs the registered cleanups, last registered first, as the
// testing package does.
func (f *fakeTB) runCleanups() {
	f.mu.Lock()
	fns := f.cleanups
	f.cleanups = nil
	f.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

func (f *fakeTB) reports() (fatals, errors []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.fatals...), append([]string(nil), f.errors...)
}

func TestEventuallyFailsOnTimeout(t *testing.T) {
	var f fakeTB
	calls := 0
	start := time.Now()
	Eventually(&f, 30*time.Millisecond, "the impossible", func() bool { calls++; return false })
	elapsed := time.Since(start)
	fatals, errs := f.reports()
	if want := "timed out after 30ms waiting for the impossible"; len(fatals) != 1 || fatals[0] != want {
		t.Fatalf("Fatalf calls %q, want exactly %q", fatals, want)
	}
	if len(errs) != 0 {
		t.Fatalf("Error calls %q, want none", errs)
	}
	if elapsed < 30*time.Millisecond {
		t.Fatalf("gave up after %v, before the 30ms were over", elapsed)
	}
	if calls < 2 {
		t.Fatalf("cond called %d times in 30ms; want it polled", calls)
	}
}

func TestEventuallySucceedsWhenConditionTurnsTrue(t *testing.T) {
	// Turned true by another goroutine after a while.
	var f fakeTB
	var ready atomic.Bool
	timer := time.AfterFunc(20*time.Millisecond, func() { ready.Store(true) })
	defer timer.Stop()
	start := time.Now()
	Eventually(&f, 10*time.Second, "the flag", ready.Load)
	if fatals, _ := f.reports(); len(fatals) != 0 {
		t.Fatalf("Fatalf calls %q, want none", fatals)
	}
	if !ready.Load() {
		t.Fatal("returned before the condition held")
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("returned %v after the start; want soon after the condition held (20ms)", elapsed)
	}

	// True on the fifth check: no check after that one.
	calls := 0
	Eventually(&f, 10*time.Second, "the fifth call", func() bool { calls++; return calls == 5 })
	if fatals, _ := f.reports(); len(fatals) != 0 || calls != 5 {
		t.Fatalf("Fatalf calls %q, cond calls %d; want none and 5", fatals, calls)
	}

	// Already true: one check, no wait.
	calls = 0
	start = time.Now()
	Eventually(&f, 0, "a true condition", func() bool { calls++; return true })
	if fatals, _ := f.reports(); len(fatals) != 0 || calls != 1 {
		t.Fatalf("Fatalf calls %q, cond calls %d; want none and 1", fatals, calls)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("waited %v for a condition that held at once", elapsed)
	}
}

// parkGoroutine starts a goroutine that blocks until release is called;
// release returns once it has ended.
func parkGoroutine() (release func()) {
	stop := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		<-stop
	}()
	return func() { close(stop); <-exited }
}

func TestVerifyNoneReportsALeak(t *testing.T) {
	defer func(d time.Duration) { leakWait = d }(leakWait)
	leakWait = 100 * time.Millisecond
	var f fakeTB
	VerifyNone(&f)
	if fatals, errs := f.reports(); len(fatals)+len(errs) != 0 {
		t.Fatalf("reported before the test ended: %q %q", fatals, errs)
	}
	release := parkGoroutine()
	f.runCleanups()
	release()
	_, errs := f.reports()
	if len(errs) != 1 || !strings.Contains(errs[0], "found unexpected goroutines") || !strings.Contains(errs[0], "parkGoroutine") {
		t.Fatalf("Error calls %q, want one naming the goroutine the test left", errs)
	}
}

func TestVerifyNoneWithoutLeaks(t *testing.T) {
	var f fakeTB
	VerifyNone(&f)
	// A goroutine that has ended by the cleanup is no leak.
	parkGoroutine()()
	f.runCleanups()
	if fatals, errs := f.reports(); len(fatals)+len(errs) != 0 {
		t.Fatalf("reported %q %q; nothing leaked", fatals, errs)
	}

	// Options reach goleak: goroutines running when IgnoreCurrent was taken
	// are not reported.
	release := parkGoroutine()
	var g fakeTB
	VerifyNone(&g, goleak.IgnoreCurrent())
	g.runCleanups()
	release()
	if fatals, errs := g.reports(); len(fatals)+len(errs) != 0 {
		t.Fatalf("reported %q %q; the goroutine was running before, and ignored", fatals, errs)
	}
}

// TestVerifyNoneWaitsForEndingGoroutines: a goroutine that ends a second
// after the test, longer than goleak's own retries (about 0.4 s), as a
// closed connection's may on a loaded machine, is no leak.
func TestVerifyNoneWaitsForEndingGoroutines(t *testing.T) {
	var f fakeTB
	VerifyNone(&f)
	release := parkGoroutine()
	ended := make(chan struct{})
	timer := time.AfterFunc(time.Second, func() { release(); close(ended) }) // the goroutine's life, not a wait
	defer timer.Stop()
	f.runCleanups()
	if fatals, errs := f.reports(); len(fatals)+len(errs) != 0 {
		t.Fatalf("reported %q %q; the goroutine was ending", fatals, errs)
	}
	<-ended
}

// TestRunOrder: Names returns what Note recorded, in order, as a copy.
func TestRunOrder(t *testing.T) {
	var o RunOrder
	o.Note("a")
	o.Note("b")
	got := o.Names()
	got[0] = "changed"
	if names := o.Names(); len(names) != 2 || names[0] != "a" || names[1] != "b" {
		t.Errorf("Names = %v, want [a b]", names)
	}
}
