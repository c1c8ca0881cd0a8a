package routes

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countStream counts its revocations and remembers the last cause.
type countStream struct {
	n     atomic.Int32
	cause atomic.Pointer[error]
}

func (s *countStream) Revoke(cause error) {
	s.cause.Store(&cause)
	s.n.Add(1)
}

func (s *countStream) lastCause() error {
	if p := s.cause.Load(); p != nil {
		return *p
	}
	return nil
}

func leaseIsDone(l *Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

func TestLeaseLifecycle(t *testing.T) {
	l := NewLease()
	if !l.Live() || l.Err() != nil || leaseIsDone(l) || l.Streams() != 0 {
		t.Fatalf("new lease: Live=%v Err=%v Done=%v Streams=%d", l.Live(), l.Err(), leaseIsDone(l), l.Streams())
	}
	a, b, c := &recStream{name: "a"}, &recStream{name: "b"}, &recStream{name: "c"}
	if !l.Attach(a) || !l.Attach(b) || !l.Attach(c) {
		t.Fatal("Attach to a live lease = false")
	}
	if !l.Attach(a) { // attaching twice is idempotent
		t.Fatal("second Attach of the same stream = false")
	}
	if n := l.Streams(); n != 3 {
		t.Errorf("Streams = %d, want 3", n)
	}
	l.Detach(b)
	l.Detach(b)                        // twice: no-op
	l.Detach(&recStream{name: "none"}) // never attached: no-op
	if n := l.Streams(); n != 2 {
		t.Errorf("Streams after Detach = %d, want 2", n)
	}

	if n := l.Cancel(ErrChanged); n != 2 {
		t.Errorf("Cancel = %d, want 2", n)
	}
	wantRevoked(t, a, ErrChanged) // once, although attached twice
	wantRevoked(t, c, ErrChanged)
	wantNotRevoked(t, b)
	if l.Live() || !leaseIsDone(l) || !errors.Is(l.Err(), ErrChanged) {
		t.Errorf("after Cancel: Live=%v Done=%v Err=%v", l.Live(), leaseIsDone(l), l.Err())
	}
	if n := l.Streams(); n != 0 {
		t.Errorf("Streams after Cancel = %d", n)
	}

	// Second Cancel: nothing, and the first cause stays.
	if n := l.Cancel(ErrShutdown); n != 0 {
		t.Errorf("second Cancel = %d, want 0", n)
	}
	if !errors.Is(l.Err(), ErrChanged) {
		t.Errorf("Err after second Cancel = %v, want the first cause", l.Err())
	}
	wantRevoked(t, a, ErrChanged)

	// Attach after Cancel is refused and does not register or revoke.
	d := &recStream{name: "d"}
	if l.Attach(d) {
		t.Error("Attach after Cancel = true")
	}
	wantNotRevoked(t, d)
	if n := l.Streams(); n != 0 {
		t.Errorf("Streams after refused Attach = %d", n)
	}
	l.Detach(a) // after Cancel: no panic
	l.Detach(d)
}

func TestLeaseCancelCause(t *testing.T) {
	wrapped := fmt.Errorf("instance team/demo: %w", ErrRejected)
	other := errors.New("something else")
	tests := []struct {
		cause error
		want  error
		label string
	}{
		{ErrWithdrawn, ErrWithdrawn, "withdrawn"},
		{ErrChanged, ErrChanged, "changed"},
		{ErrRejected, ErrRejected, "rejected"},
		{ErrExpired, ErrExpired, "expired"},
		{ErrStopped, ErrStopped, "stopped"},
		{ErrShutdown, ErrShutdown, "shutdown"},
		{wrapped, wrapped, "rejected"},
		{other, other, "other"},
		{nil, ErrWithdrawn, "withdrawn"}, // nil cause: withdrawn
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.cause), func(t *testing.T) {
			l := NewLease()
			s := &countStream{}
			l.Attach(s)
			if n := l.Cancel(tt.cause); n != 1 {
				t.Errorf("Cancel = %d", n)
			}
			if l.Err() != tt.want || s.lastCause() != tt.want || s.n.Load() != 1 {
				t.Errorf("Err %v, stream got %v (%d times), want %v once", l.Err(), s.lastCause(), s.n.Load(), tt.want)
			}
			if got := CauseLabel(l.Err()); got != tt.label {
				t.Errorf("CauseLabel = %q, want %q", got, tt.label)
			}
		})
	}
	if got := CauseLabel(nil); got != "other" {
		t.Errorf("CauseLabel(nil) = %q", got)
	}
}

