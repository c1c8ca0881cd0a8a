package monitoring_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/buckets"
	"github.com/applistener/applistener/internal/testutil"
)

// startupWithin bounds every wait on a started process (listening, a
// metric appearing after traffic).
const startupWithin = 20 * time.Second

// metricSet is what the binary exports: the names of sample lines and of
// # TYPE lines (a histogram's or summary's base name also covers its
// _bucket, _sum and _count series), and the label names and values each
// sampled metric carries.
type metricSet struct {
	names  map[string]bool
	hist   map[string]bool                       // histogram and summary base names
	labels map[string]map[string]map[string]bool // metric → label → values
}

func newMetricSet() *metricSet {
	return &metricSet{names: map[string]bool{}, hist: map[string]bool{}, labels: map[string]map[string]map[string]bool{}}
}

// has reports whether name is exported, directly or as a series of a
// histogram/summary whose base name is.
func (m *metricSet) has(name string) bool {
	if m.names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && m.hist[base] {
			return true
		}
	}
	return false
}

// labelsOf returns the label names and values of name's samples, and
// false when no sample of name was seen.
func (m *metricSet) labelsOf(name string) (map[string]map[string]bool, bool) {
	l, ok := m.labels[name]
	return l, ok
}

var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseExposition adds the metrics of a text-format scrape to m.
func parseExposition(m *metricSet, body []byte) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			m.names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				m.hist[f[2]] = true
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.IndexAny(line, "{ ")
		if i <= 0 {
			continue
		}
		name := line[:i]
		m.names[name] = true
		labels := m.labels[name]
		if labels == nil {
			labels = map[string]map[string]bool{}
			m.labels[name] = labels
		}
		if line[i] == '{' {
			if end := strings.LastIndexByte(line, '}'); end > i {
				for _, kv := range sampleLabel.FindAllStringSubmatch(line[i+1:end], -1) {
					if labels[kv[1]] == nil {
						labels[kv[1]] = map[string]bool{}
					}
					labels[kv[1]][kv[2]] = true
				}
			}
		}
	}
}

var (
	exportedOnce sync.Once
	exported     *metricSet
)

// exportedMetrics builds the binary, runs `serve` (a routes file, the app
// listener on loopback, some traffic so that labelled series exist),
// `gateway` and `edge` (following that gateway's discovery), and returns
// the union of their /metrics.
func exportedMetrics(t *testing.T) *metricSet {
	t.Helper()
	exportedOnce.Do(func() { exported = scrapeAll(t) })
	if exported == nil {
		t.Fatal("the exported metrics are unknown: starting the binary failed (see the first failing test)")
	}
	return exported
}

