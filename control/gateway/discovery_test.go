package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/routes"
)

// Tokens of the discovery fixture.
const (
	routesTokSup1   = "disc-sup-1-S3CRET"
	routesTokSup2   = "disc-sup-2-S3CRET"
	routesTokTeam   = "disc-ws-team-S3CRET"
	routesTokLab    = "disc-ws-lab-S3CRET"
	routesTokBoth   = "disc-ws-both-S3CRET"
	routesTokSecond = "disc-ws-team2-S3CRET"
)

var routesAllTokens = []string{routesTokSup1, routesTokSup2, routesTokTeam, routesTokLab, routesTokBoth, routesTokSecond}

// routesTokensText returns a tokens file; teamGrant lists the workspaces of the
// token routesTokTeam.
func routesTokensText(teamGrant ...string) string {
	if len(teamGrant) == 0 {
		teamGrant = []string{"team"}
	}
	g, _ := json.Marshal(teamGrant)
	return `{"tokens": [
  {"token": "` + routesTokSup1 + `", "supervisor": "sup-1"},
  {"token": "` + routesTokSup2 + `", "supervisor": "sup-2"},
  {"token": "` + routesTokTeam + `", "workspaces": ` + string(g) + `},
  {"token": "` + routesTokLab + `", "workspaces": ["lab"]},
  {"token": "` + routesTokBoth + `", "workspaces": ["team", "lab"]},
  {"token": "` + routesTokSecond + `", "workspaces": ["team"]}
]}`
}

// testInstance is one instance of a configuration section.
type testInstance struct {
	ws, sb   string
	services []string
}

// sectionsConfig returns a gateway configuration file from sections by
// supervisor id.
func sectionsConfig(sections map[string][]testInstance) string {
	top := map[string]any{}
	for sup, insts := range sections {
		list := []any{}
		for _, in := range insts {
			svcs := []any{}
			for i, name := range in.services {
				svcs = append(svcs, map[string]any{"name": name, "port": 8080 + i, "revision": 1})
			}
			list = append(list, map[string]any{"workspace": in.ws, "sandbox": in.sb, "generation": "1",
				"connector": map[string]any{"type": "tcp", "host": "127.0.0.1"}, "services": svcs})
		}
		top[sup] = map[string]any{"revision": "r1", "instances": list}
	}
	b, err := json.Marshal(map[string]any{"supervisors": top})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// defaultConfigText grants sup-1 team/demo (web, unnamed) and lab/x (api),
// and sup-2 team/other (web).
func defaultConfigText() string {
	return sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", "demo", []string{"web", ""}}, {"lab", "x", []string{"api"}}},
		"sup-2": {{"team", "other", []string{"web"}}},
	})
}

type routesFixtureOptions struct {
	keepalive    time.Duration
	maxWatchers  int
	sendTimeout  time.Duration
	maxLifetime  time.Duration
	reauthPeriod time.Duration
	noRun        bool
	quietLogs    bool
	http2        bool
	warmup       time.Duration // Config.DiscoveryWarmup
}

type routesFixture struct {
	t          *testing.T
	configPath string
	tokensPath string
	g          *Gateway
	srv        *httptest.Server
	client     *http.Client
	reg        *prometheus.Registry
	logs       *logBuffer
	stopRun    func()
}

// newDiscFixture starts a gateway (Poll 20 ms) with the default discovery
// configuration and tokens, served on loopback.
func newDiscFixture(t *testing.T, o routesFixtureOptions) *routesFixture {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	dir := t.TempDir()
	f := &routesFixture{
		t:          t,
		configPath: filepath.Join(dir, "gateway.json"),
		tokensPath: filepath.Join(dir, "tokens.json"),
		reg:        prometheus.NewRegistry(),
		logs:       &logBuffer{},
		stopRun:    func() {},
	}
	writeFileAtomic(t, f.configPath, defaultConfigText())
	writeFileAtomic(t, f.tokensPath, routesTokensText())
	if o.keepalive == 0 {
		o.keepalive = time.Hour
	}
	level := slog.LevelDebug
	if o.quietLogs {
		level = slog.LevelWarn
	}
	g, err := New(Config{
		ConfigPath:                   f.configPath,
		TokensPath:                   f.tokensPath,
		Keepalive:                    o.keepalive,
		Poll:                         20 * time.Millisecond,
		DiscoveryMaxWatchersPerToken: o.maxWatchers,
		DiscoverySendTimeout:         o.sendTimeout,
		DiscoveryMaxWatchLifetime:    o.maxLifetime,
		DiscoveryReauthPeriod:        o.reauthPeriod,
		DiscoveryWarmup:              o.warmup,
		Logger:                       slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: level})),
		Registerer:                   f.reg,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.g = g
	if o.http2 {
		f.srv = httptest.NewUnstartedServer(g.Handler())
		f.srv.EnableHTTP2 = true
		f.srv.StartTLS()
	} else {
		f.srv = httptest.NewServer(g.Handler())
	}
	f.client = f.srv.Client()
	t.Cleanup(f.srv.Close)
	if !o.noRun {
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan struct{})
		go func() {
			defer close(runDone)
			g.Run(ctx)
		}()
		var once sync.Once
		f.stopRun = func() {
			once.Do(func() {
				cancel()
				<-runDone
			})
		}
		t.Cleanup(f.stopRun)
	}
	t.Cleanup(g.Close)
	t.Cleanup(func() {
		logs := f.logs.String()
		for _, tok := range routesAllTokens {
			if strings.Contains(logs, tok) {
				t.Errorf("a token value appears in the logs")
			}
		}
	})
	return f
}

