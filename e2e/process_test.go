package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// TestShutdown checks SIGTERM handling: a clean exit 0, in-flight requests
// allowed to finish, and open WebSockets closed within --drain-timeout.
func TestShutdown(t *testing.T) {
	t.Parallel()

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		c, _ := e.p.client(t, hostWeb)
		if resp, body := get(t, c, "https://"+hostWeb+"/"); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		d := e.p.signalAndWait(t, syscall.SIGTERM, waitTimeout)
		if e.p.exitCode != 0 {
			t.Fatalf("exit code %d after SIGTERM (%v); want 0", e.p.exitCode, e.p.waitErr)
		}
		t.Logf("exited %v after SIGTERM", d)
	})

	t.Run("InFlightRequestFinishes", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "--drain-timeout", "5s")
		c, _ := e.p.client(t, hostWeb)
		type result struct {
			status int
			body   string
			err    error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := c.Get("https://" + hostWeb + "/slow?ms=1000")
			if err != nil {
				done <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			done <- result{resp.StatusCode, string(b), err}
		}()
		testutil.Eventually(t, waitTimeout, "the slow request to reach the app", func() bool {
			for _, r := range e.web.requests() {
				if strings.HasPrefix(r.URI, "/slow") {
					return true
				}
			}
			return false
		})
		e.p.signalAndWait(t, syscall.SIGTERM, waitTimeout)
		r := <-done
		if r.err != nil || r.status != http.StatusOK || r.body != "hello from web\n" {
			t.Errorf("request in flight at SIGTERM: %d %q %v; want it to finish with 200", r.status, r.body, r.err)
		}
		if e.p.exitCode != 0 {
			t.Errorf("exit code %d after SIGTERM (%v); want 0", e.p.exitCode, e.p.waitErr)
		}
	})

	t.Run("WebSocketAcrossSIGTERM", func(t *testing.T) {
		t.Parallel()
		const drain = time.Second
		e := newEnv(t, "--drain-timeout", drain.String())
		ws := e.p.wsDial(t, hostWeb)
		must(t, wsEcho(ws, websocket.TextMessage, []byte("before SIGTERM")))

		start := time.Now()
		if err := e.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		limit := start.Add(drain + 3*time.Second) // margin for a loaded CI machine
		err := wsExpectClosed(t, ws, until(limit))
		t.Logf("WebSocket closed %v after SIGTERM: %v", time.Since(start), err)
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code != websocket.CloseGoingAway {
			t.Errorf("close code %d (%q) on shutdown; want 1001", ce.Code, ce.Text)
		}
		select {
		case <-e.p.done:
		case <-time.After(until(limit)):
			t.Fatalf("applistener still running %v after SIGTERM with --drain-timeout %v", time.Since(start), drain)
		}
		t.Logf("exited %v after SIGTERM", time.Since(start))
		if e.p.exitCode != 0 {
			t.Errorf("exit code %d after SIGTERM (%v); want 0", e.p.exitCode, e.p.waitErr)
		}
	})
}

// TestBadFlags checks that usage errors exit 2 with one line on stderr.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(routes, routesDoc(), 0o644); err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tlsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	admin := "--admin-address=" + freeAddr(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"AppListenerWithoutDomain", []string{"serve", "--app-listener", "--app-tls-dir", tlsDir, "--routes-file", routes, admin}},
		{"UnknownFlag", []string{"serve", "--no-such-flag", "--routes-file", routes, admin}},
		{"LogFormatXML", []string{"serve", "--routes-file", routes, "--log-format", "xml", admin}},
		{"DomainWithoutAppListener", []string{"serve", "--routes-file", routes, "--app-domain", domain, admin}},
		{"UpperCaseDomain", []string{"serve", "--app-listener", "--app-domain", "APPS.TEST", "--app-tls-dir", tlsDir, "--routes-file", routes, admin}},
		{"NoConfigurationSource", []string{"serve", admin}},
		{"BadDuration", []string{"serve", "--routes-file", routes, "--route-freshness", "soon", admin}},
		{"StrayArgument", []string{"serve", "--routes-file", routes, admin, "extra"}},
		{"RequireProxyProtocolNotCIDR", []string{"serve", "--routes-file", routes, "--require-proxy-protocol", "10.0.0.1", admin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, binPath, tc.args...)
			var stdout, stderr syncBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("applistener %q: %v; want exit status 2\nstderr: %s", tc.args, err, stderr.String())
			}
			msg := stderr.String()
			if !strings.HasSuffix(msg, "\n") || strings.Count(msg, "\n") != 1 || len(strings.TrimSpace(msg)) == 0 {
				t.Errorf("stderr %q; want exactly one line", msg)
			}
			if stdout.String() != "" {
				t.Errorf("stdout %q; want nothing", stdout.String())
			}
		})
	}
}

// TestDev runs `applistener dev`, follows the curl command it prints with a
// Go client, and stops it with SIGINT.
func TestDev(t *testing.T) {
	t.Parallel()
	var curl string
	p := launch(t, launchSpec{
		name: "applistener dev",
		args: func() []string {
			return []string{"dev", "--app-address", freeAddr(t), "--admin-address", freeAddr(t), "--dir", t.TempDir()}
		},
		ready: func(run *process) bool { // it printed the curl command
			for _, line := range strings.Split(run.output(), "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "curl ") {
					curl = strings.TrimSpace(line)
				}
			}
			return curl != ""
		},
		retryPortRace: true,
	})

	m := regexp.MustCompile(`--cacert (\S+) --resolve (\S+) (https://\S+)`).FindStringSubmatch(curl)
	if m == nil {
		t.Fatalf("cannot parse the curl command %q", curl)
	}
	caFile, resolve, url := m[1], m[2], m[3]
	parts := strings.Split(resolve, ":") // host:port:address
	if len(parts) != 3 {
		t.Fatalf("--resolve %q: want host:port:address", resolve)
	}
	host, port, ip := parts[0], parts[1], parts[2]
	if !strings.HasPrefix(url, "https://"+host+":"+port+"/") {
		t.Fatalf("URL %q does not match --resolve %q", url, resolve)
	}
	caData, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caData) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr != host+":"+port {
				return nil, errors.New("unexpected address " + addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", net.JoinHostPort(ip, port))
		},
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: waitTimeout}
	var (
		status int
		body   []byte
	)
	// The route file is read in the background: allow it a moment.
	testutil.Eventually(t, waitTimeout, "the dev route to answer 200", func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		status = resp.StatusCode
		return status == http.StatusOK
	})
	if !strings.Contains(string(body), "Hello from") {
		t.Errorf("body %q; want it to contain %q", body, "Hello from")
	}
	tr.CloseIdleConnections()

	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !p.waitExit(waitTimeout) {
		t.Fatalf("applistener dev did not exit within %v of SIGINT", waitTimeout)
	}
	if p.exitCode != 0 {
		t.Errorf("applistener dev exited %d after SIGINT; want 0", p.exitCode)
	}
}
