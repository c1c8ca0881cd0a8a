package gateway

import (
	"testing"
	"time"
)

// advance moves the applied revision forward only, and every advance wakes
// the waiters, also one that leaves the revision where it is (storeDown's:
// the waiters look again and give up).
func TestAppliedRevision(t *testing.T) {
	a := newAppliedRevision()
	if ok, _ := a.reached(1); ok {
		t.Fatal("revision 1 reached before any advance")
	}
	for _, step := range []struct {
		advance, want int64
	}{{5, 5}, {3, 5}, {0, 5}, {7, 7}} {
		_, wake := a.reached(step.want + 1)
		a.advance(step.advance)
		select {
		case <-wake:
		case <-time.After(5 * time.Second):
			t.Fatalf("advance(%d) did not wake a waiter", step.advance)
		}
		if got := a.current(); got != step.want {
			t.Errorf("after advance(%d): revision %d, want %d", step.advance, got, step.want)
		}
		if ok, _ := a.reached(step.want); !ok {
			t.Errorf("after advance(%d): revision %d not reached", step.advance, step.want)
		}
		if ok, _ := a.reached(step.want + 1); ok {
			t.Errorf("after advance(%d): revision %d reached", step.advance, step.want+1)
		}
	}
}
