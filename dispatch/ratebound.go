package dispatch

import (
	"math"
	"sync/atomic"
)

// rateBound is a lock-free token bucket shared by every connection (the
// generic cell rate algorithm): tat is the time at which the bucket would
// be full again; a line is allowed when taking it leaves that time at most
// burst intervals ahead of now. One compare-and-swap per allowed line, so
// the process-wide bound adds no lock to the request path.
type rateBound struct {
	interval int64 // nanoseconds per line; 0: no bound
	window   int64 // burst × interval
	tat      atomic.Int64
}

// init sets the bound to rate lines per second with bursts of burst lines;
// rate <= 0 means no bound.
func (b *rateBound) init(rate float64, burst int) {
	if rate <= 0 || math.IsNaN(rate) {
		b.interval = 0
		return
	}
	b.interval = int64(max(1, math.Min(1e9/rate, 1e18)))
	b.window = int64(math.Min(float64(b.interval)*float64(max(1, burst)), 1e18))
}

// allow takes one line at now (unix nanoseconds); false: over the bound.
func (b *rateBound) allow(now int64) bool {
	if b.interval == 0 {
		return true
	}
	for {
		tat := b.tat.Load()
		next := max(tat, now) + b.interval
		if next-now > b.window {
			return false
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true
		}
	}
}