func (f *routesFixture) url(path string) string { return f.srv.URL + path }

// do sends a request and returns the response with its body read.
func (f *routesFixture) do(method, path, token string, body io.Reader) (*http.Response, string) {
	f.t.Helper()
	return doRequest(f.t, f.client, method, f.url(path), token, body)
}

// metric returns the value of a counter or gauge with the given labels.
func (f *routesFixture) metric(name string, labels ...string) float64 {
	f.t.Helper()
	return gatheredValue(f.t, f.reg, name, labels...)
}

// testRoute is an installation for put.
type testRoute struct {
	ws, sb, name string
	version      uint64
	expires      time.Time
	host         string // endpoint host; 10.0.0.1 when empty
	port         int    // endpoint port; 8443 when 0
	domain       string // apps.test when empty
	protocol     string // "protocol" of the entry, omitted when empty
	access       string // "access" of the entry, omitted when empty
}

func (r testRoute) hostname() string {
	d := r.domain
	if d == "" {
		d = "apps.test"
	}
	return routes.Hostname(r.ws, r.sb, r.name, d)
}

func (r testRoute) entry() map[string]any {
	host, port := r.host, r.port
	if host == "" {
		host = "10.0.0.1"
	}
	if port == 0 {
		port = 8443
	}
	e := map[string]any{
		"hostname": r.hostname(), "workspace": r.ws, "sandbox": r.sb, "name": r.name,
		"installation_version": r.version, "declaration_revision": 7,
		"expires_at": r.expires.UTC().Format(time.RFC3339Nano),
		"endpoint":   map[string]any{"host": host, "port": port},
	}
	if r.access != "" {
		e["access"] = r.access
	}
	if r.protocol != "" {
		e["protocol"] = r.protocol
	}
	return e
}

// put advertises rs as supervisor sup's complete set.
func (f *routesFixture) put(sup, token string, rs ...testRoute) {
	f.t.Helper()
	list := []any{}
	for _, r := range rs {
		list = append(list, r.entry())
	}
	b, err := json.Marshal(map[string]any{"installations": list})
	if err != nil {
		f.t.Fatal(err)
	}
	resp, body := f.do(http.MethodPut, "/v1/supervisors/"+sup+"/installations", token, bytes.NewReader(b))
	if resp.StatusCode != http.StatusNoContent {
		f.t.Fatalf("PUT installations of %s: %d %q", sup, resp.StatusCode, body)
	}
}

// snapshot GETs the snapshot of ws.
func (f *routesFixture) snapshot(ws, token string) *api.RouteSnapshot {
	f.t.Helper()
	resp, body := f.do(http.MethodGet, "/v1/workspaces/"+ws+"/service-routes", token, nil)
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("GET snapshot of %s: %d %q", ws, resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		f.t.Errorf("Content-Type %q", ct)
	}
	return decodeSnapshot(f.t, body)
}

func decodeSnapshot(t *testing.T, line string) *api.RouteSnapshot {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	var s api.RouteSnapshot
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("snapshot %.300q: %v", line, err)
	}
	if s.Routes == nil {
		t.Fatalf("snapshot %.300q: routes is not an array", line)
	}
	if _, err := strconv.ParseUint(s.Revision, 10, 64); err != nil {
		t.Fatalf("revision %q is not a decimal counter", s.Revision)
	}
	if !slices.IsSortedFunc(s.Routes, func(a, b api.ServiceRoute) int { return strings.Compare(a.Hostname, b.Hostname) }) {
		t.Fatalf("routes not sorted by hostname: %.300q", line)
	}
	return &s
}

func revNum(t *testing.T, s *api.RouteSnapshot) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s.Revision, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// routesWatch is an open watch stream read by a goroutine.
type routesWatch struct {
	t     *testing.T
	resp  *http.Response
	lines chan streamLine
	done  chan struct{}
	err   error // the read error that ended the stream; nil for a clean end
}

func (f *routesFixture) watch(ws, token string) *routesWatch {
	f.t.Helper()
	resp := openWatch(f.t, f.client, f.url("/v1/workspaces/"+ws+"/service-routes?watch=1"), token)
	w := &routesWatch{t: f.t, resp: resp, lines: make(chan streamLine, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.lines)
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			line, err := ndjson.ReadLine(br, 64<<20)
			if err != nil {
				if !errors.Is(err, io.EOF) {
					w.err = err
				}
				return
			}
			w.lines <- streamLine{text: strings.TrimSuffix(string(line), "\n"), at: time.Now()}
		}
	}()
	f.t.Cleanup(w.close)
	return w
}

func (w *routesWatch) close() {
	_ = w.resp.Body.Close()
	<-w.done
}

// next returns the next snapshot line (keepalives skipped).
func (w *routesWatch) next(within time.Duration) (*api.RouteSnapshot, time.Time) {
	w.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				w.t.Fatalf("watch stream ended (err %v)", w.err)
			}
			if l.text == `{"keepalive":true}` {
				continue
			}
			return decodeSnapshot(w.t, l.text), l.at
		case <-timer.C:
			w.t.Fatalf("no snapshot within %v", within)
			return nil, time.Time{}
		}
	}
}

