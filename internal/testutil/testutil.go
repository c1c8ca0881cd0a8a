// Package testutil holds the helpers that the tests of several packages
// share: Eventually polls for a condition, VerifyNone checks that a test
// leaves no goroutine behind, RunOrder records which goroutine ran first. Only _test.go files import it, so it and
// goleak stay out of the binaries.
package testutil

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// maxPollInterval bounds the pause between two checks in Eventually. The
// first pause is 1 ms and each one doubles up to this, so a condition that
// is about to hold is seen at once and an expensive one (a TLS handshake)
// is not run in a tight loop.
const maxPollInterval = 10 * time.Millisecond

// Eventually calls cond until it returns true, and fails t with
// "timed out after <within> waiting for <what>" when it has not by the
// time within has passed. It must be called from the test's goroutine.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
			return // for a testing.TB whose Fatalf returns
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPollInterval)
	}
}

// leakWait is how long VerifyNone gives goroutines that are ending to
// finish. goleak's own retries last about 0.4 s, less than a starved
// -race process on a loaded 2-core CI machine may take to end a closed
// connection's goroutines; a goroutine that leaks stays, and fails the
// test once this has passed.
var leakWait = 10 * time.Second

// VerifyNone registers a cleanup that fails t when any goroutine besides
// the test framework's is still running then (goleak.Find with opts, for
// example goleak.IgnoreCurrent()). Cleanups run last registered first,
// so, called first in a test, it checks after every cleanup the test
// registers later (servers closed, connections released). Goroutines that
// are already ending are given up to leakWait to finish. Tests that use it
// must not run in parallel.
func VerifyNone(t testing.TB, opts ...goleak.Option) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(leakWait)
		for {
			err := goleak.Find(opts...) // retries for about 0.4 s itself
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Error(err) // "found unexpected goroutines:" and their stacks
				return
			}
		}
	})
}

// RunOrder records the order in which goroutines reach a point, for the
// tests of run order on one core. Its methods are safe for concurrent use.
type RunOrder struct {
	mu    sync.Mutex
	names []string
}

// Note records that name got here.
func (o *RunOrder) Note(name string) {
	o.mu.Lock()
	o.names = append(o.names, name)
	o.mu.Unlock()
}

// Names returns the names noted so far, in order.
func (o *RunOrder) Names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.names...)
}
