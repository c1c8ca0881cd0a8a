package routes

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Ranges of the document's rate limits (limits.requests_per_second,
// requests_burst, bytes_per_second, bytes_burst); 0 means unlimited (a
// rate) or the default (a burst).
const (
	// MaxRequestsPerSecond is the largest accepted limits.requests_per_second.
	MaxRequestsPerSecond = 1_000_000
	// MaxRequestsBurst is the largest accepted limits.requests_burst.
	MaxRequestsBurst = 1_000_000
	// MinBytesPerSecond and MaxBytesPerSecond bound a non-zero
	// limits.bytes_per_second (1 KiB/s to 1 TiB/s): below a KiB/s one
	// buffer of a relay would pause for minutes.
	MinBytesPerSecond = 1 << 10
	MaxBytesPerSecond = 1 << 40
	// MinBytesBurst and MaxBytesBurst bound a non-zero limits.bytes_burst
	// (one TLS record to 1 GiB).
	MinBytesBurst = 16 << 10
	MaxBytesBurst = 1 << 30
	// DefaultMinBytesBurst is the smallest default bytes_burst: the burst
	// is max(DefaultMinBytesBurst, bytes_per_second).
	DefaultMinBytesBurst = 64 << 10
)

// validateRates adds the problems of the rate limits to ps.
func (l *Limits) validateRates(ps *problemList) {
	if l.RequestsPerSecond < 0 || l.RequestsPerSecond > MaxRequestsPerSecond {
		ps.add("limits.requests_per_second", "%d out of range 0..%d", l.RequestsPerSecond, MaxRequestsPerSecond)
	}
	switch {
	case l.RequestsBurst < 0 || l.RequestsBurst > MaxRequestsBurst:
		ps.add("limits.requests_burst", "%d out of range 0..%d", l.RequestsBurst, MaxRequestsBurst)
	case l.RequestsBurst > 0 && l.RequestsPerSecond == 0:
		ps.add("limits.requests_burst", "set without limits.requests_per_second")
	}
	if l.BytesPerSecond != 0 && (l.BytesPerSecond < MinBytesPerSecond || l.BytesPerSecond > MaxBytesPerSecond) {
		ps.add("limits.bytes_per_second", "%d out of range: 0 (unlimited) or %d..%d", l.BytesPerSecond, MinBytesPerSecond, int64(MaxBytesPerSecond))
	}
	switch {
	case l.BytesBurst != 0 && (l.BytesBurst < MinBytesBurst || l.BytesBurst > MaxBytesBurst):
		ps.add("limits.bytes_burst", "%d out of range: 0 (default) or %d..%d", l.BytesBurst, MinBytesBurst, MaxBytesBurst)
	case l.BytesBurst > 0 && l.BytesPerSecond == 0:
		ps.add("limits.bytes_burst", "set without limits.bytes_per_second")
	}
}

// limiterEpoch is the origin of the buckets' clocks: times are kept as
// monotonic nanoseconds since it.
var limiterEpoch = time.Now()

// fullBucket is the theoretical arrival time of a bucket that is full
// whatever the clock says.
const fullBucket = math.MinInt64 / 4

// requestBucket is a request rate limit as a GCRA (generic cell rate
// algorithm): one atomic theoretical arrival time (tat), moved on by one
// interval per admitted request; a request is admitted while tat stays
// within tau (the burst) of now. No lock, no allocation.
type requestBucket struct {
	rate, burst int   // as in the document (burst resolved), to tell a change
	interval    int64 // nanoseconds per request
	tau         int64 // burst × interval
	tat         atomic.Int64
}

func newRequestBucket(rate, burst int) *requestBucket {
	burst = requestBurst(rate, burst)
	interval := int64(time.Second) / int64(rate)
	b := &requestBucket{rate: rate, burst: burst, interval: interval, tau: int64(burst) * interval}
	b.tat.Store(fullBucket)
	return b
}

// same reports whether b (nil: none) has these limits.
func (b *requestBucket) same(rate, burst int) bool {
	return b != nil && b.rate == rate && b.burst == burst
}

// requestBurst is the burst of a request limit (0: the default).
func requestBurst(rate, burst int) int {
	if burst == 0 {
		return max(1, rate)
	}
	return burst
}

// allow admits one request at now (nanoseconds since limiterEpoch) or
// returns how long until one would be admitted.
func (b *requestBucket) allow(now int64) (bool, time.Duration) {
	for {
		tat := b.tat.Load()
		next := max(tat, now) + b.interval
		if next-now > b.tau {
			return false, time.Duration(next - b.tau - now)
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true, 0
		}
	}
}

// byteBucket is a byte rate limit as a GCRA that never refuses: each
// relay takes its bytes at once and is told how long to wait until they
// conform (the debt beyond the burst, paid at the rate).
type byteBucket struct {
	rate, burst int64 // bytes per second and burst (resolved)
	tau         int64 // the burst in nanoseconds at the rate
	tat         atomic.Int64
}