// noLine checks that no snapshot line arrives for d.
func (w *routesWatch) noLine(d time.Duration) {
	w.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				w.t.Fatal("watch stream ended")
			}
			if l.text != `{"keepalive":true}` {
				w.t.Fatalf("unexpected line %.300q", l.text)
			}
		case <-timer.C:
			return
		}
	}
}

// waitEnd waits for the stream to end and returns when it did.
func (w *routesWatch) waitEnd(within time.Duration) time.Time {
	w.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-w.lines:
			if !ok {
				return time.Now()
			}
		case <-timer.C:
			w.t.Fatalf("watch stream still open after %v", within)
		}
	}
}

// ---------------------------------------------------------------------------

func TestDiscoveryAuth(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	for _, c := range []struct {
		name, path, token string
		method            string
		code              int
	}{
		{"no token", "/v1/workspaces/team/service-routes", "", "GET", 401},
		{"unknown token", "/v1/workspaces/team/service-routes", "nope", "GET", 401},
		{"supervisor token", "/v1/workspaces/team/service-routes", routesTokSup1, "GET", 403},
		{"ungranted workspace", "/v1/workspaces/lab/service-routes", routesTokTeam, "GET", 403},
		{"ungranted workspace, watch", "/v1/workspaces/lab/service-routes?watch=1", routesTokTeam, "GET", 403},
		{"unknown token, watch", "/v1/workspaces/team/service-routes?watch=1", "nope", "GET", 401},
		{"supervisor token, watch", "/v1/workspaces/team/service-routes?watch=1", routesTokSup2, "GET", 403},
		{"invalid workspace", "/v1/workspaces/Team--x/service-routes", routesTokTeam, "GET", 400},
		{"bad watch value", "/v1/workspaces/team/service-routes?watch=2", routesTokTeam, "GET", 400},
		{"method", "/v1/workspaces/team/service-routes", routesTokTeam, "POST", 405},
		{"workspace token on a supervisor endpoint", "/v1/supervisors/sup-1/config", routesTokTeam, "GET", 403},
	} {
		resp, body := f.do(c.method, c.path, c.token, nil)
		if resp.StatusCode != c.code {
			t.Errorf("%s: %d %q, want %d", c.name, resp.StatusCode, body, c.code)
			continue
		}
		checkOneLine(t, c.code, body)
		if c.code == 401 && resp.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%s: no WWW-Authenticate", c.name)
		}
	}
	// A workspace token cannot advertise.
	resp, _ := f.do(http.MethodPut, "/v1/supervisors/sup-1/installations", routesTokTeam, strings.NewReader(`{"installations":[]}`))
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("PUT with a workspace token: %d", resp.StatusCode)
	}
	// Granted: 200 with an empty set for a workspace nobody advertised.
	s := f.snapshot("team", routesTokTeam)
	if s.Workspace != "team" || len(s.Routes) != 0 {
		t.Errorf("empty snapshot: %+v", s)
	}
	if s2 := f.snapshot("lab", routesTokBoth); s2.Workspace != "lab" {
		t.Errorf("lab snapshot: %+v", s2)
	}
}

