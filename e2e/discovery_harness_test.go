package e2e

// Helpers of the discovery end-to-end tests (discovery_test.go): the
// reference gateway, supervisors that advertise their installations, the
// edge and `applistener routes`, all as real processes of the built binary.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	edgeToken = "disc-edge-token"
	// discoveryKeepalive is the gateway's keepalive: supervisors renew (and
	// advertise) at each one.
	discoveryKeepalive = 500 * time.Millisecond
	// discoveryFreshness is the supervisors' route freshness: the advertised
	// expires_at is at most this far ahead.
	discoveryFreshness = 3 * time.Second
)

// supervisorPKI is a CA and one leaf certificate for *.apps.test per supervisor,
// each with its own key and serial number.
type supervisorPKI struct {
	pool   *x509.CertPool
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newSupervisorPKI(t testing.TB) *supervisorPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1000),
		Subject:               pkix.Name{CommonName: "applistener e2e discovery CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &supervisorPKI{pool: pool, caCert: cert, caKey: key}
}

// tlsDir writes a TLS Secret directory with a new *.apps.test leaf of the
// given serial number.
func (p *supervisorPKI) tlsDir(t testing.TB, serial int64) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "tls")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// launchReady starts the binary with the args mk returns for fresh addresses
// (retrying a lost port race) and waits until ready reports true. The
// process is stopped with SIGTERM on cleanup; its output is logged if the
// test failed.
func launchReady(t testing.TB, name string, mk func(addr, admin string) []string, ready func(p *proc) bool) *proc {
	t.Helper()
	p := &proc{}
	p.process = launch(t, launchSpec{
		name: name,
		args: func() []string {
			p.appAddr, p.adminAddr = freeAddr(t), freeAddr(t)
			return mk(p.appAddr, p.adminAddr)
		},
		env: childEnv(),
		ready: func(run *process) bool {
			p.process = run
			return ready(p)
		},
		retryPortRace: true,
	})
	return p
}

// discoveryInstance is an instance of a supervisor's section: services by name
// ("" is the unnamed one) with their app ports.
type discoveryInstance struct {
	sandbox  string
	services map[string]int
}

// discoveryGateway is the reference gateway process with its files.
type discoveryGateway struct {
	*proc
	configPath, tokensPath string
}

func (g *discoveryGateway) url() string { return "http://" + g.appAddr }

// writeConfig replaces the configuration: sections by supervisor id, all
// in workspace team.
func (g *discoveryGateway) writeConfig(t testing.TB, sections map[string][]discoveryInstance) {
	t.Helper()
	sups := map[string]any{}
	for sup, insts := range sections {
		list := []any{}
		for _, in := range insts {
			svcs := []any{}
			for name, port := range in.services {
				svcs = append(svcs, map[string]any{"name": name, "port": port, "revision": 1})
			}
			list = append(list, map[string]any{"workspace": "team", "sandbox": in.sandbox, "generation": "1",
				"connector": map[string]any{"type": "tcp", "host": "127.0.0.1"}, "services": svcs})
		}
		sups[sup] = map[string]any{"revision": fmt.Sprintf("r%d", revCounter.Add(1)), "instances": list}
	}
	b, err := json.Marshal(map[string]any{"supervisors": sups})
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, g.configPath, b)
}

// newDiscoveryGateway starts `applistener gateway` with tokens for sup-1,
// sup-2 and the workspace token edgeToken (team).
func newDiscoveryGateway(t testing.TB, sections map[string][]discoveryInstance, extra ...string) *discoveryGateway {
	t.Helper()
	dir := t.TempDir()
	g := &discoveryGateway{configPath: filepath.Join(dir, "gateway.json"), tokensPath: filepath.Join(dir, "tokens.json")}
	g.writeConfig(t, sections)
	writeAtomic(t, g.tokensPath, []byte(`{"tokens": [
		{"token": "disc-sup-1", "supervisor": "sup-1"},
		{"token": "disc-sup-2", "supervisor": "sup-2"},
		{"token": "`+edgeToken+`", "workspaces": ["team"]}]}`))
	g.proc = launchReady(t, "gateway", func(addr, admin string) []string {
		return append([]string{"gateway", "--address", addr, "--config", g.configPath, "--tokens", g.tokensPath,
			"--admin-address", admin, "--keepalive", discoveryKeepalive.String(), "--log-format", "json",
			"--discovery-warmup", "0"}, extra...)
	}, func(p *proc) bool { return p.readyz() == http.StatusOK })
	return g
}

// discoverySupervisor is a supervisor process advertising to the gateway.
type discoverySupervisor struct {
	*proc
	id     string
	serial string
}

// startSupervisor starts `applistener serve` with the gateway session, its
// own certificate (serial), --advertise-address 127.0.0.1 and the edge's
// address (127.0.0.1) in --trusted-proxies (its PROXY headers), plus
// extra flags, and waits until it is ready.
func (g *discoveryGateway) startSupervisor(t testing.TB, pki *supervisorPKI, id string, serial int64, extra ...string) *discoverySupervisor {
	t.Helper()
	tlsDir := pki.tlsDir(t, serial)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, tokenFile, []byte("disc-"+id+"\n"))
	p := launchReady(t, id, func(addr, admin string) []string {
		return append([]string{"serve", "--mode", "shared",
			"--gateway", g.url(), "--supervisor-id", id, "--gateway-token-file", tokenFile,
			"--gateway-poll-interval", "500ms", "--gateway-stream-timeout", "2s",
			"--advertise-address", "127.0.0.1", "--trusted-proxies", "127.0.0.1/32",
			"--app-listener", "--app-domain", domain, "--app-address", addr, "--app-tls-dir", tlsDir,
			"--admin-address", admin, "--address", freeAddr(t), "--route-freshness", discoveryFreshness.String(),
			"--drain-timeout", "1s", "--log-format", "json"}, extra...)
	}, func(p *proc) bool { return p.readyz() == http.StatusOK })
	return &discoverySupervisor{proc: p, id: id, serial: strconv.FormatInt(serial, 10)}
}

