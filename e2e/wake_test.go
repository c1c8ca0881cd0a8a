package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// wakeDoc routes team/demo's web (wake on navigation) in state.
func wakeDoc(port int, state string) []byte {
	return fmt.Appendf(nil, `{"revision":"w%d","instances":[
	  {"workspace":"team","sandbox":"demo","generation":"1","state":%q,
	   "services":[{"name":"web","port":%d,"wake":{"on":"navigation","hold_seconds":30}}]}]}`, revCounter.Add(1), state, port)
}

// TestWakeRoutesFile: `serve --routes-file --wake-hook`: a navigation to a
// sleeping instance calls the platform's hook once, is held while the
// platform resumes the sandbox and rewrites the routes file with the
// instance active, then gets the app's answer; a fetch never wakes it.
// With APPLISTENER_WAKE_FIGURES=1 it makes 20 wakes with a platform that
// takes 1 s and logs the time to the app's first byte (p50, p99) and what
// the listener adds to the platform's second.
func TestWakeRoutesFile(t *testing.T) {
	rounds, platformDelay := 3, 300*time.Millisecond
	if os.Getenv("APPLISTENER_WAKE_FIGURES") == "1" {
		rounds, platformDelay = 20, time.Second
	}
	be := newBackend(t, "app")
	var (
		p      *proc
		calls  atomic.Int64
		bg     sync.WaitGroup
		mu     sync.Mutex
		bodies []string
	)
	defer bg.Wait()
	platform := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		bg.Go(func() {
			time.Sleep(platformDelay) // the sandbox resumes
			writeAtomic(t, p.routesFile, wakeDoc(be.port, "active"))
		})
	}))
	defer platform.Close()
	p = startProc(t, wakeDoc(be.port, "sleeping"), "--wake-hook", platform.URL+"/wake")
	web := "team--demo--web." + domain
	c, _ := p.client(t, web)
	get := func(hdr ...string) (*http.Response, string, time.Duration) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+web+"/page", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		firstByte := time.Since(start)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp, string(b), firstByte
	}
	var took []time.Duration
	for i := range rounds {
		if i > 0 {
			p.writeRoutes(t, wakeDoc(be.port, "sleeping"))
		}
		testutil.Eventually(t, waitTimeout, "the instance sleeping", func() bool {
			resp, body, _ := get("Accept", "application/json", "Sec-Fetch-Mode", "cors")
			return resp.StatusCode == 503 && body == `{"state":"sleeping"}` && resp.Header.Get("Retry-After") != ""
		})
		if got := calls.Load(); got != int64(i) {
			t.Fatalf("round %d: %d hook calls before the navigation; fetches must not wake", i, got)
		}
		resp, body, firstByte := get("Accept", "text/html", "Sec-Fetch-Mode", "navigate")
		if resp.StatusCode != 200 || !strings.Contains(body, "app") {
			t.Fatalf("round %d: the held navigation got %d %q", i, resp.StatusCode, body)
		}
		if got := calls.Load(); got != int64(i+1) {
			t.Fatalf("round %d: %d hook calls, want %d", i, got, i+1)
		}
		took = append(took, firstByte)
	}
	mu.Lock()
	first := bodies[0]
	mu.Unlock()
	host, _ := os.Hostname()
	if want := `{"workspace":"team","sandbox":"demo","generation":"1","supervisor":"` + host + `"}`; first != want {
		t.Fatalf("hook body %s, want %s", first, want)
	}
	slices.Sort(took)
	p50, p99 := took[len(took)/2], took[min(len(took)-1, len(took)*99/100)]
	t.Logf("%d wakes, platform %v: first request to the app's first byte p50 %v p99 %v; the listener adds p50 %v p99 %v (hook call, routes file poll, release, dial)",
		len(took), platformDelay, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
		(p50 - platformDelay).Round(time.Millisecond), (p99 - platformDelay).Round(time.Millisecond))
	if n := p.metric(t, "applistener_wake_total"); n != float64(rounds) {
		t.Fatalf("applistener_wake_total = %v, want %d", n, rounds)
	}
}