func TestDiscoverySnapshotFields(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	exp := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	f.put("sup-1", routesTokSup1,
		testRoute{ws: "team", sb: "demo", name: "web", version: 3, expires: exp, host: "10.42.1.27", port: 8443, protocol: "h2c"},
		testRoute{ws: "team", sb: "demo", name: "", version: 4, expires: exp, host: "10.42.1.27", port: 8443, access: "token"},
		testRoute{ws: "lab", sb: "x", name: "api", version: 5, expires: exp, host: "10.42.1.27", port: 8443},
		// Not granted to sup-1 (sup-2's sandbox; a service sup-1 does not declare).
		testRoute{ws: "team", sb: "other", name: "web", version: 6, expires: exp},
		testRoute{ws: "team", sb: "demo", name: "api", version: 7, expires: exp},
	)
	s := f.snapshot("team", routesTokTeam)
	want := []api.ServiceRoute{
		{Hostname: "team--demo--web.apps.test", Workspace: "team", Sandbox: "demo", Name: "web", Supervisor: "sup-1",
			InstallationVersion: 3, DeclarationRevision: 7, ExpiresAt: exp, Endpoint: api.RouteEndpoint{Host: "10.42.1.27", Port: 8443},
			Protocol: "h2c"},
		{Hostname: "team--demo.apps.test", Workspace: "team", Sandbox: "demo", Name: "", Supervisor: "sup-1",
			InstallationVersion: 4, DeclarationRevision: 7, ExpiresAt: exp, Endpoint: api.RouteEndpoint{Host: "10.42.1.27", Port: 8443},
			Access: "token"},
	}
	slices.SortFunc(want, func(a, b api.ServiceRoute) int { return strings.Compare(a.Hostname, b.Hostname) })
	if !api.EqualRoutes(s.Routes, want) {
		t.Fatalf("team snapshot:\n got %+v\nwant %+v", s.Routes, want)
	}
	// The raw JSON has exactly the documented shape.
	_, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	if !strings.Contains(body, `"endpoint":{"host":"10.42.1.27","port":8443},"protocol":"h2c"}`) ||
		!strings.Contains(body, `"expires_at":"`+exp.Format(time.RFC3339Nano)+`"`) ||
		!strings.HasPrefix(body, `{"workspace":"team","revision":"`) || !strings.HasSuffix(body, "]}\n") {
		t.Errorf("snapshot body %s", body)
	}
	// Workspace isolation: lab only sees lab.
	if got := controltest.Hostnames(f.snapshot("lab", routesTokLab)); !slices.Equal(got, []string{"lab--x--api.apps.test"}) {
		t.Errorf("lab snapshot: %v", got)
	}

	// Invalid entries are not published; the valid ones are; still 204.
	bad := []map[string]any{
		// A hostname of another workspace under team's name.
		{"hostname": "lab--x--api.apps.test", "workspace": "team", "sandbox": "demo", "name": "web",
			"installation_version": 1, "expires_at": exp, "endpoint": map[string]any{"host": "10.0.0.9", "port": 1}},
		// Upper case, missing endpoint, bad port, a "service" typo.
		{"hostname": "TEAM--demo--web.apps.test", "workspace": "team", "sandbox": "demo", "name": "web",
			"installation_version": 1, "expires_at": exp, "endpoint": map[string]any{"host": "10.0.0.9", "port": 1}},
		{"hostname": "team--demo--web.apps.test", "workspace": "team", "sandbox": "demo", "name": "web",
			"installation_version": 1, "expires_at": exp},
		{"hostname": "team--demo--web.apps.test", "workspace": "team", "sandbox": "demo", "name": "web",
			"installation_version": 1, "expires_at": exp, "endpoint": map[string]any{"host": "10.0.0.9", "port": 70000}},
		{"hostname": "team--demo--web.apps.test", "workspace": "team", "sandbox": "demo", "service": "web",
			"installation_version": 1, "expires_at": exp, "endpoint": map[string]any{"host": "10.0.0.9", "port": 1}},
		{"hostname": "team--demo--web.apps.test", "workspace": "team", "sandbox": "demo", "name": "web",
			"installation_version": "x", "expires_at": exp, "endpoint": map[string]any{"host": "10.0.0.9", "port": 1}},
		// A protocol the listener does not speak to apps.
		testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp, protocol: "h3"}.entry(),
		// An access mode the listener does not enforce.
		testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp, access: "secret"}.entry(),
		testRoute{ws: "team", sb: "demo", name: "", version: 9, expires: exp}.entry(),
	}
	b, _ := json.Marshal(map[string]any{"installations": bad})
	resp, rb := f.do(http.MethodPut, "/v1/supervisors/sup-1/installations", routesTokSup1, bytes.NewReader(b))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT with invalid entries: %d %q", resp.StatusCode, rb)
	}
	s = f.snapshot("team", routesTokTeam)
	if got := controltest.Hostnames(s); !slices.Equal(got, []string{"team--demo.apps.test"}) || s.Routes[0].InstallationVersion != 9 {
		t.Errorf("after invalid entries: %+v", s.Routes)
	}
	if n := f.metric("applistener_gateway_installations_rejected_total"); n != 8 {
		t.Errorf("rejected metric %v, want 8", n)
	}
	if !strings.Contains(f.logs.String(), "advertised installations not published") {
		t.Errorf("no log of the rejected entries")
	}
	// An expires_at far in the future is capped.
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 3, expires: time.Now().Add(24 * time.Hour)})
	s = f.snapshot("team", routesTokTeam)
	if len(s.Routes) != 1 || s.Routes[0].ExpiresAt.After(time.Now().Add(MaxAdvertisedLifetime)) {
		t.Errorf("expires_at not capped: %+v", s.Routes)
	}
	if n := f.metric("applistener_gateway_discovery_snapshots_total", "mode", "get"); n < 5 {
		t.Errorf("snapshots metric %v", n)
	}
}

func TestDiscoveryRevisionAndWatchLatency(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{keepalive: 50 * time.Millisecond})
	w := f.watch("team", routesTokTeam)
	first, _ := w.next(time.Second)
	if len(first.Routes) != 0 {
		t.Fatalf("first line %+v", first)
	}
	rev := revNum(t, first)
	exp := time.Now().Add(time.Minute)
	var lat []time.Duration
	for i := 1; i <= 20; i++ {
		sent := time.Now()
		f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: uint64(i), expires: exp})
		s, at := w.next(time.Second)
		lat = append(lat, at.Sub(sent))
		if len(s.Routes) != 1 || s.Routes[0].InstallationVersion != uint64(i) {
			t.Fatalf("line %d: %+v", i, s.Routes)
		}
		if r := revNum(t, s); r <= rev {
			t.Fatalf("revision %d after %d", r, rev)
		} else {
			rev = r
		}
	}
	slices.Sort(lat)
	t.Logf("PUT → watch line latency over %d changes: median %v, max %v", len(lat), lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)-1] > time.Second {
		t.Errorf("a change took %v to reach the watch (limit 1s)", lat[len(lat)-1])
	}
	// The same set again (a renewal with nothing new) and a change of
	// another workspace: no line, same revision.
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 20, expires: exp},
		testRoute{ws: "lab", sb: "x", name: "api", version: 1, expires: exp})
	w.noLine(150 * time.Millisecond)
	if s := f.snapshot("team", routesTokTeam); revNum(t, s) != rev {
		t.Errorf("revision changed without a change: %s, was %d", s.Revision, rev)
	}
	// A renewal moves expires_at: that is a change of the published set.
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 20, expires: exp.Add(time.Second)},
		testRoute{ws: "lab", sb: "x", name: "api", version: 1, expires: exp})
	if s, _ := w.next(time.Second); revNum(t, s) <= rev || !s.Routes[0].ExpiresAt.Equal(exp.Add(time.Second)) {
		t.Errorf("renewal line %+v", s)
	}
	// Withdrawal: an empty set.
	f.put("sup-1", routesTokSup1)
	if s, _ := w.next(time.Second); len(s.Routes) != 0 {
		t.Errorf("after withdrawal: %+v", s.Routes)
	}
	if f.metric("applistener_gateway_discovery_snapshots_total", "mode", "watch") < 22 {
		t.Errorf("watch snapshots metric %v", f.metric("applistener_gateway_discovery_snapshots_total", "mode", "watch"))
	}
}