func (s *discoverySupervisor) port() int {
	_, port, _ := net.SplitHostPort(s.appAddr)
	n, _ := strconv.Atoi(port)
	return n
}

// startEdge starts `applistener edge` for workspace team and waits
// until it has a snapshot (/readyz 200).
func (g *discoveryGateway) startEdge(t testing.TB) *proc {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, tokenFile, []byte(edgeToken+"\n"))
	return launchReady(t, "edge", func(addr, admin string) []string {
		return []string{"edge", "--address", addr, "--gateway", g.url(), "--gateway-token-file", tokenFile,
			"--workspace", "team", "--admin-address", admin, "--gateway-stream-timeout", "2s",
			"--drain-timeout", "1s", "--log-format", "json"}
	}, func(p *proc) bool { return p.readyz() == http.StatusOK })
}

// discoveryRoute and discoverySnapshot are the discovery wire format.
type discoveryRoute struct {
	Hostname            string    `json:"hostname"`
	Workspace           string    `json:"workspace"`
	Sandbox             string    `json:"sandbox"`
	Name                string    `json:"name"`
	Supervisor          string    `json:"supervisor"`
	InstallationVersion uint64    `json:"installation_version"`
	DeclarationRevision int64     `json:"declaration_revision"`
	ExpiresAt           time.Time `json:"expires_at"`
	Endpoint            struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	} `json:"endpoint"`
}

type discoverySnapshot struct {
	Workspace string           `json:"workspace"`
	Revision  string           `json:"revision"`
	Routes    []discoveryRoute `json:"routes"`
}

func (s *discoverySnapshot) route(host string) *discoveryRoute {
	for i := range s.Routes {
		if s.Routes[i].Hostname == host {
			return &s.Routes[i]
		}
	}
	return nil
}

// snapshot reads the discovery snapshot of team with the edge's token.
func (g *discoveryGateway) snapshot(t testing.TB) *discoverySnapshot {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.url()+"/v1/workspaces/team/service-routes", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+edgeToken)
	resp, err := adminClient.Do(req)
	if err != nil {
		t.Fatalf("discovery GET: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("discovery GET: %d %s", resp.StatusCode, body)
	}
	var s discoverySnapshot
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("discovery snapshot %s: %v", body, err)
	}
	return &s
}

// getThroughEdge does one GET https://host/ through the edge on a new
// connection, verifying the certificate against the PKI, and returns the
// body and the serial of the certificate the supervisor presented.
func getThroughEdge(edgeAddr string, pool *x509.CertPool, host string) (body, serial string, err error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", edgeAddr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: host},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + host + "/")
	if err != nil {
		return "", "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b)), resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

// edgeConn opens a TLS connection through the edge and keeps it.
func edgeConn(t testing.TB, edgeAddr string, pool *x509.CertPool, host string) *rawConn {
	t.Helper()
	raw, err := net.DialTimeout("tcp", edgeAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host})
	_ = tc.SetDeadline(time.Now().Add(waitTimeout))
	if err := tc.Handshake(); err != nil {
		_ = raw.Close()
		t.Fatalf("TLS through the edge to %s: %v", host, err)
	}
	_ = tc.SetDeadline(time.Time{})
	t.Cleanup(func() { _ = tc.Close() })
	return &rawConn{Conn: tc, br: bufio.NewReader(tc)}
}

// edgeHandshakeErr is the error of a TLS handshake through the edge.
func edgeHandshakeErr(edgeAddr string, pool *x509.CertPool, host string) error {
	raw, err := net.DialTimeout("tcp", edgeAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	return tc.Handshake()
}

// outputLines runs a command and delivers its stdout lines.
type outputLines struct {
	*process // its output is stderr's
	lines    chan string
}

// runCommand starts the binary with args, its stdout read line by line. It is
// stopped with SIGTERM on cleanup (exit 0 expected).
func runCommand(t testing.TB, args ...string) *outputLines {
	t.Helper()
	l := &outputLines{lines: make(chan string, 4096)}
	w := &lineWriter{lines: l.lines}
	l.process = launch(t, launchSpec{
		name:  fmt.Sprintf("%q", args),
		args:  argv(args...),
		env:   childEnv(),
		setup: func(cmd *exec.Cmd) { cmd.Stdout = w },
		exit:  exitZero, // also when a SIGTERM of the test ended it
	})
	go func() {
		<-l.done // the process has exited and its stdout is written
		w.flush()
		close(l.lines)
	}()
	return l
}

// next returns the next stdout line that satisfies match, failing after
// within.
func (l *outputLines) next(t testing.TB, within time.Duration, what string, match func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				t.Fatalf("waiting for %s: output ended; stderr:\n%s", what, l.output())
			}
			if match(line) {
				return line
			}
		case <-timer.C:
			t.Fatalf("no output line with %s within %v; stderr:\n%s", what, within, l.output())
		}
	}
}

// runCommandOnce runs the binary to completion and returns stdout, stderr and
// the exit code.
func runCommandOnce(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBin(t, "", args...)
}
