package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

// writePair writes a self-signed tls.crt/tls.key for names, valid from
// notBefore to notAfter, into a new directory and returns it.
func writePair(t *testing.T, names []string, notBefore, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notAfter,
	}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notAfter}, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "tls.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	write(t, filepath.Join(dir, "tls.key"), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	return dir
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func lines(ps problems) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func TestCheckDocumentPaths(t *testing.T) {
	doc := `{"revision": "r1", "instances": [
	  {"workspace": "team", "sandbox": "a", "services": [{"name": "web", "port": 8080}]},
	  {"workspace": "team", "sandbox": "b", "services": [{"name": "web", "port": 8080}]},
	  {"workspace": "team", "sandbox": "c", "limits": {"max_streamz": 3}, "services": [{"name": "web", "port": 8080}]},
	  {"workspace": "team", "sandbox": "d", "services": [{"name": "web", "port": 80800}]},
	  {"workspace": "team", "sandbox": "e", "services": [{"name": "web", "port": 8080, "extra": true}]}
	]}`
	got := lines(checkDocument("routes.json", "", []byte(doc)))
	want := []string{
		"routes.json: instances[2].limits.max_streamz: unknown field",
		`routes.json: instances[3].services[0].port: service "web": port 80800 out of range 1..65535`,
		"routes.json: instances[4].services[0].extra: unknown field",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = lines(checkDocument("routes.json", "", []byte(`{"revision": "r1", "instancez": []}`)))
	if len(got) != 1 || !strings.HasPrefix(got[0], "routes.json: ") || !strings.Contains(got[0], `unknown field "instancez"`) {
		t.Errorf("unknown top-level field: %q", got)
	}
	if got := checkDocument("routes.json", "", []byte(`{"revision": "r1", "instances": []}`)); len(got) != 0 {
		t.Errorf("empty document: %q, want no problem", lines(got))
	}
}

// Ten problems in four entries are ten lines, each with its path; a
// syntax error names its line and column, in the routes file as in the
// gateway's configuration file.
func TestCheckDocumentEveryProblem(t *testing.T) {
	doc := `{"revision": "r1", "instances": [
	  {"workspace": "Team", "sandbox": "a", "connector": {"type": "tcp", "host": "10.0.0.1"}, "services": [{"name": "web", "port": 0}]},
	  {"workspace": "team", "sandbox": "b", "limits": {"max_streamz": 3, "max_streams": -1}, "services": [{"name": "web", "port": 8080}]},
	  {"workspace": "team", "sandbox": "c", "services": [{"name": "web", "port": "8080"}, {"name": "web", "port": 8081, "protocol": "h3"}]},
	  {"workspace": "team", "sandbox": "d", "generation": 3, "services": []}
	]}`
	got := lines(checkDocument("routes.json", "", []byte(doc)))
	want := []string{
		`routes.json: instances[0].workspace: name "Team": character 'T' not allowed (use [a-z0-9-])`,
		`routes.json: instances[0].connector.host: tcp host "10.0.0.1" is not a loopback address`,
		`routes.json: instances[0].services[0].port: service "web": port 0 out of range 1..65535`,
		"routes.json: instances[1].limits.max_streamz: unknown field",
		"routes.json: instances[1].limits.max_streams: -1 out of range 0..1000000",
		"routes.json: instances[2].services[0].port: must be a whole number, not a string",
		`routes.json: instances[2].services[1].name: duplicate service "web"`,
		`routes.json: instances[2].services[1].protocol: service "web": protocol "h3" not supported (use http1 or h2c)`,
		"routes.json: instances[3].generation: must be a string, not a number",
		"routes.json: instances[3].services: at least one service is required",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	got = lines(checkDocument("routes.json", "", []byte("{\"revision\": \"r1\",\n  \"instances\": [\n    {\"workspace\": \"team\",}\n]}")))
	if want := []string{"routes.json:3:26: invalid JSON: invalid character '}' looking for beginning of object key string"}; !slices.Equal(got, want) {
		t.Errorf("syntax error: %q, want %q", got, want)
	}
	cfg := filepath.Join(t.TempDir(), "gateway.json")
	write(t, cfg, "{\"supervisors\": {\n  \"sup-1\": {\"instances\": [}\n}}")
	if got, want := lines(checkGatewayConfig(cfg)), []string{cfg + ":2:27: invalid JSON: invalid character '}' looking for beginning of value"}; !slices.Equal(got, want) {
		t.Errorf("gateway syntax error: %q, want %q", got, want)
	}
}

func TestCheckCertificate(t *testing.T) {
	now := time.Now()
	good := writePair(t, []string{"*.apps.example.com"}, now.Add(-time.Hour), now.Add(time.Hour))
	other := writePair(t, []string{"*.apps.other.com"}, now.Add(-time.Hour), now.Add(time.Hour))
	expired := writePair(t, []string{"*.apps.example.com"}, now.Add(-2*time.Hour), now.Add(-time.Hour))
	for _, c := range []struct {
		name, dir string
		acme      bool
		errs      int
		want      string
	}{
		{"covers", good, false, 0, ""},
		{"other domain", other, false, 1, "does not cover *.apps.example.com (DNS names: *.apps.other.com)"},
		{"other domain with ACME", other, true, 0, "warning: "},
		{"expired", expired, false, 1, "certificate expired at "},
		{"missing", t.TempDir(), false, 1, "certificate pair: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := checkCertificate(c.dir, "apps.example.com", c.acme, now)
			if n := len(ps.errors(true)); n != c.errs {
				t.Errorf("%d errors %q, want %d", n, lines(ps), c.errs)
			}
			if c.want != "" && (len(ps) != 1 || !strings.Contains(ps[0].String(), c.want)) {
				t.Errorf("problems %q, want one containing %q", lines(ps), c.want)
			}
		})
	}
}

func TestCheckPort(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()
	ps := checkPort("--address", busy.Addr().String())
	if len(ps) != 1 || !strings.Contains(ps[0].String(), "--address "+busy.Addr().String()+": cannot listen: ") {
		t.Errorf("busy port: %q", lines(ps))
	}
	if ps := checkPort("--address", "127.0.0.1:0"); len(ps) != 0 {
		t.Errorf("free port: %q", lines(ps))
	}
	if ps := checkPort("--address", ""); len(ps) != 0 {
		t.Errorf("off: %q", lines(ps))
	}
}

func TestCheckGateway(t *testing.T) {
	dir := t.TempDir()
	cfg, tokens := filepath.Join(dir, "gateway.json"), filepath.Join(dir, "tokens.json")
	write(t, cfg, `{"supervisors": {"sup-1": {"revision": "r1", "instances": [
	  {"workspace": "team", "sandbox": "a", "limits": {"max_streamz": 1}, "services": [{"name": "web", "port": 8080}]}]}}}`)
	o := gatewayOptions{address: "127.0.0.1:0", configFile: cfg, tokensFile: tokens, store: "memory"}
	got := lines(checkGateway(&o, true, time.Now()))
	want := []string{
		cfg + ": supervisors.sup-1.instances[0].limits.max_streamz: unknown field",
		tokens + ": tokens file (--tokens): does not exist",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	write(t, cfg, `{"supervisors": {"sup-1": {"revision": "r1", "instances": []}}}`)
	write(t, tokens, `{"tokens": [{"token": "0123456789abcdef0123456789abcdef", "supervisor": "sup-1"}]}`)
	if got := checkGateway(&o, true, time.Now()); len(got) != 0 {
		t.Errorf("clean gateway files: %q", lines(got))
	}
	write(t, tokens, `{"tokenz": []}`)
	if got := checkGateway(&o, true, time.Now()); len(got) != 1 || got[0].where != "gateway" {
		t.Errorf("bad tokens file: %q, want the gateway's own refusal", lines(got))
	}
}

// validate prints one line per problem on stdout and exits 1; 0 and
// "configuration ok" when clean; a flag error is exit 2.
func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.json")
	write(t, routes, `{"revision": "r1", "instances": [{"workspace": "team", "sandbox": "a", "services": [{"name": "web", "port": 8080}]}]}`)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"validate", "--routes-file", routes, "--admin-address", "127.0.0.1:0"}, &stdout, &stderr); code != 0 {
		t.Fatalf("clean: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	if stdout.String() != "configuration ok\n" {
		t.Errorf("clean: stdout %q", stdout.String())
	}
	stdout.Reset()
	stderr.Reset()
	missing := filepath.Join(dir, "missing.json")
	if code := run([]string{"validate", "--routes-file", missing, "--admin-address", "127.0.0.1:0"}, &stdout, &stderr); code != 1 {
		t.Fatalf("missing routes file: exit %d, want 1", code)
	}
	if want := missing + ": routes file (--routes-file): does not exist\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	stdout.Reset()
	if code := run([]string{"validate", "--no-such-flag"}, &stdout, &stderr); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	for _, grace := range []string{"-1s", "5m1s"} {
		stderr.Reset()
		if code := run([]string{"validate", "--routes-file", routes, "--admin-address", "127.0.0.1:0", "--app-start-grace", grace}, &stdout, &stderr); code != 2 {
			t.Errorf("--app-start-grace %s: exit %d, want 2", grace, code)
		}
		if !strings.Contains(stderr.String(), "--app-start-grace must be between 0 and 5m0s") {
			t.Errorf("--app-start-grace %s: stderr %q", grace, stderr.String())
		}
	}
	for _, grace := range []string{"0", "5m"} {
		if code := run([]string{"validate", "--routes-file", routes, "--admin-address", "127.0.0.1:0", "--app-start-grace", grace}, &stdout, &stderr); code != 0 {
			t.Errorf("--app-start-grace %s: exit %d, want 0", grace, code)
		}
	}
}

