package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/internal/testutil"
)

const (
	domain      = "apps.test"
	hostWeb     = "team--demo--web.apps.test"
	hostAPI     = "team--demo--api.apps.test"
	hostDefault = "team--demo.apps.test"

	// waitTimeout bounds every poll: CI is a noisy 2-core machine running -race.
	waitTimeout = 10 * time.Second
	freshness   = 2 * time.Second
)

var (
	binPath string // the applistener binary built by TestMain

	caPEM, leafPEM, leafKeyPEM []byte
	caPool                     *x509.CertPool
)

// runner lets goleak check for leaks after the temp dir is removed.
type runner struct {
	m       *testing.M
	cleanup func()
}

func (r runner) Run() int {
	defer r.cleanup()
	return r.m.Run()
}

func TestMain(m *testing.M) {
	if os.Getenv("APPLISTENER_E2E_NS_HELPER") != "" {
		// A backend helper process (see netns_harness_test.go): it needs no
		// binary and must start fast.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "applistener-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	if err := setup(dir); err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(runner{m: m, cleanup: func() { _ = os.RemoveAll(dir) }})
}

func setup(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	binPath = filepath.Join(dir, "applistener")
	args := []string{"build", "-o", binPath}
	if os.Getenv("APPLISTENER_E2E_RACE") == "1" {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/applistener")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return makeCerts()
}

// moduleRoot walks up from the working directory to the directory holding go.mod.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("go.mod not found above the working directory")
		}
		d = parent
	}
}

// makeCerts creates a CA and an ECDSA leaf for *.apps.test signed by it.
func makeCerts() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "applistener e2e CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	leafPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})
	leafKeyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	caPool = x509.NewCertPool()
	caPool.AddCert(caCert)
	return nil
}

// ---------------------------------------------------------------------------
// small helpers

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	portsMu   sync.Mutex
	portsUsed = map[string]bool{}
)

// freeAddr returns a loopback address that was free a moment ago and that
// no other caller in this test binary has been given.
func freeAddr(t testing.TB) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		portsMu.Lock()
		used := portsUsed[addr]
		portsUsed[addr] = true
		portsMu.Unlock()
		if !used {
			return addr
		}
	}
}

// deadPort returns a loopback port nothing listens on: a socket is bound to
// it (without SO_REUSEADDR, so no parallel test can take the port) but never
// listens, so connecting to it is refused. It is released on cleanup.
func deadPort(t testing.TB) int {
	t.Helper()
	return testutil.DeadLoopbackPort(t)
}

