package api

import "time"

// Retry bounded by freshness (DESIGN, "Faults"): a control-plane client
// that holds valid routes retries so that the next attempt is never
// further away than RetryFraction of the validity it still holds, whatever
// its exponential backoff has grown to. One backoff spans every configured
// endpoint and every kind of answer that is retried (connection errors,
// 5xx such as the 503 of an etcd quorum loss).
const (
	// RetryFraction is the divisor of the remaining validity: with 30 s
	// left, the next attempt is at most 3 s away (jitter spreads it over
	// the upper half of that bound).
	RetryFraction = 10
	// MinRetryBound is the smallest bound: below 10×MinRetryBound of
	// remaining validity the client retries about every MinRetryBound
	// rather than spinning.
	MinRetryBound = 50 * time.Millisecond
)

// RetryBound returns the cap of the next retry delay for a client whose
// routes stay valid until validUntil: RetryFraction of the time left, at
// least MinRetryBound; 0 (no cap beyond the backoff's own) when nothing
// valid is held (validUntil zero or past).
func RetryBound(validUntil, now time.Time) time.Duration {
	if validUntil.IsZero() {
		return 0
	}
	left := validUntil.Sub(now)
	if left <= 0 {
		return 0
	}
	return max(left/RetryFraction, MinRetryBound)
}
