package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/wake"
)

// Tokens of the replica fixture, beside the discovery fixture's.
const (
	repTokAdmin = "rep-admin-S3CRET"
	repTokPoolA = "rep-pool-a-S3CRET"
	repTokPoolB = "rep-pool-b-S3CRET"
)

// replicaTokens is routesTokensText plus an admin token and two pool tokens.
func replicaTokens() string {
	base := strings.TrimSuffix(strings.TrimSpace(routesTokensText()), "\n]}")
	return base + `,
  {"token": "` + repTokAdmin + `", "admin": true},
  {"token": "` + repTokPoolA + `", "pool": "pool-a"},
  {"token": "` + repTokPoolB + `", "pool": "pool-b"}
]}`
}

// replicaOptions configure one gateway of a replica test.
type replicaOptions struct {
	etcd         []string // etcd endpoints; nil: the memory store
	prefix       string   // etcd prefix; "/test/" when empty
	configPath   string   // "": no configuration file
	tokensPath   string   // required
	sessionTTL   time.Duration
	keepalive    time.Duration
	keepaliveMin time.Duration
	policy       string
	reauth       time.Duration
	idleGrace    time.Duration
	strict       bool
	wakeHook     *wake.HookOptions // nil: no wake hook
	warmup       time.Duration     // Config.DiscoveryWarmup (memory store)
}

// replica is one Gateway served on loopback, with Run running.
type replica struct {
	t      testing.TB
	g      *Gateway
	srv    *httptest.Server
	client *http.Client
	reg    *prometheus.Registry
	logs   *logBuffer
	stop   func()
}

// replicaFiles writes a tokens file (replicaTokens) and a configuration
// file (defaultConfigText) and returns their paths.
func replicaFiles(t testing.TB) (configPath, tokensPath string) {
	dir := t.TempDir()
	configPath, tokensPath = filepath.Join(dir, "gateway.json"), filepath.Join(dir, "tokens.json")
	writeFileAtomicTB(t, configPath, defaultConfigText())
	writeFileAtomicTB(t, tokensPath, replicaTokens())
	return configPath, tokensPath
}

// writeFileAtomicTB is writeFileAtomic for benchmarks too.
func writeFileAtomicTB(t testing.TB, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// checkLeaks makes the test check, when it ends (after every cleanup
// registered later: gateways, etcd members), that no goroutine started
// from now on is left.
func checkLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// newReplica starts a gateway and waits until its store is loaded. The
// caller checks leaks (checkLeaks before anything else starts).
func newReplica(t testing.TB, o replicaOptions) *replica {
	t.Helper()
	r := &replica{t: t, reg: prometheus.NewRegistry(), logs: &logBuffer{}}
	cfg := Config{
		ConfigPath:            o.configPath,
		TokensPath:            o.tokensPath,
		SessionTTL:            o.sessionTTL,
		Keepalive:             o.keepalive,
		KeepaliveMin:          o.keepaliveMin,
		EndpointPolicy:        o.policy,
		Poll:                  20 * time.Millisecond,
		DiscoveryReauthPeriod: o.reauth,
		IdleGrace:             o.idleGrace,
		StrictSupervisors:     o.strict,
		WakeHook:              o.wakeHook,
		DiscoveryWarmup:       o.warmup,
		Logger:                slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:            r.reg,
	}
	if cfg.Keepalive == 0 {
		cfg.Keepalive = time.Hour
	}
	if o.etcd != nil {
		cfg.Etcd = &EtcdConfig{Endpoints: o.etcd, Prefix: o.prefix, DialTimeout: 2 * time.Second}
		if cfg.Etcd.Prefix == "" {
			cfg.Etcd.Prefix = "/test/"
		}
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.g = g
	r.srv = httptest.NewServer(g.Handler())
	r.client = r.srv.Client()
	t.Cleanup(r.srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		g.Run(ctx)
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			g.Close()
			cancel()
			<-runDone
		})
	}
	t.Cleanup(r.stop)
	t.Cleanup(func() {
		logs := r.logs.String()
		for _, tok := range append(routesAllTokens, repTokAdmin, repTokPoolA, repTokPoolB) {
			if strings.Contains(logs, tok) {
				t.Errorf("a token value appears in the logs")
			}
		}
	})
	testutil.Eventually(t, 10*time.Second, "the store loaded", func() bool { ok, _ := g.Ready(); return ok })
	if o.configPath != "" {
		testutil.Eventually(t, 10*time.Second, "the configuration imported", func() bool {
			g.reloadMu.Lock()
			defer g.reloadMu.Unlock()
			return !g.importPending
		})
	}
	return r
}

// do sends a request and returns the response with its body read.
func (r *replica) do(method, path, token string, body io.Reader, header ...string) (*http.Response, string) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.srv.URL+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(b)
}

// metric returns the value of a counter or gauge.
func (r *replica) metric(name string, labels ...string) float64 {
	r.t.Helper()
	return gatheredValue(r.t, r.reg, name, labels...)
}

// sessionID returns a valid session id made from n.
func sessionID(n int) string { return fmt.Sprintf("%032x", n) }

// genRoute is a testRoute with a generation.
type genRoute struct {
	testRoute
	generation string
}

// advBody returns an installations body of session sid.
func advBody(sid string, rs ...genRoute) []byte {
	list := []any{}
	for _, r := range rs {
		e := r.entry()
		if r.generation != "" {
			e["generation"] = r.generation
		}
		list = append(list, e)
	}
	body := map[string]any{"installations": list}
	if sid != "" {
		body["session"] = sid
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return b
}

// advertise PUTs an advertisement and returns the status code.
func (r *replica) advertise(sup, token, sid string, rs ...genRoute) int {
	r.t.Helper()
	resp, body := r.do(http.MethodPut, "/v1/supervisors/"+sup+"/installations", token, bytes.NewReader(advBody(sid, rs...)))
	if resp.StatusCode != http.StatusNoContent {
		r.t.Logf("PUT installations of %s: %d %q", sup, resp.StatusCode, body)
	}
	return resp.StatusCode
}

// snapshot GETs the snapshot of ws; it fails the test unless 200.
func (r *replica) snapshot(ws, token string) []string {
	r.t.Helper()
	resp, body := r.do(http.MethodGet, "/v1/workspaces/"+ws+"/service-routes", token, nil)
	if resp.StatusCode != http.StatusOK {
		r.t.Fatalf("GET snapshot of %s: %d %q", ws, resp.StatusCode, body)
	}
	var s struct {
		Routes []struct {
			Hostname   string `json:"hostname"`
			Supervisor string `json:"supervisor"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		r.t.Fatal(err)
	}
	out := []string{}
	for _, rt := range s.Routes {
		out = append(out, rt.Hostname+"@"+rt.Supervisor)
	}
	return out
}

// webRoute is sup-1's team/demo/web route at generation "1" (the default
// configuration's), expiring in a minute.
func webRoute(version uint64) genRoute {
	return genRoute{testRoute{ws: "team", sb: "demo", name: "web", version: version, expires: time.Now().Add(time.Minute)}, "1"}
}
