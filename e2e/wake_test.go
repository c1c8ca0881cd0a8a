package e2e

import (
	"fmt"
	"io"
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