func writeAtomic(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// bigBody returns n deterministic, not trivially compressible bytes.
func bigBody(n int) []byte {
	b := make([]byte, n)
	var ctr [8]byte
	for i := 0; i < n; i += sha256.Size {
		for j := range ctr {
			ctr[j] = byte(i >> (8 * j))
		}
		sum := sha256.Sum256(ctr[:])
		copy(b[i:], sum[:])
	}
	return b
}

// ---------------------------------------------------------------------------
// route documents

type service struct {
	Name       string `json:"name"`
	Port       int    `json:"port"`
	Revision   int    `json:"revision"`
	StartGrace *int   `json:"start_grace_seconds,omitempty"`
}

var revCounter atomic.Int64

func routesDoc(svcs ...service) []byte {
	return routesDocument(docEntry{sandbox: "demo", services: svcs})
}

// docEntry is one instance of a routes (or gateway configuration) document.
type docEntry struct {
	workspace string // "": team
	sandbox   string
	connector map[string]any // nil: TCP to 127.0.0.1
	limits    map[string]any // nil: none
	services  []service      // nil: none
}

// routesDocument is a document of entries under a fresh revision.
func routesDocument(entries ...docEntry) []byte {
	list := []any{}
	for _, in := range entries {
		e := map[string]any{
			"workspace":  cmp.Or(in.workspace, "team"),
			"sandbox":    in.sandbox,
			"generation": "1",
			"connector":  in.connector,
			"services":   in.services,
		}
		if in.connector == nil {
			e["connector"] = map[string]any{"type": "tcp", "host": "127.0.0.1"}
		}
		if in.services == nil {
			e["services"] = []service{}
		}
		if in.limits != nil {
			e["limits"] = in.limits
		}
		list = append(list, e)
	}
	b, err := json.Marshal(map[string]any{
		"revision":  fmt.Sprintf("r%d", revCounter.Add(1)),
		"instances": list,
	})
	if err != nil {
		panic(err)
	}
	return b
}

// ---------------------------------------------------------------------------
// backends

type recorded struct {
	Method           string
	URI              string
	Host             string
	Proto            string
	Header           http.Header
	TransferEncoding []string
	ContentLength    int64
	Body             []byte
	BodyErr          error
}

// backend is an app on loopback that records what it receives and answers
// with its name.
type backend struct {
	name string
	srv  *httptest.Server
	port int

	accepted atomic.Int64 // TCP connections accepted
	open     atomic.Int64 // TCP connections not yet closed

	mu   sync.Mutex
	reqs []*recorded
	ws   wsEchoes
}

// wsEchoes is a WebSocket echo handler that keeps track of its
// connections, so that a test app can close them when it stops.
type wsEchoes struct {
	mu    sync.Mutex
	conns map[*websocket.Conn]struct{}
	wg    sync.WaitGroup
}

// serve upgrades r and echoes every message until the connection ends.
func (e *wsEchoes) serve(w http.ResponseWriter, r *http.Request) {
	c, err := wsUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	e.track(c)
}

// track echoes every message of the upgraded c until the connection ends,
// keeping track of it meanwhile.
func (e *wsEchoes) track(c *websocket.Conn) {
	e.mu.Lock()
	if e.conns == nil {
		e.conns = map[*websocket.Conn]struct{}{}
	}
	e.conns[c] = struct{}{}
	e.wg.Add(1)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		_ = c.Close()
		e.wg.Done()
	}()
	for {
		typ, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		if err := c.WriteMessage(typ, msg); err != nil {
			return
		}
	}
}

// closeAll closes the open WebSockets.
func (e *wsEchoes) closeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := range e.conns {
		_ = c.Close()
	}
}

func newBackend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serveHTTP))
	b.srv.Listener = &countingListener{Listener: b.srv.Listener, b: b}
	b.srv.Start()
	b.port = b.srv.Listener.Addr().(*net.TCPAddr).Port
	t.Cleanup(b.close)
	return b
}

func (b *backend) hostPort() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

func (b *backend) close() {
	b.ws.closeAll()
	b.srv.Close()
	b.ws.wg.Wait()
}

func (b *backend) record(r *http.Request, body []byte, err error) *recorded {
	rec := &recorded{
		Method: r.Method, URI: r.RequestURI, Host: r.Host, Proto: r.Proto,
		Header: r.Header.Clone(), TransferEncoding: r.TransferEncoding,
		ContentLength: r.ContentLength, Body: body, BodyErr: err,
	}
	b.mu.Lock()
	b.reqs = append(b.reqs, rec)
	b.mu.Unlock()
	return rec
}

// requests returns a copy of what the backend received so far.
func (b *backend) requests() []*recorded {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*recorded(nil), b.reqs...)
}

func (b *backend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

// last returns the most recent request whose URI is uri.
func (b *backend) last(t testing.TB, uri string) *recorded {
	t.Helper()
	reqs := b.requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].URI == uri {
			return reqs[i]
		}
	}
	t.Fatalf("backend %s received no request for %s (got %d requests)", b.name, uri, len(reqs))
	return nil
}

var wsUpgrader = websocket.Upgrader{
	CheckOrigin: func(*http.Request) bool { return true },
}

