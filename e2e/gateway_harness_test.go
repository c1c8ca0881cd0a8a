package e2e

// Harness for the gateway session tests: the reference gateway
// (`applistener gateway`) and a shared-mode supervisor (`applistener serve
// --gateway-endpoint`) as child processes, started with launch
// (launch_test.go). It builds on harness_test.go: the binary, the
// certificates, the backends and the *proc type (a supervisor started here
// is a *proc with extra fields, so its client helpers apply). The fixtures
// are typed: a memGateway starts its supervisors (startSupervisor), and a
// gatewayEnv (gateway_session_test.go) is one gateway, one supervisor and
// two backends, in the shape of Tailscale's tstest/integration NewTestEnv.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

const (
	supervisorID    = "sup-1"
	supervisorToken = "t1"
	// gatewayKeepalive is the gateway's keepalive interval in these tests: well
	// under the supervisor's --gateway-stream-timeout (1s).
	gatewayKeepalive = 200 * time.Millisecond
	// gatewayPollInterval is the supervisor's --gateway-poll-interval.
	gatewayPollInterval = 300 * time.Millisecond
	// deadlineMargin is the slack on top of a contractual deadline (loaded CI).
	deadlineMargin = 3 * time.Second
)

// ---------------------------------------------------------------------------
// documents

// serviceHost is the hostname of service svc of workspace ws, sandbox sb.
func serviceHost(ws, sb, svc string) string {
	if svc == "" {
		return ws + "--" + sb + "." + domain
	}
	return ws + "--" + sb + "--" + svc + "." + domain
}

// ---------------------------------------------------------------------------
// the gateway process

// memGateway is the reference gateway. It is created with its files but not
// started; start may be called again after kill or stop, on the same port.
type memGateway struct {
	addr       string
	adminAddr  string
	configPath string
	tokensPath string
	extra      []string
	stderr     *syncBuffer // the output of all its runs

	mu  sync.Mutex
	run *process // the current (or last) run; nil before the first start
	// pinned: a supervisor knows the address, so it can no longer change.
	pinned bool
}

// newMemGateway writes the gateway's files (doc is sup-1's document; the
// token t1 grants sup-1) and returns the gateway, not started. Without
// --keepalive in extra, the keepalive is gatewayKeepalive. It is stopped on
// cleanup and its stderr printed if the test failed.
func newMemGateway(t testing.TB, doc []byte, extra ...string) *memGateway {
	t.Helper()
	dir := t.TempDir()
	if !containsFlag(extra, "--keepalive") {
		extra = append([]string{"--keepalive", gatewayKeepalive.String()}, extra...)
	}
	g := &memGateway{
		addr:       freeAddr(t),
		adminAddr:  freeAddr(t),
		configPath: filepath.Join(dir, "gateway.json"),
		tokensPath: filepath.Join(dir, "tokens.json"),
		extra:      extra,
		stderr:     &syncBuffer{},
	}
	g.writeDoc(t, doc)
	g.writeTokens(t, supervisorToken)
	t.Cleanup(func() {
		g.stop(t)
		if t.Failed() {
			t.Logf("gateway stderr (%s):\n%s", g.addr, g.stderr.String())
		}
	})
	return g
}

func (g *memGateway) endpoint() string { return "http://" + g.addr }

// writeDoc replaces sup-1's document (atomic rename).
func (g *memGateway) writeDoc(t testing.TB, doc []byte) {
	t.Helper()
	data := append([]byte(`{"supervisors":{"`+supervisorID+`":`), doc...)
	data = append(data, "}}\n"...)
	writeAtomic(t, g.configPath, data)
}

// writeTokens grants each token sup-1.
func (g *memGateway) writeTokens(t testing.TB, tokens ...string) {
	t.Helper()
	type entry struct {
		Token      string `json:"token"`
		Supervisor string `json:"supervisor"`
	}
	var list []entry
	for _, tok := range tokens {
		list = append(list, entry{tok, supervisorID})
	}
	b, err := json.Marshal(map[string]any{"tokens": list})
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, g.tokensPath, b)
}