func TestDiscoveryExpiry(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	w := f.watch("team", routesTokTeam)
	w.next(time.Second)
	exp := time.Now().Add(400 * time.Millisecond)
	f.put("sup-1", routesTokSup1,
		testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp},
		testRoute{ws: "team", sb: "demo", name: "", version: 2, expires: time.Now().Add(time.Minute)})
	if s, _ := w.next(time.Second); len(s.Routes) != 2 {
		t.Fatalf("routes %+v", s.Routes)
	}
	// Nothing else happens; the watch gets the line without the expired route.
	s, at := w.next(3 * time.Second)
	if got := controltest.Hostnames(s); !slices.Equal(got, []string{"team--demo.apps.test"}) {
		t.Fatalf("after expiry: %v", got)
	}
	late := at.Sub(exp)
	t.Logf("expired route left the watch %v after its expires_at", late)
	if late < 0 || late > time.Second {
		t.Errorf("expired route left the watch %v after expires_at (want within 1s, never before)", late)
	}
	if got := controltest.Hostnames(f.snapshot("team", routesTokTeam)); !slices.Equal(got, []string{"team--demo.apps.test"}) {
		t.Errorf("GET after expiry: %v", got)
	}
	// An advertisement that is already expired is never published.
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: time.Now().Add(-time.Second)})
	if s, _ := w.next(time.Second); len(s.Routes) != 0 {
		t.Errorf("expired advertisement published: %+v", s.Routes)
	}
}

// The GET path never serves an expired route, even when the loop has not
// run yet.
func TestDiscoveryGetNeverServesExpired(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	for i := range 20 {
		exp := time.Now().Add(time.Duration(5+i) * time.Millisecond)
		f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: uint64(i + 1), expires: exp})
		time.Sleep(time.Until(exp))
		now := time.Now()
		for _, r := range f.snapshot("team", routesTokTeam).Routes {
			if !r.ExpiresAt.After(now) {
				t.Fatalf("expired route served: %+v (now %v)", r, now)
			}
		}
	}
}

func TestDiscoveryConfigReloadRevokes(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	exp := time.Now().Add(time.Minute)
	f.put("sup-1", routesTokSup1,
		testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp},
		testRoute{ws: "team", sb: "demo", name: "", version: 2, expires: exp})
	w := f.watch("team", routesTokTeam)
	if s, _ := w.next(time.Second); len(s.Routes) != 2 {
		t.Fatalf("routes %+v", s.Routes)
	}
	// The operator removes the web service from sup-1's section.
	writeFileAtomic(t, f.configPath, sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", "demo", []string{""}}},
	}))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	// Immediately after the reload, before any re-advertisement.
	if got := controltest.Hostnames(f.snapshot("team", routesTokTeam)); !slices.Equal(got, []string{"team--demo.apps.test"}) {
		t.Fatalf("after the reload: %v", got)
	}
	if s, _ := w.next(time.Second); !slices.Equal(controltest.Hostnames(s), []string{"team--demo.apps.test"}) {
		t.Fatalf("watch after the reload: %v", controltest.Hostnames(s))
	}
	// The sandbox moves to sup-2: sup-1's routes vanish at once.
	writeFileAtomic(t, f.configPath, sectionsConfig(map[string][]testInstance{
		"sup-2": {{"team", "demo", []string{"", "web"}}},
	}))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	if s, _ := w.next(time.Second); len(s.Routes) != 0 {
		t.Fatalf("after the move: %v", controltest.Hostnames(s))
	}
	f.put("sup-2", routesTokSup2, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp, host: "10.0.0.2"})
	s, _ := w.next(time.Second)
	if len(s.Routes) != 1 || s.Routes[0].Supervisor != "sup-2" || s.Routes[0].Endpoint.Host != "10.0.0.2" {
		t.Fatalf("after sup-2 advertised: %+v", s.Routes)
	}
	// A file with a section that does not parse is refused: the stored
	// documents, and what they grant, stay.
	writeFileAtomic(t, f.configPath, `{"supervisors": {"sup-2": {"instances": "nope"}}}`)
	if err := f.g.Reload(); err == nil || !strings.Contains(err.Error(), `supervisors.sup-2: "instances" must be an array`) {
		t.Fatalf("Reload of an unparsable section: %v", err)
	}
	if got := controltest.Hostnames(f.snapshot("team", routesTokTeam)); len(got) != 1 {
		t.Fatalf("after a refused file: %v", got)
	}
	// A stored section that does not parse (written by an older gateway)
	// grants nothing (fail closed).
	if _, _, err := f.g.store.put(context.Background(), keyDocs+"sup-2", []byte(`{"instances":"nope"}`), putOptions{}); err != nil {
		t.Fatal(err)
	}
	if s, _ := w.next(time.Second); len(s.Routes) != 0 {
		t.Fatalf("with an unparsable section: %+v", s.Routes)
	}
}

