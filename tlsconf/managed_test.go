package tlsconf

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	_ "unsafe" // go:linkname, see stopCertmagicRateLimiters

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/testutil"
)

// Managed issuance is tested against Let's Encrypt's test CA, pebble, run
// as a child process. It is built once with `go install` into the user's
// cache directory; it is not a module dependency of the project.
const (
	pebbleVersion = "v2.10.3"
	pebblePackage = "github.com/letsencrypt/pebble/v2/cmd/pebble"

	otherServerName = "team--nope.apps.test"
	issueTimeout    = 60 * time.Second
)

// pebbleBinary returns the cached pebble binary, building it on first use.
// When it cannot be built the test fails if the environment variable CI is
// set and is skipped otherwise.
func pebbleBinary(t *testing.T) string {
	t.Helper()
	unavailable := func(format string, args ...any) string {
		t.Helper()
		msg := fmt.Sprintf("pebble %s (the local ACME test CA) is not available", pebbleVersion)
		if os.Getenv("CI") != "" {
			t.Fatalf("%s (CI is set, so this fails): %s", msg, fmt.Sprintf(format, args...))
		}
		t.Skipf("%s (skipped because CI is not set): %s", msg, fmt.Sprintf(format, args...))
		return ""
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return unavailable("no user cache directory: %v", err)
	}
	dir := filepath.Join(cache, "applistener-test", "pebble-"+pebbleVersion)
	bin := filepath.Join(dir, "pebble")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return unavailable("no go command in PATH to build it: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return unavailable("%v", err)
	}
	// Build into a private directory and rename, so that concurrent test
	// processes never run a half-written binary.
	gobin, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return unavailable("%v", err)
	}
	defer func() { _ = os.RemoveAll(gobin) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, goTool, "install", pebblePackage+"@"+pebbleVersion)
	cmd.Dir = gobin // outside this module
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return unavailable("`GOBIN=%s go install %s@%s` failed: %v\n%s", gobin, pebblePackage, pebbleVersion, err, out)
	}
	if err := os.Rename(filepath.Join(gobin, "pebble"), bin); err != nil {
		return unavailable("%v", err)
	}
	t.Logf("built pebble %s in %v: %s", pebbleVersion, time.Since(start).Round(time.Millisecond), bin)
	return bin
}

