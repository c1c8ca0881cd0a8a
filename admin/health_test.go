package admin

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/testutil"
)

// freeAddr returns a loopback address whose port was free a moment ago:
// the health listener is given a fixed address (as kubelet probes one) and
// must reopen on the same one.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// probeAccepted connects to addr like a kubelet tcpSocket probe and
// expects the health listener to accept the connection and close it.
func probeAccepted(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatalf("probe %s while ready: %v", addr, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	var one [1]byte
	n, err := c.Read(one[:])
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("probe %s while ready: read %d bytes, %v; want the listener to close the connection (EOF)", addr, n, err)
	}
}

// probeRefused expects nothing to listen on addr.
func probeRefused(t *testing.T, addr, when string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err == nil {
		_ = c.Close()
		t.Fatalf("probe %s %s: connected, want the connection refused", addr, when)
	}
}

func newHealth(t *testing.T, addr string) *HealthListener {
	t.Helper()
	h := NewHealthListener(addr, discardLogger())
	t.Cleanup(h.Close)
	return h
}

func setReady(t *testing.T, h *HealthListener, ready bool) {
	t.Helper()
	if err := h.SetReady(ready); err != nil {
		t.Fatalf("SetReady(%v): %v", ready, err)
	}
}

func TestHealthListenerClosedUntilReady(t *testing.T) {
	testutil.VerifyNone(t)
	addr := freeAddr(t)
	h := newHealth(t, addr)
	if got := h.Addr(); got != "" {
		t.Errorf("Addr before the first open = %q, want \"\"", got)
	}
	probeRefused(t, addr, "before SetReady")
	setReady(t, h, false) // closing a closed listener does nothing
	probeRefused(t, addr, "after SetReady(false)")
	if got := h.Addr(); got != "" {
		t.Errorf("Addr after SetReady(false) only = %q, want \"\"", got)
	}
}

func TestHealthListenerFollowsReadiness(t *testing.T) {
	testutil.VerifyNone(t)
	addr := freeAddr(t)
	h := newHealth(t, addr)
	for round := range 3 {
		setReady(t, h, true)
		if got := h.Addr(); got != addr {
			t.Fatalf("round %d: Addr = %q, want %q", round, got, addr)
		}
		for range 5 { // every probe is accepted and closed, not only the first
			probeAccepted(t, addr)
		}

		setReady(t, h, false)
		probeRefused(t, addr, "after SetReady(false)")
		if got := h.Addr(); got != addr {
			t.Errorf("round %d: Addr after closing = %q, want the last bound %q", round, got, addr)
		}
		// Closed means closed: its accept goroutine has ended too.
		if err := goleak.Find(); err != nil {
			t.Fatalf("round %d: goroutines left after SetReady(false): %v", round, err)
		}
	}
}

func TestHealthListenerSetReadyIsIdempotent(t *testing.T) {
	testutil.VerifyNone(t)
	h := newHealth(t, "127.0.0.1:0")
	setReady(t, h, true)
	first := h.Addr()
	if first == "" || strings.HasSuffix(first, ":0") {
		t.Fatalf("Addr after opening on 127.0.0.1:0 = %q, want the bound port", first)
	}
	probeAccepted(t, first)

	// Opening an open listener keeps it (binding :0 again would move it).
	setReady(t, h, true)
	if got := h.Addr(); got != first {
		t.Fatalf("Addr after a second SetReady(true) = %q, want %q unchanged", got, first)
	}
	probeAccepted(t, first)

	setReady(t, h, false)
	setReady(t, h, false)
	probeRefused(t, first, "after SetReady(false) twice")

	// Reopened on 127.0.0.1:0: a new port, which accepts.
	setReady(t, h, true)
	again := h.Addr()
	if again == "" || strings.HasSuffix(again, ":0") {
		t.Fatalf("Addr after reopening = %q, want the bound port", again)
	}
	probeAccepted(t, again)
}

func TestHealthListenerCloseIsFinal(t *testing.T) {
	testutil.VerifyNone(t)
	addr := freeAddr(t)
	h := newHealth(t, addr)
	setReady(t, h, true)
	probeAccepted(t, addr)

	h.Close()
	probeRefused(t, addr, "after Close")
	if err := goleak.Find(); err != nil {
		t.Fatalf("goroutines left after Close: %v", err)
	}
	// Readiness reported after Close (the readiness loop's last tick)
	// does not reopen it.
	if err := h.SetReady(true); err != nil {
		t.Fatalf("SetReady(true) after Close: %v, want nil", err)
	}
	probeRefused(t, addr, "after Close and SetReady(true)")
	if got := h.Addr(); got != addr {
		t.Errorf("Addr after Close = %q, want the last bound %q", got, addr)
	}
	h.Close() // closing twice is harmless
}

func TestHealthListenerCloseBeforeOpen(t *testing.T) {
	testutil.VerifyNone(t)
	addr := freeAddr(t)
	h := NewHealthListener(addr, discardLogger())
	h.Close()
	if err := h.SetReady(true); err != nil {
		t.Fatalf("SetReady(true) after Close: %v, want nil", err)
	}
	probeRefused(t, addr, "after Close before any open")
}

func TestHealthListenerBindErrorIsRetried(t *testing.T) {
	testutil.VerifyNone(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := busy.Addr().String()
	h := newHealth(t, addr)

	err = h.SetReady(true)
	if err == nil {
		_ = busy.Close()
		t.Fatalf("SetReady(true) on %s, which is in use, succeeded", addr)
	}
	if !strings.Contains(err.Error(), "health listener") {
		t.Errorf("SetReady(true) on a busy address: error %q does not name the health listener", err)
	}
	if got := h.Addr(); got != "" {
		t.Errorf("Addr after a failed open = %q, want \"\"", got)
	}

	// Once the address is free, the next readiness report opens it.
	if err := busy.Close(); err != nil {
		t.Fatal(err)
	}
	setReady(t, h, true)
	if got := h.Addr(); got != addr {
		t.Fatalf("Addr after the retry = %q, want %q", got, addr)
	}
	probeAccepted(t, addr)
}

// Readiness reports, address reads and Close race as they do in cmd (a
// ticker goroutine, the shutdown path, log lines); -race checks the locking
// and the result must still be one consistent listener.
func TestHealthListenerConcurrentUse(t *testing.T) {
	testutil.VerifyNone(t)
	addr := freeAddr(t)
	h := newHealth(t, addr)
	var wg sync.WaitGroup
	errs := make(chan error, 4*50)
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				if err := h.SetReady((g+i)%2 == 0); err != nil {
					errs <- err
				}
				_ = h.Addr()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("SetReady during concurrent use: %v", err)
	}

	setReady(t, h, true)
	probeAccepted(t, addr)
	h.Close()
	probeRefused(t, addr, "after Close")
}
