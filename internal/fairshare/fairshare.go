// Package fairshare admits units of work (request heads, TLS handshakes,
// WebSocket chunks) in turn across flows (sandbox instances) when the
// process is busy.
//
// A Scheduler has a fixed number of admission slots. While a slot is free
// and nobody waits, Admit takes one with a compare-and-swap on a bitmap: no
// lock, no allocation. When every slot is taken, the caller queues on its
// flow's FIFO, and flows with waiters are served by deficit round robin
// (quantum = the flow's weight): a released slot goes directly to the next
// waiter in that order, so a flooding flow queues behind its own work, not
// in front of everyone else's.
//
// Some slots are kept for light flows (Config.Reserve): while anyone
// queues, a flow with waiters of its own gets a slot only while more than
// the reserve is free, and a flow that holds no slot and has no queue takes
// a free one at once. A flood therefore never holds every slot while others
// want one, and a neighbour's request does not wait for the flood's to end.
//
// A slot is meant to cover CPU work. One held longer than the lease (an
// exchange waiting on a long poll, a slow client, a streamed body) may be
// taken over for a waiter: its generation changes and the old holder's
// Release is a no-op. Long-lived work therefore stops counting by itself.
// Takeovers happen as work is released or queued; a timer covers the case
// where nothing moves (at most two leases after a slot was taken).
package fairshare

import (
	"errors"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/buckets"
)

// MaxSlots is the most admission slots a Scheduler has (one bitmap word).
const MaxSlots = 64

// DefaultLease is how long a slot counts as busy before a waiter may take
// it over: longer than a small request's CPU work (tens of µs) and a
// loopback app's answer, short against a neighbour's latency. 1 ms and
// 2 ms measured the same; 5 ms cost the flood a tenth of its throughput.
const DefaultLease = 2 * time.Millisecond

// SlotsPerProc is the number of slots per GOMAXPROCS when Config.Slots is
// 0: 8 for the flows that queue plus one for the reserve (ReservePerSlots).
// Measured on one core with a 100-connection flood on one instance and
// 100 requests/s on another: 4 for the flood cut its throughput by a
// quarter or more (a slot also covers the wait for the app's answer), 8
// kept it within the noise while the quiet instance's median stayed under
// 1 ms (5 ms without fair admission); 16 doubled that median.
const SlotsPerProc = 9

// ReservePerSlots is the default reserve (Config.Reserve): one slot in
// nine is kept for flows that hold none, so that on one core a flood holds
// at most 8 while others want one.
const ReservePerSlots = 9

// DefaultSoloWindow is the solo window serve uses (Config.SoloWindow): a
// neighbour that sends at least once a second is always queued for in
// turn; an instance alone on its listener for a second stops paying for
// queues it has nobody to share with.
const DefaultSoloWindow = time.Second

// MaxWeight is the largest flow weight.
const MaxWeight = 100

// ErrCancelled is returned by Admit when done closed or the timeout passed
// while the caller was queued.
var ErrCancelled = errors.New("fairshare: admission cancelled while queued")

// Kind is what a unit of work is, for the wait histogram.
type Kind uint8

// The kinds of work admitted.
const (
	KindRequest Kind = iota
	KindHandshake
	KindWebSocket
	numKinds
)

var kindNames = [numKinds]string{"request", "handshake", "websocket"}

// String returns the kind's metric label.
func (k Kind) String() string { return kindNames[k] }

// Ticket is an admission: the slot and its generation, or, for an
// admission beyond the slots (overflowSlot), its flow. The zero Ticket
// admits nothing; releasing it is a no-op.
type Ticket struct {
	flow *Flow
	gen  uint32
	slot uint8
}

// overflowSlot is the slot of a light flow's admission beyond the slots
// (TryAdmitFlow).
const overflowSlot = MaxSlots

// Valid reports whether t is an admission (not the zero Ticket).
func (t Ticket) Valid() bool { return t.gen != 0 }

