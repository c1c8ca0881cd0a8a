package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
	"github.com/applistener/applistener/internal/testutil"
)

func TestRetryBound(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		until time.Time
		want  time.Duration
	}{
		{time.Time{}, 0},
		{now.Add(-time.Second), 0},
		{now, 0},
		{now.Add(30 * time.Second), 3 * time.Second},
		{now.Add(time.Second), 100 * time.Millisecond},
		{now.Add(100 * time.Millisecond), api.MinRetryBound},
	} {
		if got := api.RetryBound(tc.until, now); got != tc.want {
			t.Errorf("RetryBound(now%+v) = %v; want %v", tc.until.Sub(now), got, tc.want)
		}
	}
}

// The watch rides out outages shorter than the freshness: the gateway goes
// away (connections refused, streams cut) and, later, answers 503 (an etcd
// quorum loss), each for most of the routes' validity, with a backoff
// allowed to grow to 30 s. The held route never expires and the watch is
// back within a fraction of the validity left once the gateway is.
func TestDiscoveryWatchRetryBoundedByFreshness(t *testing.T) {
	const freshness = 6 * time.Second
	var unavailable atomic.Bool
	srv, _ := discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if unavailable.Load() {
			http.Error(w, "503 Service Unavailable: store unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for i := 0; ; i++ {
			// Every snapshot renews the route, as a gateway does while its
			// supervisor keeps its session.
			line := discSnapshotLine(t, "team", fmt.Sprint(n*100000+i), discTestRoute("demo", "web", time.Now().Add(freshness)))
			if _, err := fmt.Fprint(w, line); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tk.C:
			}
		}
	})
	out := controltest.NewOutage(t, strings.TrimPrefix(srv.URL, "http://"))
	c := &api.DiscoveryClient{Gateway: "http://" + out.Addr(), MaxBackoff: 30 * time.Second, StreamIdleTimeout: time.Second}
	defer c.CloseIdleConnections()

	var lastRenewal atomic.Int64 // unix nanoseconds of the last snapshot delivered
	var lost atomic.Int64        // snapshots that came after the previous one's route expired
	var heldUntil time.Time      // the expiry of the route held (watch goroutine only)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, "team", func(s *api.RouteSnapshot) {
			now := time.Now()
			if !heldUntil.IsZero() && !now.Before(heldUntil) {
				lost.Add(1)
			}
			if len(s.Routes) == 1 {
				heldUntil = s.Routes[0].ExpiresAt
			}
			lastRenewal.Store(now.UnixNano())
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the watch ended with %v, want its context's cancellation", err)
		}
	}()
	testutil.Eventually(t, 5*time.Second, "a first snapshot", func() bool { return lastRenewal.Load() != 0 })

	outage := freshness * 2 / 3
	gap := func(what string, down, up func()) {
		down()
		deadline := time.Now().Add(outage)
		for time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		back := time.Now()
		up()
		testutil.Eventually(t, freshness, "a renewal after "+what, func() bool { return lastRenewal.Load() > back.UnixNano() })
		g := time.Unix(0, lastRenewal.Load()).Sub(back)
		t.Logf("%s of %v: renewed %v after the gateway's return", what, outage, g.Round(time.Millisecond))
		// What was left was about freshness-outage (2 s): the bound is a
		// tenth of it, plus a reconnection on a loaded machine. (A backoff
		// bounded only by its 30 s cap is often seconds from its next attempt
		// here.)
		if g > time.Second {
			t.Errorf("%s: renewal %v after the gateway's return; want within a fraction of the validity left", what, g)
		}
	}
	gap("outage", out.Down, out.Up)
	gap("503s", func() { unavailable.Store(true); out.Down(); out.Up() }, func() { unavailable.Store(false) })
	if n := lost.Load(); n != 0 {
		t.Errorf("the held route expired %d times during outages shorter than its freshness", n)
	}
}
