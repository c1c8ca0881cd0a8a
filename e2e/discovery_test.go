package e2e

// End-to-end tests of route discovery and its consumers: the reference
// gateway, two supervisors that advertise their installations, the edge
// (SNI pass-through) and `applistener routes`, as real processes.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

const (
	demoHost  = "team--demo--web.apps.test"
	otherHost = "team--other--web.apps.test"
)

func TestDiscoveryEdgeEndToEnd(t *testing.T) {
	pki := newSupervisorPKI(t)
	web1, web2, web3 := newBackend(t, "web1"), newBackend(t, "web2"), newBackend(t, "web3")
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{
		"sup-1": {{"demo", map[string]int{"web": web1.port}}},
		"sup-2": {{"other", map[string]int{"web": web2.port}}},
	})
	sup1 := gw.startSupervisor(t, pki, "sup-1", 101)
	sup2 := gw.startSupervisor(t, pki, "sup-2", 202)

	// Both supervisors' installations are published with their endpoints.
	var snap *discoverySnapshot
	testutil.Eventually(t, waitTimeout, "both routes in discovery", func() bool {
		snap = gw.snapshot(t)
		return snap.route(demoHost) != nil && snap.route(otherHost) != nil
	})
	for _, c := range []struct {
		host string
		sup  *discoverySupervisor
	}{{demoHost, sup1}, {otherHost, sup2}} {
		r := snap.route(c.host)
		if r.Supervisor != c.sup.id || r.Endpoint.Host != "127.0.0.1" || r.Endpoint.Port != c.sup.port() ||
			r.Workspace != "team" || r.Name != "web" || r.InstallationVersion == 0 || time.Until(r.ExpiresAt) > discoveryFreshness+time.Second {
			t.Fatalf("route %s: %+v", c.host, r)
		}
	}

	edge := gw.startEdge(t)
	// Through the edge, each hostname reaches its own supervisor, which
	// terminates TLS with its own certificate (verified against the CA).
	for _, c := range []struct {
		host, app string
		sup       *discoverySupervisor
	}{{demoHost, "web1", sup1}, {otherHost, "web2", sup2}} {
		body, serial, err := getThroughEdge(edge.appAddr, pki.pool, c.host)
		if err != nil {
			t.Fatalf("GET https://%s/ through the edge: %v", c.host, err)
		}
		if body != "hello from "+c.app || serial != c.sup.serial {
			t.Fatalf("%s through the edge: %q from certificate %s, want %s from %s", c.host, body, serial, c.app, c.sup.serial)
		}
	}
	// An unknown name gets unrecognized_name from the edge.
	if err := edgeHandshakeErr(edge.appAddr, pki.pool, "team--nope--web.apps.test"); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("unknown name through the edge: %v", err)
	}

	// `routes get` prints the snapshot, as a table and as JSON.
	out, errOut, code := runCommandOnce(t, "routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team")
	if code != 0 || !strings.HasPrefix(out, "HOSTNAME") || !strings.Contains(out, demoHost) || !strings.Contains(out, "sup-2") {
		t.Fatalf("routes get: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Logf("routes get:\n%s", out)
	// The deprecated --token-file still works, with a warning on stderr.
	aliasOut, aliasErr, code := runCommandOnce(t, "routes", "get", "--gateway", gw.url(), "--token-file", teamTokenFile(t), "--workspace", "team")
	if code != 0 || !strings.Contains(aliasOut, demoHost) || !strings.Contains(aliasErr, "warning: --token-file is deprecated and will be removed; use --gateway-token-file") {
		t.Fatalf("routes get --token-file: exit %d\n%s\nstderr: %s", code, aliasOut, aliasErr)
	}
	out, _, code = runCommandOnce(t, "routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team", "--output", "json")
	var got discoverySnapshot
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.route(otherHost) == nil {
		t.Fatalf("routes get --output json: exit %d %q", code, out)
	}
	watch := runCommand(t, "routes", "watch", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team", "--output", "json")
	watch.next(t, waitTimeout, "the first set", func(l string) bool { return strings.Contains(l, demoHost) })

	// Renewal keeps the installation version while expires_at moves on.
	first := gw.snapshot(t).route(demoHost)
	testutil.Eventually(t, waitTimeout, "a renewal", func() bool {
		r := gw.snapshot(t).route(demoHost)
		return r != nil && r.ExpiresAt.After(first.ExpiresAt.Add(discoveryKeepalive/2))
	})
	if r := gw.snapshot(t).route(demoHost); r.InstallationVersion != first.InstallationVersion {
		t.Fatalf("renewal changed installation_version %d → %d", first.InstallationVersion, r.InstallationVersion)
	}

	// A port change is a new installation (new version); the edge's new
	// connections reach the new app.
	gw.writeConfig(t, map[string][]discoveryInstance{
		"sup-1": {{"demo", map[string]int{"web": web3.port}}},
		"sup-2": {{"other", map[string]int{"web": web2.port}}},
	})
	testutil.Eventually(t, waitTimeout, "a new installation version", func() bool {
		r := gw.snapshot(t).route(demoHost)
		return r != nil && r.InstallationVersion > first.InstallationVersion && r.Supervisor == "sup-1"
	})
	testutil.Eventually(t, waitTimeout, "web3 through the edge", func() bool {
		body, _, err := getThroughEdge(edge.appAddr, pki.pool, demoHost)
		return err == nil && body == "hello from web3"
	})

	// Move the sandbox from sup-1 to sup-2 in the gateway's configuration:
	// the open connection to sup-1 is closed, new ones follow to sup-2.
	held := edgeConn(t, edge.appAddr, pki.pool, demoHost)
	if resp, body := held.roundTrip(t, "GET / HTTP/1.1\r\nHost: "+demoHost+"\r\n\r\n"); resp.StatusCode != 200 || string(body) != "hello from web3\n" {
		t.Fatalf("held connection: %d %q", resp.StatusCode, body)
	}
	moved := time.Now()
	gw.writeConfig(t, map[string][]discoveryInstance{
		"sup-2": {{"other", map[string]int{"web": web2.port}}, {"demo", map[string]int{"web": web3.port}}},
	})
	var followed time.Duration
	testutil.Eventually(t, waitTimeout, "new connections to follow the move to sup-2", func() bool {
		_, serial, err := getThroughEdge(edge.appAddr, pki.pool, demoHost)
		if err == nil && serial == sup2.serial {
			followed = time.Since(moved)
			return true
		}
		return false
	})
	t.Logf("edge followed the move %v after the configuration was written (gateway file poll 250ms)", followed.Round(time.Millisecond))
	held.expectClosed(t, waitTimeout)
	if r := gw.snapshot(t).route(demoHost); r == nil || r.Supervisor != "sup-2" || r.Endpoint.Port != sup2.port() {
		t.Fatalf("after the move: %+v", r)
	}
	watch.next(t, waitTimeout, "the move in routes watch", func(l string) bool {
		var s discoverySnapshot
		if json.Unmarshal([]byte(l), &s) != nil {
			return false
		}
		r := s.route(demoHost)
		return r != nil && r.Supervisor == "sup-2"
	})

	// Stopping sup-2 abruptly (no withdrawal): its routes leave discovery
	// at their expires_at at the latest, the watch forgets them, and the
	// edge refuses their names.
	before := gw.snapshot(t)
	var latest time.Time
	for _, r := range before.Routes {
		if r.Supervisor == "sup-2" && r.ExpiresAt.After(latest) {
			latest = r.ExpiresAt
		}
	}
	sup2.kill()
	var gone time.Time
	testutil.Eventually(t, discoveryFreshness+waitTimeout, "sup-2's routes to leave discovery", func() bool {
		s := gw.snapshot(t)
		for _, r := range s.Routes {
			if r.Supervisor == "sup-2" {
				return false
			}
		}
		gone = time.Now()
		return true
	})
	t.Logf("sup-2's routes left discovery %v after their latest expires_at", gone.Sub(latest).Round(time.Millisecond))
	if gone.After(latest.Add(time.Second)) {
		t.Errorf("sup-2's routes left discovery %v after their latest expires_at", gone.Sub(latest))
	}
	watch.next(t, waitTimeout, "routes watch without sup-2", func(l string) bool {
		var s discoverySnapshot
		return json.Unmarshal([]byte(l), &s) == nil && s.route(demoHost) == nil && s.route(otherHost) == nil
	})
	testutil.Eventually(t, waitTimeout, "the edge to refuse sup-2's names", func() bool {
		err := edgeHandshakeErr(edge.appAddr, pki.pool, otherHost)
		return err != nil && strings.Contains(err.Error(), "unrecognized name")
	})
	if n := edge.metric(t, "applistener_edge_connections_total"); n < 5 {
		t.Errorf("edge connections metric %v", n)
	}
	if n := gw.metric(t, "applistener_gateway_discovery_watchers"); n < 2 {
		t.Errorf("gateway discovery watchers %v (edge and routes watch)", n)
	}
}

// teamTokenFile writes the edge's workspace token to a new file.
func teamTokenFile(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(edgeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// `routes watch` forgets a route at its expires_at even when the gateway
// stays silent (only keepalives), by a local timer.
func TestDiscoveryRoutesWatchLocalExpiry(t *testing.T) {
	exp := time.Now().Add(1500 * time.Millisecond).UTC()
	snapshot := fmt.Sprintf(`{"workspace":"team","revision":"7","routes":[`+
		`{"hostname":"team--a.apps.test","workspace":"team","sandbox":"a","name":"","supervisor":"sup-1","installation_version":1,"declaration_revision":1,"expires_at":%q,"endpoint":{"host":"10.0.0.1","port":8443}},`+
		`{"hostname":"team--b.apps.test","workspace":"team","sandbox":"b","name":"","supervisor":"sup-1","installation_version":2,"declaration_revision":1,"expires_at":%q,"endpoint":{"host":"10.0.0.1","port":8443}}]}`,
		exp.Format(time.RFC3339Nano), time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+edgeToken || r.URL.Query().Get("watch") != "1" {
			http.Error(w, "403 Forbidden: no", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, snapshot+"\n")
		w.(http.Flusher).Flush()
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tk.C:
				_, _ = io.WriteString(w, `{"keepalive":true}`+"\n")
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(fake.Close) // after the watch's cleanup has stopped it
	watch := runCommand(t, "routes", "watch", "--gateway", fake.URL, "--gateway-token-file", teamTokenFile(t), "--workspace", "team")
	watch.next(t, waitTimeout, "the table header", func(l string) bool { return strings.HasPrefix(l, "HOSTNAME") })
	watch.next(t, waitTimeout, "route a", func(l string) bool { return strings.HasPrefix(l, "team--a.apps.test") })
	header := watch.next(t, waitTimeout, "the next set", func(l string) bool { return strings.HasPrefix(l, "# ") })
	at := time.Now()
	if !strings.Contains(header, "1 route(s)") {
		t.Fatalf("next set header %q", header)
	}
	watch.next(t, time.Second, "the table header", func(l string) bool { return strings.HasPrefix(l, "HOSTNAME") })
	if l := watch.next(t, time.Second, "a route line", func(l string) bool { return strings.HasPrefix(l, "team--") }); !strings.HasPrefix(l, "team--b.apps.test") {
		t.Fatalf("after expiry the set has %q", l)
	}
	t.Logf("routes watch dropped the expired route %v after its expires_at (the gateway stayed silent)", at.Sub(exp).Round(time.Millisecond))
	if at.Before(exp) || at.After(exp.Add(time.Second)) {
		t.Errorf("dropped at %v, expires_at %v", at, exp)
	}
}

func TestDiscoveryCommandErrors(t *testing.T) {
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{})
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"routes"}, 2, "subcommand"},
		{[]string{"routes", "list"}, 2, "unknown subcommand"},
		{[]string{"routes", "get", "--gateway", gw.url()}, 2, "--gateway-token-file is required"},
		{[]string{"routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "Team"}, 2, "--workspace"},
		{[]string{"routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team", "--output", "yaml"}, 2, "--output"},
		{[]string{"routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "lab"}, 1, "403"},
		{[]string{"routes", "watch", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "lab"}, 1, "403"},
		{[]string{"routes", "get", "--gateway", gw.url(), "--gateway-token-file", "/nonexistent", "--workspace", "team"}, 1, "token file"},
		{[]string{"edge", "--address", "127.0.0.1:0"}, 2, "--gateway is required"},
		{[]string{"edge", "--address", "127.0.0.1:0", "--gateway", gw.url(), "--gateway-token-file", "x", "--workspace", "team,team"}, 2, "twice"},
		{[]string{"edge", "--address", "127.0.0.1:0", "--gateway", gw.url(), "--gateway-token-file", "x", "--workspace", "team", "--proxy-protocol", "v1"}, 2, "--proxy-protocol must be auto, v2 or off"},
		{[]string{"gateway", "--address", "127.0.0.1:0", "--config", "c", "--tokens", "t", "--discovery-send-timeout", "0s"}, 2, "--discovery-send-timeout"},
	} {
		_, stderr, code := runCommandOnce(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%q: exit %d, stderr %q; want exit %d with one line containing %q", c.args, code, stderr, c.code, c.want)
		}
	}
	// SIGTERM ends a watch with exit 0 (checked on cleanup).
	w := runCommand(t, "routes", "watch", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team")
	w.next(t, waitTimeout, "the table header", func(l string) bool { return strings.HasPrefix(l, "HOSTNAME") })
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
}