// Flow is the per-instance state of the scheduler: its weight, its queue of
// waiters and its counters. The zero Flow has weight 1. A Flow must not be
// copied after first use.
type Flow struct {
	weight atomic.Int32 // 0: 1
	// held is the number of slots the flow's tickets hold; queued the
	// number of its waiters (changed under Scheduler.mu).
	held   atomic.Int32
	queued atomic.Int32
	// queuedAt is when an admission of the flow last queued (the
	// scheduler's now() nanoseconds; 0: never), for RecentlyQueued.
	queuedAt atomic.Int64
	// Counters, read by the instance metrics.
	waits     atomic.Uint64
	waitNanos atomic.Int64

	// Under Scheduler.mu.
	head, tail *waiter
	deficit    int
	prev, next *Flow // the ring of flows with waiters
	active     bool
}

// SetWeight sets the flow's weight, clamped to 1..MaxWeight; it applies to
// the next round.
func (f *Flow) SetWeight(w int) { f.weight.Store(int32(min(max(w, 1), MaxWeight))) }

// Weight returns the flow's weight.
func (f *Flow) Weight() int { return int(max(f.weight.Load(), 1)) }

// Waits returns how many admissions of the flow had to queue.
func (f *Flow) Waits() uint64 { return f.waits.Load() }

// WaitTime returns the flow's total time spent queued.
func (f *Flow) WaitTime() time.Duration { return time.Duration(f.waitNanos.Load()) }

// waiter is one queued Admit.
type waiter struct {
	flow       *Flow
	ready      chan Ticket // buffered 1: the granted ticket
	prev, next *waiter
	queued     bool
}

// Config configures a Scheduler.
type Config struct {
	// Slots is the number of admission slots: 0 for SlotsPerProc ×
	// GOMAXPROCS, at most MaxSlots.
	Slots int
	// Lease is how long a slot may be held before a waiter takes it over
	// (0: DefaultLease).
	Lease time.Duration
	// Registerer receives the scheduler's metrics; nil: none.
	Registerer prometheus.Registerer
	// Reserve is the number of slots kept, while anyone queues, for flows
	// that hold no slot: 0 for Slots / ReservePerSlots (none below 9
	// slots), negative for none.
	Reserve int
	// BusyHold is how long after an admission last queued Busy and
	// RecentlyQueued still report it (0: DefaultBusyHold).
	BusyHold time.Duration
	// SoloWindow, when positive, lets a flow that has been the only one
	// admitted for that long be admitted at once even when every slot is
	// taken (with the zero Ticket): with nobody else to be fair to,
	// queueing only costs the flow (8 % of one instance's throughput at
	// 50 connections on one core). The first admission of another flow
	// ends it: from then on everyone queues in turn. 0: never.
	SoloWindow time.Duration
}

// Scheduler admits work across flows. Its methods are safe for concurrent
// use; a nil *Scheduler admits everything at once.
type Scheduler struct {
	n        int
	full     uint64
	lease    int64
	busyHold int64
	// heavyMax is the most slots taken (n minus the reserve) at which a
	// slot may go to a flow that already holds one while others queue.
	heavyMax int
	// taken has bit i set while slot i is held (or handed to a waiter).
	taken atomic.Uint64
	// waiting is the number of queued waiters; changed under mu only.
	waiting atomic.Int64
	slot    [MaxSlots]atomic.Uint64 // heldWord or released gen<<32
	// holder is the flow of slot i's current ticket (nil for TryAdmit's),
	// written by whoever issues it and read by whoever ends it.
	holder [MaxSlots]atomic.Pointer[Flow]

	now   func() int64 // monotonic nanoseconds
	timer func(d time.Duration, f func()) stopper

	mu     sync.Mutex
	ring   *Flow // front of the ring of flows with waiters
	armed  stopper
	closed bool

	m      *metrics
	waiter sync.Pool

	// queuedAt is when an admission last queued (now() nanoseconds; 0:
	// never), for Busy.
	queuedAt atomic.Int64

	// Solo admission (Config.SoloWindow): the flow of the last Admit and
	// when a different flow was last seen (now() nanoseconds).
	solo      int64
	lastFlow  atomic.Pointer[Flow]
	flowSince atomic.Int64
}

type stopper interface{ Stop() bool }