// pebbleCA is a running pebble process.
type pebbleCA struct {
	directory string // ACME directory URL
	mgmt      string // management interface host:port
	trust     *x509.CertPool
	out       *logBuffer // pebble's output
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// startPebble runs pebble on loopback. It validates TLS-ALPN-01 challenges
// for real: it resolves names with the DNS server at dnsAddr and connects
// to 127.0.0.1:tlsPort. Its own HTTPS endpoints use a certificate of ca.
func startPebble(t *testing.T, ca *Authority, tlsPort int, dnsAddr string) *pebbleCA {
	t.Helper()
	bin := pebbleBinary(t)
	dir := t.TempDir()
	certPEM, keyPEM, err := ca.Issue([]string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteKeyPair(dir, certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	mgmt := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	var conf struct {
		Pebble map[string]any `json:"pebble"`
	}
	conf.Pebble = map[string]any{
		"listenAddress":           listen,
		"managementListenAddress": mgmt,
		"certificate":             filepath.Join(dir, CertFile),
		"privateKey":              filepath.Join(dir, KeyFile),
		"httpPort":                freePort(t), // HTTP-01 is never used
		"tlsPort":                 tlsPort,
		"keyAlgorithm":            "ecdsa",
		"retryAfter":              map[string]int{"authz": 1, "order": 1},
		"profiles": map[string]any{
			"default": map[string]any{"description": "test", "validityPeriod": 7776000},
		},
	}
	confJSON, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(confPath, confJSON, 0o600); err != nil {
		t.Fatal(err)
	}

	p := &pebbleCA{directory: "https://" + listen + "/dir", mgmt: mgmt, out: &logBuffer{}}
	cmd := exec.Command(bin, "-config", confPath, "-dnsserver", dnsAddr)
	cmd.Env = append(os.Environ(),
		"PEBBLE_VA_NOSLEEP=1",      // validate at once
		"PEBBLE_WFE_NONCEREJECT=0", // no random badNonce errors
	)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pebble: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("pebble output:\n%s", p.out)
		}
	})

	// Wait until both endpoints answer TLS.
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range []string{listen, mgmt} {
		for {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr,
				&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
			if err == nil {
				_ = conn.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("pebble exited:\n%s", p.out)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("pebble did not listen on %s: %v\n%s", addr, err, p.out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	p.trust = p.root(t, ca)
	return p
}

// root fetches the root that pebble issues under from its management
// interface.
func (p *pebbleCA) root(t *testing.T, ca *Authority) *x509.CertPool {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + p.mgmt + "/roots/0")
	if err != nil {
		t.Fatalf("fetch pebble root: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("fetch pebble root: %s %v", resp.Status, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(body) {
		t.Fatalf("pebble root is not PEM:\n%s", body)
	}
	return pool
}

// orders counts the orders pebble has created.
func (p *pebbleCA) orders() int {
	return strings.Count(p.out.String(), "Added order ")
}

// dnsServer answers every A query with 127.0.0.1 (and other queries with
// no records) over TCP, which is how pebble's validation authority asks.
type dnsServer struct {
	addr string
	ln   net.Listener

	mu      sync.Mutex
	queries []string // question names, lower case, without the final dot
}

// acceptLoop serves every connection ln accepts with serve in a goroutine
// of its own and closes it when serve returns; at the end of the test it
// closes ln and the open connections and waits for every goroutine.
func acceptLoop(t *testing.T, ln net.Listener, serve func(net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					_ = c.Close()
				}()
				serve(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{addr: ln.Addr().String(), ln: ln}
	acceptLoop(t, ln, d.serve)
	return d
}

func (d *dnsServer) serve(c net.Conn) {
	for {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		var size [2]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp := d.answer(msg)
		if resp == nil {
			return
		}
		if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(resp)))); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// answer builds the response to one query, or returns nil for garbage.
func (d *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for {
		if i >= len(q) {
			return nil
		}
		n := int(q[i])
		i++
		if n == 0 {
			break
		}
		if n > 63 || i+n > len(q) {
			return nil
		}
		labels = append(labels, strings.ToLower(string(q[i:i+n])))
		i += n
	}
	if i+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i:])
	question := q[12 : i+4]
	d.mu.Lock()
	d.queries = append(d.queries, strings.Join(labels, "."))
	d.mu.Unlock()

	var ancount uint16
	if qtype == 1 { // A
		ancount = 1
	}
	resp := binary.BigEndian.AppendUint16(nil, binary.BigEndian.Uint16(q)) // ID
	flags := uint16(0x8400) | binary.BigEndian.Uint16(q[2:])&0x0100        // QR, AA, copy RD
	resp = binary.BigEndian.AppendUint16(resp, flags)
	resp = binary.BigEndian.AppendUint16(resp, 1)
	resp = binary.BigEndian.AppendUint16(resp, ancount)
	resp = binary.BigEndian.AppendUint16(resp, 0)
	resp = binary.BigEndian.AppendUint16(resp, 0)
	resp = append(resp, question...)
	if ancount == 1 {
		resp = append(resp, 0xc0, 12) // name: pointer to the question
		resp = binary.BigEndian.AppendUint16(resp, 1)
		resp = binary.BigEndian.AppendUint16(resp, 1)
		resp = binary.BigEndian.AppendUint32(resp, 60)
		resp = binary.BigEndian.AppendUint16(resp, 4)
		resp = append(resp, 127, 0, 0, 1)
	}
	return resp
}

func (d *dnsServer) names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.queries)
}

func (d *dnsServer) queried(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.queries, name)
}

// slowServer is a TLS echo server like testServer, but it allows a minute
// for the handshake (issuance happens inside it) and records the ALPN
// protocol of every completed handshake.
type slowServer struct {
	addr string
	ln   net.Listener
	cfg  *tls.Config

	mu     sync.Mutex
	protos []string
}

func serveSlow(t *testing.T, ln net.Listener, cfg *tls.Config) *slowServer {
	t.Helper()
	s := &slowServer{addr: ln.Addr().String(), ln: ln, cfg: cfg}
	acceptLoop(t, ln, s.serve)
	return s
}

