//go:build linux

package dispatch

import (
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// h2Parks returns how many times the readers of the server's HTTP/2
// connections have waited with the idle poller, and how many connections
// there are.
func (e *fairEnv) h2Parks() (parks int64, conns int) {
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	for hc := range e.srv.h2conns {
		parks += hc.nc.parks.Load()
	}
	return parks, len(e.srv.h2conns)
}

// TestQuietH2ReaderWaitsWithTheIdlePoller: while fair admission is
// contended, the reader of a light instance's HTTP/2 connection waits for
// its client's next frames with the idle poller (where a flood's releases
// look, pollParked), and its next requests are served from there; while
// nothing is contended it reads as usual. A revocation while it waits ends
// the connection at once (its registration is taken before the socket is
// closed), as does the client's hang-up.
func TestQuietH2ReaderWaitsWithTheIdlePoller(t *testing.T) {
	e := newFairEnv(t, 9, time.Hour)
	b := e.client(fairHostB, true)
	if err := <-send(b, "/fast"); err != nil {
		t.Fatal(err)
	}
	if parks, _ := e.h2Parks(); parks != 0 || e.srv.idleConns.waiters() != 0 {
		t.Fatalf("%d waits with the idle poller with nothing contended", parks)
	}

	release := e.holdEverySlot()
	if err := <-send(b, "/fast"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "B's reader waiting with the idle poller", func() bool { return e.srv.idleConns.waiters() == 1 })
	for i := range 3 {
		if err := <-send(b, "/fast"); err != nil {
			t.Fatalf("request %d after the reader waited with the idle poller: %v", i, err)
		}
		testutil.Eventually(t, 5*time.Second, "B's reader waiting again", func() bool { return e.srv.idleConns.waiters() == 1 })
	}
	if parks, _ := e.h2Parks(); parks < 4 {
		t.Errorf("%d waits with the idle poller for 4 requests under contention", parks)
	}

	// Revoked while it waits: the connection ends, nothing stays
	// registered.
	doc, err := routes.ParseDocument([]byte(`{"revision":"r2","instances":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	e.table.Apply(doc)
	testutil.Eventually(t, 5*time.Second, "the revoked connection ended", func() bool {
		_, conns := e.h2Parks()
		return conns == 0 && e.srv.idleConns.waiters() == 0
	})
	release()
}

// TestQuietH2ReaderHangUp: a light instance's HTTP/2 connection whose
// reader waits with the idle poller ends when its client hangs up.
func TestQuietH2ReaderHangUp(t *testing.T) {
	e := newFairEnv(t, 9, time.Hour)
	tc := e.dialTLS(fairHostB, "h2")
	cc, err := h2NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	b := &h2FairClient{host: fairHostB, cc: cc}
	defer e.holdEverySlot()()
	if err := <-send(b, "/fast"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "B's reader waiting with the idle poller", func() bool { return e.srv.idleConns.waiters() == 1 })
	_ = cc.Close()
	_ = tc.Close()
	testutil.Eventually(t, 5*time.Second, "the connection ended", func() bool {
		_, conns := e.h2Parks()
		return conns == 0 && e.srv.idleConns.waiters() == 0
	})
}
