package e2e

// Operator-facing start-up: `applistener validate`, fail-fast start-up of
// `serve`, the stamped version, and pprof behind --admin-pprof. Every case
// runs the built binary as a process.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runBinary runs bin with args to completion (bounded by waitTimeout) and
// returns its exit code, stdout and stderr.
func runBinary(t *testing.T, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("applistener %q still running after %v (killed)\nstdout: %s\nstderr: %s", args, waitTimeout, out.String(), errb.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("applistener %q: %v", args, err)
	}
	return code, out.String(), errb.String()
}

// certDir writes a self-signed pair for names, valid from notBefore to
// notAfter, as a TLS Secret directory under a new temporary directory.
func certDir(t *testing.T, names []string, notBefore, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, NotBefore: notBefore, NotAfter: notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "tls")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	mustWrite(t, filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return dir
}

func mustWrite(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// readmeDocument is the configuration document of README.md's "The
// configuration document".
func readmeDocument(t *testing.T) []byte {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### The configuration document.*?```json\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no JSON block under \"The configuration document\"")
	}
	return m[1]
}

// oneLine checks that s is exactly one non-empty line.
func oneLine(t *testing.T, what, s string) {
	t.Helper()
	if !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 || strings.TrimSpace(s) == "" {
		t.Errorf("%s %q; want exactly one line", what, s)
	}
}

// TestValidate: `applistener validate` exits 0 on the README's examples and
// 1 with one FILE: PATH: PROBLEM line on stdout per problem.
func TestValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tlsDir := writeTLSDir(t, dir)
	doc := readmeDocument(t)
	routesFile := filepath.Join(dir, "routes.json")
	mustWrite(t, routesFile, doc)
	gatewayFile := filepath.Join(dir, "gateway.json")
	mustWrite(t, gatewayFile, []byte(`{"supervisors": {"sup-1": `+string(doc)+`}}`))
	tokensFile := filepath.Join(dir, "tokens.json")
	mustWrite(t, tokensFile, []byte(`{"tokens": [{"token": "t1", "supervisor": "sup-1"}]}`))
	badDoc := filepath.Join(dir, "bad-routes.json")
	mustWrite(t, badDoc, bytes.Replace(doc, []byte(`"max_streams"`), []byte(`"max_streamz"`), 1))
	now := time.Now()
	otherDomain := certDir(t, []string{"*.apps.other.test"}, now.Add(-time.Hour), now.Add(24*time.Hour))
	expired := certDir(t, []string{"*." + domain}, now.Add(-48*time.Hour), now.Add(-24*time.Hour))

	serve := func(tls, routes string) []string {
		return []string{"validate", "--app-listener", "--app-domain", domain, "--app-address", "127.0.0.1:0",
			"--app-tls-dir", tls, "--routes-file", routes, "--admin-address", "127.0.0.1:0"}
	}
	gateway := func(tokens string) []string {
		return []string{"validate", "gateway", "--address", "127.0.0.1:0", "--config", gatewayFile, "--tokens", tokens}
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string // the one stdout line when code is 1
	}{
		{"README document", serve(tlsDir, routesFile), 0, ""},
		{"README gateway", gateway(tokensFile), 0, ""},
		{"unknown field in an instance", serve(tlsDir, badDoc), 1, badDoc + ": instances[0].limits.max_streamz: unknown field"},
		{"certificate for another domain", serve(otherDomain, routesFile), 1,
			filepath.Join(otherDomain, "tls.crt") + ": certificate does not cover *." + domain + " (DNS names: *.apps.other.test)"},
		{"expired certificate", serve(expired, routesFile), 1, filepath.Join(expired, "tls.crt") + ": certificate expired at "},
		{"missing tokens file", gateway(filepath.Join(dir, "no-tokens.json")), 1,
			filepath.Join(dir, "no-tokens.json") + ": tokens file (--tokens): does not exist"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runBinary(t, binPath, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, stdout, stderr)
			}
			if c.code == 0 {
				if stdout != "configuration ok\n" {
					t.Errorf("stdout %q, want \"configuration ok\"", stdout)
				}
				return
			}
			oneLine(t, "stdout", stdout)
			if !strings.HasPrefix(stdout, c.want) {
				t.Errorf("stdout %q, want it to start with %q", stdout, c.want)
			}
			oneLine(t, "stderr", stderr)
		})
	}
}