func (s *slowServer) serve(raw net.Conn) {
	conn := tls.Server(raw, s.cfg)
	_ = conn.SetDeadline(time.Now().Add(issueTimeout))
	if err := conn.Handshake(); err != nil {
		return
	}
	proto := conn.ConnectionState().NegotiatedProtocol
	s.mu.Lock()
	s.protos = append(s.protos, proto)
	s.mu.Unlock()
	if proto == ACMETLS1Protocol {
		return // a validation handshake carries no data
	}
	_ = conn.SetDeadline(time.Time{})
	_, _ = io.Copy(conn, conn)
}

func (s *slowServer) challengeHandshakes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.protos {
		if p == ACMETLS1Protocol {
			n++
		}
	}
	return n
}

func dialSlow(addr string, cfg *tls.Config) (*tls.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: issueTimeout}, "tcp", addr, cfg)
}

// allowList is a decision function over a fixed set of names that records
// what it was asked.
type allowList struct {
	names map[string]bool
	mu    sync.Mutex
	asked []string
}

func newAllowList(names ...string) *allowList {
	a := &allowList{names: map[string]bool{}}
	for _, n := range names {
		a.names[n] = true
	}
	return a
}

func (a *allowList) Allowed(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, name)
	return a.names[name]
}

func (a *allowList) askedNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked)
}

func (a *allowList) wasAsked(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.asked, name)
}

//go:linkname certmagicRateLimiters github.com/caddyserver/certmagic.rateLimiters
var certmagicRateLimiters map[string]*certmagic.RingBufferRateLimiter

//go:linkname certmagicRateLimitersMu github.com/caddyserver/certmagic.rateLimitersMu
var certmagicRateLimitersMu sync.RWMutex

// stopCertmagicRateLimiters stops and forgets certmagic's per-CA rate
// limiters. certmagic starts one goroutine per CA and account on the first
// order and never stops it (acmeclient.go: "TODO: stop rate limiter when it
// is garbage-collected"); no API reaches it, hence the linkname.
func stopCertmagicRateLimiters() {
	certmagicRateLimitersMu.Lock()
	defer certmagicRateLimitersMu.Unlock()
	for key, rl := range certmagicRateLimiters {
		rl.Stop()
		delete(certmagicRateLimiters, key)
	}
}

// waitCertmagicLockRefreshers waits for certmagic's lock file refreshers to
// end: each polls every 5 s and stops once its lock file is gone.
func waitCertmagicLockRefreshers(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "certmagic.keepLockfileFresh") {
			return
		}
		if time.Now().After(deadline) {
			t.Error("certmagic lock file refreshers still running after 15s")
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkCertmagicGoroutines registers, as the test's last cleanup, a check
// that the test left no goroutine behind once certmagic's unstoppable
// helpers are dealt with.
func checkCertmagicGoroutines(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		stopCertmagicRateLimiters()
		waitCertmagicLockRefreshers(t)
		goleak.VerifyNone(t, ignore)
	})
}

func newManaged(t *testing.T, cfg ManagedConfig) *Managed {
	t.Helper()
	m, err := NewManaged(cfg)
	if err != nil {
		t.Fatalf("NewManaged: %v", err)
	}
	t.Cleanup(m.Close)
	return m
}