func TestDiscoveryConflictIncumbentWins(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	writeFileAtomic(t, f.configPath, sectionsConfig(map[string][]testInstance{
		"sup-1": {{"team", "demo", []string{"web"}}},
		"sup-2": {{"team", "demo", []string{"web"}}},
	}))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute)
	f.put("sup-2", routesTokSup2, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp, host: "10.0.0.2"})
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp.Add(time.Second), host: "10.0.0.1"})
	owner := func() string {
		s := f.snapshot("team", routesTokTeam)
		if len(s.Routes) != 1 {
			t.Fatalf("routes %+v", s.Routes)
		}
		return s.Routes[0].Supervisor
	}
	if o := owner(); o != "sup-2" {
		t.Fatalf("owner %s, want the incumbent sup-2", o)
	}
	// Renewals (later expires_at) do not move it.
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp.Add(2 * time.Second), host: "10.0.0.1"})
	if o := owner(); o != "sup-2" {
		t.Fatalf("owner %s after a renewal of sup-1", o)
	}
	if f.metric("applistener_gateway_discovery_conflicts") != 1 {
		t.Errorf("conflicts gauge %v", f.metric("applistener_gateway_discovery_conflicts"))
	}
	// The incumbent withdraws: the other takes over.
	f.put("sup-2", routesTokSup2)
	if o := owner(); o != "sup-1" {
		t.Fatalf("owner %s after sup-2 withdrew", o)
	}
	if f.metric("applistener_gateway_discovery_conflicts") != 0 {
		t.Errorf("conflicts gauge %v", f.metric("applistener_gateway_discovery_conflicts"))
	}
}

// A reader that stops reading is disconnected after the send timeout; the
// watcher count drops.
func TestDiscoverySlowReaderDisconnected(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{sendTimeout: 100 * time.Millisecond})
	conn := rawRoutesWatch(t, f, "team", routesTokTeam)
	defer func() { _ = conn.Close() }()
	testutil.Eventually(t, 2*time.Second, "the watch", func() bool { return f.metric("applistener_gateway_discovery_watchers") == 1 })
	exp := time.Now().Add(time.Minute)
	start := time.Now()
	for i := 0; f.metric("applistener_gateway_discovery_watchers") != 0; i++ {
		if time.Since(start) > 30*time.Second {
			t.Fatal("a reader that never reads was never disconnected")
		}
		f.put("sup-1", routesTokSup1, bigRoutes(i, exp)...)
		time.Sleep(20 * time.Millisecond)
	}
	if f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonSendTimeout) != 1 {
		t.Errorf("disconnect reasons: send_timeout %v, write_error %v",
			f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonSendTimeout),
			f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonWriteError))
	}
	t.Logf("non-reading watcher disconnected %v after the first change", time.Since(start).Round(time.Millisecond))
}

// bigRoutes returns about 130 KB of snapshot: 330 routes of team/demo/web
// under distinct domains, with long endpoint hosts; i varies the content.
func bigRoutes(i int, exp time.Time) []testRoute {
	rs := make([]testRoute, 0, 330)
	for j := range 330 {
		rs = append(rs, testRoute{ws: "team", sb: "demo", name: "web", version: uint64(i), expires: exp,
			host: fmt.Sprintf("h%03d-%03d.%s", i, j, strings.Repeat("x", 150)), domain: fmt.Sprintf("d%03d.apps.test", j)})
	}
	return rs
}

