package gateway

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// discoveryCode returns the status of a discovery GET of team.
func discoveryCode(r *replica) int {
	resp, _ := r.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	return resp.StatusCode
}

// A memory-store gateway's discovery warmup ends as soon as every
// supervisor that a document grants routes is back (a session and an
// advertisement made in it), not a whole warmup later: before, 503; once
// the last one advertised, 200 with every route and a log line. Until
// then, one supervisor back is not enough.
func TestMemoryWarmupEndsWhenEverySupervisorIsBack(t *testing.T) {
	checkLeaks(t)
	configPath, tokensPath := replicaFiles(t)
	r := newReplica(t, replicaOptions{configPath: configPath, tokensPath: tokensPath, warmup: time.Minute})
	if code := discoveryCode(r); code != http.StatusServiceUnavailable {
		t.Fatalf("discovery at the start of the warmup: %d; want 503", code)
	}
	web := webRoute(1)
	other := genRoute{testRoute{ws: "team", sb: "other", name: "web", version: 1, expires: time.Now().Add(time.Minute), host: "10.0.0.2"}, "1"}
	if code := r.advertise("sup-1", routesTokSup1, sessionID(1), web); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if code := discoveryCode(r); code != http.StatusServiceUnavailable {
		t.Fatalf("discovery with sup-2 not back yet: %d; want 503", code)
	}
	back := time.Now()
	if code := r.advertise("sup-2", routesTokSup2, sessionID(2), other); code != http.StatusNoContent {
		t.Fatal(code)
	}
	want := []string{web.hostname() + "@sup-1", other.hostname() + "@sup-2"}
	slices.Sort(want)
	testutil.Eventually(t, 5*time.Second, "discovery answering once every supervisor is back", func() bool {
		return discoveryCode(r) == http.StatusOK
	})
	t.Logf("warmup of 1m ended %v after the last supervisor advertised", time.Since(back).Round(time.Millisecond))
	if got := r.snapshot("team", routesTokTeam); !slices.Equal(got, want) {
		t.Fatalf("first answer after the warmup: %v; want %v", got, want)
	}
	if !strings.Contains(r.logs.String(), "discovery warmup ended early") {
		t.Errorf("no log line of the early end:\n%s", r.logs.String())
	}
}