func TestManagedIssuesOnDemandForInstalledRoutesOnly(t *testing.T) {
	checkCertmagicGoroutines(t)
	ca := newTestAuthority(t)
	dns := startDNS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pebble := startPebble(t, ca, ln.Addr().(*net.TCPAddr).Port, dns.addr)

	cacheDir := t.TempDir()
	allow := newAllowList(testServerName)
	logger, logs := newTestLogger()
	cfg := ManagedConfig{
		CA:               pebble.directory,
		Email:            "ops@apps.test",
		CacheDir:         cacheDir,
		CARoots:          ca.Pool(),
		ChallengeAddress: ln.Addr().String(),
		Allowed:          allow.Allowed,
		Logger:           logger,
	}
	m := newManaged(t, cfg)
	srv := serveSlow(t, ln, ServerConfig(m.GetCertificate, []string{"http/1.1", ACMETLS1Protocol}))
	client := func(name string) *tls.Config {
		return &tls.Config{RootCAs: pebble.trust, ServerName: name, NextProtos: []string{"http/1.1"}}
	}

	// (1) An installed route gets a certificate from pebble on its first
	// handshake, after pebble validated the TLS-ALPN-01 challenge through
	// the same listener.
	ordersBefore := pebble.orders()
	start := time.Now()
	conn, err := dialSlow(srv.addr, client(testServerName))
	if err != nil {
		t.Fatalf("handshake for installed route %s: %v\ncertmagic logs:\n%s", testServerName, err, logs)
	}
	t.Logf("first handshake (on-demand issuance) took %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { _ = conn.Close() })
	echo(t, conn, "managed")
	state := conn.ConnectionState()
	leaf := state.PeerCertificates[0]
	if len(state.VerifiedChains) == 0 || !slices.Equal(leaf.DNSNames, []string{testServerName}) {
		t.Errorf("leaf DNS names %v (verified chains %d), want [%s]", leaf.DNSNames, len(state.VerifiedChains), testServerName)
	}
	if key, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || key.Curve != elliptic.P256() {
		t.Errorf("leaf key %T, want ECDSA P-256", leaf.PublicKey)
	}
	if state.Version != tls.VersionTLS13 {
		t.Errorf("version %s, want TLS 1.3", tls.VersionName(state.Version))
	}
	if got := pebble.orders() - ordersBefore; got != 1 {
		t.Errorf("pebble created %d orders, want 1", got)
	}
	if srv.challengeHandshakes() == 0 || !dns.queried(testServerName) {
		t.Errorf("challenge not validated through the listener: %d acme-tls/1 handshakes, DNS queries %v",
			srv.challengeHandshakes(), dns.names())
	}
	if !logs.contains("component=certmagic") || !logs.contains("certificate obtained successfully") {
		t.Errorf("certmagic's logs did not reach the slog logger:\n%s", logs)
	}
	serial := leaf.SerialNumber.Text(16)
	// Its expiry is exported under the hostname, with the NotAfter the
	// client was served, beside the TLS directory's certificate.
	reg := prometheus.NewRegistry()
	reg.MustRegister(ExpiryCollector(nil, m))
	wantExpiry := fmt.Sprintf("# HELP applistener_certificate_expiry_timestamp_seconds %s\n# TYPE applistener_certificate_expiry_timestamp_seconds gauge\n"+
		"applistener_certificate_expiry_timestamp_seconds{name=%q} %d\n", expiryHelp, testServerName, leaf.NotAfter.Unix())
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(wantExpiry), "applistener_certificate_expiry_timestamp_seconds"); err != nil {
		t.Errorf("managed certificate expiry: %v", err)
	}

	// Later handshakes reuse it.
	if got := handshakeSerial(t, srv.addr, client(testServerName)); got != serial {
		t.Errorf("second handshake serial %s, want %s", got, serial)
	}

	// (2) A name that is not an installed route is never requested: the
	// decision says no, pebble sees no order, and the handshake fails.
	ordersBefore = pebble.orders()
	if conn, err := dialSlow(srv.addr, client(otherServerName)); err == nil {
		_ = conn.Close()
		t.Errorf("handshake for %s succeeded", otherServerName)
	}
	if !allow.wasAsked(otherServerName) {
		t.Errorf("decision function was not asked about %s", otherServerName)
	}
	if got := pebble.orders(); got != ordersBefore {
		t.Errorf("pebble orders went from %d to %d after a handshake for %s", ordersBefore, got, otherServerName)
	}
	if strings.Contains(pebble.out.String(), otherServerName) || dns.queried(otherServerName) {
		t.Errorf("%s reached the CA", otherServerName)
	}
	// Upper case and a trailing dot reach the decision normalized.
	if conn, err := dialSlow(srv.addr, client("TEAM--Nope.apps.test.")); err == nil {
		_ = conn.Close()
		t.Error("handshake for TEAM--Nope.apps.test. succeeded")
	}
	for _, asked := range allow.askedNames() {
		if asked != normalizeServerName(asked) {
			t.Errorf("decision asked about %q, not normalized", asked)
		}
	}
	if got := pebble.orders(); got != ordersBefore {
		t.Errorf("pebble orders went from %d to %d", ordersBefore, got)
	}
	// Refused names are not exported; a withdrawn route's series goes.
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(wantExpiry), "applistener_certificate_expiry_timestamp_seconds"); err != nil {
		t.Errorf("managed certificate expiry after refused names: %v", err)
	}
	allow.mu.Lock()
	delete(allow.names, testServerName)
	allow.mu.Unlock()
	if n, err := promtestutil.GatherAndCount(reg, "applistener_certificate_expiry_timestamp_seconds"); err != nil || n != 0 {
		t.Errorf("after the route is withdrawn: %d expiry series (%v), want 0", n, err)
	}
	allow.mu.Lock()
	allow.names[testServerName] = true
	allow.mu.Unlock()

	// (3) The certificate is cached in CacheDir: a new Managed on the same
	// directory serves it without a new order.
	m.Close()
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ChallengeAddress = ln2.Addr().String()
	m2 := newManaged(t, cfg)
	srv2 := serveSlow(t, ln2, ServerConfig(m2.GetCertificate, []string{"http/1.1", ACMETLS1Protocol}))
	ordersBefore = pebble.orders()
	if got := handshakeSerial(t, srv2.addr, client(testServerName)); got != serial {
		t.Errorf("handshake on a new Managed over the same cache directory: serial %s, want %s", got, serial)
	}
	if got := pebble.orders(); got != ordersBefore {
		t.Errorf("pebble orders went from %d to %d for a cached certificate", ordersBefore, got)
	}
	m2.Close()
	// After Close there is no fallback, so handshakes fail.
	if conn, err := dialSlow(srv2.addr, client(testServerName)); err == nil {
		_ = conn.Close()
		t.Error("handshake succeeded after Close without a fallback")
	}
}