// rawRoutesWatch opens a watch on a raw TCP connection with a tiny receive
// buffer and never reads from it.
func rawRoutesWatch(t *testing.T, f *routesFixture, ws, token string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "GET /v1/workspaces/%s/service-routes?watch=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n\r\n", ws, token); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Many watchers that never read, while ~100 KB snapshots change 50 times:
// the gateway holds at most the latest snapshot per watcher (shared), never
// a queue, so its heap stays bounded.
func TestDiscoveryManySlowWatchersBoundedMemory(t *testing.T) {
	const (
		watchers = 200
		changes  = 50
		// A queue per watcher would need watchers*changes*100 KB ≈ 1 GB.
		bound = 32 << 20
	)
	f := newDiscFixture(t, routesFixtureOptions{maxWatchers: watchers, sendTimeout: time.Minute, quietLogs: true})
	exp := time.Now().Add(time.Minute)
	f.put("sup-1", routesTokSup1, bigRoutes(0, exp)...)
	line := f.snapshot("team", routesTokTeam)
	if len(line.Routes) != 330 {
		t.Fatalf("%d routes published", len(line.Routes))
	}
	_, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	t.Logf("snapshot size %d bytes", len(body))

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	conns := make([]net.Conn, 0, watchers)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range watchers {
		conns = append(conns, rawRoutesWatch(t, f, "team", routesTokTeam))
	}
	testutil.Eventually(t, 10*time.Second, "the watches", func() bool {
		return f.metric("applistener_gateway_discovery_watchers") == watchers
	})
	for i := 1; i <= changes; i++ {
		f.put("sup-1", routesTokSup1, bigRoutes(i, exp)...)
	}
	time.Sleep(200 * time.Millisecond) // let the writers block
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	delta := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("%d watchers that never read, %d changes of a %d-byte snapshot: HeapInuse delta %.1f MiB (bound %d MiB)",
		watchers, changes, len(body), float64(delta)/(1<<20), bound>>20)
	if delta > bound {
		t.Errorf("heap grew by %d bytes, more than %d", delta, bound)
	}
	if n := f.metric("applistener_gateway_discovery_watchers"); n != watchers {
		t.Errorf("%v watchers connected, want %d (the send timeout is a minute)", n, watchers)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	f.g.Close()
	testutil.Eventually(t, 10*time.Second, "the watches to end", func() bool {
		return f.metric("applistener_gateway_discovery_watchers") == 0
	})
}

func TestDiscoveryGrantNarrowedEndsWatch(t *testing.T) {
	const period = 200 * time.Millisecond
	f := newDiscFixture(t, routesFixtureOptions{reauthPeriod: period})
	wTeam := f.watch("team", routesTokTeam)
	wTeam.next(time.Second)
	wLab := f.watch("lab", routesTokBoth)
	wLab.next(time.Second)
	// The token file no longer grants team to routesTokTeam (it gets lab).
	changed := time.Now()
	writeFileAtomic(t, f.tokensPath, routesTokensText("lab"))
	end := wTeam.waitEnd(2 * time.Second)
	t.Logf("watch ended %v after the tokens file changed (file poll 20 ms, reauth period %v)", end.Sub(changed).Round(time.Millisecond), period)
	if end.Sub(changed) > period+500*time.Millisecond {
		t.Errorf("the watch ended %v after the grant was narrowed", end.Sub(changed))
	}
	if resp, _ := f.do(http.MethodGet, "/v1/workspaces/team/service-routes?watch=1", routesTokTeam, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("reconnect after narrowing: %d", resp.StatusCode)
	}
	// Other watches are untouched.
	wLab.noLine(2 * period)
	if f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonRevoked) != 1 {
		t.Errorf("revoked metric %v", f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonRevoked))
	}

	// The periodic check alone (a state swap fed to discovery without the
	// reload's immediate re-check) ends a watch within one period.
	w2 := f.watch("lab", routesTokLab)
	w2.next(time.Second)
	f.g.mu.Lock()
	old := f.g.state.Load()
	var tokens []tokenGrant
	for _, tk := range old.tokens {
		if slices.Contains(tk.workspaces, "lab") && len(tk.workspaces) == 1 {
			continue // drop routesTokLab (and the narrowed routesTokTeam)
		}
		tokens = append(tokens, tk)
	}
	f.g.state.Store(&stateSnapshot{docs: old.docs, tokens: tokens, grants: old.grants})
	f.g.feedDiscoveryLocked(map[string]struct{}{})
	f.g.mu.Unlock()
	swapped := time.Now()
	end = w2.waitEnd(2 * time.Second)
	t.Logf("periodic reauthorization ended the watch %v after the grant vanished", end.Sub(swapped).Round(time.Millisecond))
	if end.Sub(swapped) > period+500*time.Millisecond {
		t.Errorf("periodic reauth took %v (period %v)", end.Sub(swapped), period)
	}
}

func TestDiscoveryMaxLifetime(t *testing.T) {
	const life = 300 * time.Millisecond
	f := newDiscFixture(t, routesFixtureOptions{maxLifetime: life, keepalive: 50 * time.Millisecond})
	opened := time.Now() // the server's timer starts later than this
	w := f.watch("team", routesTokTeam)
	w.next(time.Second)
	end := w.waitEnd(3 * time.Second)
	if w.err != nil {
		t.Errorf("the stream did not end cleanly: %v", w.err)
	}
	d := end.Sub(opened)
	t.Logf("watch ended after %v (max lifetime %v, up to 10%% jitter)", d.Round(time.Millisecond), life)
	if d < life*9/10 || d > life+time.Second {
		t.Errorf("watch lived %v, want about %v", d, life)
	}
	if f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonLifetime) != 1 {
		t.Error("no max_lifetime disconnect counted")
	}
}

func TestDiscoveryWatcherLimit(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{maxWatchers: 2})
	w1 := f.watch("team", routesTokTeam)
	w1.next(time.Second)
	w2 := f.watch("team", routesTokTeam)
	w2.next(time.Second)
	resp, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes?watch=1", routesTokTeam, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third watch: %d %q", resp.StatusCode, body)
	}
	checkOneLine(t, 429, body)
	// The limit is per token.
	f.watch("team", routesTokSecond).next(time.Second)
	// Snapshots are not limited.
	f.snapshot("team", routesTokTeam)
	w1.close()
	testutil.Eventually(t, 2*time.Second, "a slot", func() bool { return f.metric("applistener_gateway_discovery_watchers") == 2 })
	f.watch("team", routesTokTeam).next(time.Second)
}

func TestDiscoveryKeepaliveAndClose(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{keepalive: 30 * time.Millisecond})
	w := f.watch("team", routesTokTeam)
	w.next(time.Second)
	select {
	case l := <-w.lines:
		if l.text != `{"keepalive":true}` {
			t.Fatalf("line %q, want a keepalive", l.text)
		}
	case <-time.After(time.Second):
		t.Fatal("no keepalive")
	}
	f.g.Close()
	w.waitEnd(2 * time.Second)
	if resp, _ := f.do(http.MethodGet, "/v1/workspaces/team/service-routes?watch=1", routesTokTeam, nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("watch after Close: %d", resp.StatusCode)
	}
	if f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonClosing) != 1 {
		t.Error("closing not counted")
	}
}