// current is the current (or last) run, nil before the first start.
func (g *memGateway) current() *process {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.run
}

func (g *memGateway) running() bool {
	p := g.current()
	return p != nil && !p.exited()
}

// start runs the gateway and waits until it answers HTTP. Before any
// supervisor knows its address, a lost port race picks new ports.
func (g *memGateway) start(t testing.TB) {
	t.Helper()
	if g.running() {
		t.Fatal("gateway already running")
	}
	g.mu.Lock()
	pinned := g.pinned
	g.mu.Unlock()
	retry := false
	p := launch(t, launchSpec{
		name: "gateway",
		args: func() []string {
			if retry { // the last start lost a port race
				g.addr, g.adminAddr = freeAddr(t), freeAddr(t)
			}
			retry = true
			return append([]string{"gateway",
				"--address", g.addr,
				"--config", g.configPath,
				"--tokens", g.tokensPath,
				"--admin-address", g.adminAddr,
				"--log-format", "json",
				// No discovery warmup unless a test asks for one (extra).
				"--discovery-warmup", "0",
			}, g.extra...)
		},
		env:           childEnv(),
		output:        g.stderr,
		ready:         func(*process) bool { return g.answers() },
		retryPortRace: !pinned,
		exit:          exitAny,
		noCleanup:     true, // newMemGateway's cleanup stops every run
	})
	g.mu.Lock()
	g.run = p
	g.mu.Unlock()
}