func (b *backend) serveHTTP(w http.ResponseWriter, r *http.Request) {
	// An h2c-capable app: honour "Upgrade: h2c" by switching protocols.
	// The listener must never let such an upgrade through.
	if strings.EqualFold(r.Header.Get("Upgrade"), "h2c") {
		b.record(r, nil, nil)
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		_ = rw.Flush()
		_ = c.Close()
		return
	}
	switch r.URL.Path {
	case "/ws":
		b.serveWS(w, r)
		return
	case "/sized":
		// The first n bytes of bigResponse.
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 || n > len(bigResponse) {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		b.record(r, nil, nil)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		_, _ = w.Write(bigResponse[:n])
		return
	case "/big":
		b.record(r, nil, nil)
		body := bigResponse
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		return
	case "/hop":
		// Hop-by-hop response headers the listener must not pass on.
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "secret")
		w.Header().Set("Proxy-Authenticate", `Basic realm="app"`)
		w.Header().Set("Keep-Alive", "timeout=99")
	case "/set-cookie":
		// The app sets the cookie given in ?c= as it is.
		w.Header().Set("Set-Cookie", r.URL.Query().Get("c"))
	case "/slow":
		b.record(r, nil, nil)
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
	}
	body, err := io.ReadAll(r.Body)
	b.record(r, body, err)
	if err != nil {
		http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("X-Backend", b.name)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintf(w, "hello from %s\n", b.name)
}

func (b *backend) serveWS(w http.ResponseWriter, r *http.Request) {
	b.record(r, nil, nil)
	b.ws.serve(w, r)
}

var bigResponse = bigBody(5 << 20)

type countingListener struct {
	net.Listener
	b *backend
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.b.accepted.Add(1)
	l.b.open.Add(1)
	return &countedConn{Conn: c, b: l.b}, nil
}

type countedConn struct {
	net.Conn
	once sync.Once
	b    *backend
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.b.open.Add(-1) })
	return c.Conn.Close()
}

// ---------------------------------------------------------------------------
// the applistener process

// proc is an applistener process with an app listener and an admin
// endpoint; startProc's also has a routes file.
type proc struct {
	*process
	appAddr    string
	adminAddr  string
	dir        string
	routesFile string
}

var adminClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true},
	Timeout:   2 * time.Second,
}

// startProc writes doc as the routes file and starts `applistener serve`
// with the app listener, waiting until /readyz answers 200. extra flags are
// appended. The process is stopped (SIGTERM, then kill) on cleanup, and its
// stderr is printed if the test failed.
func startProc(t testing.TB, doc []byte, extra ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	tlsDir := writeTLSDir(t, dir)
	routesFile := filepath.Join(dir, "routes.json")
	writeAtomic(t, routesFile, doc)
	p := &proc{dir: dir, routesFile: routesFile}
	p.process = launch(t, launchSpec{
		name: "applistener",
		args: func() []string {
			p.appAddr, p.adminAddr = freeAddr(t), freeAddr(t)
			args := []string{"serve",
				"--app-listener",
				"--app-domain", domain,
				"--app-address", p.appAddr,
				"--app-tls-dir", tlsDir,
				"--routes-file", routesFile,
				"--admin-address", p.adminAddr,
				"--route-freshness", freshness.String(),
				"--log-format", "json",
			}
			if !containsFlag(extra, "--drain-timeout") {
				args = append(args, "--drain-timeout", "3s")
			}
			if containsFlag(extra, "--mode") && !containsFlag(extra, "--address") { // --mode=shared requires a health listener
				args = append(args, "--address", freeAddr(t))
			}
			return append(args, extra...)
		},
		// childEnv: a -race binary would otherwise sleep 1 s at exit,
		// which the shutdown tests' exit deadlines would have to absorb.
		env:           childEnv(),
		ready:         func(*process) bool { return p.readyz() == http.StatusOK },
		retryPortRace: true,
	})
	return p
}

// writeTLSDir writes the wildcard certificate as a Kubernetes TLS Secret
// directory, dir/tls, and returns its path.
func writeTLSDir(t testing.TB, dir string) string {
	t.Helper()
	tlsDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tlsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tlsDir, "tls.crt"), leafPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tlsDir, "tls.key"), leafKeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return tlsDir
}

func containsFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// readyz returns the status of GET /readyz, or 0 on a transport error or
// an answer that is not from an applistener admin endpoint.
func (p *proc) readyz() int {
	resp, err := adminClient.Get("http://" + p.adminAddr + "/readyz")
	if err != nil {
		return 0
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if !strings.HasPrefix(string(body), "ready") && !strings.HasPrefix(string(body), "not ready") {
		return 0
	}
	return resp.StatusCode
}

// metric sums every sample of the named metric on /metrics.
func (p *proc) metric(t testing.TB, name string) float64 {
	t.Helper()
	resp, err := adminClient.Get("http://" + p.adminAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		t.Fatalf("metric %s not found on /metrics", name)
	}
	return sum
}

func (p *proc) writeRoutes(t testing.TB, doc []byte) { writeAtomic(t, p.routesFile, doc) }

// ---------------------------------------------------------------------------
// clients

func (p *proc) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", p.appAddr)
}

func tlsConfig(sni string) *tls.Config {
	return &tls.Config{RootCAs: caPool, ServerName: sni}
}

// client returns an HTTP/1.1 client whose connections all go to the
// listener with the given SNI, and a counter of the TCP dials it made.
func (p *proc) client(t testing.TB, sni string) (*http.Client, *atomic.Int64) {
	dials := &atomic.Int64{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return p.dial(ctx, network, addr)
		},
		TLSClientConfig:       tlsConfig(sni),
		ForceAttemptHTTP2:     false,
		MaxConnsPerHost:       1,
		MaxIdleConnsPerHost:   1,
		ResponseHeaderTimeout: waitTimeout,
		DisableCompression:    true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, dials
}

