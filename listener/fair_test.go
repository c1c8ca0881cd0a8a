package listener

import (
	"crypto/tls"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/testutil"
)

// TestHandshakeFairAdmission: a new TLS handshake waits for fair
// admission, as the instance its SNI names, while every slot is taken, and
// completes once one is released; a handshake queued past the handshake
// timeout is closed without a slot lost.
func TestHandshakeFairAdmission(t *testing.T) {
	sched := fairshare.New(fairshare.Config{Slots: 1, Lease: time.Hour})
	t.Cleanup(sched.Close)
	l, h, ca := newTestListenerWith(t, nil, func(c *Config) {
		c.Fair = sched
		c.HandshakeTimeout = 2 * time.Second
	})
	held, ok := sched.TryAdmit()
	if !ok {
		t.Fatal("the only slot is taken")
	}
	dialed := make(chan error, 1)
	go func() {
		tc, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: "team--demo--web." + testDomain, RootCAs: ca.Pool()})
		if err == nil {
			_ = tc.Close()
		}
		dialed <- err
	}()
	testutil.Eventually(t, 5*time.Second, "the handshake queued", func() bool { return sched.Waiting() == 1 })
	select {
	case err := <-dialed:
		t.Fatalf("handshake finished while its admission was queued: %v", err)
	default:
	}
	route := l.cfg.Routes.Lookup("team--demo--web." + testDomain)
	sched.Release(held)
	if err := <-dialed; err != nil {
		t.Fatalf("handshake after the slot was released: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, "the handoff", func() bool { return len(h.handedOff()) == 1 })
	if n := route.Instance.Fair.Waits(); n != 1 {
		t.Errorf("instance fair waits %d, want 1", n)
	}

	// Queued past the handshake timeout: closed, and the slot still works.
	held, _ = sched.TryAdmit()
	start := time.Now()
	_, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: "team--demo--web." + testDomain, RootCAs: ca.Pool()})
	if err == nil {
		t.Fatal("handshake completed with the only slot held throughout")
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("refused after %v, before the handshake timeout", d)
	}
	testutil.Eventually(t, 5*time.Second, "nothing queued", func() bool { return sched.Waiting() == 0 })
	testutil.Eventually(t, 5*time.Second, "the refusal counted", func() bool {
		return promtestutil.ToFloat64(l.m.rejections.WithLabelValues("fair_wait")) == 1
	})
	sched.Release(held)
	if sched.Contended() {
		t.Error("a slot lost after the timed-out handshake")
	}
}