var epoch = time.Now()

func monotonic() int64 { return int64(time.Since(epoch)) }

func realTimer(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }

// New returns a Scheduler.
func New(cfg Config) *Scheduler {
	n := cfg.Slots
	if n <= 0 {
		n = SlotsPerProc * runtime.GOMAXPROCS(0)
	}
	n = min(n, MaxSlots)
	lease := cfg.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	reserve := cfg.Reserve
	if reserve == 0 {
		reserve = n / ReservePerSlots
	}
	reserve = min(max(reserve, 0), n-1)
	busyHold := cfg.BusyHold
	if busyHold <= 0 {
		busyHold = DefaultBusyHold
	}
	s := &Scheduler{n: n, heavyMax: n - reserve, lease: int64(lease), busyHold: int64(busyHold), now: monotonic, timer: realTimer, m: newMetrics(cfg.Registerer),
		solo: int64(max(cfg.SoloWindow, 0))}
	if n == MaxSlots {
		s.full = ^uint64(0)
	} else {
		s.full = 1<<n - 1
	}
	s.waiter.New = func() any { return &waiter{ready: make(chan Ticket, 1)} }
	return s
}

// Slots returns the number of admission slots.
func (s *Scheduler) Slots() int { return s.n }

// Lease returns how long a slot may be held before a waiter takes it over.
func (s *Scheduler) Lease() time.Duration { return time.Duration(s.lease) }

// Contended reports whether an Admit now could have to wait: every slot is
// taken or someone waits. It is two atomic loads; callers admitting small
// units (WebSocket chunks) admit only when it is true.
func (s *Scheduler) Contended() bool {
	return s != nil && (s.waiting.Load() > 0 || s.taken.Load() == s.full)
}

// DefaultBusyHold is how long after an admission last queued Busy still
// reports the scheduler busy (Config.BusyHold): longer than the gaps in a
// flood, during which its waiters have all been admitted while its next
// requests are still on the way.
const DefaultBusyHold = 10 * time.Millisecond

// Busy reports whether the scheduler is contended now or an admission
// queued within the last busy hold (Config.BusyHold). Contended alone
// flickers under a flood: its queue empties for a moment whenever its
// requests in flight wait on the network, and work that keeps a
// neighbour's requests ahead of the flood's (the listener's early parking
// of idle connections) would stop and start with it. With nothing queued
// for the hold it costs what Contended does and one atomic load.
func (s *Scheduler) Busy() bool {
	return s != nil && (s.Contended() || s.withinHold(s.queuedAt.Load()))
}

// RecentlyQueued reports whether an admission of flow f queued within
// the last busy hold (Config.BusyHold): f is a flood's, or was lately. A
// flow that has never had to queue, or not for that long, is light,
// however much it has in flight for a moment.
func (s *Scheduler) RecentlyQueued(f *Flow) bool {
	return s != nil && f != nil && s.withinHold(f.queuedAt.Load())
}

// withinHold reports whether queuedAt (a queuedAt value; 0: never) lies
// within the busy hold before now.
func (s *Scheduler) withinHold(queuedAt int64) bool {
	return queuedAt != 0 && s.now()-queuedAt < s.busyHold
}

// Waiting returns the number of queued waiters.
func (s *Scheduler) Waiting() int { return int(s.waiting.Load()) }

func nextGen(g uint32) uint32 {
	if g++; g == 0 {
		g = 1
	}
	return g
}

// A slot's state is one word, so that a release and a takeover cannot
// both win: the generation of its current ticket (high 32 bits), whether a
// ticket is out (bit 31) and when it was issued, in microseconds of now()
// modulo 2³¹ (35 minutes; only differences under the lease matter).
const (
	heldBit   = 1 << 31
	startMask = heldBit - 1
)

func genOf(w uint64) uint32 { return uint32(w >> 32) }

func (s *Scheduler) heldWord(g uint32, now int64) uint64 {
	return uint64(g)<<32 | heldBit | uint64(now/int64(time.Microsecond))&startMask
}