// dialTLS opens a TLS connection to the listener with the given config.
func (p *proc) dialTLS(cfg *tls.Config) (*tls.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", p.appAddr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(time.Now().Add(waitTimeout))
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// rawConn is a TLS connection for hand-written requests.
type rawConn struct {
	*tls.Conn
	br *bufio.Reader
}

func (p *proc) raw(t testing.TB, sni string) *rawConn {
	t.Helper()
	c, err := p.dialTLS(tlsConfig(sni))
	if err != nil {
		t.Fatalf("TLS handshake with SNI %q: %v", sni, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// roundTrip writes req verbatim and reads one response with its body.
func (r *rawConn) roundTrip(t testing.TB, req string) (*http.Response, []byte) {
	t.Helper()
	resp, body, err := r.tryRoundTrip(req)
	if err != nil {
		t.Fatalf("round trip of %q: %v", firstLine(req), err)
	}
	return resp, body
}

func (r *rawConn) tryRoundTrip(req string) (*http.Response, []byte, error) {
	_ = r.SetDeadline(time.Now().Add(waitTimeout))
	defer func() { _ = r.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(r.Conn, req); err != nil {
		return nil, nil, fmt.Errorf("write: %w", err)
	}
	return readResponse(r.br, strings.SplitN(req, " ", 2)[0])
}

func readResponse(br *bufio.Reader, method string) (*http.Response, []byte, error) {
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return nil, nil, fmt.Errorf("read response: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return resp, body, fmt.Errorf("read body: %w", err)
	}
	return resp, body, nil
}

// expectClosed checks that the server closes the connection (a read
// returns EOF or a reset, not a timeout) within timeout.
func (r *rawConn) expectClosed(t testing.TB, timeout time.Duration) {
	t.Helper()
	_ = r.SetReadDeadline(time.Now().Add(timeout))
	n, err := r.br.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case err == nil:
		t.Fatalf("connection still open: read %d unexpected byte(s)", n)
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("connection not closed by the listener within %v", timeout)
	}
}

func firstLine(s string) string {
	if i := strings.Index(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

// wsDial opens a WebSocket through the listener.
func (p *proc) wsDial(t testing.TB, sni string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{
		NetDialContext:   p.dial,
		TLSClientConfig:  tlsConfig(sni),
		HandshakeTimeout: waitTimeout,
	}
	c, resp, err := d.Dial("wss://"+sni+"/ws", nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("WebSocket dial %s: %v (status %d)", sni, err, status)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wsEcho sends msg as a message of type typ on c and expects it back, each
// way within waitTimeout. It returns the failure instead of ending the test,
// so that it serves off the test goroutine too (the harnesses' periodic
// checks, goroutines holding a WebSocket).
func wsEcho(c *websocket.Conn, typ int, msg []byte) error {
	_ = c.SetWriteDeadline(time.Now().Add(waitTimeout))
	if err := c.WriteMessage(typ, msg); err != nil {
		return fmt.Errorf("WebSocket write of %s: %w", wsMessage(typ, msg), err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	gotTyp, got, err := c.ReadMessage()
	if err != nil {
		return fmt.Errorf("WebSocket read of the echo of %s: %w", wsMessage(typ, msg), err)
	}
	if gotTyp != typ || !bytes.Equal(got, msg) {
		return fmt.Errorf("WebSocket echo: got %s; want %s", wsMessage(gotTyp, got), wsMessage(typ, msg))
	}
	return nil
}

// must ends the test with err, if there is one.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wsMessage describes a message for a failure: short text as it is,
// anything else by type and size.
func wsMessage(typ int, msg []byte) string {
	if typ == websocket.TextMessage && len(msg) <= 64 {
		return fmt.Sprintf("text %q", msg)
	}
	return fmt.Sprintf("type %d, %d bytes", typ, len(msg))
}

// expectCloseCode checks that a WebSocket read ended with err, a close
// frame carrying code.
func expectCloseCode(t testing.TB, what string, err error, code int) {
	t.Helper()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Errorf("%s: the WebSocket ended with %v; want a close frame %d first", what, err, code)
		return
	}
	if ce.Code != code {
		t.Errorf("%s: close code %d (%q); want %d", what, ce.Code, ce.Text, code)
	}
}

// wsExpectClosed waits for the listener to end c and returns the error the
// read saw (a *websocket.CloseError when a close frame arrived).
func wsExpectClosed(t testing.TB, c *websocket.Conn, timeout time.Duration) error {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("WebSocket not closed within %v", timeout)
		}
		return err
	}
}

// handshakeRefused checks that a TLS handshake with cfg fails with the
// alert unrecognized_name and that no certificate reached the client.
func (p *proc) handshakeRefused(t testing.TB, cfg *tls.Config) {
	t.Helper()
	var sawCert atomic.Bool
	cfg = cfg.Clone()
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		sawCert.Store(true)
		return nil
	}
	c, err := p.dialTLS(cfg)
	if err == nil {
		_ = c.Close()
		t.Fatalf("TLS handshake with SNI %q succeeded; want alert unrecognized_name", cfg.ServerName)
	}
	if !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("TLS handshake with SNI %q: %v; want alert unrecognized_name", cfg.ServerName, err)
	}
	if sawCert.Load() {
		t.Fatalf("TLS handshake with SNI %q: the server sent a certificate before refusing", cfg.ServerName)
	}
}

// handshakeErr returns the error of a TLS handshake with sni (nil: success).
func (p *proc) handshakeErr(sni string) error {
	c, err := p.dialTLS(tlsConfig(sni))
	if err == nil {
		_ = c.Close()
	}
	return err
}

// demoBackends are the two backends of team/demo, web and api, that the
// test environments (env, gatewayEnv) route to.
type demoBackends struct {
	web, api *backend
}

func newDemoBackends(t testing.TB) demoBackends {
	return demoBackends{web: newBackend(t, "web"), api: newBackend(t, "api")}
}

// services returns the chosen services, each on its backend's port.
func (b demoBackends) services(web, api bool) []service {
	var s []service
	if web {
		s = append(s, service{Name: "web", Port: b.web.port, Revision: 1})
	}
	if api {
		s = append(s, service{Name: "api", Port: b.api.port, Revision: 1})
	}
	return s
}

// env is one applistener process routing web and api to two backends.
type env struct {
	p *proc
	demoBackends
}

func newEnv(t testing.TB, extra ...string) *env {
	t.Helper()
	e := &env{demoBackends: newDemoBackends(t)}
	e.p = startProc(t, e.doc(true, true), extra...)
	return e
}

// doc is the routes document with the chosen services.
func (e *env) doc(web, api bool) []byte { return routesDoc(e.services(web, api)...) }

func get(t testing.TB, c *http.Client, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, body
}

func deadline() time.Time { return time.Now().Add(waitTimeout) }

// until returns the time left before t, at least 50 ms.
func until(t time.Time) time.Duration {
	return max(time.Until(t), 50*time.Millisecond)
}
