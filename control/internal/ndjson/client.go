package ndjson

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// ReadLine reads one line of at most max bytes, its "\n" included. A last
// line without "\n" is not a line: the stream ended in its middle, and the
// read error (io.EOF) is returned.
func ReadLine(br *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > max {
			return nil, fmt.Errorf("NDJSON line larger than %d bytes", max)
		}
		if err == nil {
			if buf == nil {
				return frag, nil
			}
			return append(buf, frag...), nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			buf = append(buf, frag...)
			continue
		}
		return nil, err
	}
}

// keepaliveCompact is the keepalive line without white space.
var keepaliveCompact = []byte(`{"keepalive":true}`)

// IsKeepalive reports whether line is the keepalive line,
// {"keepalive":true}, white space (spaces, tabs, line ends) aside.
func IsKeepalive(line []byte) bool {
	if len(line) > 64 {
		return false
	}
	var compact [64]byte
	n := 0
	for _, c := range line {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		compact[n] = c
		n++
	}
	return bytes.Equal(compact[:n], keepaliveCompact)
}

// SilentError ends a watch stream that sent nothing, not even a keepalive,
// for For.
type SilentError struct{ For time.Duration }

func (e *SilentError) Error() string { return fmt.Sprintf("watch stream silent for %v", e.For) }

// Reader reads the lines of one watch stream and calls it dead after a
// silence. Use it from one goroutine; Stop it when done.
type Reader struct {
	br     *bufio.Reader
	max    int
	idle   time.Duration
	timer  *time.Timer
	silent atomic.Bool
}

// NewReader reads body in lines of at most maxLine bytes. When nothing
// arrives for idle it calls cancel, which must end the reads of body (the
// cancel of the request's context), and Next then fails with a
// *SilentError.
func NewReader(body io.Reader, maxLine int, idle time.Duration, cancel context.CancelFunc) *Reader {
	r := &Reader{br: bufio.NewReaderSize(body, 64<<10), max: maxLine, idle: idle}
	r.timer = time.AfterFunc(idle, func() {
		r.silent.Store(true)
		cancel()
	})
	return r
}

// Next returns the next line that is not blank, without surrounding white
// space, and whether it is a keepalive. Every line, a keepalive or a blank
// one too, restarts the silence timer. At the end of the stream it returns
// io.EOF; after a silence, a *SilentError.
func (r *Reader) Next() (line []byte, keepalive bool, err error) {
	for {
		line, err := ReadLine(r.br, r.max)
		if err != nil {
			if r.silent.Load() {
				return nil, false, &SilentError{For: r.idle}
			}
			return nil, false, err
		}
		r.timer.Reset(r.idle)
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		return line, IsKeepalive(line), nil
	}
}

// Stop stops the silence timer.
func (r *Reader) Stop() { r.timer.Stop() }

// Backoff spaces the retries of a client: exponential from Base, at most
// Max, with ±50 % jitter. The zero value uses DefaultBackoffBase and
// DefaultBackoffMax. It is used by one goroutine.
type Backoff struct {
	// Base is the delay before the first retry (DefaultBackoffBase when
	// not positive); each failure doubles it.
	Base time.Duration
	// Max caps the delay (DefaultBackoffMax when not positive).
	Max time.Duration

	failures int
}

// Defaults of Backoff.
const (
	DefaultBackoffBase = 250 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
)

// Next counts a failure and returns the delay before the next attempt:
// exponential in the failures since the last Reset, capped by Max and by
// limit (when positive: what the caller can afford to wait, such as a
// fraction of the validity it still holds), then spread by jitter over its
// upper half, so that it never exceeds either cap.
func (b *Backoff) Next(limit time.Duration) time.Duration {
	d := b.Peek(limit)
	b.failures++
	return d
}

// Peek returns a delay as Next does without counting a failure.
func (b *Backoff) Peek(limit time.Duration) time.Duration {
	base, most := b.Base, b.Max
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if most <= 0 {
		most = DefaultBackoffMax
	}
	d := min(base<<min(b.failures, 20), most)
	if limit > 0 {
		d = min(d, limit)
	}
	return d/2 + rand.N(d/2+1)
}

// Reset forgets the failures: the next delay is the base one again.
func (b *Backoff) Reset() { b.failures = 0 }

// Failures returns the failures counted since the last Reset.
func (b *Backoff) Failures() int { return b.failures }

// Hold caps the failures counted at n, so that the next delays stay at
// most those after n failures.
func (b *Backoff) Hold(n int) { b.failures = min(b.failures, n) }

// Sleep waits d, or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
