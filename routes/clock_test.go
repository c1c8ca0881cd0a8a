package routes

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a manual Clock for tests. Time only moves when the test says
// so. Timers created by AfterFunc run synchronously, in the goroutine that
// calls Advance or Fire, in deadline order (creation order for equal
// deadlines), and never while the fake clock's own lock is held, so a timer
// function may call back into the clock (Now, AfterFunc, Stop).
//
// Unlike time.AfterFunc, a due function does not run in its own goroutine:
// tests stay deterministic, and a caller of Advance must not hold any lock
// that the timer function takes.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer // pending timers, unordered
}

// fakeTimer is one pending AfterFunc.
type fakeTimer struct {
	clock *fakeClock
	when  time.Time
	seq   uint64
	f     func()
}

// fakeEpoch is the fake clock's initial time: a fixed, non-zero instant.
var fakeEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func newFakeClock() *fakeClock { return &fakeClock{now: fakeEpoch} }

// Now returns the fake time.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d. A d ≤ 0 timer is due at once but, like
// every fake timer, only runs on the next Advance or Fire.
func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{clock: c, when: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer; it reports whether the timer was still pending
// (false once it has run or been stopped).
func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.timers {
		if p == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock forward by d, running every timer that falls due
// on the way, in deadline order. While a timer runs, Now returns its
// deadline. Timers scheduled by a running timer also run if they fall due
// before the target time.
func (c *fakeClock) Advance(d time.Duration) {
	if d < 0 {
		panic("fakeClock: negative Advance")
	}
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	c.runUntil(target)
}

// Fire runs the timers that are due at the current time without moving it.
func (c *fakeClock) Fire() { c.runUntil(c.Now()) }

// Skip moves the clock forward by d WITHOUT running any timer: it models a
// timer goroutine that has not been scheduled yet. A later Fire or Advance
// runs the timers that became due.
func (c *fakeClock) Skip(d time.Duration) {
	if d < 0 {
		panic("fakeClock: negative Skip")
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Pending returns the number of timers not yet run or stopped.
func (c *fakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// runUntil runs due timers one at a time, each outside the lock, then sets
// the clock to target (unless it is already later).
func (c *fakeClock) runUntil(target time.Time) {
	for {
		c.mu.Lock()
		next := -1
		for i, t := range c.timers {
			if t.when.After(target) {
				continue
			}
			if next < 0 || t.when.Before(c.timers[next].when) ||
				(t.when.Equal(c.timers[next].when) && t.seq < c.timers[next].seq) {
				next = i
			}
		}
		if next < 0 {
			if target.After(c.now) {
				c.now = target
			}
			c.mu.Unlock()
			return
		}
		t := c.timers[next]
		c.timers = append(c.timers[:next], c.timers[next+1:]...)
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
	}
}

// The fake clock is tested on its own so that a table test failure cannot be
// blamed on it.
func TestFakeClock(t *testing.T) {
	c := newFakeClock()
	var _ Clock = c
	if !c.Now().Equal(fakeEpoch) {
		t.Fatalf("Now = %v, want %v", c.Now(), fakeEpoch)
	}

	var order []string
	var seenAt []time.Duration
	record := func(name string) func() {
		return func() {
			order = append(order, name)
			seenAt = append(seenAt, c.Now().Sub(fakeEpoch))
		}
	}
	c.AfterFunc(3*time.Second, record("c3"))
	c.AfterFunc(1*time.Second, record("a1"))
	stopped := c.AfterFunc(2*time.Second, record("stopped"))
	c.AfterFunc(2*time.Second, record("b2"))
	c.AfterFunc(2*time.Second, func() {
		record("b2-second")()
		// A timer scheduled from a timer, due before the target: runs in this Advance.
		c.AfterFunc(500*time.Millisecond, record("nested2.5"))
		// Due after the target: stays pending.
		c.AfterFunc(10*time.Second, record("nested12"))
	})
	if !stopped.Stop() {
		t.Error("Stop of a pending timer = false, want true")
	}
	if stopped.Stop() {
		t.Error("second Stop = true, want false")
	}
	if n := c.Pending(); n != 4 {
		t.Errorf("Pending = %d, want 4", n)
	}

	c.Advance(999 * time.Millisecond)
	if len(order) != 0 {
		t.Fatalf("timers ran early: %v", order)
	}
	c.Advance(2001 * time.Millisecond) // now = +3s
	want := []string{"a1", "b2", "b2-second", "nested2.5", "c3"}
	if len(order) != len(want) {
		t.Fatalf("ran %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("ran %v, want %v", order, want)
		}
	}
	wantAt := []time.Duration{time.Second, 2 * time.Second, 2 * time.Second, 2500 * time.Millisecond, 3 * time.Second}
	for i := range wantAt {
		if seenAt[i] != wantAt[i] {
			t.Errorf("timer %s saw Now = +%v, want +%v", order[i], seenAt[i], wantAt[i])
		}
	}
	if got := c.Now().Sub(fakeEpoch); got != 3*time.Second {
		t.Errorf("Now after Advance = +%v, want +3s", got)
	}
	if n := c.Pending(); n != 1 {
		t.Errorf("Pending = %d, want 1 (nested12)", n)
	}

	// Skip moves time without running timers; Fire runs what is due.
	order = nil
	c.Skip(20 * time.Second)
	if len(order) != 0 {
		t.Fatalf("Skip ran timers: %v", order)
	}
	c.Fire()
	if len(order) != 1 || order[0] != "nested12" {
		t.Fatalf("Fire ran %v, want [nested12]", order)
	}
	if got := c.Now().Sub(fakeEpoch); got != 23*time.Second {
		t.Errorf("Now after Skip+Fire = +%v, want +23s (Fire must not move time backwards)", got)
	}

	// A timer that stops itself or another timer while running must not deadlock.
	var other Timer
	ran := false
	self := c.AfterFunc(time.Second, func() { other.Stop() })
	other = c.AfterFunc(2*time.Second, func() { ran = true })
	c.Advance(5 * time.Second)
	if ran {
		t.Error("timer stopped by another timer still ran")
	}
	if self.Stop() {
		t.Error("Stop after the timer ran = true, want false")
	}
}