// TestWakeThroughGatewayAndEdge (issue 27, test 7): the real gateway
// with --wake-hook pointing at a test platform, a supervisor on a gateway
// session and the edge in front. Through the edge, a fetch to the sleeping
// instance gets 503 {"state":"sleeping"} and wakes nothing; a navigation
// is held while the supervisor asks the gateway, the gateway asks the
// platform once, and the platform marks the instance active through the
// write API; the navigation then gets the app. APPLISTENER_WAKE_FIGURES=1
// makes it 20 wakes with a platform that takes 1 s, and logs p50 and p99.
func TestWakeThroughGatewayAndEdge(t *testing.T) {
	const adminToken = "wake-admin-token"
	rounds, platformDelay := 2, 200*time.Millisecond
	if os.Getenv("APPLISTENER_WAKE_FIGURES") == "1" {
		rounds, platformDelay = 20, time.Second
	}
	pki := newSupervisorPKI(t)
	be := newBackend(t, "web1")
	entry := func(state string) string {
		return fmt.Sprintf(`{"workspace":"team","sandbox":"demo","generation":"1","state":%q,"services":[{"name":"web","port":%d,"wake":{"on":"navigation","hold_seconds":30}}]}`, state, be.port)
	}
	var (
		gwURL string
		calls atomic.Int64
		bg    sync.WaitGroup
		mu    sync.Mutex
		body  string
	)
	defer bg.Wait()
	put := func(e string) (int, error) {
		req, _ := http.NewRequest(http.MethodPut, gwURL+"/v1/supervisors/sup-1/instances/team/demo", strings.NewReader(e))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := adminClient.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	platform := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		body = string(b)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		bg.Go(func() {
			time.Sleep(platformDelay) // the sandbox resumes
			_, _ = put(entry("active"))
		})
	}))
	defer platform.Close()
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{}, "--wake-hook", platform.URL+"/wake")
	gwURL = gw.url()
	writeAtomic(t, gw.tokensPath, []byte(`{"tokens": [
		{"token": "disc-sup-1", "supervisor": "sup-1"},
		{"token": "`+edgeToken+`", "workspaces": ["team"]},
		{"token": "`+adminToken+`", "admin": true}]}`))
	testutil.Eventually(t, waitTimeout, "the sleeping entry written with the admin token", func() bool {
		code, err := put(entry("sleeping"))
		return err == nil && code == http.StatusOK
	})
	gw.startSupervisor(t, pki, "sup-1", 101)
	testutil.Eventually(t, waitTimeout, "the sleeping route in discovery", func() bool { return gw.snapshot(t).route(demoHost) != nil })
	edge := gw.startEdge(t)

	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", edge.appAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: pki.pool, ServerName: demoHost},
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	get := func(hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+demoHost+"/", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET through the edge: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	var took []time.Duration
	for i := range rounds {
		if i > 0 {
			if code, err := put(entry("sleeping")); err != nil || code != http.StatusOK {
				t.Fatalf("round %d: PUT sleeping: %d %v", i, code, err)
			}
		}
		testutil.Eventually(t, waitTimeout, "the edge reaching the sleeping instance", func() bool {
			code, b := get("Accept", "application/json", "Sec-Fetch-Mode", "cors")
			return code == 503 && b == `{"state":"sleeping"}`
		})
		if got := calls.Load(); got != int64(i) {
			t.Fatalf("round %d: %d platform calls before the navigation; fetches must not wake", i, got)
		}
		start := time.Now()
		code, b := get("Accept", "text/html", "Sec-Fetch-Mode", "navigate")
		if code != 200 || b != "hello from web1" {
			t.Fatalf("round %d: the navigation through the edge got %d %q", i, code, b)
		}
		took = append(took, time.Since(start))
		if got := calls.Load(); got != int64(i+1) {
			t.Fatalf("round %d: %d platform calls, want %d", i, got, i+1)
		}
	}
	slices.Sort(took)
	p50, p99 := took[len(took)/2], took[min(len(took)-1, len(took)*99/100)]
	t.Logf("%d wakes through the edge, the supervisor and the gateway, platform %v: first request to the app's answer p50 %v p99 %v; applistener adds p50 %v p99 %v",
		len(took), platformDelay, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
		(p50 - platformDelay).Round(time.Millisecond), (p99 - platformDelay).Round(time.Millisecond))
	mu.Lock()
	got := body
	mu.Unlock()
	if want := `{"workspace":"team","sandbox":"demo","generation":"1","supervisor":"sup-1"}`; got != want {
		t.Fatalf("hook body %s, want %s", got, want)
	}
}