// expired reports whether the held word w's lease has ended at now.
func (s *Scheduler) expired(w uint64, now int64) bool {
	return w&heldBit != 0 && int64(ageOf(w, now))*int64(time.Microsecond) >= s.lease
}

// ageOf returns how long ago, in microseconds modulo 2³¹, w was stamped.
func ageOf(w uint64, now int64) uint64 {
	return (uint64(now/int64(time.Microsecond)) - w) & startMask
}

// issue gives slot i, whose bit the caller set, a new ticket for flow f
// (nil: none). Nobody else writes the word of a slot whose bit is set and
// whose ticket is not out.
func (s *Scheduler) issue(i int, f *Flow) Ticket {
	g := nextGen(genOf(s.slot[i].Load()))
	if f != nil {
		f.held.Add(1)
	}
	s.holder[i].Store(f)
	s.slot[i].Store(s.heldWord(g, s.now()))
	return Ticket{gen: g, slot: uint8(i)}
}

// ended notes that slot i's ticket no longer holds it (released or taken
// over): its flow holds one slot fewer.
func (s *Scheduler) ended(i int) {
	if f := s.holder[i].Swap(nil); f != nil {
		f.held.Add(-1)
	}
}

// tryTake takes a free slot, if any, for flow f (nil: none).
func (s *Scheduler) tryTake(f *Flow) (Ticket, bool) {
	for {
		b := s.taken.Load()
		if b == s.full {
			return Ticket{}, false
		}
		i := bits.TrailingZeros64(^b)
		if s.taken.CompareAndSwap(b, b|1<<i) {
			return s.issue(i, f), true
		}
	}
}

// admitNow admits flow f without queueing if it may: into a free slot
// when nobody waits or f is light, else beyond the slots (overflow).
func (s *Scheduler) admitNow(f *Flow) (Ticket, bool) {
	if s.waiting.Load() == 0 || light(f) {
		if t, ok := s.tryTake(f); ok {
			return t, true
		}
	}
	return s.overflow(f)
}

// overflow admits light flow f beyond the slots: its one unit of work in
// progress. A flow holding anything, or with waiters, is refused, and
// nobody without a reserve (Config.Reserve): there, flows queue in turn
// from their first unit of work.
func (s *Scheduler) overflow(f *Flow) (Ticket, bool) {
	if s.heavyMax == s.n || f == nil || f.queued.Load() != 0 || !f.held.CompareAndSwap(0, 1) {
		return Ticket{}, false
	}
	s.m.overflows.Inc()
	return Ticket{flow: f, gen: 1, slot: overflowSlot}, true
}

// light reports whether flow f may take a free slot without queueing
// while others wait: it holds none and has no waiters of its own (the
// reserve is for it).
func light(f *Flow) bool {
	return f != nil && f.held.Load() == 0 && f.queued.Load() == 0
}

// TryAdmit admits at once if a slot is free and nobody waits; it never
// blocks, locks or allocates. A nil Scheduler admits with the zero Ticket.
func (s *Scheduler) TryAdmit() (Ticket, bool) {
	if s == nil {
		return Ticket{}, true
	}
	if s.waiting.Load() > 0 {
		return Ticket{}, false
	}
	return s.tryTake(nil)
}

// Admit admits a unit of work of flow f: at once when a slot is free and
// nobody waits, else in f's turn. It returns ErrCancelled when done closes
// or timeout (0: none) passes first. A nil Scheduler admits at once with
// the zero Ticket.
func (s *Scheduler) Admit(f *Flow, kind Kind, done <-chan struct{}, timeout time.Duration) (Ticket, error) {
	if t, ok := s.TryAdmitFlow(f); ok {
		return t, nil
	}
	return s.wait(f, kind, done, nil, timeout)
}

// TryAdmitFlow is TryAdmit for a unit of work of flow f: it also notes f
// as the latest flow admitted and, when f has been the only one for the
// solo window (Config.SoloWindow), admits it at once with the zero Ticket
// even when every slot is taken. A light flow (it holds no slot and has
// nothing queued) is always admitted: into a free slot, else beyond the
// slots, once (its ticket counts as held until released), when the
// scheduler keeps a reserve, so that each instance always has one unit of
// work admitted and only a flow with more than one queues. It never
// blocks or allocates.
func (s *Scheduler) TryAdmitFlow(f *Flow) (Ticket, bool) {
	if s == nil {
		return Ticket{}, true
	}
	s.noteFlow(f)
	if t, ok := s.admitNow(f); ok {
		return t, true
	}
	if s.alone() {
		return Ticket{}, true
	}
	return Ticket{}, false
}