// TestStartupFailsFast: `serve` refuses to start, exit 1 and one line on
// stderr, on an address it cannot bind, a missing routes file and a
// certificate that does not cover the app domain.
func TestStartupFailsFast(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tlsDir := writeTLSDir(t, dir)
	routesFile := filepath.Join(dir, "routes.json")
	mustWrite(t, routesFile, routesDoc())
	now := time.Now()
	otherDomain := certDir(t, []string{"*.apps.other.test"}, now.Add(-time.Hour), now.Add(24*time.Hour))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Close() }) // after the parallel subtests
	busyAddr := busy.Addr().String()

	// args returns serve's flags with free addresses, overridden by over
	// (flag → value).
	args := func(over map[string]string) []string {
		flags := map[string]string{
			"--app-address": freeAddr(t), "--admin-address": freeAddr(t), "--address": freeAddr(t),
			"--app-tls-dir": tlsDir, "--routes-file": routesFile,
		}
		for k, v := range over {
			flags[k] = v
		}
		out := []string{"serve", "--app-listener", "--app-domain", domain}
		for k, v := range flags {
			out = append(out, k+"="+v)
		}
		return out
	}
	for _, c := range []struct {
		name string
		over map[string]string
		want string
	}{
		{"health address in use", map[string]string{"--address": busyAddr}, "--address " + busyAddr + ": cannot listen: "},
		{"admin address in use", map[string]string{"--admin-address": busyAddr}, "--admin-address " + busyAddr + ": cannot listen: "},
		{"app address in use", map[string]string{"--app-address": busyAddr}, "--app-address " + busyAddr + ": cannot listen: "},
		{"routes file missing", map[string]string{"--routes-file": filepath.Join(dir, "typo.json")},
			filepath.Join(dir, "typo.json") + ": routes file (--routes-file): does not exist"},
		{"certificate for another domain", map[string]string{"--app-tls-dir": otherDomain},
			filepath.Join(otherDomain, "tls.crt") + ": certificate does not cover *." + domain},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := args(c.over)
			start := time.Now()
			code, stdout, stderr := runBinary(t, binPath, a...)
			if code != 1 {
				t.Fatalf("applistener %q: exit %d, want 1\nstderr: %s", a, code, stderr)
			}
			oneLine(t, "stderr", stderr)
			if want := "applistener serve: " + c.want; !strings.HasPrefix(stderr, want) {
				t.Errorf("stderr %q, want it to start with %q", stderr, want)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			t.Logf("exited in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
		})
	}
}

// TestVersionStamped builds the binary with `make build VERSION=...` (the
// Makefile's -ldflags stamp) and reads the version back from `version` and
// from --version of each command. The Dockerfile stamps it the same way.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ARG VERSION", "-X main.version=${VERSION}"} {
		if !bytes.Contains(dockerfile, []byte(want)) {
			t.Errorf("Dockerfile does not contain %q", want)
		}
	}
	const stamp = "v0.0.0-e2e-stamp"
	bin := filepath.Join(t.TempDir(), "applistener")
	build := exec.Command("make", "--no-print-directory", "build", "BIN="+bin, "VERSION="+stamp)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"version"}, {"--version"}, {"serve", "--version"}, {"gateway", "--version"},
		{"edge", "--version"}, {"routes", "--version"}, {"instances", "--version"}, {"dev", "--version"}, {"validate", "--version"}} {
		code, stdout, stderr := runBinary(t, bin, args...)
		if code != 0 || stderr != "" {
			t.Errorf("applistener %q: exit %d, stderr %q", args, code, stderr)
		}
		oneLine(t, "stdout", stdout)
		if !strings.HasPrefix(stdout, "applistener "+stamp+" module=") || !strings.Contains(stdout, " go=go") {
			t.Errorf("applistener %q: %q, want \"applistener %s module=... go=go...\"", args, stdout, stamp)
		}
	}
	// The test binary itself is not stamped: it says so rather than
	// printing the stamp.
	if _, stdout, _ := runBinary(t, binPath, "version"); strings.Contains(stdout, stamp) {
		t.Errorf("unstamped binary reports %q", stdout)
	}
}

// TestAdminPprof: /debug/pprof is 404 on the admin address unless
// --admin-pprof is given.
func TestAdminPprof(t *testing.T) {
	t.Parallel()
	get := func(t *testing.T, p *proc, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + p.adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, string(body)
	}
	t.Run("off by default", func(t *testing.T) {
		t.Parallel()
		p := startProc(t, routesDoc())
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
			if code, _ := get(t, p, path); code != http.StatusNotFound {
				t.Errorf("GET %s without --admin-pprof: %d, want 404", path, code)
			}
		}
		if code, _ := get(t, p, "/metrics"); code != http.StatusOK {
			t.Errorf("GET /metrics: %d, want 200", code)
		}
	})
	t.Run("on with --admin-pprof", func(t *testing.T) {
		t.Parallel()
		p := startProc(t, routesDoc(), "--admin-pprof")
		if code, body := get(t, p, "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
			t.Errorf("GET /debug/pprof/ with --admin-pprof: %d, want 200 listing the goroutine profile", code)
		}
		if code, body := get(t, p, "/debug/pprof/cmdline"); code != http.StatusOK || !strings.Contains(body, "--admin-pprof") {
			t.Errorf("GET /debug/pprof/cmdline: %d %q, want 200 with the command line", code, body)
		}
	})
}