// answers reports whether the gateway (and not something else on its port)
// answers an unknown path with its one-line 404.
func (g *memGateway) answers() bool {
	resp, err := adminClient.Get(g.endpoint() + "/e2e-probe")
	if err != nil {
		return false
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusNotFound && strings.HasPrefix(string(body), "404 Not Found")
}

// kill ends the gateway with SIGKILL (no goodbye to its sessions).
func (g *memGateway) kill(t testing.TB) {
	t.Helper()
	p := g.current()
	if p == nil {
		t.Fatal("gateway not started")
	}
	_ = p.cmd.Process.Kill()
	if !p.waitExit(waitTimeout) {
		t.Fatal("gateway did not die after SIGKILL")
	}
}

// stop ends the gateway with SIGTERM (kill after a while).
func (g *memGateway) stop(t testing.TB) {
	if p := g.current(); p != nil {
		p.stop(t)
	}
}

// ---------------------------------------------------------------------------
// the supervisor process

// gatewaySupervisor is a supervisor holding a session with a gateway.
type gatewaySupervisor struct {
	*proc
	healthAddr string
	tokenFile  string
}

// supervisorConfig tunes startSupervisor.
type supervisorConfig struct {
	extra []string // appended flags; --drain-timeout defaults to 2s
	// noWait: wait only until the admin endpoint answers, not for /readyz 200.
	noWait bool
	token  string // content of the token file (supervisorToken when empty)
	// setup runs on every attempt before Start (stdin pipe, stderr).
	setup func(cmd *exec.Cmd)
}

// startSupervisor starts `applistener serve --mode shared` against g and waits
// until it is ready (or, with noWait, until its admin endpoint answers).
// It is stopped with SIGTERM on cleanup (exit 0 expected) and its stderr
// printed if the test failed.
func (g *memGateway) startSupervisor(t testing.TB, cfg supervisorConfig) *gatewaySupervisor {
	t.Helper()
	g.mu.Lock()
	g.pinned = true
	g.mu.Unlock()
	return launchSupervisor(t, g.endpoint(), cfg)
}

// launchSupervisor is startSupervisor against endpoints (a comma-separated list).
func launchSupervisor(t testing.TB, endpoints string, cfg supervisorConfig) *gatewaySupervisor {
	t.Helper()
	dir := t.TempDir()
	tlsDir := writeTLSDir(t, dir)
	tokenFile := filepath.Join(dir, "token")
	tok := cfg.token
	if tok == "" {
		tok = supervisorToken
	}
	writeAtomic(t, tokenFile, []byte(tok+"\n"))

	s := &gatewaySupervisor{proc: &proc{dir: dir}, tokenFile: tokenFile}
	ready := func(*process) bool { return s.readyz() == http.StatusOK }
	if cfg.noWait {
		ready = func(*process) bool { return s.readyz() != 0 }
	}
	s.process = launch(t, launchSpec{
		name: "supervisor",
		args: func() []string {
			s.appAddr, s.adminAddr, s.healthAddr = freeAddr(t), freeAddr(t), freeAddr(t)
			args := []string{"serve",
				"--mode", "shared",
				"--gateway", endpoints,
				"--supervisor-id", supervisorID,
				"--gateway-token-file", tokenFile,
				"--address", s.healthAddr,
				"--app-listener",
				"--app-domain", domain,
				"--app-address", s.appAddr,
				"--app-tls-dir", tlsDir,
				"--admin-address", s.adminAddr,
				"--route-freshness", freshness.String(),
				"--gateway-poll-interval", gatewayPollInterval.String(),
				"--gateway-stream-timeout", "1s",
				"--log-format", "json",
			}
			if !containsFlag(cfg.extra, "--drain-timeout") {
				args = append(args, "--drain-timeout", "2s")
			}
			return append(args, cfg.extra...)
		},
		env:           childEnv(),
		setup:         cfg.setup,
		ready:         ready,
		retryPortRace: true,
		detail:        func(*process) string { return "/readyz " + readyzString(s.adminAddr) },
	})
	return s
}

// readyzAt returns the status and body of GET /readyz (0 on a transport
// error).
func readyzAt(adminAddr string) (int, string) {
	resp, err := adminClient.Get("http://" + adminAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	return resp.StatusCode, strings.TrimSpace(string(body))
}

func readyzString(adminAddr string) string {
	code, body := readyzAt(adminAddr)
	return fmt.Sprintf("%d %q", code, body)
}

// dialHealth connects to the health listener: nil when it accepted.
func dialHealth(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
	}
	return err
}

// isRefused reports whether err is a refused connection.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// isUnrecognizedName reports whether err is the TLS alert unrecognized_name.
func isUnrecognizedName(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unrecognized name")
}

// ---------------------------------------------------------------------------
// metrics

// scrapeMetric sums the samples of metric name whose labels include want.
// found reports whether any sample matched.
func scrapeMetric(adminAddr, name string, want map[string]string) (sum float64, found bool, err error) {
	resp, err := adminClient.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := map[string]string{}
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return 0, false, fmt.Errorf("metric line %q: no closing brace", line)
			}
			labels, err = parseLabels(rest[1:end])
			if err != nil {
				return 0, false, fmt.Errorf("metric line %q: %v", line, err)
			}
			rest = rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false, fmt.Errorf("metric line %q: no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}

// parseLabels parses `a="x",b="y"` (with Prometheus escapes).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, fmt.Errorf("bad labels %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("unterminated label value in %q", s)
		}
		out[key] = val.String()
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out, nil
}

// metricAt is scrapeMetric that fails the test on a scrape error; a metric
// with no matching sample is 0.
func metricAt(t testing.TB, adminAddr, name string, want map[string]string) float64 {
	t.Helper()
	v, _, err := scrapeMetric(adminAddr, name, want)
	if err != nil {
		t.Fatalf("metric %s%v: %v", name, want, err)
	}
	return v
}

// ---------------------------------------------------------------------------
// clients that report instead of failing (for loops and goroutines)