// noteFlow records f as the flow of the latest admission: one atomic load,
// and a store and a clock read only when the flow changes.
func (s *Scheduler) noteFlow(f *Flow) {
	if s.solo == 0 || s.lastFlow.Load() == f {
		return
	}
	s.lastFlow.Store(f)
	s.flowSince.Store(s.now())
}

// alone reports whether the latest admissions' flow has been the only one
// for the solo window: it is admitted without queueing.
func (s *Scheduler) alone() bool {
	return s.solo > 0 && s.waiting.Load() == 0 && s.now()-s.flowSince.Load() >= s.solo
}

// Queue waits for flow f's turn, for a caller whose TryAdmitFlow has just
// failed (and that had something to do first, before it queues): Admit
// without its fast path, cancelled when done or also closes.
func (s *Scheduler) Queue(f *Flow, kind Kind, done, also <-chan struct{}) (Ticket, error) {
	return s.wait(f, kind, done, also, 0)
}

// AdmitEither is Admit cancelled when either done or also closes (a
// stream's reset and its route's revocation), without a timeout.
func (s *Scheduler) AdmitEither(f *Flow, kind Kind, done, also <-chan struct{}) (Ticket, error) {
	if t, ok := s.TryAdmitFlow(f); ok {
		return t, nil
	}
	return s.wait(f, kind, done, also, 0)
}

func (s *Scheduler) wait(f *Flow, kind Kind, done, also <-chan struct{}, timeout time.Duration) (Ticket, error) {
	start := s.now()
	s.mu.Lock()
	if t, ok := s.admitNow(f); ok {
		s.mu.Unlock()
		return t, nil
	}
	s.queuedAt.Store(max(start, 1))
	f.queuedAt.Store(max(start, 1))
	w := s.waiter.Get().(*waiter)
	w.flow = f
	s.enqueueLocked(w)
	s.fillLocked()    // free slots go to waiters in turn (this one perhaps)
	s.reclaimLocked() // slots held past their lease go to waiters at once
	s.armLocked()
	s.mu.Unlock()
	s.m.waiting.Inc()

	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	var t Ticket
	var err error
	select {
	case t = <-w.ready:
	case <-done:
		err = ErrCancelled
	case <-also:
		err = ErrCancelled
	case <-expired:
		err = ErrCancelled
	}
	if err != nil {
		s.mu.Lock()
		if w.queued {
			s.dequeueLocked(w)
			s.mu.Unlock()
		} else {
			s.mu.Unlock()
			s.Release(<-w.ready) // granted meanwhile: pass it on
		}
	}
	s.m.waiting.Dec()
	waited := s.now() - start
	f.waits.Add(1)
	f.waitNanos.Add(waited)
	s.m.wait[kind].Observe(time.Duration(waited).Seconds())
	w.flow = nil
	s.waiter.Put(w)
	return t, err
}

// Release gives back an admission; it reports whether t still held its
// slot. Releasing the zero Ticket, or one whose slot was taken over since,
// is a no-op.
func (s *Scheduler) Release(t Ticket) bool {
	if s == nil || t.gen == 0 {
		return false
	}
	if t.slot == overflowSlot {
		t.flow.held.Add(-1)
		return true
	}
	i := int(t.slot)
	for {
		w := s.slot[i].Load()
		if genOf(w) != t.gen || w&heldBit == 0 {
			return false // taken over after its lease
		}
		if s.slot[i].CompareAndSwap(w, uint64(t.gen)<<32) {
			break
		}
	}
	s.ended(i)
	if s.waiting.Load() == 0 {
		s.taken.And(^(uint64(1) << i))
		if s.waiting.Load() == 0 {
			return true
		}
		// A waiter queued meanwhile, perhaps after seeing no free slot.
		s.mu.Lock()
		s.fillLocked()
		s.mu.Unlock()
		return true
	}
	s.mu.Lock()
	s.grantOrFreeLocked(i)
	s.reclaimLocked() // slots held past their lease go to waiters now
	s.mu.Unlock()
	return true
}

