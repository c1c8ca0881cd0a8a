package ndjson

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// One keepalive rule for every client: the keepalive line, white space
// aside, and nothing else.
func TestIsKeepalive(t *testing.T) {
	for line, want := range map[string]bool{
		`{"keepalive":true}`:             true,
		`{"keepalive": true}`:            true,
		" {\t\"keepalive\" : true }\r\n": true,
		`{"keepalive":false}`:            false,
		`{"keepalive":true,"x":1}`:       false,
		`{"keepalive":"true"}`:           false,
		`{"revision":"1"}`:               false,
		``:                               false,
		`{"keepalive":true}` + strings.Repeat(" ", 64): false, // longer than any keepalive line
	} {
		if got := IsKeepalive([]byte(line)); got != want {
			t.Errorf("IsKeepalive(%q) = %v, want %v", line, got, want)
		}
	}
}

// The reader skips blank lines, tells keepalives, returns io.EOF at a
// clean end and refuses a line over the bound.
func TestReaderLines(t *testing.T) {
	body := "{\"a\":1}\n\n  \n{\"keepalive\":true}\n" + `{"b":"` + strings.Repeat("x", 100) + `"}` + "\n"
	r := NewReader(strings.NewReader(body), 64, time.Minute, func() {})
	defer r.Stop()
	if line, ka, err := r.Next(); string(line) != `{"a":1}` || ka || err != nil {
		t.Fatalf("first: %q %v %v", line, ka, err)
	}
	if line, ka, err := r.Next(); !ka || err != nil {
		t.Fatalf("second: %q %v %v; want the keepalive", line, ka, err)
	}
	if _, _, err := r.Next(); err == nil || !strings.Contains(err.Error(), "larger than 64") {
		t.Fatalf("a line over the bound: %v", err)
	}
	r2 := NewReader(strings.NewReader("{\"a\":1}\n{\"cut"), 64, time.Minute, func() {})
	defer r2.Stop()
	_, _, _ = r2.Next()
	if _, _, err := r2.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("a stream ending in a line: %v; want io.EOF", err)
	}
}

// A stream that sends nothing for the idle time is cancelled and its read
// fails with a *SilentError; lines and keepalives keep it alive.
func TestReaderSilence(t *testing.T) {
	const idle = time.Second
	pr, pw := io.Pipe()
	defer func() { _ = pr.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The cancel of a request's context ends its body's reads.
		<-ctx.Done()
		_ = pw.CloseWithError(context.Canceled)
	}()
	r := NewReader(pr, 1024, idle, cancel)
	defer r.Stop()
	writes := make(chan error, 1)
	go func() {
		// Keepalives at a fifth of the idle time, for twice the idle time.
		for range 10 {
			if _, err := pw.Write(KeepaliveLine); err != nil {
				writes <- err
				return
			}
			time.Sleep(idle / 5)
		}
		writes <- nil
	}()
	start := time.Now()
	for range 10 {
		if _, ka, err := r.Next(); err != nil || !ka {
			t.Fatalf("keepalive: %v %v after %v", ka, err, time.Since(start))
		}
	}
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	_, _, err := r.Next()
	var silent *SilentError
	if !errors.As(err, &silent) || silent.For != idle {
		t.Fatalf("after the silence: %v; want a *SilentError for %v", err, idle)
	}
	if took := time.Since(start); took < 2*idle {
		t.Errorf("silent after %v; the keepalives came for at least %v", took, 2*idle)
	}
}

// Backoff: exponential from Base up to Max, jitter in the upper half,
// never above the limit passed in; Reset and Hold bring it back down.
func TestBackoff(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	for i, top := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		top *= time.Millisecond
		if top > time.Second {
			top = time.Second
		}
		d := b.Next(0)
		if d < top/2 || d > top {
			t.Fatalf("delay %d: %v, want in [%v, %v]", i, d, top/2, top)
		}
	}
	if b.Failures() != 6 {
		t.Fatalf("failures %d, want 6", b.Failures())
	}
	// A limit (what the caller still holds) caps every delay, jitter
	// included.
	for range 100 {
		if d := b.Peek(150 * time.Millisecond); d > 150*time.Millisecond || d < 75*time.Millisecond {
			t.Fatalf("limited delay %v, want in [75ms, 150ms]", d)
		}
	}
	if b.Failures() != 6 {
		t.Fatal("Peek counted a failure")
	}
	b.Hold(2)
	if d := b.Next(0); d > 400*time.Millisecond {
		t.Fatalf("after Hold(2): %v, want at most 400ms", d)
	}
	b.Reset()
	if d := b.Next(0); d > 100*time.Millisecond {
		t.Fatalf("after Reset: %v, want at most the base", d)
	}
	var zero Backoff
	if d := zero.Next(0); d < DefaultBackoffBase/2 || d > DefaultBackoffBase {
		t.Fatalf("zero value: %v", d)
	}
	for range 40 {
		zero.Next(0)
	}
	if d := zero.Next(0); d > DefaultBackoffMax {
		t.Fatalf("zero value after many failures: %v > %v", d, DefaultBackoffMax)
	}
}

// Sleep waits its time, or ends with its context.
func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep without a cancel returned false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if Sleep(ctx, time.Minute) {
		t.Fatal("Sleep returned true after its context ended")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Sleep ended %v after its context", took)
	}
}