func newByteBucket(rate, burst int64) *byteBucket {
	burst = bytesBurst(rate, burst)
	b := &byteBucket{rate: rate, burst: burst, tau: bytesNanos(burst, rate)}
	b.tat.Store(fullBucket)
	return b
}

// same reports whether b (nil: none) has these limits.
func (b *byteBucket) same(rate, burst int64) bool {
	return b != nil && b.rate == rate && b.burst == burst
}

// bytesBurst is the burst of a byte limit (0: the default).
func bytesBurst(rate, burst int64) int64 {
	if burst == 0 {
		return min(max(DefaultMinBytesBurst, rate), MaxBytesBurst)
	}
	return burst
}

// bytesNanos is the time n bytes take at rate bytes per second.
func bytesNanos(n, rate int64) int64 {
	if n <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(n), uint64(time.Second))
	if hi >= uint64(rate) {
		return math.MaxInt64 / 4 // not reached: n is a buffer, rate ≥ MinBytesPerSecond
	}
	q, _ := bits.Div64(hi, lo, uint64(rate))
	return int64(min(q, math.MaxInt64/4))
}

// take charges n bytes at now and returns how long the caller waits
// before relaying them (0: at once).
func (b *byteBucket) take(n, now int64) time.Duration {
	cost := bytesNanos(n, b.rate)
	for {
		tat := b.tat.Load()
		next := max(tat, now) + cost
		if b.tat.CompareAndSwap(tat, next) {
			return time.Duration(max(next-b.tau-now, 0))
		}
	}
}

// instanceRates are an Instance's rate limits: nil buckets are unlimited,
// so that an unlimited instance pays one atomic load per check.
type instanceRates struct {
	requests atomic.Pointer[requestBucket]
	bytes    atomic.Pointer[byteBucket]
	// throttledRequests counts 429s, throttledBytes pauses.
	throttledRequests atomic.Uint64
	throttledBytes    atomic.Uint64
}

// setRates applies the document's rate limits in place. A bucket whose
// limits did not change keeps its state; a changed one starts full, so
// that a raised limit takes effect at once.
func (r *instanceRates) setRates(l *Limits) {
	if rate := l.RequestsPerSecond; rate == 0 {
		r.requests.Store(nil)
	} else if burst := requestBurst(rate, l.RequestsBurst); !r.requests.Load().same(rate, burst) {
		r.requests.Store(newRequestBucket(rate, burst))
	}
	if rate := l.BytesPerSecond; rate == 0 {
		r.bytes.Store(nil)
	} else if burst := bytesBurst(rate, l.BytesBurst); !r.bytes.Load().same(rate, burst) {
		r.bytes.Store(newByteBucket(rate, burst))
	}
}

// sinceEpoch is now on the buckets' clock.
func sinceEpoch(now time.Time) int64 { return int64(now.Sub(limiterEpoch)) }

// LimitsRequests reports whether the instance has a request rate limit:
// callers skip reading the clock when not.
func (i *Instance) LimitsRequests() bool { return i.rates.requests.Load() != nil }

// LimitsBytes reports whether the instance has a byte rate limit.
func (i *Instance) LimitsBytes() bool { return i.rates.bytes.Load() != nil }

// AllowRequest admits one request of the instance at now under its
// limits.requests_per_second; when refused, retryAfter is how long until
// a request would be admitted, and the refusal is counted
// (applistener_instance_throttled_total{reason="requests"}).
func (i *Instance) AllowRequest(now time.Time) (ok bool, retryAfter time.Duration) {
	b := i.rates.requests.Load()
	if b == nil {
		return true, 0
	}
	ok, retryAfter = b.allow(sinceEpoch(now))
	if !ok {
		i.rates.throttledRequests.Add(1)
	}
	return ok, retryAfter
}

// ThrottleBytes charges n bytes relayed for the instance at now against
// its limits.bytes_per_second and returns how long the caller must wait
// before relaying them (0: at once). Bytes in both directions (request
// and response bodies, WebSocket frames either way) share the instance's
// one budget. A wait is counted
// (applistener_instance_throttled_total{reason="bytes"}).
func (i *Instance) ThrottleBytes(n int, now time.Time) (wait time.Duration) {
	b := i.rates.bytes.Load()
	if b == nil || n <= 0 {
		return 0
	}
	wait = b.take(int64(n), sinceEpoch(now))
	if wait > 0 {
		i.rates.throttledBytes.Add(1)
	}
	return wait
}

// Throttled returns the instance's counts of requests refused (429) and
// of byte pauses.
func (i *Instance) Throttled() (requests, bytes uint64) {
	return i.rates.throttledRequests.Load(), i.rates.throttledBytes.Load()
}
