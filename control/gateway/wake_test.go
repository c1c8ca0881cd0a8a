package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/wake"
)

// testPlatform is a real HTTP server standing for the platform's wake
// hook: it marks a woken instance active through the gateway's write API
// (as a platform does once the sandbox runs) and refuses sandbox "gone"
// with 409.
type testPlatform struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	bodies  []map[string]string
	gateway string // the gateway's URL, for the write API
	entries map[string]string
	fail    atomic.Bool // answer 500
}

func newTestPlatform(t *testing.T) *testPlatform {
	p := &testPlatform{entries: map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.calls.Add(1)
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		p.mu.Lock()
		p.bodies = append(p.bodies, body)
		entry := p.entries[body["workspace"]+"/"+body["sandbox"]]
		p.mu.Unlock()
		if p.fail.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if body["sandbox"] == "gone" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"reason":"sandbox deleted"}`))
			return
		}
		w.WriteHeader(http.StatusAccepted)
		if entry == "" {
			return
		}
		// Wake the sandbox, then mark it active through the write API.
		active := strings.Replace(entry, `"state":"sleeping"`, `"state":"active"`, 1)
		req, _ := http.NewRequest(http.MethodPut, p.gateway+"/v1/supervisors/"+body["supervisor"]+"/instances/"+body["workspace"]+"/"+body["sandbox"], strings.NewReader(active))
		req.Header.Set("Authorization", "Bearer "+repTokAdmin)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

const (
	wakeSup     = "sup-9" // a member of pool-a: not named by the configuration file
	wakeEntry   = `{"workspace":"team","sandbox":"nine","generation":"4","services":[{"name":"web","port":8080,"revision":1,"wake":{"on":"any","hold_seconds":45}}],"state":"sleeping"}`
	wakeDocPath = "/v1/supervisors/" + wakeSup + "/instances"
)

// The write API stores an instance's state and wake policy as written and
// serves them back; the supervisor's parse reads them.
func TestWriteAPIStateAndWake(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/nine", repTokAdmin, strings.NewReader(wakeEntry)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	resp, body := r.do(http.MethodGet, wakeDocPath, repTokAdmin, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, wakeEntry) {
		t.Fatalf("GET: %d %q, want the entry as written", resp.StatusCode, body)
	}
	doc, err := routes.ParseDocument([]byte(body))
	if err != nil || len(doc.Instances) != 1 {
		t.Fatalf("parse: %v %+v", err, doc)
	}
	in := doc.Instances[0]
	if !in.Sleeping() || in.Services[0].Wake.Mode() != routes.WakeAny || in.Services[0].Wake.Hold() != 45*time.Second {
		t.Fatalf("parsed %+v", in)
	}
	bad := strings.Replace(wakeEntry, `"sleeping"`, `"paused"`, 1)
	if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/nine", repTokAdmin, strings.NewReader(bad)); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(body, `state: state "paused" not supported`) {
		t.Fatalf("PUT state paused: %d %q", resp.StatusCode, body)
	}
	bad = strings.Replace(wakeEntry, `"hold_seconds":45`, `"hold_seconds":600`, 1)
	if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/nine", repTokAdmin, strings.NewReader(bad)); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(body, "services[0].wake.hold_seconds") {
		t.Fatalf("PUT hold 600: %d %q", resp.StatusCode, body)
	}
}

// The wake endpoint: session-authenticated, forwarded to the hook once
// per instance, answered from the document when the instance is active,
// with the platform's refusal (cached) and its failures.
func TestWakeEndpoint(t *testing.T) {
	p := newTestPlatform(t)
	r := newMemoryReplica(t, replicaOptions{wakeHook: &wake.HookOptions{URL: p.srv.URL + "/wake", Attempts: 2, Backoff: 10 * time.Millisecond}})
	p.gateway = r.srv.URL
	p.entries["team/nine"] = wakeEntry
	for _, e := range []string{wakeEntry, strings.Replace(wakeEntry, `"nine"`, `"gone"`, 1), strings.Replace(strings.Replace(wakeEntry, `"nine"`, `"awake"`, 1), `"sleeping"`, `"active"`, 1)} {
		var k instanceKeyOf
		_ = json.Unmarshal([]byte(e), &k)
		if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/"+k.Sandbox, repTokAdmin, strings.NewReader(e)); resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT %s: %d %q", k.Sandbox, resp.StatusCode, body)
		}
	}
	sid := sessionID(9)
	wakePath := func(sb, query string) string { return wakeDocPath + "/team/" + sb + "/wake" + query }
	// Before the session exists.
	if resp, body := r.do(http.MethodPost, wakePath("nine", "?session="+sid), repTokPoolA, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("no session yet: %d %q", resp.StatusCode, body)
	}
	if resp, body := r.do(http.MethodGet, "/v1/supervisors/"+wakeSup+"/config?session="+sid, repTokPoolA, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("poll: %d %q", resp.StatusCode, body)
	}
	for _, c := range []struct {
		name, method, path, token string
		code                      int
	}{
		{"no token", "POST", wakePath("nine", "?session="+sid), "", 401},
		{"admin token", "POST", wakePath("nine", "?session="+sid), repTokAdmin, 403},
		{"other supervisor's token", "POST", wakePath("nine", "?session="+sid), routesTokSup1, 403},
		{"other pool", "POST", wakePath("nine", "?session="+sid), repTokPoolB, 403},
		{"no session", "POST", wakePath("nine", ""), repTokPoolA, 400},
		{"bad session", "POST", wakePath("nine", "?session=xyz"), repTokPoolA, 400},
		{"another session", "POST", wakePath("nine", "?session="+sessionID(10)), repTokPoolA, 403},
		{"GET", "GET", wakePath("nine", "?session="+sid), repTokPoolA, 405},
		{"bad name", "POST", wakePath("Nine", "?session="+sid), repTokPoolA, 400},
		{"unknown instance", "POST", wakePath("ten", "?session="+sid), repTokPoolA, 404},
	} {
		resp, body := r.do(c.method, c.path, c.token, nil)
		if resp.StatusCode != c.code {
			t.Errorf("%s: %d %q, want %d", c.name, resp.StatusCode, body, c.code)
		}
	}
	if p.calls.Load() != 0 {
		t.Fatalf("refused requests called the hook %d times", p.calls.Load())
	}

	// An active instance: answered from the document, no hook call.
	resp, body := r.do(http.MethodPost, wakePath("awake", "?session="+sid), repTokPoolA, nil)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != `{"state":"active"}` {
		t.Fatalf("active: %d %q", resp.StatusCode, body)
	}

	// Concurrent wakes of a sleeping instance: one hook call, which marks
	// it active through the write API.
	var wg sync.WaitGroup
	codes := make(chan int, 10)
	for range 10 {
		wg.Go(func() {
			resp, _ := r.do(http.MethodPost, wakePath("nine", "?session="+sid), repTokPoolA, nil)
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusAccepted && c != http.StatusOK {
			t.Fatalf("wake answered %d", c)
		}
	}
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("%d hook calls for 10 concurrent wakes, want 1", n)
	}
	p.mu.Lock()
	got := p.bodies[0]
	p.mu.Unlock()
	want := map[string]string{"workspace": "team", "sandbox": "nine", "generation": "4", "supervisor": wakeSup}
	if len(got) != len(want) || got["workspace"] != "team" || got["sandbox"] != "nine" || got["generation"] != "4" || got["supervisor"] != wakeSup {
		t.Fatalf("hook body %v, want %v", got, want)
	}
	if spec, ok := r.g.documentInstance(wakeSup, "team", "nine"); !ok || spec.Sleeping() {
		t.Fatalf("after the wake the document has %+v (found %v), want it active", spec, ok)
	}
	resp, body = r.do(http.MethodPost, wakePath("nine", "?session="+sid), repTokPoolA, nil)
	if resp.StatusCode != http.StatusOK || p.calls.Load() != 1 {
		t.Fatalf("after the wake: %d %q, %d hook calls", resp.StatusCode, body, p.calls.Load())
	}

	// "Cannot be woken": 409 with the reason and a Retry-After; cached.
	for i := range 2 {
		resp, body = r.do(http.MethodPost, wakePath("gone", "?session="+sid), repTokPoolA, nil)
		if resp.StatusCode != http.StatusConflict || strings.TrimSpace(body) != `{"state":"sleeping","reason":"sandbox deleted"}` ||
			resp.Header.Get("Retry-After") == "" {
			t.Fatalf("gone (%d): %d %q Retry-After %q", i, resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	}
	if n := p.calls.Load(); n != 2 {
		t.Fatalf("%d hook calls, want 2 (the refusal is cached)", n)
	}

	// A platform that fails: 502 with Retry-After.
	p.fail.Store(true)
	if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/nine", repTokAdmin, strings.NewReader(wakeEntry)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	resp, body = r.do(http.MethodPost, wakePath("nine", "?session="+sid), repTokPoolA, nil)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("failing platform: %d %q", resp.StatusCode, body)
	}
	if n := r.metric("applistener_gateway_requests_total", "endpoint", endpointWake, "code", "202"); n < 1 {
		t.Errorf("wake 202 requests %v", n)
	}
	if n := r.metric("applistener_wake_total", "result", "refused"); n != 1 {
		t.Errorf("wake_total{refused} %v, want 1", n)
	}
}

// A gateway without a hook answers 501.
func TestWakeEndpointWithoutHook(t *testing.T) {
	r := newMemoryReplica(t, replicaOptions{})
	if resp, body := r.do(http.MethodPut, wakeDocPath+"/team/nine", repTokAdmin, strings.NewReader(wakeEntry)); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %d %q", resp.StatusCode, body)
	}
	sid := sessionID(9)
	r.do(http.MethodGet, "/v1/supervisors/"+wakeSup+"/config?session="+sid, repTokPoolA, nil)
	resp, body := r.do(http.MethodPost, wakeDocPath+"/team/nine/wake?session="+sid, repTokPoolA, nil)
	if resp.StatusCode != http.StatusNotImplemented || !bytes.Contains([]byte(body), []byte("--wake-hook")) {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}