// TestSharedModeRequiresHealthAddress: a shared host without --address
// (the listener the platform probes) is a usage error, exit 2 with one
// line that names the missing flag, for serve and validate alike; with it,
// either configuration source is accepted.
func TestSharedModeRequiresHealthAddress(t *testing.T) {
	for _, cmd := range []string{"serve", "validate"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{cmd, "--mode=shared", "--routes-file", "routes.json"}, &stdout, &stderr)
		if code != 2 {
			t.Errorf("%s --mode=shared without --address: exit %d, want 2", cmd, code)
		}
		out := stderr.String() + stdout.String()
		if !strings.Contains(out, "--mode=shared requires --address") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%s --mode=shared without --address: output %q, want one line naming --address", cmd, out)
		}
	}
	o := serveOptions{mode: "shared", healthAddress: "127.0.0.1:0", routesFile: "routes.json", logFormat: "text", logLevel: "info", freshness: 30e9, maxHeaderBytes: 16 << 10}
	if err := o.validate(); err != nil {
		t.Errorf("shared mode with --address and a routes file: %v", err)
	}
}

func TestVersion(t *testing.T) {
	old := version
	defer func() { version = old }()
	version = "v9.8.7-test"
	for _, args := range [][]string{{"version"}, {"--version"}, {"serve", "--version"}, {"gateway", "--routes-file", "x", "--version"}, {"validate", "gateway", "--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
		if !strings.HasPrefix(stdout.String(), "applistener v9.8.7-test module=") || !strings.Contains(stdout.String(), " go=go") ||
			strings.Count(stdout.String(), "\n") != 1 {
			t.Errorf("%q: stdout %q", args, stdout.String())
		}
	}
	if wantsVersion([]string{"--", "--version"}) {
		t.Error("--version after -- counted")
	}
	version = ""
	if v := readBuildInfo().Version; v == "" {
		t.Error("unstamped version is empty")
	}
}

// --admin-pprof: /debug/pprof/ is served only with it, on every command
// that has an admin address (serve, gateway and edge share bindAdmin).
func TestAdminPprofFlag(t *testing.T) {
	for _, cmd := range []struct {
		name string
		o    commandOptions
	}{
		{"serve", &serveOptions{}},
		{"gateway", &gatewayOptions{}},
		{"edge", &edgeOptions{}},
	} {
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		cmd.o.flags(fs)
		f := fs.Lookup("admin-pprof")
		if f == nil || f.DefValue != "false" {
			t.Errorf("%s: --admin-pprof missing or not off by default (%v)", cmd.name, f)
		}
	}
	for _, pprof := range []bool{false, true} {
		var wg sync.WaitGroup
		a, err := startAdmin(&wg, "127.0.0.1:0", prometheus.NewRegistry(), func() (bool, string) { return true, "" },
			slog.New(slog.DiscardHandler), nil, pprof)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + a.Addr() + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		want := http.StatusNotFound
		if pprof {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("pprof=%v: GET /debug/pprof/ = %d, want %d", pprof, resp.StatusCode, want)
		}
		a.Stop()
		wg.Wait()
	}
}

// applistener_build_info carries what `applistener version` prints, and
// every command's registry has it.
func TestBuildInfoMetric(t *testing.T) {
	b := buildInfo{Version: "v1.2.3", Revision: "abc123", Modified: true, GoVersion: "go1.26.0"}
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfoGauge(b))
	want := `
# HELP applistener_build_info Always 1; its labels are the version, VCS revision and Go version of the running binary.
# TYPE applistener_build_info gauge
applistener_build_info{goversion="go1.26.0",revision="abc123-dirty",version="v1.2.3"} 1
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "applistener_build_info"); err != nil {
		t.Error(err)
	}
	b.Revision, b.Modified = "", false
	reg = prometheus.NewRegistry()
	reg.MustRegister(buildInfoGauge(b))
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(strings.Replace(want, "abc123-dirty", "unknown", 1)), "applistener_build_info"); err != nil {
		t.Error(err)
	}

	old := version
	defer func() { version = old }()
	version = "v9.8.7-test"
	mfs, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, mf := range mfs {
		if mf.GetName() != "applistener_build_info" {
			continue
		}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
	}
	if labels["version"] != "v9.8.7-test" || labels["goversion"] != readBuildInfo().GoVersion || labels["revision"] == "" {
		t.Errorf("applistener_build_info labels %v", labels)
	}
}
