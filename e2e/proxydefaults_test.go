package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestEdgeAndSupervisorDefaultsWorkTogether: a supervisor without
// --trusted-proxies or --require-proxy-protocol (its defaults) and an
// edge with its default --proxy-protocol (auto) serve requests end to end;
// the mismatch (the supervisor refuses the edge's PROXY header) is
// explained once on each side and costs the client nothing.
func TestEdgeAndSupervisorDefaultsWorkTogether(t *testing.T) {
	pki := newSupervisorPKI(t)
	web := newBackend(t, "web1")
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{
		"sup-1": {{"demo", map[string]int{"web": web.port}}},
	})
	// startSupervisor's flags without --trusted-proxies.
	tlsDir := pki.tlsDir(t, 101)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, tokenFile, []byte("disc-sup-1\n"))
	sup := launchReady(t, "sup-1", func(addr, admin string) []string {
		return []string{"serve", "--mode", "shared",
			"--gateway", gw.url(), "--supervisor-id", "sup-1", "--gateway-token-file", tokenFile,
			"--gateway-poll-interval", "500ms", "--gateway-stream-timeout", "2s",
			"--advertise-address", "127.0.0.1",
			"--app-listener", "--app-domain", domain, "--app-address", addr, "--app-tls-dir", tlsDir,
			"--admin-address", admin, "--address", freeAddr(t), "--route-freshness", discoveryFreshness.String(),
			"--drain-timeout", "1s", "--log-format", "json"}
	}, func(p *proc) bool { return p.readyz() == http.StatusOK })
	testutil.Eventually(t, waitTimeout, "the route in discovery", func() bool { return gw.snapshot(t).route(demoHost) != nil })
	edge := gw.startEdge(t) // no --proxy-protocol: the default

	var took []time.Duration
	for i := range 5 {
		start := time.Now()
		body, _, err := getThroughEdge(edge.appAddr, pki.pool, demoHost)
		if err != nil || body != "hello from web1" {
			t.Fatalf("request %d through the edge with default flags: %q, %v", i, body, err)
		}
		took = append(took, time.Since(start).Round(100*time.Microsecond))
	}
	// The first connection pays the refused header and a second dial.
	t.Logf("request times on new connections (the first one falls back): %v", took)
	if n := strings.Count(sup.output(), `"reason":"proxy_untrusted"`); n != 1 {
		t.Errorf("the supervisor refused %d PROXY headers; want 1 (the edge then sends none):\n%s", n, sup.output())
	}
	if !strings.Contains(sup.output(), "list its address in --trusted-proxies") {
		t.Errorf("the supervisor's refusal does not say what to do:\n%s", sup.output())
	}
	if n := strings.Count(edge.output(), "PROXY protocol mismatch"); n != 1 {
		t.Errorf("the edge logged the mismatch %d times; want 1:\n%s", n, edge.output())
	}
}