func scrapeAll(t *testing.T) *metricSet {
	t.Helper()
	bin := applistenerBinary(t)
	dir, err := os.MkdirTemp("", "applistener-monitoring-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	m := newMetricSet()

	// --- serve ---------------------------------------------------------
	domain := "apps.example.test"
	tlsDir := filepath.Join(dir, "tls")
	pool := writeCertificate(t, tlsDir, "*."+domain)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	defer app.Close()
	appPort := app.Listener.Addr().(*net.TCPAddr).Port
	deadPort := testutil.DeadLoopbackPort(t) // nothing listens: dials fail, 502
	routesFile := filepath.Join(dir, "routes.json")
	writeFile(t, routesFile, fmt.Sprintf(`{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
		`"services":[{"name":"web","port":%d,"revision":1},{"name":"down","port":%d,"revision":1,"start_grace_seconds":1}]}]}`, appPort, deadPort))
	appAddr := "127.0.0.1:" + fmt.Sprint(freePort(t))
	serveAdmin := "127.0.0.1:" + fmt.Sprint(freePort(t))
	serve := start(t, dir, "serve", bin, "serve",
		"--routes-file", routesFile, "--admin-address", serveAdmin,
		"--app-listener", "--app-domain", domain, "--app-tls-dir", tlsDir, "--app-address", appAddr,
		"--drain-timeout", "1s")
	defer serve.stop()
	waitMetric(t, serve, serveAdmin, "applistener_routes 2")
	waitMetric(t, serve, serveAdmin, buildInfoPrefix)
	waitMetric(t, serve, serveAdmin, `applistener_certificate_expiry_timestamp_seconds{name="*.`+domain+`"} `)

	// Traffic: a request served (2xx, a dial that succeeds, per-instance
	// series), one to an app that is not listening (5xx, a failed dial),
	// one whose Host is another route than its SNI (421 denial) and a
	// handshake for an unknown name (handshake rejection).
	web, down := "team--demo--web."+domain, "team--demo--down."+domain
	request := func(sni, host string, wantStatus int) {
		t.Helper()
		tr := &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: sni},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, appAddr)
			},
		}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodGet, "https://"+sni+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("GET https://%s/ (SNI %s): %v\n%s", host, sni, err, serve.log())
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("GET https://%s/ (SNI %s): %s, want %d", host, sni, resp.Status, wantStatus)
		}
	}
	request(web, web, http.StatusOK)
	request(web, down, http.StatusMisdirectedRequest)
	request(down, down, http.StatusBadGateway) // no app listening
	if c, err := tls.Dial("tcp", appAddr, &tls.Config{RootCAs: pool, ServerName: "nobody--here." + domain}); err == nil {
		_ = c.Close()
		t.Fatal("a handshake for an unknown name succeeded")
	}
	// Per-instance series exist while the instance is installed.
	waitMetric(t, serve, serveAdmin, `applistener_instance_requests_total{`)
	// GET /v1/usage (serve's admin address) lists the instance with the
	// bytes it served ("hello" to the one answered request).
	testutil.Eventually(t, startupWithin, "GET /v1/usage to report team/demo\n"+serve.log(), func() bool {
		return usageBytesOut(serveAdmin, "team", "demo") >= int64(len("hello"))
	})
	parseExposition(m, scrape(t, serve, serveAdmin))
	// Withdraw the instance: its routes are revoked.
	writeFile(t, routesFile, `{"revision":"r2","instances":[]}`)
	waitMetric(t, serve, serveAdmin, `applistener_route_revocations_total{cause="withdrawn"} 2`)
	waitMetric(t, serve, serveAdmin, `applistener_handshake_rejections_total{reason=`)
	parseExposition(m, scrape(t, serve, serveAdmin))

	// --- gateway and edge ------------------------------------------------
	gwConfig := filepath.Join(dir, "gateway.json")
	writeFile(t, gwConfig, `{"supervisors":{"s1":{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","generation":"1","services":[{"name":"web","port":8080,"revision":1}]}]}}}`)
	tokens := filepath.Join(dir, "tokens.json")
	writeFile(t, tokens, `{"tokens":[{"token":"t-sup","supervisor":"s1"},{"token":"t-team","workspaces":["team"]}]}`)
	teamToken := filepath.Join(dir, "team.token")
	writeFile(t, teamToken, "t-team")
	gwAddr := "127.0.0.1:" + fmt.Sprint(freePort(t))
	gwAdmin := "127.0.0.1:" + fmt.Sprint(freePort(t))
	gw := start(t, dir, "gateway", bin, "gateway", "--address", gwAddr, "--admin-address", gwAdmin,
		"--config", gwConfig, "--tokens", tokens, "--discovery-warmup", "0")
	defer gw.stop()
	edgeAdmin := "127.0.0.1:" + fmt.Sprint(freePort(t))
	edge := start(t, dir, "edge", bin, "edge", "--address", "127.0.0.1:"+fmt.Sprint(freePort(t)), "--admin-address", edgeAdmin,
		"--gateway", "http://"+gwAddr, "--gateway-token-file", teamToken, "--workspace", "team")
	defer edge.stop()
	waitMetric(t, gw, gwAdmin, "applistener_gateway_discovery_watchers 1")
	waitMetric(t, edge, edgeAdmin, "applistener_edge_discovery_updates_total ")
	// Every command exports applistener_build_info.
	waitMetric(t, gw, gwAdmin, buildInfoPrefix)
	waitMetric(t, edge, edgeAdmin, buildInfoPrefix)
	parseExposition(m, scrape(t, gw, gwAdmin))
	parseExposition(m, scrape(t, edge, edgeAdmin))
	return m
}

// usageBytesOut returns bytes_out of workspace/sandbox in GET /v1/usage
// (-1 when it is not listed or the request fails).
func usageBytesOut(admin, workspace, sandbox string) int64 {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + admin + "/v1/usage")
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	var u struct {
		Instances []struct {
			Workspace string `json:"workspace"`
			Sandbox   string `json:"sandbox"`
			BytesOut  int64  `json:"bytes_out"`
		} `json:"instances"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&u) != nil {
		return -1
	}
	for _, i := range u.Instances {
		if i.Workspace == workspace && i.Sandbox == sandbox {
			return i.BytesOut
		}
	}
	return -1
}

// buildInfoPrefix starts the applistener_build_info line (labels in
// exposition order: goversion, revision, version).
const buildInfoPrefix = `applistener_build_info{goversion="go`

// process is a started applistener command with its output.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func start(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("applistener %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) log() string {
	return fmt.Sprintf("--- applistener %s output:\n%s", p.name, p.out.String())
}

func (p *process) stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// scrape returns the body of http://admin/metrics.
func scrape(t *testing.T, p *process, admin string) []byte {
	t.Helper()
	body, err := get(admin)
	if err != nil {
		t.Fatalf("scrape applistener %s: %v\n%s", p.name, err, p.log())
	}
	return body
}

func get(admin string) ([]byte, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	return body, err
}

// waitMetric polls /metrics until a line starts with prefix; it fails at
// once if the process exits.
func waitMetric(t *testing.T, p *process, admin, prefix string) {
	t.Helper()
	var last []byte
	testutil.Eventually(t, startupWithin, fmt.Sprintf("applistener %s to export %q\n%s", p.name, prefix, lazyLog{p, &last}), func() bool {
		if p.exited() {
			t.Fatalf("applistener %s exited\n%s", p.name, p.log())
		}
		body, err := get(admin)
		if err != nil {
			return false
		}
		last = body
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, prefix) {
				return true
			}
		}
		return false
	})
}

// lazyLog formats a process's output and last scrape only when printed.
type lazyLog struct {
	p    *process
	last *[]byte
}

func (l lazyLog) String() string {
	return fmt.Sprintf("%s--- last scrape:\n%s", l.p.log(), *l.last)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Written beside and renamed, as a configuration update would be: the
	// reader never sees half a document.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// writeCertificate writes a self-signed tls.crt/tls.key for name into dir
// and returns a pool that trusts it.
func writeCertificate(t *testing.T, dir, name string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "tls.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, filepath.Join(dir, "tls.key"), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// ---------------------------------------------------------------------------
// The applistener binary.
// ---------------------------------------------------------------------------

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// applistenerBinary builds ./cmd/applistener once per test process (or
// uses $APPLISTENER_BIN).
func applistenerBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("APPLISTENER_BIN"); p != "" {
			binPath = p
			return
		}
		binDir, binErr = os.MkdirTemp("", "applistener-monitoring-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "applistener")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/applistener")
		cmd.Dir = moduleRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/applistener: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

// TestMain fails the tests if a goroutine they started (the waits of the
// launched binary) is still running at the end, then removes the binary.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binDir != "" {
			_ = os.RemoveAll(binDir)
		}
		os.Exit(code)
	}))
}

func TestParseExposition(t *testing.T) {
	m := newMetricSet()
	parseExposition(m, []byte(`# HELP a_total A.
# TYPE a_total counter
a_total{x="1"} 3
# TYPE h_seconds histogram
h_seconds_bucket{le="+Inf"} 1
h_seconds_sum 0.1
h_seconds_count 1
plain 1
`))
	for _, n := range []string{"a_total", "h_seconds", "h_seconds_bucket", "h_seconds_sum", "h_seconds_count", "plain"} {
		if !m.has(n) {
			t.Errorf("%s not found", n)
		}
	}
	for _, n := range []string{"a", "a_total_bucket", "plain_count", "h_second_bucket"} {
		if m.has(n) {
			t.Errorf("%s found", n)
		}
	}
	if l, ok := m.labelsOf("a_total"); !ok || len(l) != 1 || !l["x"]["1"] {
		t.Errorf("labels of a_total: %v, %v", l, ok)
	}
	if l, ok := m.labelsOf("plain"); !ok || len(l) != 0 {
		t.Errorf("labels of plain: %v, %v", l, ok)
	}
	if l, ok := m.labelsOf("h_seconds_bucket"); !ok || !l["le"]["+Inf"] {
		t.Errorf("labels of h_seconds_bucket: %v, %v", l, ok)
	}
	if _, ok := m.labelsOf("h_seconds"); ok {
		t.Error("h_seconds has samples")
	}
}

// Every histogram the binary exports (serve, gateway, edge) has the
// project's round bucket bounds (internal/buckets: 1-2.5-5 progression),
// so that dashboards and alerts can name them.
func TestHistogramBucketsRound(t *testing.T) {
	exported := exportedMetrics(t)
	histograms := 0
	for name := range exported.names {
		if !strings.HasSuffix(name, "_bucket") {
			continue
		}
		histograms++
		labels, _ := exported.labelsOf(name)
		for le := range labels["le"] {
			if le == "+Inf" {
				continue
			}
			v, err := strconv.ParseFloat(le, 64)
			if err != nil || !buckets.IsRound(v) {
				t.Errorf("%s: bucket bound le=%q is not one of the round values (0.0001, 0.00025, 0.0005, ... 10, 25, 50)", name, le)
			}
		}
	}
	if histograms < 5 {
		t.Errorf("only %d histograms exported: the scrape missed some", histograms)
	}
}
