package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/gateway"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/wake"
)

const (
	wakeSupervisor = "sup-w"
	wakeSupToken   = "wake-sup-S3CRET"
	wakeAdminToken = "wake-admin-S3CRET"
	wakeWebHost    = "team--nine--web." + testDomain
	wakeEntry      = `{"workspace":"team","sandbox":"nine","generation":"4","services":[{"name":"web","port":8080}],"state":"sleeping"}`
)

// The whole control-plane path of a wake: the data plane's coordinator
// asks the supervisor's gateway client, the real gateway (memory store)
// forwards to a test platform once, the platform marks the instance active
// through the write API, the supervisor's table gets it, and the held
// requests are released; a sandbox the platform cannot wake is refused
// with its reason.
func TestWakeThroughGateway(t *testing.T) {
	testutil.VerifyNone(t)
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokens := write("tokens.json", `{"tokens":[{"token":"`+wakeSupToken+`","supervisor":"`+wakeSupervisor+`"},{"token":"`+wakeAdminToken+`","admin":true}]}`)
	config := write("gateway.json", `{"supervisors":{}}`)
	supToken := write("sup-token", wakeSupToken)

	// The platform: accepts, resumes the sandbox (200 ms) and marks it
	// active through the gateway's write API; refuses sandbox "gone".
	var (
		gatewayURL string
		calls      atomic.Int64
		bg         sync.WaitGroup
	)
	defer bg.Wait()
	platform := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body["sandbox"] == "gone" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte(`{"reason":"over quota"}`))
			return
		}
		w.WriteHeader(http.StatusAccepted)
		if body["supervisor"] != wakeSupervisor || body["sandbox"] != "nine" || body["generation"] != "4" {
			return
		}
		bg.Go(func() {
			time.Sleep(200 * time.Millisecond)
			active := strings.Replace(wakeEntry, `"state":"sleeping"`, `"state":"active"`, 1)
			req, _ := http.NewRequest(http.MethodPut, gatewayURL+"/v1/supervisors/"+wakeSupervisor+"/instances/team/nine", strings.NewReader(active))
			req.Header.Set("Authorization", "Bearer "+wakeAdminToken)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		})
	}))
	defer platform.Close()

	logger := slog.New(slog.DiscardHandler)
	g, err := gateway.New(gateway.Config{ConfigPath: config, TokensPath: tokens, Logger: logger,
		WakeHook: &wake.HookOptions{URL: platform.URL + "/wake"}})
	if err != nil {
		t.Fatal(err)
	}
	gsrv := httptest.NewServer(g.Handler())
	defer gsrv.Close()
	gatewayURL = gsrv.URL
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	defer g.Close()
	wg.Go(func() { g.Run(ctx) })

	put := func(entry string) {
		t.Helper()
		var k struct{ Sandbox string }
		_ = json.Unmarshal([]byte(entry), &k)
		req, _ := http.NewRequest(http.MethodPut, gsrv.URL+"/v1/supervisors/"+wakeSupervisor+"/instances/team/"+k.Sandbox, strings.NewReader(entry))
		req.Header.Set("Authorization", "Bearer "+wakeAdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT %s: %d", k.Sandbox, resp.StatusCode)
		}
	}
	put(wakeEntry)
	put(strings.Replace(wakeEntry, `"nine"`, `"gone"`, 1))

	table := routes.NewTable(routes.Options{Domain: testDomain, Logger: logger})
	defer table.Close()
	client := &GatewayClient{Endpoint: gsrv.URL, SupervisorID: wakeSupervisor, TokenFile: supToken, Sink: table,
		PollInterval: 200 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: logger, Metrics: NewMetrics(nil)}
	if err := client.Init(); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = client.Run(ctx) })
	testutil.Eventually(t, 10*time.Second, "the sleeping route installed", func() bool {
		r := table.Lookup(wakeWebHost)
		return r != nil && r.Sleeping()
	})

	coord, err := wake.New(wake.Options{Waker: client, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	wg.Go(func() { coord.FollowTable(ctx, table) })

	r := table.Lookup(wakeWebHost)
	const n = 20
	type result struct {
		tk  wake.Ticket
		err error
	}
	results := make(chan result, n)
	start := time.Now()
	for range n {
		go func() {
			tk, err := coord.Wait(context.Background(), wake.KeyOf(r), 30*time.Second, r.Woken())
			results <- result{tk, err}
		}()
	}
	for range n {
		res := <-results
		if res.err != nil {
			t.Fatalf("Wait: %v", res.err)
		}
	}
	t.Logf("20 held requests released %v after the first (platform resumes in 200 ms)", time.Since(start))
	if a := table.Lookup(wakeWebHost); a == nil || a.Sleeping() {
		t.Fatalf("after the wake the route is %+v", a)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d platform calls, want 1", got)
	}

	gone := table.Lookup("team--gone--web." + testDomain)
	if gone == nil {
		t.Fatal("no route for team/gone")
	}
	_, err = coord.Wait(context.Background(), wake.KeyOf(gone), 30*time.Second, gone.Woken())
	var cw *wake.CannotWakeError
	if !errors.As(err, &cw) || cw.Reason != "over quota" {
		t.Fatalf("gone: %v, want the platform's reason", err)
	}
}