// Without the maintenance loop, discovery fails closed.
func TestDiscoveryFailClosedWithoutLoop(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{reauthPeriod: 50 * time.Millisecond})
	w := f.watch("team", routesTokTeam)
	w.next(time.Second)
	f.stopRun()
	resp, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("GET without the loop: %d %q", resp.StatusCode, body)
	}
	checkOneLine(t, 503, body)
	w.waitEnd(time.Second)
	if f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonUnusable) != 1 {
		t.Error("state_unusable not counted")
	}
	// A stalled loop (old beat) is refused too.
	f2 := newDiscFixture(t, routesFixtureOptions{noRun: true})
	if resp, _ := f2.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET right after New: %d", resp.StatusCode)
	}
	f2.g.discovery.beat.Store(time.Now().Add(-discoveryStaleAfter - time.Second).UnixNano())
	if resp, _ := f2.do(http.MethodGet, "/v1/workspaces/team/service-routes?watch=1", routesTokTeam, nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("watch with a stalled loop: %d", resp.StatusCode)
	}
}

// TestDiscoveryWarmupArmedAtNew: a memory-store gateway with a warmup
// answers discovery 503 from the moment it can serve, not only once Run
// has started: a request in between would take the empty set for the
// whole truth (seen in CI: one 200 without the supervisor's still-valid
// route, 2 ms after a restart).
func TestDiscoveryWarmupArmedAtNew(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{noRun: true, warmup: time.Minute})
	resp, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("GET right after New, before Run, in the warmup: %d %q; want 503", resp.StatusCode, body)
	}
}

// A snapshot too large to serve is refused (503), not truncated.
func TestDiscoverySnapshotTooLarge(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	d := f.g.discovery
	d.mu.Lock()
	p := d.encodeSnapshot("team", 1, []api.ServiceRoute{{Hostname: strings.Repeat("a", api.MaxDiscoverySnapshotBytes)}})
	d.published["team"] = p
	d.mu.Unlock()
	if p.err == nil {
		t.Fatal("no error for an oversized snapshot")
	}
	resp, body := f.do(http.MethodGet, "/v1/workspaces/team/service-routes", routesTokTeam, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("oversized snapshot: %d %.200q", resp.StatusCode, body)
	}
	checkOneLine(t, 503, body)
}

// A supervisor whose token is removed from the tokens file is no longer
// trusted: its routes leave discovery at once.
func TestDiscoverySupervisorTokenRemoved(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{})
	exp := time.Now().Add(time.Minute)
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: exp})
	f.put("sup-2", routesTokSup2, testRoute{ws: "team", sb: "other", name: "web", version: 1, expires: exp})
	w := f.watch("team", routesTokTeam)
	if s, _ := w.next(time.Second); len(s.Routes) != 2 {
		t.Fatalf("routes %+v", s.Routes)
	}
	writeFileAtomic(t, f.tokensPath, strings.Replace(routesTokensText(), `{"token": "`+routesTokSup1+`", "supervisor": "sup-1"},`, "", 1))
	if err := f.g.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := controltest.Hostnames(f.snapshot("team", routesTokTeam)); !slices.Equal(got, []string{"team--other--web.apps.test"}) {
		t.Fatalf("after removing sup-1's token: %v", got)
	}
	if s, _ := w.next(time.Second); len(s.Routes) != 1 {
		t.Fatalf("watch after removing sup-1's token: %v", controltest.Hostnames(s))
	}
}

// Watches work over HTTP/2 (TLS), and a stream whose reader stops taking
// lines is reset after the send timeout (HTTP/2 flow control blocks the
// writer).
func TestDiscoveryWatchHTTP2(t *testing.T) {
	f := newDiscFixture(t, routesFixtureOptions{http2: true, sendTimeout: 200 * time.Millisecond})
	t.Cleanup(f.client.CloseIdleConnections)
	w := f.watch("team", routesTokTeam)
	if w.resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", w.resp.Proto)
	}
	w.next(time.Second)
	// Idle for longer than the send timeout: the stream stays open (on
	// HTTP/2 a write deadline left set would reset it when it fires).
	w.noLine(3 * 200 * time.Millisecond)
	sent := time.Now()
	f.put("sup-1", routesTokSup1, testRoute{ws: "team", sb: "demo", name: "web", version: 1, expires: time.Now().Add(time.Minute)})
	s, at := w.next(time.Second)
	if len(s.Routes) != 1 {
		t.Fatalf("routes %+v", s.Routes)
	}
	t.Logf("HTTP/2 watch latency %v", at.Sub(sent))

	// A second stream on the same connection that is never read.
	req, err := http.NewRequest(http.MethodGet, f.url("/v1/workspaces/team/service-routes?watch=1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+routesTokTeam)
	stuck, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stuck.Body.Close() }()
	testutil.Eventually(t, 2*time.Second, "two watchers", func() bool { return f.metric("applistener_gateway_discovery_watchers") == 2 })
	exp := time.Now().Add(time.Minute)
	// The client's HTTP/2 transport buffers 4 MiB per stream before flow
	// control stops the writer: push well beyond that.
	for i := 0; f.metric("applistener_gateway_discovery_watchers") != 1; i++ {
		if i > 400 {
			t.Fatalf("the stuck HTTP/2 stream was never reset; logs:\n%.3000s", f.logs.String()[max(0, len(f.logs.String())-3000):])
		}
		f.put("sup-1", routesTokSup1, bigRoutes(i, exp)...)
		time.Sleep(10 * time.Millisecond)
	}
	// The first stream, which reads, is still served.
	for {
		s, _ := w.next(2 * time.Second)
		if len(s.Routes) == 330 {
			break
		}
	}
	if n := f.metric("applistener_gateway_discovery_watch_disconnects_total", "reason", reasonSendTimeout); n != 1 {
		t.Errorf("send_timeout disconnects %v", n)
	}
}
