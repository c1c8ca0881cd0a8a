package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/applistener/applistener/internal/testutil"
)

// etcdCount returns the number of keys under prefix+sub.
func etcdCount(t testing.TB, endpoints []string, prefix string) int {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// probeDiscovery asks r for the snapshot of team every 50 ms for d and
// fails the test at any 200 that lacks one of want; it returns the number
// of 200s and 503s.
func probeDiscovery(t *testing.T, r *replica, d time.Duration, want ...string) (ok, unavailable int) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		resp, body := r.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
			for _, w := range want {
				if !strings.Contains(body, `"hostname":"`+w+`"`) {
					t.Fatalf("a restarted replica answered 200 without %s, which its supervisor still serves: %s", w, body)
				}
			}
		case http.StatusServiceUnavailable:
			unavailable++
		default:
			t.Fatalf("discovery answered %d: %s", resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond) // the probe's period, not a wait for a condition
	}
	return ok, unavailable
}

// After every replica was down for longer than the session TTL (etcd
// expired every session), a restarted replica never answers 200 without a
// route still valid at its supervisor: the advertisements whose sessions
// expired meanwhile stay published (DESIGN, "Faults"); one expires at its
// expires_at, one is kept when its supervisor returns with its session,
// and its withdrawal removes it (issue 25, test 2, etcd).
func TestEtcdFleetRestartKeepsAdvertisementsWhoseSessionsExpired(t *testing.T) {
	c, a, b := twoReplicas(t, 1, replicaOptions{sessionTTL: MinEtcdSessionTTL})
	o := replicaOptions{etcd: c.endpoints(), sessionTTL: MinEtcdSessionTTL}
	o.configPath, o.tokensPath = a.g.configPath, a.g.tokensPath
	web := webRoute(1)
	other := genRoute{testRoute{ws: "team", sb: "other", name: "web", version: 1, expires: time.Now().Add(30 * time.Second), host: "10.0.0.2"}, "1"}
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), web); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if code := b.advertise("sup-2", routesTokSup2, sessionID(2), other); code != http.StatusNoContent {
		t.Fatal(code)
	}
	both := []string{web.hostname() + "@sup-1", other.hostname() + "@sup-2"}
	slices.Sort(both)
	testutil.Eventually(t, 5*time.Second, "both routes published", func() bool {
		return slices.Equal(a.snapshot("team", routesTokTeam), both) && slices.Equal(b.snapshot("team", routesTokTeam), both)
	})

	// Every replica down until etcd has expired every session (and the
	// replicas' liveness keys).
	down := time.Now()
	a.stop()
	b.stop()
	testutil.Eventually(t, 4*MinEtcdSessionTTL, "every session and liveness key expired", func() bool {
		return etcdCount(t, o.etcd, "/test/"+keySessions) == 0 && etcdCount(t, o.etcd, "/test/"+keyReplicas) == 0
	})
	t.Logf("sessions expired %v after every replica stopped", time.Since(down).Round(100*time.Millisecond))
	if !time.Now().Before(other.expires.Add(-3 * time.Second)) {
		t.Fatalf("sup-2's route expires before the check (the machine is too slow for this test's timing)")
	}

	// The pair restarts one after the other: the second starts beside the
	// first, which is alive, and must not fall back to the normal rule.
	r := newReplica(t, o)
	testutil.Eventually(t, 10*time.Second, "the first restarted replica's liveness key", func() bool {
		return etcdCount(t, o.etcd, "/test/"+keyReplicas) == 1
	})
	r2 := newReplica(t, o)
	for i, rr := range []*replica{r, r2} {
		ok, unavailable := probeDiscovery(t, rr, time.Second, web.hostname(), other.hostname())
		t.Logf("restarted replica %d, 50 ms probes over 1 s: %d × 200 with every valid route, %d × 503", i+1, ok, unavailable)
		if ok == 0 {
			t.Fatalf("restarted replica %d never answered 200", i+1)
		}
	}
	if !strings.Contains(r.logs.String(), "every gateway replica was down") {
		t.Errorf("no log line of the recovered advertisements:\n%s", r.logs.String())
	}
	if !strings.Contains(r2.logs.String(), "recovered by another replica") {
		t.Errorf("the second replica did not take the first one's recovered advertisements:\n%s", r2.logs.String())
	}

	// sup-1 returns with its session: its route stays, under the normal
	// rule again.
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(2)); code != http.StatusNoContent {
		t.Fatalf("sup-1's return: %d", code)
	}
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, both) {
		t.Fatalf("after sup-1 returned: %v; want %v", got, both)
	}
	if got := r2.snapshot("team", routesTokTeam); !slices.Equal(got, both) {
		t.Fatalf("after sup-1 returned, on the second replica: %v; want %v", got, both)
	}
	// sup-2 never returns: its route goes at its expires_at, not before.
	testutil.Eventually(t, time.Until(other.expires)+5*time.Second, "sup-2's route expired", func() bool {
		return !slices.Contains(r.snapshot("team", routesTokTeam), other.hostname()+"@sup-2") &&
			!slices.Contains(r2.snapshot("team", routesTokTeam), other.hostname()+"@sup-2")
	})
	if early := time.Until(other.expires); early > 0 {
		t.Fatalf("sup-2's route left %v before its expires_at", early)
	}
	// sup-1 withdraws: gone.
	if resp, body := r.do(http.MethodDelete, "/v1/supervisors/sup-1/installations?session="+sessionID(1), routesTokSup1, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("withdraw: %d %q", resp.StatusCode, body)
	}
	testutil.Eventually(t, 5*time.Second, "the withdrawn route gone on both replicas", func() bool {
		return len(r.snapshot("team", routesTokTeam)) == 0 && len(r2.snapshot("team", routesTokTeam)) == 0
	})
}

// While a replica is alive, a session that expires ends its routes (its
// supervisor is gone), and a replica restarted then does not publish
// them again: recovery is for a fleet that was down only.
func TestEtcdReplicaRestartWithAnotherAliveKeepsExpiredSessionsOut(t *testing.T) {
	c, a, b := twoReplicas(t, 1, replicaOptions{sessionTTL: MinEtcdSessionTTL})
	o := replicaOptions{etcd: c.endpoints(), sessionTTL: MinEtcdSessionTTL}
	o.configPath, o.tokensPath = a.g.configPath, a.g.tokensPath
	if code := a.advertise("sup-1", routesTokSup1, sessionID(1), webRoute(1)); code != http.StatusNoContent {
		t.Fatal(code)
	}
	testutil.Eventually(t, 5*time.Second, "the route published", func() bool { return len(b.snapshot("team", routesTokTeam)) == 1 })
	// The supervisor goes silent: its session expires under the replicas'
	// watch, and its route leaves discovery.
	testutil.Eventually(t, 4*MinEtcdSessionTTL, "the silent supervisor's route gone", func() bool {
		return len(a.snapshot("team", routesTokTeam)) == 0
	})
	b.stop()
	r := newReplica(t, o)
	if got := r.snapshot("team", routesTokTeam); len(got) != 0 {
		t.Fatalf("a replica restarted beside a live one publishes %v, whose session expired under a replica's watch", got)
	}
	if strings.Contains(r.logs.String(), "every gateway replica was down") {
		t.Errorf("the restarted replica took the fleet for down:\n%s", r.logs.String())
	}
}
