package fairshare

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manual clock; its timer never fires by itself (tests call
// onLease).
// It records the duration of the latest timer armed.
type fakeClock struct{ t, armed atomic.Int64 }

func (c *fakeClock) now() int64              { return c.t.Load() }
func (c *fakeClock) advance(d time.Duration) { c.t.Add(int64(d)) }
func (c *fakeClock) timer(d time.Duration, _ func()) stopper {
	c.armed.Store(int64(d))
	return fakeTimer{}
}

type fakeTimer struct{}

func (fakeTimer) Stop() bool { return true }

func newTest(t *testing.T, slots int) (*Scheduler, *fakeClock, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := New(Config{Slots: slots, Lease: 5 * time.Millisecond, Registerer: reg})
	c := &fakeClock{}
	c.t.Store(int64(time.Hour))
	s.now, s.timer = c.now, c.timer
	t.Cleanup(s.Close)
	return s, c, reg
}

// queued is one Admit waiting in the background.
type queued struct {
	name string
	got  chan Ticket
	err  chan error
}

// enqueue starts an Admit of f and waits until it is queued (the
// scheduler's waiter count reaches want).
func enqueue(t *testing.T, s *Scheduler, f *Flow, name string, done <-chan struct{}, want int, wg *sync.WaitGroup) *queued {
	t.Helper()
	q := &queued{name: name, got: make(chan Ticket, 1), err: make(chan error, 1)}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk, err := s.Admit(f, KindRequest, done, 0)
		if err != nil {
			q.err <- err
			return
		}
		q.got <- tk
	}()
	waitFor(t, func() bool { return s.Waiting() == want })
	return q
}

// settle waits for a queued Admit's locked section (it counts itself
// waiting before it reclaims and arms the timer under the same lock).
func settle(s *Scheduler) {
	s.mu.Lock()
	s.mu.Unlock() //nolint:staticcheck // an empty critical section: waiting for the holder is the point
}