// getWithin does one GET with a timeout and returns the status and body.
func getWithin(c *http.Client, url string, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// expect200 checks one GET answers 200 with the backend's greeting.
func expect200(c *http.Client, host, backendName string) error {
	code, body, err := getWithin(c, "https://"+host+"/gw", 5*time.Second)
	if err != nil {
		return fmt.Errorf("GET %s: %v", host, err)
	}
	if code != http.StatusOK || body != "hello from "+backendName+"\n" {
		return fmt.Errorf("GET %s: %d %q; want 200 from %s", host, code, body, backendName)
	}
	return nil
}

// wsTryDial opens a WebSocket through p without failing the test.
func (p *proc) wsTryDial(sni string) (*websocket.Conn, error) { return wsDialVia(p.dial, sni) }

// wsDialVia opens a WebSocket to sni over a connection from dial (a 5 s
// handshake) without failing the test.
func wsDialVia(dial func(ctx context.Context, network, addr string) (net.Conn, error), sni string) (*websocket.Conn, error) {
	d := websocket.Dialer{
		NetDialContext:   dial,
		TLSClientConfig:  tlsConfig(sni),
		HandshakeTimeout: 5 * time.Second,
	}
	c, resp, err := d.Dial("wss://"+sni+"/ws", nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	return c, err
}

// handshakeOK reports whether a TLS handshake with sni succeeds.
func (p *proc) handshakeOK(sni string) bool {
	d := &net.Dialer{Timeout: 2 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", p.appAddr, tlsConfig(sni))
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// ---------------------------------------------------------------------------
// watching that something stays true

// periodicCheck is one periodic check of holdsFor.
type periodicCheck struct {
	name  string
	every time.Duration
	fn    func() error

	next     time.Time
	runs     int
	failures int
	first    []string
}

// holdsFor runs every check at its interval for d and fails the test
// (Errorf) for each check that ever failed, with its first failures. It
// returns the number of runs of each check.
func holdsFor(t testing.TB, d time.Duration, checks ...*periodicCheck) {
	t.Helper()
	start := time.Now()
	for _, c := range checks {
		c.next = start
	}
	for {
		now := time.Now()
		if now.Sub(start) >= d {
			break
		}
		wake := start.Add(d)
		for _, c := range checks {
			if !now.Before(c.next) {
				c.runs++
				if err := c.fn(); err != nil {
					c.failures++
					if len(c.first) < 5 {
						c.first = append(c.first, fmt.Sprintf("at %v: %v", time.Since(start).Round(time.Millisecond), err))
					}
				}
				c.next = c.next.Add(c.every)
				if c.next.Before(time.Now()) {
					c.next = time.Now().Add(c.every / 2)
				}
			}
			if c.next.Before(wake) {
				wake = c.next
			}
		}
		time.Sleep(max(time.Until(wake), time.Millisecond))
	}
	for _, c := range checks {
		t.Logf("%s: %d checks over %v, %d failed", c.name, c.runs, d, c.failures)
		if c.failures > 0 {
			t.Errorf("%s failed %d of %d times; first: %s", c.name, c.failures, c.runs, strings.Join(c.first, "; "))
		}
	}
}

// wsEnded is how and when a WebSocket ended.
type wsEnded struct {
	err error
	at  time.Time
}

// watchClose reads c in the background (discarding messages) until it
// ends or timeout passes, and reports how and when it ended. The caller must
// not read c meanwhile.
func watchClose(c *websocket.Conn, timeout time.Duration) <-chan wsEnded {
	ch := make(chan wsEnded, 1)
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	go func() {
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				ch <- wsEnded{err, time.Now()}
				return
			}
		}
	}()
	return ch
}

// awaitClose waits for a watchClose report; a read timeout fails the
// test.
func awaitClose(t testing.TB, what string, ch <-chan wsEnded) wsEnded {
	t.Helper()
	r := <-ch
	var ne net.Error
	if errors.As(r.err, &ne) && ne.Timeout() {
		t.Fatalf("%s: not closed in time", what)
	}
	return r
}
