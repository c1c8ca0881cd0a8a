package dispatch

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRateBound: the process-wide bound lets a burst through at once, then
// one line per interval, never more than a burst after a quiet spell; many
// goroutines at once get exactly the burst between them; a negative rate
// is no bound.
func TestRateBound(t *testing.T) {
	const rate, burst = 10, 5
	var b rateBound
	b.init(rate, burst)
	t0 := time.Now().UnixNano()
	count := func(now int64, n int) int {
		ok := 0
		for range n {
			if b.allow(now) {
				ok++
			}
		}
		return ok
	}
	if got := count(t0, 20); got != burst {
		t.Errorf("at once: %d allowed, want the burst %d", got, burst)
	}
	if got := count(t0+int64(100*time.Millisecond), 20); got != 1 {
		t.Errorf("one interval later: %d allowed, want 1", got)
	}
	if got := count(t0+int64(time.Hour), 20); got != burst {
		t.Errorf("after an hour: %d allowed, want the burst %d", got, burst)
	}

	var shared rateBound
	shared.init(rate, 100)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if shared.allow(t0) {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != 100 {
		t.Errorf("8 goroutines at once: %d allowed, want the burst 100", n)
	}

	var none rateBound
	none.init(-1, 0)
	if got := func() int {
		ok := 0
		for range 1000 {
			if none.allow(t0) {
				ok++
			}
		}
		return ok
	}(); got != 1000 {
		t.Errorf("no bound: %d of 1000 allowed", got)
	}
}

// BenchmarkRateBound is the process-wide access-log bound's cost per line,
// from one goroutine and from all at once (the bound never refuses here).
//
//	go test -run XXX -bench RateBound -benchmem ./dispatch/
func BenchmarkRateBound(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		var rb rateBound
		rb.init(1e9, 1<<30)
		b.ReportAllocs()
		for b.Loop() {
			rb.allow(time.Now().UnixNano())
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var rb rateBound
		rb.init(1e9, 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rb.allow(time.Now().UnixNano())
			}
		})
	})
}