// Cancel returns only after every Revoke has returned, whatever the count
// (small counts run inline, large ones in parallel chunks).
func TestLeaseCancelManyStreams(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 1000, 4099, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			l := NewLease()
			streams := make([]*countStream, n)
			for i := range streams {
				streams[i] = &countStream{}
				if !l.Attach(streams[i]) {
					t.Fatal("Attach failed")
				}
			}
			if got := l.Cancel(ErrExpired); got != n {
				t.Errorf("Cancel = %d, want %d", got, n)
			}
			for i, s := range streams {
				if s.n.Load() != 1 || s.lastCause() != ErrExpired {
					t.Fatalf("stream %d: revoked %d times with %v when Cancel returned, want once with ErrExpired", i, s.n.Load(), s.lastCause())
				}
			}
		})
	}
}

// A stream may call back into its lease from Revoke (a connection detaching
// itself on close) without deadlocking.
func TestLeaseRevokeReentrant(t *testing.T) {
	for _, n := range []int{1, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			l := NewLease()
			var revoked atomic.Int32
			for range n {
				var s *callbackStream
				s = &callbackStream{f: func(cause error) {
					l.Detach(s)
					_ = l.Err()
					_ = l.Streams()
					_ = l.Live()
					if l.Attach(&recStream{}) {
						t.Error("Attach from Revoke succeeded on a cancelled lease")
					}
					if l.Cancel(ErrShutdown) != 0 {
						t.Error("nested Cancel revoked streams")
					}
					revoked.Add(1)
				}}
				l.Attach(s)
			}
			done := make(chan int)
			go func() { done <- l.Cancel(ErrWithdrawn) }()
			select {
			case got := <-done:
				if got != n || int(revoked.Load()) != n {
					t.Errorf("Cancel = %d, %d revoked, want %d", got, revoked.Load(), n)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Cancel deadlocked with a Revoke that calls back into the lease")
			}
		})
	}
}

type callbackStream struct{ f func(error) }

func (s *callbackStream) Revoke(cause error) { s.f(cause) }

// Attach racing Cancel: every stream whose Attach returned true is revoked
// exactly once, and no other stream is (run with -race).
func TestLeaseConcurrentAttachCancel(t *testing.T) {
	for round := range 20 {
		l := NewLease()
		const goroutines, perG = 32, 200
		type rec struct {
			s        *countStream
			attached bool
			detached bool
		}
		recs := make([][]rec, goroutines)
		var start, wg sync.WaitGroup
		start.Add(1)
		for g := range goroutines {
			wg.Go(func() {
				start.Wait()
				for i := range perG {
					s := &countStream{}
					r := rec{s: s, attached: l.Attach(s)}
					if r.attached && i%5 == 0 {
						l.Detach(s)
						r.detached = true
					}
					recs[g] = append(recs[g], r)
				}
			})
		}
		var cancelled atomic.Int64
		var winners atomic.Int32
		for range 4 {
			wg.Go(func() {
				start.Wait()
				time.Sleep(time.Duration(round%5) * 50 * time.Microsecond)
				n := l.Cancel(ErrWithdrawn)
				if n > 0 {
					winners.Add(1)
				}
				cancelled.Add(int64(n))
			})
		}
		start.Done()
		wg.Wait()

		if winners.Load() > 1 {
			t.Errorf("round %d: %d Cancel calls revoked streams, want at most 1", round, winners.Load())
		}
		var attachedLive int64
		for _, rs := range recs {
			for _, r := range rs {
				n := r.s.n.Load()
				switch {
				case !r.attached && n != 0:
					t.Fatalf("round %d: a refused stream was revoked %d times", round, n)
				case r.attached && !r.detached && n != 1:
					t.Fatalf("round %d: an attached stream was revoked %d times, want 1", round, n)
				case r.detached && n > 1:
					t.Fatalf("round %d: a detached stream was revoked %d times", round, n)
				}
				if n == 1 && r.s.lastCause() != ErrWithdrawn {
					t.Fatalf("round %d: cause %v", round, r.s.lastCause())
				}
				attachedLive += int64(n)
			}
		}
		if attachedLive != cancelled.Load() {
			t.Errorf("round %d: Cancel reported %d streams, %d were revoked", round, cancelled.Load(), attachedLive)
		}
		if l.Live() || l.Streams() != 0 {
			t.Errorf("round %d: lease live=%v streams=%d after Cancel", round, l.Live(), l.Streams())
		}
	}
}
