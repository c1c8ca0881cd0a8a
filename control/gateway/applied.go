package gateway

import "sync"

// appliedRevision is the store revision the gateway's view has, and a way
// to wait for it to move. It has a lock of its own, taken after
// Gateway.mu (the view advances it with that lock held, after the view
// itself is updated) and never around a call out.
type appliedRevision struct {
	mu   sync.Mutex
	rev  int64
	wake chan struct{} // closed (and replaced) whenever waiters are to look again
}

func newAppliedRevision() *appliedRevision {
	return &appliedRevision{wake: make(chan struct{})}
}

// advance records that the view has every change up to rev (an older rev
// leaves it) and wakes the waiters, which look again.
func (a *appliedRevision) advance(rev int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rev = max(a.rev, rev)
	close(a.wake)
	a.wake = make(chan struct{})
}

// current returns the revision the view has.
func (a *appliedRevision) current() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rev
}

// reached reports whether the view has rev, and returns a channel that is
// closed when that is to be looked at again.
func (a *appliedRevision) reached(rev int64) (bool, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rev >= rev, a.wake
}
