package edge

import (
	"context"
	"time"

	"github.com/applistener/applistener/internal/panicguard"
)

// guardedWatchOnce is watchOnce behind panicguard (EdgeWatch): a panic
// (in the Source or in applying a snapshot) ends that one watch as a
// failure, which watch retries after its backoff; the cache and the
// spliced connections stay.
func (e *Edge) guardedWatchOnce(ctx context.Context, ws string) (rewatched bool, err error) {
	err = panicguard.Call(e.log, panicguard.EdgeWatch, ws, func() error {
		var werr error
		rewatched, werr = e.watchOnce(ctx, ws)
		return werr
	}, "workspace", ws)
	return rewatched, err
}

// expiryRestartDelay spaces the restarts of the expiry loop after a
// panic, so that one that repeats cannot spin.
const expiryRestartDelay = 100 * time.Millisecond

// guardedExpiryLoop runs expiryLoop behind panicguard (EdgeExpiry) until
// ctx ends: a panic is reported and the loop restarted.
func (e *Edge) guardedExpiryLoop(ctx context.Context) {
	for ctx.Err() == nil {
		err := panicguard.Call(e.log, panicguard.EdgeExpiry, "", func() error {
			e.expiryLoop(ctx)
			return nil
		})
		if err == nil {
			return
		}
		t := time.NewTimer(expiryRestartDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// applyLocked runs f with e.mu held, and releases it even when f panics
// (the panic goes on to the goroutine's guard): a panic while the table
// is rebuilt must not leave every connection of the edge waiting for the
// lock.
func (e *Edge) applyLocked(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}
