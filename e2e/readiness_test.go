package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestReadinessFollowsRouteValidity (issue 25, the readiness blip): the
// gateway is killed; /readyz, and the health port of a dedicated
// supervisor (the probe that gates its Service), stay ready while the
// routes it holds are valid and served, and turn not ready once they
// expire, never before: a gateway outage shorter than the freshness pulls
// no endpoint. A shared host's health port keeps the seed's meaning and
// closes as soon as the session is lost. When the gateway returns,
// everything is ready again.
func TestReadinessFollowsRouteValidity(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"dedicated", "shared"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testReadinessFollowsRouteValidity(t, mode)
		})
	}
}

func testReadinessFollowsRouteValidity(t *testing.T, mode string) {
	// Renewals every 2 s (a third of it): at the kill the routes hold at
	// least ~4 s of validity, of which the first half is checked below.
	const fresh = 6 * time.Second
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}))
	gw.start(t)
	p := gw.startSupervisor(t, supervisorConfig{extra: []string{"--mode", mode, "--route-freshness", fresh.String()}})
	testutil.Eventually(t, waitTimeout, "the health port to accept connections", func() bool {
		return dialHealth(p.healthAddr) == nil
	})

	killed := time.Now()
	gw.kill(t)
	var healthClosedAt time.Duration
	holdsFor(t, fresh/2,
		&periodicCheck{name: "/readyz 200 while the routes are valid", every: 50 * time.Millisecond, fn: func() error {
			if code, body := readyzAt(p.adminAddr); code != http.StatusOK {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			return nil
		}},
		&periodicCheck{name: "the route served", every: 200 * time.Millisecond, fn: func() error {
			return p.handshakeErr(hostWeb)
		}},
		&periodicCheck{name: "the health port", every: 50 * time.Millisecond, fn: func() error {
			err := dialHealth(p.healthAddr)
			switch {
			case mode == "dedicated":
				return err // open while the routes are valid
			case err == nil && healthClosedAt == 0:
				return nil
			case isRefused(err):
				if healthClosedAt == 0 {
					healthClosedAt = time.Since(killed)
				}
				return nil
			case err == nil:
				return fmt.Errorf("the shared host's health port reopened %v after it closed without a gateway", healthClosedAt)
			}
			return err
		}},
	)
	if mode == "shared" && healthClosedAt == 0 {
		t.Errorf("the shared host's health port stayed open %v into the outage; want it closed once the session is lost", fresh/2)
	}

	// Then: not ready exactly when the routes expire. Both are observed
	// in turn every 50 ms; each only ever goes one way without a
	// gateway, so /readyz 503 while a handshake still succeeds after it,
	// or a refused handshake followed by /readyz 200, is a readiness
	// that does not say whether routes are served.
	var notReady, expired time.Duration
	var why string
	testutil.Eventually(t, fresh+deadlineMargin, "/readyz 503 and the route expired", func() bool {
		code, body := readyzAt(p.adminAddr)
		served := p.handshakeErr(hostWeb) == nil
		switch {
		case code == http.StatusServiceUnavailable && notReady == 0:
			notReady, why = time.Since(killed), body
			if served {
				t.Errorf("/readyz 503 %q %v after the kill while the route is still served", body, notReady)
			}
		case code == http.StatusOK && expired != 0:
			t.Errorf("/readyz 200 %v after the kill, after the route expired (%v)", time.Since(killed), expired)
		}
		if !served && expired == 0 {
			expired = time.Since(killed)
		}
		return notReady != 0 && expired != 0
	})
	t.Logf("%s: gateway killed; /readyz 503 after %v (%q), route refused after %v, a shared host's health port closed after %v",
		mode, notReady.Round(time.Millisecond), why, expired.Round(time.Millisecond), healthClosedAt.Round(time.Millisecond))
	if !strings.Contains(why, "stale") || !strings.Contains(why, "no gateway session") {
		t.Errorf("/readyz reason %q; want the stale routes and the lost session", why)
	}
	// The health port follows within its 100 ms tick.
	testutil.Eventually(t, waitTimeout, "the health port closed with the routes expired", func() bool {
		return isRefused(dialHealth(p.healthAddr))
	})

	gw.start(t)
	testutil.Eventually(t, waitTimeout, "/readyz 200 and the health port open after the gateway returned", func() bool {
		return p.readyz() == http.StatusOK && dialHealth(p.healthAddr) == nil && p.handshakeErr(hostWeb) == nil
	})
}
