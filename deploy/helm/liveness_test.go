package helm_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// startProcess starts the built binary with args and stops it (SIGTERM,
// then SIGKILL) on cleanup; its output is logged if the test failed. kill
// ends it at once.
func startProcess(t *testing.T, name string, args ...string) (out *lockedBuffer, kill func()) {
	t.Helper()
	cmd := exec.Command(applistenerBinary(t), args...)
	out = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	var exitErr error
	stop := func(sig os.Signal) {
		once.Do(func() {
			_ = cmd.Process.Signal(sig)
			select {
			case exitErr = <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				exitErr = <-exited
			}
		})
	}
	t.Cleanup(func() {
		stop(os.Interrupt)
		if t.Failed() {
			t.Logf("%s %q (%v):\n%s", name, args, exitErr, out.String())
		}
	})
	return out, func() { stop(os.Kill) }
}

// TestChartLivenessStaysGreenThroughGatewayOutage (issue 25, test 5): the
// supervisor runs with the chart's arguments against a real gateway (only
// what Kubernetes supplies is replaced, as in TestChartArgsRunTheBinary);
// the gateway is killed. The target of the chart's readiness probe (the
// health port) closes once the routes go stale, while the target of its
// liveness probe, GET on the port and path the chart names, answers 200
// every time, before and well after: a gateway outage restarts no
// supervisor.
func TestChartLivenessStaysGreenThroughGatewayOutage(t *testing.T) {
	const domain = "apps.chart.test"
	values := map[string]any{
		"mode": "shared",
		"appListener": map[string]any{
			"enabled": true,
			"domain":  domain,
			"tls":     map[string]any{"secretName": "wildcard", "mountPath": "/var/run/tls/app"},
		},
		"controlPlane": map[string]any{
			"source":          "gateway",
			"gatewayEndpoint": "http://gateway.example:8080",
			"token":           map[string]any{"secretName": "supervisor-token"},
			"routeFreshness":  "3s", // no pollInterval: serve derives it (1 s)
		},
	}
	r := render(t, values)
	c := supervisorContainer(t, supervisorDeployment(t, r))
	ports := containerPorts(t, c)
	dir := t.TempDir()
	free := freeAddrs(t)

	// The gateway, on the memory store, granting the supervisor id the
	// chart gives ($(POD_NAME), here 127.0.0.1) one route.
	const supID, token = "127.0.0.1", "chart-liveness-token"
	gwAddr := free()
	gwConfig, gwTokens := filepath.Join(dir, "gateway.json"), filepath.Join(dir, "tokens.json")
	writeFile(t, gwConfig, fmt.Sprintf(`{"supervisors":{%q:{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":8080,"revision":1}]}]}}}`, supID))
	writeFile(t, gwTokens, fmt.Sprintf(`{"tokens":[{"token":%q,"supervisor":%q}]}`, token, supID))
	_, killGateway := startProcess(t, "gateway", "gateway", "--address", gwAddr, "--config", gwConfig, "--tokens", gwTokens,
		"--admin-address", free(), "--discovery-warmup", "0", "--log-format", "json")

	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, token+"\n")
	tlsDir, _ := writeWildcard(t, filepath.Join(dir, "tls"), domain)
	local := map[string]string{} // flag → local value
	byPort := map[int]string{}   // the chart's listen port → the local address
	var run []string
	for _, a := range c.Args[1:] {
		name, val, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !hasValue {
			run = append(run, a)
			continue
		}
		switch {
		case name == "gateway":
			val = "http://" + gwAddr
		case name == "gateway-token-file":
			val = tokenFile
		case name == "app-tls-dir":
			val = tlsDir
		case strings.HasPrefix(val, "0.0.0.0:"):
			port, _ := strconv.Atoi(strings.TrimPrefix(val, "0.0.0.0:"))
			val = free()
			byPort[port] = val
		case strings.HasPrefix(val, "$("): // the Pod's name or IP
			val = supID
		}
		local[name] = val
		run = append(run, "--"+name+"="+val)
	}
	_, _ = startProcess(t, "supervisor", append([]string{"serve"}, run...)...)

	// The probes' targets, as the chart names them.
	lp := c.LivenessProbe
	if lp == nil || lp.HTTPGet == nil {
		t.Fatalf("the chart's liveness probe is not an httpGet probe: %+v", lp)
	}
	livePort := lp.HTTPGet.Port.IntValue()
	if livePort == 0 {
		livePort = ports[lp.HTTPGet.Port.StrVal]
	}
	liveURL := "http://" + byPort[livePort] + lp.HTTPGet.Path
	rp := c.ReadinessProbe
	if rp == nil || rp.TCPSocket == nil {
		t.Fatalf("the chart's readiness probe is not a tcpSocket probe: %+v", rp)
	}
	readyPort := rp.TCPSocket.Port.IntValue()
	if readyPort == 0 {
		readyPort = ports[rp.TCPSocket.Port.StrVal]
	}
	readyAddr := byPort[readyPort]
	if byPort[livePort] == "" || readyAddr == "" {
		t.Fatalf("probe ports %d and %d are not listen ports of the chart's arguments %q", livePort, readyPort, c.Args)
	}
	probeClient := &http.Client{Timeout: time.Duration(max(lp.TimeoutSeconds, 1)) * time.Second}
	live := func() error {
		resp, err := probeClient.Get(liveURL)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 { // kubelet's success range
			return fmt.Errorf("%s: %d", liveURL, resp.StatusCode)
		}
		return nil
	}
	ready := func() bool {
		conn, err := net.DialTimeout("tcp", readyAddr, time.Second)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}
	testutil.Eventually(t, 20*time.Second, "the supervisor ready (the readiness probe's target open)", ready)
	if err := live(); err != nil {
		t.Fatalf("liveness before the outage: %v", err)
	}

	killGateway()
	killed := time.Now()
	var checks, notReadyAt int
	var wentDown time.Duration
	for time.Since(killed) < 30*time.Second {
		checks++
		if err := live(); err != nil {
			t.Fatalf("the chart's liveness probe target failed %v into the gateway outage: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		if wentDown == 0 && !ready() {
			wentDown, notReadyAt = time.Since(killed), checks
		}
		if wentDown > 0 && checks-notReadyAt >= 20 { // 5 s of liveness while not ready
			break
		}
		time.Sleep(250 * time.Millisecond) // the probe's period here, not a wait for a condition
	}
	if wentDown == 0 {
		t.Fatal("the readiness probe's target stayed open through the outage (routes of 3 s freshness)")
	}
	t.Logf("gateway killed: readiness target closed after %v; liveness target answered all %d probes over %v",
		wentDown.Round(time.Millisecond), checks, time.Since(killed).Round(time.Millisecond))
}

// writeFile writes data to path, failing the test on an error.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// freeAddrs returns a function that gives loopback addresses nobody
// listens on, never one it gave before: the kernel may hand out a port it
// just freed again, and two of the supervisor's listeners on one port
// fail to start (it did once, in CI: --address and --app-address got one
// port).
func freeAddrs(t *testing.T) func() string {
	given := map[string]bool{}
	return func() string {
		for {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			_ = l.Close()
			if !given[addr] {
				given[addr] = true
				return addr
			}
		}
	}
}