// unreachableCA is an ACME directory URL on a port where nothing listens.
func unreachableCA(t *testing.T) string {
	return fmt.Sprintf("https://127.0.0.1:%d/directory", freePort(t))
}

func TestManagedNotAllowedUsesFallbackWithoutContactingTheCA(t *testing.T) {
	checkCertmagicGoroutines(t)
	ca := newTestAuthority(t)
	_, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	allow := newAllowList() // nothing is installed
	logger, _ := newTestLogger()
	cfg := ManagedConfig{
		CA:               unreachableCA(t),
		CacheDir:         t.TempDir(),
		ChallengeAddress: ln.Addr().String(),
		Allowed:          allow.Allowed,
		Fallback:         store.GetCertificate,
		Logger:           logger,
	}
	m := newManaged(t, cfg)
	srv := serveSlow(t, ln, ServerConfig(m.GetCertificate, []string{"http/1.1", ACMETLS1Protocol}))

	// The Secret's certificate is served for a name that is not a route.
	conn := mustDial(t, srv.addr, clientConfig(ca))
	echo(t, conn, "fallback")
	if got, want := peerSerial(conn), store.Current().Leaf.SerialNumber.Text(16); got != want {
		t.Errorf("serial %s, want the Secret's %s", got, want)
	}
	if !allow.wasAsked(testServerName) {
		t.Error("decision function not asked")
	}

	// A TLS-ALPN-01 validation handshake never gets the fallback: there
	// is no challenge in progress, so it fails.
	chal := &tls.Config{ServerName: testServerName, NextProtos: []string{ACMETLS1Protocol}, InsecureSkipVerify: true}
	if conn, err := dial(srv.addr, chal); err == nil {
		_ = conn.Close()
		t.Error("acme-tls/1 handshake without a challenge in progress succeeded")
	}

	// Without a fallback, a name that is not a route fails the handshake.
	cfg.Fallback = nil
	m2 := newManaged(t, cfg)
	hello := &tls.ClientHelloInfo{ServerName: testServerName}
	if cert, err := m2.GetCertificate(hello); err == nil || !strings.Contains(err.Error(), "not an installed route") {
		t.Errorf("GetCertificate = %v, %v; want a not-installed error", cert, err)
	}
	if entries, _ := os.ReadDir(cfg.CacheDir); len(entries) != 0 {
		t.Errorf("cache directory has %d entries, want none (nothing was requested)", len(entries))
	}
}