// grantOrFreeLocked hands slot i, whose bit is set and whose ticket is not
// out (or not yet used), to the next waiter in turn that may have it, or
// frees it.
func (s *Scheduler) grantOrFreeLocked(i int) {
	if !s.grantLocked(i) {
		s.freeLocked(i)
	}
}

// freeLocked frees slot i, whose bit is set and whose ticket is not out.
func (s *Scheduler) freeLocked(i int) {
	s.slot[i].Store(uint64(genOf(s.slot[i].Load())) << 32)
	s.taken.And(^(uint64(1) << i))
}

// fillLocked hands free slots to waiters in turn while one may have them.
func (s *Scheduler) fillLocked() {
	for s.waiting.Load() > 0 {
		t, ok := s.tryTake(nil)
		if !ok {
			return
		}
		if !s.grantLocked(int(t.slot)) {
			s.freeLocked(int(t.slot)) // its ticket, a flowless one, never went out
			return
		}
	}
}

// grantLocked gives slot i, whose bit is set, a new ticket and hands it to
// the next waiter in turn that may have it; it reports false when none
// may. Within the reserve (more than heavyMax slots taken, i included)
// only a flow that holds no slot may.
func (s *Scheduler) grantLocked(i int) bool {
	w := s.nextLocked(bits.OnesCount64(s.taken.Load()) > s.heavyMax)
	if w == nil {
		return false
	}
	w.ready <- s.issue(i, w.flow)
	return true
}

// enqueueLocked queues w on its flow, and the flow on the ring.
func (s *Scheduler) enqueueLocked(w *waiter) {
	f := w.flow
	w.queued = true
	w.prev, w.next = f.tail, nil
	f.queued.Add(1)
	if f.tail != nil {
		f.tail.next = w
	} else {
		f.head = w
	}
	f.tail = w
	s.waiting.Add(1)
	if !f.active {
		f.active = true
		f.deficit = f.Weight()
		s.ringPushLocked(f)
	}
}

// dequeueLocked removes w (queued) from its flow.
func (s *Scheduler) dequeueLocked(w *waiter) {
	f := w.flow
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		f.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		f.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	f.queued.Add(-1)
	s.waiting.Add(-1)
	if f.head == nil {
		s.ringRemoveLocked(f)
	}
}

// nextLocked takes the next waiter by deficit round robin: the flow at the
// front of the ring is served until its deficit (refilled with its weight
// each round) is spent, then goes to the back. With lightOnly, it takes
// the first waiter in ring order whose flow holds no slot, without
// touching deficits or the ring's order; nil if there is none.
func (s *Scheduler) nextLocked(lightOnly bool) *waiter {
	f := s.ring
	if f == nil {
		return nil
	}
	if lightOnly {
		for f.held.Load() != 0 {
			if f = f.next; f == s.ring {
				return nil
			}
		}
		w := f.head
		s.dequeueLocked(w)
		return w
	}
	w := f.head
	s.dequeueLocked(w)
	if f.active {
		if f.deficit--; f.deficit <= 0 {
			f.deficit = f.Weight()
			s.ring = f.next // f goes to the back
		}
	}
	return w
}

func (s *Scheduler) ringPushLocked(f *Flow) {
	if s.ring == nil {
		f.prev, f.next = f, f
		s.ring = f
		return
	}
	back := s.ring.prev
	f.prev, f.next = back, s.ring
	back.next = f
	s.ring.prev = f
}

func (s *Scheduler) ringRemoveLocked(f *Flow) {
	f.active = false
	f.deficit = 0
	if f.next == f {
		s.ring = nil
	} else {
		f.prev.next = f.next
		f.next.prev = f.prev
		if s.ring == f {
			s.ring = f.next
		}
	}
	f.prev, f.next = nil, nil
}

