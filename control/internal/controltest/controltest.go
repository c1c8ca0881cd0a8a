// Package controltest holds the test helpers that the tests of more than
// one control package use: a collector of the snapshots a discovery watch
// delivers, a runner for such a watch, and the hostnames of a snapshot. It
// is imported by tests only.
package controltest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
)

// Collector records the snapshots a watch delivers.
type Collector struct {
	mu    sync.Mutex
	snaps []*api.RouteSnapshot
	// C gets every snapshot Add records.
	C chan *api.RouteSnapshot
}

// NewCollector returns an empty Collector.
func NewCollector() *Collector { return &Collector{C: make(chan *api.RouteSnapshot, 1024)} }

// Add records s; it is the callback to hand to a watch.
func (c *Collector) Add(s *api.RouteSnapshot) {
	c.mu.Lock()
	c.snaps = append(c.snaps, s)
	c.mu.Unlock()
	c.C <- s
}

// Next returns the next snapshot, failing the test after within.
func (c *Collector) Next(t *testing.T, within time.Duration) *api.RouteSnapshot {
	t.Helper()
	select {
	case s := <-c.C:
		return s
	case <-time.After(within):
		t.Fatalf("no snapshot within %v", within)
		return nil
	}
}

// RunWatch runs watch in a goroutine until the test ends; the returned
// channel gets its result.
func RunWatch(t *testing.T, watch func(ctx context.Context) error) (cancel func(), result chan error) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	result = make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		result <- watch(ctx)
	}()
	var once sync.Once
	cancel = func() {
		once.Do(func() {
			cancelCtx()
			<-done
		})
	}
	t.Cleanup(cancel)
	return cancel, result
}

// Hostnames returns the hostnames of s's routes, in order.
func Hostnames(s *api.RouteSnapshot) []string {
	var out []string
	for _, r := range s.Routes {
		out = append(out, r.Hostname)
	}
	return out
}