func TestManagedCloseCancelsIssuance(t *testing.T) {
	checkCertmagicGoroutines(t)
	ca := newTestAuthority(t)
	_, store, _ := newSecretStore(t, issue(t, ca, time.Hour, testDomainCert))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	allow := newAllowList(testServerName)
	logger, logs := newTestLogger()
	m := newManaged(t, ManagedConfig{
		CA:               unreachableCA(t), // the first attempt fails; certmagic retries after a minute
		CacheDir:         t.TempDir(),
		ChallengeAddress: ln.Addr().String(),
		Allowed:          allow.Allowed,
		Fallback:         store.GetCertificate,
		Logger:           logger,
	})
	srv := serveSlow(t, ln, ServerConfig(m.GetCertificate, []string{"http/1.1", ACMETLS1Protocol}))

	type result struct {
		serial string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := dialSlow(srv.addr, clientConfig(ca))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer func() { _ = conn.Close() }()
		done <- result{serial: peerSerial(conn)}
	}()
	testutil.Eventually(t, 20*time.Second, "a failed first issuance attempt", func() bool {
		return logs.contains("will retry")
	})
	select {
	case r := <-done:
		t.Fatalf("handshake returned during issuance: %+v", r)
	default:
	}
	start := time.Now()
	m.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("handshake after Close: %v", r.err)
		}
		if want := store.Current().Leaf.SerialNumber.Text(16); r.serial != want {
			t.Errorf("serial %s, want the fallback's %s", r.serial, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handshake still blocked after Close")
	}
}

func TestNewManagedValidatesConfig(t *testing.T) {
	checkCertmagicGoroutines(t)
	logger, _ := newTestLogger()
	good := ManagedConfig{
		Logger:           logger,
		CA:               "https://127.0.0.1:1/dir",
		CacheDir:         t.TempDir(),
		ChallengeAddress: ":8443",
		Allowed:          func(string) bool { return true },
	}
	for name, mutate := range map[string]func(*ManagedConfig){
		"no CA":                 func(c *ManagedConfig) { c.CA = "" },
		"no cache dir":          func(c *ManagedConfig) { c.CacheDir = "" },
		"no decision":           func(c *ManagedConfig) { c.Allowed = nil },
		"no challenge address":  func(c *ManagedConfig) { c.ChallengeAddress = "" },
		"challenge port 0":      func(c *ManagedConfig) { c.ChallengeAddress = "127.0.0.1:0" },
		"challenge port a name": func(c *ManagedConfig) { c.ChallengeAddress = "127.0.0.1:https" },
	} {
		cfg := good
		mutate(&cfg)
		if m, err := NewManaged(cfg); err == nil {
			m.Close()
			t.Errorf("%s: NewManaged succeeded", name)
		}
	}
	m, err := NewManaged(good)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close() // idempotent
}

func TestNormalizeServerName(t *testing.T) {
	for in, want := range map[string]string{
		"Team--Demo--Web.Apps.Test.": "team--demo--web.apps.test",
		"team--demo--web.apps.test":  "team--demo--web.apps.test",
		".":                          "",
		"":                           "",
	} {
		if got := normalizeServerName(in); got != want {
			t.Errorf("normalizeServerName(%q) = %q, want %q", in, got, want)
		}
	}
}

// rsaPair issues an RSA-2048 certificate for names, signed by ca.
func rsaPair(t *testing.T, ca *Authority, names ...string) *tls.Certificate {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := randomSerial()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}
}

func ecdsaPair(t *testing.T, ca *Authority, names ...string) *tls.Certificate {
	t.Helper()
	p := issue(t, ca, time.Hour, names...)
	cert, err := tls.X509KeyPair(p.certPEM, p.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &cert
}

func static(cert *tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
}

func failing(err error) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, err }
}