// armLocked starts the lease timer for the oldest slot, unless it runs.
//
// The timer is a backstop, armed a lease after the oldest slot's lease
// ends: while work flows, releases and queued admissions reclaim expired
// slots on time (reclaimLocked), and the timer is needed only when every
// slot is stuck and nothing else happens. Each firing runs in a new
// goroutine, and a goroutine started takes the processor's next place: a
// quiet neighbour's connection delivered just before (fairpoll.go) was
// pushed behind the whole run queue. Armed at the lease itself, it fired
// thousands of times a second under a flood (one run on one core: the
// delivered goroutine's start p99 1.4 ms, 0.8 ms as a backstop).
func (s *Scheduler) armLocked() {
	if s.armed != nil || s.closed || s.waiting.Load() == 0 {
		return
	}
	s.armed = s.timer(time.Duration(s.untilExpiryLocked()+s.lease), s.onLease)
}

// untilExpiryLocked returns the time until the oldest held slot's lease
// ends (at least a microsecond).
func (s *Scheduler) untilExpiryLocked() int64 {
	now := s.now()
	nowUs := uint64(now / int64(time.Microsecond))
	var oldest uint64
	b := s.taken.Load()
	for b != 0 {
		i := bits.TrailingZeros64(b)
		b &^= 1 << i
		if w := s.slot[i].Load(); w&heldBit != 0 {
			oldest = max(oldest, (nowUs-w)&startMask)
		}
	}
	return max(s.lease-int64(oldest)*int64(time.Microsecond), int64(time.Microsecond))
}

func (s *Scheduler) onLease() {
	s.mu.Lock()
	s.armed = nil
	s.reclaimLocked()
	s.armLocked()
	s.mu.Unlock()
}

// reclaimLocked takes over, for waiters, the slots held past their lease.
func (s *Scheduler) reclaimLocked() {
	now := s.now()
	b := s.taken.Load()
	for b != 0 && s.waiting.Load() > 0 {
		i := bits.TrailingZeros64(b)
		b &^= 1 << i
		w := s.slot[i].Load()
		if w&heldBit != 0 && ageOf(w, now) > startMask/2 {
			// Stamped after now was read (a slot taken without the
			// lock meanwhile): its age would wrap to 35 minutes and
			// count as expired. The clock read after the stamp's load
			// gives its true age.
			now = s.now()
		}
		if !s.expired(w, now) {
			continue
		}
		// The holder's ticket is out of date from here; its Release is a
		// no-op. The CAS fails if it released meanwhile (its Release then
		// hands the slot on).
		if !s.slot[i].CompareAndSwap(w, uint64(genOf(w))<<32) {
			continue
		}
		s.ended(i)
		s.m.takeovers.Inc()
		s.grantOrFreeLocked(i)
	}
}

// Close stops the lease timer. Queued waiters still get slots as they are
// released.
func (s *Scheduler) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	if s.armed != nil {
		s.armed.Stop()
		s.armed = nil
	}
	s.mu.Unlock()
}

type metrics struct {
	wait      [numKinds]prometheus.Observer
	waiting   prometheus.Gauge
	takeovers prometheus.Counter
	overflows prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "applistener_fair_wait_seconds",
		Help:    "Time spent queued for fair admission when every slot was taken, by kind (request, handshake, websocket); admissions that did not wait are not observed.",
		Buckets: buckets.Latency,
	}, []string{"kind"})
	m := &metrics{
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "applistener_fair_waiting",
			Help: "Units of work queued for fair admission now.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_fair_lease_takeovers_total",
			Help: "Admission slots taken over for a waiter because their holder kept them longer than the lease.",
		}),
		overflows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "applistener_fair_overflow_admissions_total",
			Help: "Admissions beyond the slots: an instance that held none and had nothing queued found every slot taken and was admitted at once (one at a time per instance).",
		}),
	}
	for k := range numKinds {
		m.wait[k] = wait.WithLabelValues(k.String())
	}
	if reg != nil {
		reg.MustRegister(wait, m.waiting, m.takeovers, m.overflows)
	}
	return m
}
