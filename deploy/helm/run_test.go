package helm_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/tlsconf"
)

// TestChartArgsRunTheBinary: the supervisor's container arguments, exactly
// as the chart renders them (routes-file source, the app listener on), start
// the built binary and serve a request; only what Kubernetes would supply is
// replaced: the mounted files' directories by local ones holding the same
// files, and the 0.0.0.0 listen addresses by free loopback ports. So the
// chart and the binary cannot drift apart on a flag's name or meaning.
func TestChartArgsRunTheBinary(t *testing.T) {
	const domain = "apps.chart.test"
	values := map[string]any{
		"appListener": map[string]any{
			"enabled": true,
			"domain":  domain,
			"tls":     map[string]any{"secretName": "wildcard", "mountPath": "/var/run/tls/app"},
		},
		"controlPlane": map[string]any{"source": "routesFile", "routesFile": map[string]any{"configMapName": "demo-routes"}},
	}
	r := render(t, values)
	c := supervisorContainer(t, supervisorDeployment(t, r))
	args := parseArgs(t, c.Args, "serve") // also checks the shape

	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from the app behind the chart's flags")
	}))
	defer app.Close()
	appPort := app.Listener.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	tlsDir, pool := writeWildcard(t, filepath.Join(dir, "tls"), domain)
	routesDir := filepath.Join(dir, "routes")
	if err := os.MkdirAll(routesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	routesFile := filepath.Join(routesDir, filepath.Base(args["routes-file"]))
	doc := fmt.Sprintf(`{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","services":[{"name":"web","port":%d,"revision":1}]}]}`, appPort)
	if err := os.WriteFile(routesFile, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	free := freeAddrs(t)
	local := map[string]string{} // flag → local value, for the flags Kubernetes supplies
	var run []string
	for _, a := range c.Args[1:] {
		name, val, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !hasValue { // a boolean flag, as given
			local[name] = "true"
			run = append(run, a)
			continue
		}
		switch {
		case name == "app-tls-dir":
			val = tlsDir
		case name == "routes-file":
			val = routesFile
		case strings.HasPrefix(val, "0.0.0.0:") || strings.HasPrefix(val, ":"):
			val = free()
		case strings.HasPrefix(val, "$("): // a downward-API variable (the Pod IP, its name)
			val = "127.0.0.1"
		}
		local[name] = val
		run = append(run, "--"+name+"="+val)
	}
	for _, f := range []string{"app-listener", "app-domain", "app-address", "admin-address", "routes-file", "app-tls-dir"} {
		if _, ok := local[f]; !ok {
			t.Fatalf("the chart does not give --%s: %q", f, c.Args)
		}
	}

	cmd := exec.Command(applistenerBinary(t), append([]string{"serve"}, run...)...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		var exitErr error
		select {
		case exitErr = <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			exitErr = <-exited
		}
		if t.Failed() {
			t.Logf("applistener serve %q (%v):\n%s", run, exitErr, out.String())
		}
	}()

	admin := &http.Client{Timeout: 2 * time.Second}
	testutil.Eventually(t, 20*time.Second, "/readyz 200 on the chart's admin address", func() bool {
		resp, err := admin.Get("http://" + local["admin-address"] + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	host := "team--demo--web." + domain
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, local["app-address"])
		},
		ForceAttemptHTTP2: true,
	}}
	resp, err := client.Get("https://" + host + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "hello from the app behind the chart's flags" {
		t.Fatalf("GET through the chart's flags: %s %q", resp.Status, body)
	}
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// writeWildcard writes a *.domain pair issued by a new tlsconf.Authority
// (the CA of `applistener dev`) as a TLS Secret directory (tls.crt,
// tls.key) and returns the directory and the CA's pool.
func writeWildcard(t *testing.T, dir, domain string) (string, *x509.CertPool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, err := tlsconf.NewAuthority("chart test CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + domain}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, ca.Pool()
}