func TestPreferECDSASelection(t *testing.T) {
	ca := newTestAuthority(t)
	rsaCert := rsaPair(t, ca, testDomainCert)
	ecCert := ecdsaPair(t, ca, testDomainCert)
	if isECDSACert(rsaCert) || !isECDSACert(ecCert) {
		t.Fatal("isECDSACert misclassifies the test pairs")
	}
	noLeaf := *ecCert
	noLeaf.Leaf = nil
	if !isECDSACert(&noLeaf) {
		t.Error("isECDSACert without a parsed leaf")
	}
	tls13 := []uint16{tls.VersionTLS13}
	ecdsaAndRSA := &tls.ClientHelloInfo{
		ServerName:        testServerName,
		SupportedVersions: tls13,
		SignatureSchemes:  []tls.SignatureScheme{tls.PSSWithSHA256, tls.ECDSAWithP256AndSHA256},
	}
	rsaOnly := &tls.ClientHelloInfo{
		ServerName:        testServerName,
		SupportedVersions: tls13,
		SignatureSchemes:  []tls.SignatureScheme{tls.PSSWithSHA256, tls.PKCS1WithSHA256},
	}
	ecdsaOnly := &tls.ClientHelloInfo{
		ServerName:        testServerName,
		SupportedVersions: tls13,
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256},
	}
	otherName := &tls.ClientHelloInfo{
		ServerName:        "web.other.test",
		SupportedVersions: tls13,
		SignatureSchemes:  []tls.SignatureScheme{tls.PSSWithSHA256, tls.ECDSAWithP256AndSHA256},
	}
	errA, errB := errors.New("a failed"), errors.New("b failed")

	for _, tc := range []struct {
		name    string
		sources []func(*tls.ClientHelloInfo) (*tls.Certificate, error)
		hello   *tls.ClientHelloInfo
		want    *tls.Certificate
		wantErr error
	}{
		{"both supported, RSA first", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(rsaCert), static(ecCert)}, ecdsaAndRSA, ecCert, nil},
		{"both supported, ECDSA first", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(ecCert), static(rsaCert)}, ecdsaAndRSA, ecCert, nil},
		{"RSA-only client", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(ecCert), static(rsaCert)}, rsaOnly, rsaCert, nil},
		{"ECDSA-only client", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(rsaCert), static(ecCert)}, ecdsaOnly, ecCert, nil},
		{"RSA-only client, RSA missing", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(ecCert), failing(errA)}, rsaOnly, ecCert, nil},
		{"name not covered: first certificate", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){static(rsaCert), static(ecCert)}, otherName, rsaCert, nil},
		{"failing and nil sources skipped", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){failing(errA), nil, static(rsaCert)}, ecdsaAndRSA, rsaCert, nil},
		{"all fail: first error", []func(*tls.ClientHelloInfo) (*tls.Certificate, error){failing(errA), failing(errB)}, ecdsaAndRSA, nil, errA},
		{"no sources", nil, ecdsaAndRSA, nil, errNoCertificate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PreferECDSA(tc.sources...)(tc.hello)
			if got != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("got %p, %v; want %p, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestPreferECDSAHandshakes(t *testing.T) {
	ca := newTestAuthority(t)
	rsaCert := rsaPair(t, ca, testDomainCert)
	ecCert := ecdsaPair(t, ca, testDomainCert)
	srv := startServer(t, ServerConfig(PreferECDSA(static(rsaCert), static(ecCert)), []string{"http/1.1"}))

	keyOf := func(conn *tls.Conn) x509.PublicKeyAlgorithm {
		return conn.ConnectionState().PeerCertificates[0].PublicKeyAlgorithm
	}
	// A modern client gets the ECDSA certificate though RSA comes first.
	conn := mustDial(t, srv.addr, clientConfig(ca))
	if got := keyOf(conn); got != x509.ECDSA {
		t.Errorf("TLS 1.3 client got a %v certificate, want ECDSA", got)
	}
	echo(t, conn, "ecdsa")

	// A TLS 1.2 client offering only ECDHE-RSA suites gets the RSA one.
	c := clientConfig(ca)
	c.MaxVersion = tls.VersionTLS12
	c.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256}
	conn = mustDial(t, srv.addr, c)
	if got := keyOf(conn); got != x509.RSA {
		t.Errorf("RSA-only TLS 1.2 client got a %v certificate, want RSA", got)
	}
	echo(t, conn, "rsa")

	// And one offering only ECDHE-ECDSA suites gets the ECDSA one.
	c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
	conn = mustDial(t, srv.addr, c)
	if got := keyOf(conn); got != x509.ECDSA {
		t.Errorf("ECDSA-only TLS 1.2 client got a %v certificate, want ECDSA", got)
	}
}
