package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestMemoryGatewayRestartNeverPublishesAPartialSet (issue 25, test 2,
// memory store): a memory-store gateway that restarts cannot know the
// routes its supervisors still hold until their sessions are back, so
// discovery, probed every 50 ms through a SIGKILL and a restart, never
// answers 200 without the supervisor's still-valid route: 503 during the
// warmup (--session-ttl + 2 s, ended early once the supervisor is back
// with its session and advertisement), then the full set.
func TestMemoryGatewayRestartNeverPublishesAPartialSet(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	gw := newMemGateway(t, routesDocument(docEntry{sandbox: "demo", services: []service{{Name: "web", Port: web.port, Revision: 1}}}),
		"--session-ttl", "3s", "--discovery-warmup", "-1s")
	writeAtomic(t, gw.tokensPath, []byte(`{"tokens": [{"token": "`+supervisorToken+`", "supervisor": "`+supervisorID+`"},
		{"token": "`+edgeToken+`", "workspaces": ["team"]}]}`))
	gw.start(t)
	gw.startSupervisor(t, supervisorConfig{extra: []string{"--route-freshness", "15s", "--advertise-address", "127.0.0.1"}})

	// probe returns the status of one discovery GET and, for a 200,
	// whether it holds hostWeb with an expires_at in the future.
	probe := func() (code int, holds bool, err error) {
		req, err := http.NewRequest(http.MethodGet, gw.endpoint()+"/v1/workspaces/team/service-routes", nil)
		if err != nil {
			return 0, false, err
		}
		req.Header.Set("Authorization", "Bearer "+edgeToken)
		resp, err := adminClient.Do(req)
		if err != nil {
			return 0, false, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return resp.StatusCode, false, err
		}
		var s struct {
			Routes []struct {
				Hostname  string    `json:"hostname"`
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"routes"`
		}
		if err := json.Unmarshal(body, &s); err != nil {
			return resp.StatusCode, false, fmt.Errorf("snapshot: %w", err)
		}
		for _, r := range s.Routes {
			if r.Hostname == hostWeb && r.ExpiresAt.After(time.Now()) {
				return resp.StatusCode, true, nil
			}
		}
		return resp.StatusCode, false, nil
	}
	testutil.Eventually(t, waitTimeout, "the advertised route in discovery", func() bool {
		code, holds, _ := probe()
		return code == http.StatusOK && holds
	})

	gw.kill(t)
	gw.start(t)
	restarted := time.Now()
	var ok200, unavailable, partial, failed int
	var firstPartial string
	var firstFull time.Duration
	for time.Since(restarted) < 8*time.Second { // warmup 5 s, then the full set
		code, holds, err := probe()
		switch {
		case err != nil:
			failed++
		case code == http.StatusOK && holds:
			ok200++
			if firstFull == 0 {
				firstFull = time.Since(restarted)
			}
		case code == http.StatusOK:
			partial++
			if firstPartial == "" {
				firstPartial = fmt.Sprintf("at %v", time.Since(restarted).Round(time.Millisecond))
			}
		case code == http.StatusServiceUnavailable:
			unavailable++
		default:
			t.Errorf("discovery answered %d after the restart", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after the restart: %d answers 503, %d 200 with the route (first after %v), %d 200 without it, %d failed probes",
		unavailable, ok200, firstFull.Round(time.Millisecond), partial, failed)
	if partial > 0 {
		t.Errorf("discovery answered 200 without the supervisor's still-valid route %d times (first %s)", partial, firstPartial)
	}
	// The warmup ends early once the supervisor is back (its session and
	// advertisement): no 503 at all is possible only then.
	if unavailable == 0 && !strings.Contains(gw.stderr.String(), "discovery warmup ended early") {
		t.Error("discovery never answered 503 after the restart: no warmup")
	}
	if ok200 == 0 {
		t.Error("discovery never published the route again after the warmup")
	}
	if !strings.Contains(gw.stderr.String(), "discovery answers 503 until") {
		t.Error("the warmup was not logged")
	}
}