// TestStampAfterTheClock: reclaimLocked reads the clock before it loads
// the slots, and a light flow may take a slot without the lock in between:
// its stamp is then later than the clock read, its age negative (it wraps
// to 35 minutes). Such a slot is not taken over; one held that long
// truly (whose age does not change on a second read) is.
func TestStampAfterTheClock(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	fresh, _ := s.TryAdmit() // stamped at the clock's time
	clock.advance(-time.Microsecond)
	reads := 0
	s.now = func() int64 { // the reclaim's first read comes before the stamp
		reads++
		if reads == 1 {
			return clock.now()
		}
		return clock.now() + int64(2*time.Microsecond)
	}
	var f Flow
	s.mu.Lock()
	w := s.waiter.Get().(*waiter)
	w.flow = &f
	s.enqueueLocked(w)
	s.reclaimLocked()
	s.mu.Unlock()
	if got := testutil.ToFloat64(s.m.takeovers); got != 0 {
		t.Fatalf("a slot stamped after the clock was read was taken over (%v takeovers)", got)
	}
	// The same slot, truly held for 20 minutes: taken over for the waiter.
	s.now = clock.now
	clock.advance(20 * time.Minute)
	s.mu.Lock()
	s.reclaimLocked()
	s.mu.Unlock()
	if got := testutil.ToFloat64(s.m.takeovers); got != 1 {
		t.Fatalf("a slot held for 20 minutes was not taken over (%v takeovers)", got)
	}
	tk := <-w.ready
	if s.Release(fresh) {
		t.Error("the taken-over holder's release took effect")
	}
	s.Release(tk)
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("after all: taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// order releases held and then each granted ticket in turn, returning the
// names in the order they were admitted.
func order(t *testing.T, s *Scheduler, held Ticket, qs []*queued) []string {
	t.Helper()
	var names []string
	cur := held
	for range qs {
		s.Release(cur)
		var next *queued
		deadline := time.After(10 * time.Second)
		for next == nil {
			for _, q := range qs {
				select {
				case tk := <-q.got:
					if next != nil {
						t.Fatalf("%s and %s admitted by one release", next.name, q.name)
					}
					next, cur = q, tk
				default:
				}
			}
			if next == nil {
				select {
				case <-deadline:
					t.Fatalf("nothing admitted after %v", names)
				case <-time.After(time.Millisecond):
				}
			}
		}
		names = append(names, next.name)
	}
	s.Release(cur)
	return names
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoundRobinAcrossFlowsFIFOWithin(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, ok := s.TryAdmit()
	if !ok {
		t.Fatal("uncontended TryAdmit failed")
	}
	var a, b, c Flow
	var wg sync.WaitGroup
	var qs []*queued
	for i, x := range []struct {
		f    *Flow
		name string
	}{{&a, "a1"}, {&a, "a2"}, {&a, "a3"}, {&a, "a4"}, {&b, "b1"}, {&b, "b2"}, {&c, "c1"}} {
		qs = append(qs, enqueue(t, s, x.f, x.name, nil, i+1, &wg))
	}
	got := order(t, s, held, qs)
	want := []string{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}
	if !equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
	wg.Wait()
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("after all releases: taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
	if a.Waits() != 4 || b.Waits() != 2 || c.Waits() != 1 {
		t.Errorf("waits a %d b %d c %d, want 4 2 1", a.Waits(), b.Waits(), c.Waits())
	}
}

func TestWeights(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	var heavy, light Flow
	heavy.SetWeight(3)
	var wg sync.WaitGroup
	var qs []*queued
	n := 0
	for i := range 6 {
		n++
		qs = append(qs, enqueue(t, s, &heavy, "h"+string(rune('1'+i)), nil, n, &wg))
	}
	for i := range 3 {
		n++
		qs = append(qs, enqueue(t, s, &light, "l"+string(rune('1'+i)), nil, n, &wg))
	}
	got := order(t, s, held, qs)
	want := []string{"h1", "h2", "h3", "l1", "h4", "h5", "h6", "l2", "l3"}
	if !equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
	wg.Wait()
	if heavy.Weight() != 3 || light.Weight() != 1 {
		t.Errorf("weights %d %d", heavy.Weight(), light.Weight())
	}
	heavy.SetWeight(1000)
	if heavy.Weight() != MaxWeight {
		t.Errorf("weight 1000 clamped to %d, want %d", heavy.Weight(), MaxWeight)
	}
}

func TestReleaseHandsSlotToWaiter(t *testing.T) {
	s, _, reg := newTest(t, 2)
	t1, _ := s.TryAdmit()
	t2, _ := s.TryAdmit()
	if _, ok := s.TryAdmit(); ok {
		t.Fatal("a third admission with two slots")
	}
	if !s.Contended() {
		t.Error("not contended with every slot taken")
	}
	var f Flow
	var wg sync.WaitGroup
	q := enqueue(t, s, &f, "w", nil, 1, &wg)
	if got := testutil.ToFloat64(s.m.waiting); got != 1 {
		t.Errorf("applistener_fair_waiting %v, want 1", got)
	}
	s.Release(t1)
	tk := <-q.got
	wg.Wait()
	if tk.slot != t1.slot || tk.gen == t1.gen {
		t.Errorf("waiter got %+v after release of %+v", tk, t1)
	}
	if s.taken.Load() != 3 {
		t.Errorf("taken %b, want both slots still taken", s.taken.Load())
	}
	s.Release(t1) // twice: a no-op
	if s.taken.Load() != 3 {
		t.Errorf("second release of a ticket freed a slot: %b", s.taken.Load())
	}
	s.Release(tk)
	s.Release(t2)
	if s.taken.Load() != 0 || s.Contended() {
		t.Errorf("after releases: taken %b", s.taken.Load())
	}
	if n := testutil.CollectAndCount(reg, "applistener_fair_wait_seconds"); n != 3 {
		t.Errorf("%d wait series, want one per kind", n)
	}
}

func TestLeaseTakeover(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	old, _ := s.TryAdmit()
	var f Flow
	var wg sync.WaitGroup
	q := enqueue(t, s, &f, "w", nil, 1, &wg)
	clock.advance(4 * time.Millisecond)
	s.onLease()
	select {
	case <-q.got:
		t.Fatal("taken over before the lease ended")
	default:
	}
	clock.advance(time.Millisecond)
	s.onLease()
	tk := <-q.got
	wg.Wait()
	if got := testutil.ToFloat64(s.m.takeovers); got != 1 {
		t.Errorf("takeovers %v, want 1", got)
	}
	s.Release(old) // the old holder's release: a no-op
	if s.taken.Load() != 1 {
		t.Fatalf("old holder's release freed the taken-over slot: taken %b", s.taken.Load())
	}
	if _, ok := s.TryAdmit(); ok {
		t.Fatal("admitted past the only slot after the old holder's release")
	}
	s.Release(tk)
	if s.taken.Load() != 0 {
		t.Errorf("new holder's release did not free the slot: %b", s.taken.Load())
	}
}

func TestLeaseTimerDuration(t *testing.T) {
	s, clock, _ := newTest(t, 2)
	t1, _ := s.TryAdmit()
	clock.advance(3 * time.Millisecond)
	t2, _ := s.TryAdmit()
	s.mu.Lock()
	d := s.untilExpiryLocked()
	s.mu.Unlock()
	if d != int64(2*time.Millisecond) {
		t.Errorf("until expiry %v, want 2ms (the oldest slot's remaining lease)", time.Duration(d))
	}
	s.Release(t1)
	s.Release(t2)
}

// TestReleaseReclaims: a release while others queue also takes over, for
// the next waiter, any other slot held past its lease, without the lease
// timer (the timer is a backstop: it would start a goroutine, which takes
// the processor's next place from a neighbour's goroutine just started).
func TestReleaseReclaims(t *testing.T) {
	s, clock, _ := newTest(t, 2)
	old, _ := s.TryAdmit()
	clock.advance(3 * time.Millisecond)
	young, _ := s.TryAdmit()
	var a, b Flow
	var wg sync.WaitGroup
	qa := enqueue(t, s, &a, "a", nil, 1, &wg)
	qb := enqueue(t, s, &b, "b", nil, 2, &wg)
	settle(s)
	clock.advance(2 * time.Millisecond) // old's lease (5 ms) ends; young's does not
	s.Release(young)
	ta := <-qa.got // young's slot
	var tb Ticket
	select {
	case tb = <-qb.got: // old's slot, taken over by the release
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not take over the slot held past its lease")
	}
	wg.Wait()
	if got := testutil.ToFloat64(s.m.takeovers); got != 1 {
		t.Errorf("takeovers %v, want 1", got)
	}
	if s.Release(old) {
		t.Error("the old holder's release took effect after the takeover")
	}
	s.Release(ta)
	s.Release(tb)
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("after all: taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
}

// TestLeaseTimerIsABackstop: the lease timer is armed a lease after the
// oldest slot's lease ends, for when nothing is released or queued
// meanwhile (releases and queued admissions reclaim on time).
func TestLeaseTimerIsABackstop(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	clock.advance(time.Millisecond)
	var f Flow
	var wg sync.WaitGroup
	q := enqueue(t, s, &f, "w", nil, 1, &wg)
	settle(s)
	if got, want := time.Duration(clock.armed.Load()), 4*time.Millisecond+s.Lease(); got != want {
		t.Errorf("lease timer armed for %v, want %v (the oldest slot's remaining lease, plus a lease)", got, want)
	}
	s.Release(held)
	s.Release(<-q.got)
	wg.Wait()
}

func TestCancelWhileQueued(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	var a, b Flow
	var wg sync.WaitGroup
	done := make(chan struct{})
	qa := enqueue(t, s, &a, "a", done, 1, &wg)
	qb := enqueue(t, s, &b, "b", nil, 2, &wg)
	close(done)
	if err := <-qa.err; !errors.Is(err, ErrCancelled) {
		t.Errorf("cancelled Admit: %v", err)
	}
	if s.Waiting() != 1 {
		t.Errorf("waiting %d after a cancel, want 1", s.Waiting())
	}
	s.Release(held)
	tk := <-qb.got
	s.Release(tk)
	wg.Wait()
	if s.taken.Load() != 0 || s.Waiting() != 0 || s.ring != nil {
		t.Errorf("after all: taken %b, waiting %d, ring %v", s.taken.Load(), s.Waiting(), s.ring)
	}
}

func TestTimeoutWhileQueued(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	var f Flow
	if _, err := s.Admit(&f, KindHandshake, nil, 10*time.Millisecond); !errors.Is(err, ErrCancelled) {
		t.Errorf("Admit with a timeout: %v", err)
	}
	s.Release(held)
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
}

// TestCancelRacesGrant cancels waiters while slots are released: whether a
// waiter was granted before it saw its cancel or not, no slot is lost.
func TestCancelRacesGrant(t *testing.T) {
	s := New(Config{Slots: 2, Lease: time.Hour})
	defer s.Close()
	var f Flow
	for range 200 {
		t1, _ := s.TryAdmit()
		t2, _ := s.TryAdmit()
		done := make(chan struct{})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if tk, err := s.Admit(&f, KindRequest, done, 0); err == nil {
					s.Release(tk)
				}
			})
		}
		waitFor(t, func() bool { return s.Waiting() > 0 })
		go close(done)
		s.Release(t1)
		s.Release(t2)
		wg.Wait()
		if s.taken.Load() != 0 || s.Waiting() != 0 {
			t.Fatalf("slot lost: taken %b, waiting %d", s.taken.Load(), s.Waiting())
		}
	}
}

func TestNilSchedulerAdmitsAll(t *testing.T) {
	var s *Scheduler
	tk, err := s.Admit(nil, KindRequest, nil, 0)
	if err != nil || tk.Valid() || s.Contended() {
		t.Errorf("nil scheduler: %+v %v", tk, err)
	}
	s.Release(tk)
	s.Close()
}

func TestDefaultSlots(t *testing.T) {
	s := New(Config{})
	if s.Slots() < SlotsPerProc || s.Slots() > MaxSlots || s.Lease() != DefaultLease {
		t.Errorf("slots %d lease %v", s.Slots(), s.Lease())
	}
	if New(Config{Slots: 1000}).Slots() != MaxSlots {
		t.Error("slots not capped at MaxSlots")
	}
	full := New(Config{Slots: MaxSlots})
	for range MaxSlots {
		if _, ok := full.TryAdmit(); !ok {
			t.Fatal("could not take all 64 slots")
		}
	}
	if _, ok := full.TryAdmit(); ok {
		t.Error("a 65th admission")
	}
}

func TestUncontendedAdmitAllocatesNothing(t *testing.T) {
	s := New(Config{Slots: 4})
	var f Flow
	allocs := testing.AllocsPerRun(1000, func() {
		tk, err := s.Admit(&f, KindRequest, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		s.Release(tk)
		if s.Contended() {
			t.Fatal("contended")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per uncontended Admit/Release", allocs)
	}
}

// TestStress admits from many goroutines of several flows with a short
// real lease and cancellations: a current ticket's slot is never marked
// free, every admission ends in an effective release or a takeover,
// and no slot is lost at the end.
func TestStress(t *testing.T) {
	const slots = 3
	s := New(Config{Slots: slots, Lease: 200 * time.Microsecond})
	defer s.Close()
	flows := make([]Flow, 4)
	var admitted, released, over atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			f := &flows[g%len(flows)]
			f.SetWeight(1 + g%3)
			for range 300 {
				var done chan struct{}
				if r.IntN(10) == 0 {
					done = make(chan struct{})
					close(done)
				}
				tk, err := s.Admit(f, KindRequest, done, 0)
				if err != nil {
					continue
				}
				admitted.Add(1)
				// While the ticket is current its slot is marked taken
				// (read the bitmap first: a ticket current after it was
				// current at it).
				b := s.taken.Load()
				if w := s.slot[tk.slot].Load(); genOf(w) == tk.gen && w&heldBit != 0 && b&(1<<tk.slot) == 0 {
					over.Add(1)
				}
				if s.heldSlots() > slots {
					over.Add(1)
				}
				if r.IntN(20) == 0 {
					time.Sleep(300 * time.Microsecond) // past the lease
				}
				if s.Release(tk) {
					released.Add(1)
				}
			}
		})
	}
	wg.Wait()
	takeovers := int64(testutil.ToFloat64(s.m.takeovers))
	// A takeover may grant a waiter that was cancelled meanwhile (its
	// Admit passes the slot on), so takeovers may exceed the admissions
	// that ended in one.
	if a, r := admitted.Load(), released.Load(); r > a || a > r+takeovers {
		t.Errorf("%d admissions, %d effective releases + %d takeovers", admitted.Load(), released.Load(), takeovers)
	}
	if over.Load() != 0 {
		t.Errorf("%d times a current ticket's slot marked free, or more held slots than %d", over.Load(), slots)
	}
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("at the end: taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
}

// heldSlots counts the slots whose ticket is out.
func (s *Scheduler) heldSlots() int {
	n := 0
	for i := range s.n {
		if s.slot[i].Load()&heldBit != 0 {
			n++
		}
	}
	return n
}

func TestAdmitEitherCancelledBySecond(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	var f Flow
	also := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		_, err := s.AdmitEither(&f, KindRequest, nil, also)
		got <- err
	}()
	waitFor(t, func() bool { return s.Waiting() == 1 })
	close(also)
	if err := <-got; !errors.Is(err, ErrCancelled) {
		t.Errorf("AdmitEither after its second channel closed: %v", err)
	}
	s.Release(held)
	if s.taken.Load() != 0 || s.Waiting() != 0 {
		t.Errorf("taken %b, waiting %d", s.taken.Load(), s.Waiting())
	}
}

// TestSoloWindow: a flow that has been the only one admitted for the solo
// window is admitted at once (the zero Ticket) even with every slot taken;
// the first admission of another flow ends that, and from then on both
// queue in turn. Without a window (the zero Config) nothing changes.
func TestSoloWindow(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	s.solo = int64(time.Second)
	s.lease = int64(time.Hour) // no takeover while the clock moves on
	var a, b Flow
	held, err := s.Admit(&a, KindRequest, nil, 0)
	if err != nil || !held.Valid() {
		t.Fatalf("first admission: %+v %v", held, err)
	}
	if _, ok := s.TryAdmitFlow(&a); ok {
		t.Fatal("admitted beyond the slots before the flow was alone for the window")
	}
	clock.advance(time.Second)
	tk, ok := s.TryAdmitFlow(&a)
	if !ok || tk.Valid() {
		t.Fatalf("alone for the window: admitted %v with %+v, want the zero Ticket", ok, tk)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = s.TryAdmitFlow(&a) }); allocs != 0 {
		t.Errorf("%v allocations per solo admission", allocs)
	}
	// Another flow arrives: it queues for the slot, and so does a again.
	var wg sync.WaitGroup
	qb := enqueue(t, s, &b, "b", nil, 1, &wg)
	if _, ok := s.TryAdmitFlow(&a); ok {
		t.Fatal("a admitted beyond the slots while b waits")
	}
	s.Release(held)
	tb := <-qb.got
	wg.Wait()
	clock.advance(time.Second / 2)
	if _, ok := s.TryAdmitFlow(&a); ok {
		t.Fatal("a admitted beyond the slots half a window after b")
	}
	s.Release(tb)

	off, offClock, _ := newTest(t, 1) // SoloWindow 0
	h, _ := off.Admit(&a, KindRequest, nil, 0)
	offClock.advance(time.Hour)
	if _, ok := off.TryAdmitFlow(&a); ok {
		t.Fatal("admitted beyond the slots without a solo window")
	}
	off.Release(h)
}

// TestReserveForLightFlows: with 9 slots one is kept for flows that hold
// none, and such a flow is always admitted. A flood that took every slot
// before anyone queued cannot stop a neighbour's first request, which is
// admitted beyond the slots (once: its second queues); the flood's
// releases are then kept free while only the reserve would be left, so
// that a newcomer takes a free slot at once, and go to the flood's own
// waiters once more than the reserve is free.
func TestReserveForLightFlows(t *testing.T) {
	s, _, _ := newTest(t, 9)
	if s.heavyMax != 8 {
		t.Fatalf("heavyMax = %d, want 8 (one slot in nine reserved)", s.heavyMax)
	}
	var flood, b, c Flow
	var held []Ticket
	for range 9 {
		tk, ok := s.TryAdmitFlow(&flood)
		if !ok {
			t.Fatal("a free slot was refused")
		}
		held = append(held, tk)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	fq := []*queued{enqueue(t, s, &flood, "flood1", nil, 1, &wg), enqueue(t, s, &flood, "flood2", nil, 2, &wg)}

	// Every slot is the flood's: b's first request is admitted beyond them.
	bt, ok := s.TryAdmitFlow(&b)
	if !ok || !bt.Valid() {
		t.Fatal("a flow holding nothing was not admitted while a flood held every slot")
	}
	if got := testutil.ToFloat64(s.m.overflows); got != 1 {
		t.Fatalf("overflow admissions = %v, want 1", got)
	}
	if _, ok := s.TryAdmitFlow(&b); ok {
		t.Fatal("b's second request was admitted beyond the slots too")
	}
	// The flood's release would leave no slot free for a newcomer: kept.
	s.Release(held[0])
	select {
	case <-fq[0].got:
		t.Fatal("the reserve's slot went to the flood")
	case <-time.After(20 * time.Millisecond):
	}
	// A newcomer that holds nothing takes it at once, though the flood queues.
	ct, ok := s.TryAdmitFlow(&c)
	if !ok || ct.slot == overflowSlot {
		t.Fatal("a light flow did not take the free reserved slot")
	}
	s.Release(held[1]) // the reserve again
	select {
	case <-fq[0].got:
		t.Fatal("the reserve's slot went to the flood")
	case <-time.After(20 * time.Millisecond):
	}
	// With more than the reserve free, the flood's releases go to its own.
	s.Release(held[2])
	f1 := <-fq[0].got
	s.Release(bt)
	s.Release(ct)
	f2 := <-fq[1].got
	for _, tk := range append(held[3:], f1, f2) {
		s.Release(tk)
	}
	for _, f := range []*Flow{&flood, &b, &c} {
		if got := f.held.Load(); got != 0 {
			t.Fatalf("a flow still counts %d slots after every release", got)
		}
	}
	if got := s.taken.Load(); got != 0 {
		t.Fatalf("slots still taken after every release: %b", got)
	}
}

// TestReserveOff: below 9 slots, or with a negative Reserve, there is no
// reserve: a release goes to the next waiter in turn even when that flow
// already holds slots.
func TestReserveOff(t *testing.T) {
	for _, cfg := range []Config{{Slots: 8}, {Slots: 9, Reserve: -1}} {
		s := New(cfg)
		if s.heavyMax != cfg.Slots {
			t.Fatalf("%+v: heavyMax = %d, want %d", cfg, s.heavyMax, cfg.Slots)
		}
		s.Close()
	}
}

// TestTakeoverEndsHolding: a slot taken over after its lease no longer
// counts for the flow that held it.
func TestTakeoverEndsHolding(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	var a, b Flow
	at, ok := s.TryAdmitFlow(&a)
	if !ok {
		t.Fatal("free slot refused")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	bq := enqueue(t, s, &b, "b", nil, 1, &wg)
	clock.advance(10 * time.Millisecond)
	s.onLease()
	bt := <-bq.got
	if a.held.Load() != 0 || b.held.Load() != 1 {
		t.Fatalf("after the takeover a holds %d, b %d; want 0 and 1", a.held.Load(), b.held.Load())
	}
	if s.Release(at) {
		t.Fatal("the taken-over ticket still released its slot")
	}
	s.Release(bt)
	if b.held.Load() != 0 {
		t.Fatalf("b holds %d after its release", b.held.Load())
	}
}

// TestBusyHoldsAfterTheQueueEmpties: Busy is false before anything ever
// queued, true while contended, and stays true for BusyHold after the last
// admission queued, though the queue is empty and slots are free again;
// RecentlyQueued holds as long for the flow that queued, never for one
// that did not.
func TestBusyHoldsAfterTheQueueEmpties(t *testing.T) {
	s, clock, _ := newTest(t, 1)
	var nilSched *Scheduler
	if nilSched.Busy() {
		t.Error("a nil scheduler is busy")
	}
	held, _ := s.TryAdmit()
	if !s.Busy() {
		t.Error("not busy with every slot taken")
	}
	s.Release(held)
	if s.Busy() {
		t.Error("busy though nothing ever queued")
	}
	held, _ = s.TryAdmit()
	var f Flow
	var wg sync.WaitGroup
	q := enqueue(t, s, &f, "w", nil, 1, &wg)
	s.Release(held)
	tk := <-q.got
	wg.Wait()
	s.Release(tk)
	if s.Contended() {
		t.Fatal("still contended after every release")
	}
	var other Flow
	if !s.Busy() || !s.RecentlyQueued(&f) {
		t.Error("not busy, or f not recently queued, right after its admission queued")
	}
	if s.RecentlyQueued(&other) || s.RecentlyQueued(nil) || nilSched.RecentlyQueued(&f) {
		t.Error("recently queued: a flow that never queued, no flow, or on a nil scheduler")
	}
	clock.advance(DefaultBusyHold - time.Microsecond)
	if !s.Busy() || !s.RecentlyQueued(&f) {
		t.Errorf("not busy, or f not recently queued, %v after its admission queued", DefaultBusyHold-time.Microsecond)
	}
	clock.advance(time.Microsecond)
	if s.Busy() || s.RecentlyQueued(&f) {
		t.Errorf("still busy, or f recently queued, %v after the last admission queued", DefaultBusyHold)
	}
}

// TestQueue: Queue waits for the flow's turn (no fast path of its own: its
// caller's TryAdmitFlow failed) and is cancelled by either channel.
func TestQueue(t *testing.T) {
	s, _, _ := newTest(t, 1)
	held, _ := s.TryAdmit()
	var f Flow
	got := make(chan error, 1)
	go func() {
		tk, err := s.Queue(&f, KindRequest, nil, nil)
		if err == nil && !tk.Valid() {
			err = errors.New("no ticket")
		}
		if err == nil {
			s.Release(tk)
		}
		got <- err
	}()
	waitFor(t, func() bool { return s.Waiting() == 1 })
	s.Release(held)
	if err := <-got; err != nil {
		t.Fatalf("Queue after the slot was released: %v", err)
	}

	held, _ = s.TryAdmit()
	defer s.Release(held)
	also := make(chan struct{})
	go func() {
		_, err := s.Queue(&f, KindRequest, nil, also)
		got <- err
	}()
	waitFor(t, func() bool { return s.Waiting() == 1 })
	close(also)
	if err := <-got; !errors.Is(err, ErrCancelled) {
		t.Fatalf("Queue cancelled by its second channel: %v, want ErrCancelled", err)
	}
}
