package h2engine

import (
	"time"

	"golang.org/x/net/http2"
)

// tokenBucket bounds events in rate: burst tokens, refilled at rate per
// second. Only the reading goroutine uses a connection's buckets.
type tokenBucket struct {
	tokens float64
	burst  float64
	rate   float64
	at     time.Time // the last take (zero: none yet)
}

func (b *tokenBucket) init(burst int, rate float64) {
	b.burst, b.rate, b.tokens = float64(burst), rate, float64(burst)
}

// take takes a token; false when the bucket is empty.
func (b *tokenBucket) take() bool {
	now := time.Now()
	if !b.at.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	}
	b.at = now
	b.tokens--
	return b.tokens >= 0
}

// chargeReset charges a stream that ended before its handler could
// answer to the rapid-reset bucket: a reset from the client, a stream
// refused or rejected as malformed, or one the engine reset because of
// the client's frames (MadeYouReset). False when the bucket is empty.
func (c *Conn) chargeReset() bool { return c.resets.take() }

// Connection errors of the rate defences.
var (
	// errRapidReset: the reset bucket is empty.
	errRapidReset = connError{http2.ErrCodeEnhanceYourCalm, "too many streams reset or refused (rapid reset)"}
	// errInvalidFrames: the invalid-frame bucket is empty.
	errInvalidFrames = connError{http2.ErrCodeEnhanceYourCalm, "too many invalid frames (stream errors)"}
)

// clientStreamError answers a stream error the client's frames caused
// (an invalid frame, a malformed request or trailers): RST_STREAM on the
// stream, charged to the invalid-frame bucket and, when it reset a stream
// that was open, to the rapid-reset bucket as the client's own resets are
// (CVE-2025-8671, MadeYouReset): a client cannot have streams reset
// faster than it could reset them itself. The reset stream keeps its
// place among the MaxConcurrentStreams until its handler has returned
// (finishStream), so resets never make room for more handlers. An empty
// bucket closes the connection (GOAWAY ENHANCE_YOUR_CALM); done reports
// it.
func (c *Conn) clientStreamError(id uint32, code http2.ErrCode, reason string) (done bool, _ error) {
	wasOpen := c.streamError(id, code, reason)
	if wasOpen && !c.chargeReset() {
		return true, c.connError(errRapidReset.code, errRapidReset.reason)
	}
	if !c.invalid.take() {
		return true, c.connError(errInvalidFrames.code, errInvalidFrames.reason)
	}
	return false, nil
}
