package e2e

// Helpers for the shared-host tests: network namespaces created per test,
// a sandbox app running inside each (this test binary as a helper process,
// TestNSHelperBackend), routes documents with several instances, and
// labelled /metrics samples. A netNamespace launches its app (launch) and
// names itself as a routes connector (connector).

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// namespaceHelperEnv set to "backend" makes TestNSHelperBackend act as a
	// sandbox app.
	namespaceHelperEnv = "APPLISTENER_E2E_NS_HELPER"
	// namespaceHelperNameEnv is what the app answers with.
	namespaceHelperNameEnv = "APPLISTENER_E2E_NS_NAME"
	// namespaceHelperAddrEnv is where it listens (default 127.0.0.1:8080).
	namespaceHelperAddrEnv = "APPLISTENER_E2E_NS_ADDR"
	// namespaceAppPort is the app's port on every sandbox's loopback.
	namespaceAppPort = 8080
	// namespaceHelperTimeout bounds a helper's start: its process runs this test
	// binary's TestMain (which builds the applistener binary, cached) first.
	namespaceHelperTimeout = 60 * time.Second
)

// TestNSHelperBackend is not a test. With APPLISTENER_E2E_NS_HELPER=backend
// (the shared-host tests run it inside a network namespace) it is a sandbox
// app on 127.0.0.1:8080: GET / answers its name, /ws is a WebSocket echo,
// /slow blocks until the request ends; it prints "ready" once listening and
// returns when its stdin reaches EOF. Without the variable it passes at once.
func TestNSHelperBackend(t *testing.T) {
	if os.Getenv(namespaceHelperEnv) != "backend" {
		return
	}
	addr := cmp.Or(os.Getenv(namespaceHelperAddrEnv), "127.0.0.1:"+strconv.Itoa(namespaceAppPort))
	if err := serveNamespaceApp(os.Getenv(namespaceHelperNameEnv), addr, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// namespaceAppServer is the sandbox app of TestNSHelperBackend.
type namespaceAppServer struct {
	name string
	wg   sync.WaitGroup
	ws   wsEchoes
}

// serveNamespaceApp serves the sandbox app on addr until stdin reaches EOF.
func serveNamespaceApp(name, addr string, stdin io.Reader, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	a := &namespaceAppServer{name: name}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		_ = srv.Close()
		return err
	}
	_, _ = io.Copy(io.Discard, stdin) // until the test closes stdin, or dies
	_ = srv.Close()                   // cancels the contexts of /slow
	a.ws.closeAll()
	err = <-served // http.ErrServerClosed, unless serving failed before
	a.wg.Wait()
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (a *namespaceAppServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.wg.Add(1)
	defer a.wg.Done()
	w.Header().Set("X-Sandbox-App", a.name)
	switch r.URL.Path {
	case "/ws":
		a.ws.serve(w, r)
	case "/slow":
		<-r.Context().Done()
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, a.name)
	}
}

var namespaceSeq atomic.Int64

// namespacesUnavailable fails the test when CI is set (namespaces are required
// there) and skips it otherwise.
func namespacesUnavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("network namespaces are required when CI is set, but cannot be created: %s", msg)
	}
	t.Skipf("SKIP: network namespaces unavailable (needs Linux, root and iproute2; with CI set this is a failure): %s", msg)
}

// netNamespace is a named network namespace owned by one test.
type netNamespace struct {
	name string
	path string // /run/netns/NAME
}

// newNetNamespace creates a uniquely named network namespace (al-PID-N) with its
// loopback up; it is removed when the test ends.
func newNetNamespace(t testing.TB) *netNamespace {
	t.Helper()
	if runtime.GOOS != "linux" {
		namespacesUnavailable(t, "not Linux (%s)", runtime.GOOS)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		namespacesUnavailable(t, "the ip command (iproute2) is missing: %v", err)
	}
	ns := &netNamespace{name: fmt.Sprintf("al-%d-%d", os.Getpid(), namespaceSeq.Add(1))}
	if out, err := exec.Command("ip", "netns", "add", ns.name).CombinedOutput(); err != nil {
		namespacesUnavailable(t, "ip netns add %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
	ns.path = filepath.Join("/run/netns", ns.name)
	t.Cleanup(func() {
		if _, err := os.Lstat(ns.path); err != nil {
			return // deleted by the test
		}
		if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
		}
	})
	if _, err := os.Stat(ns.path); err != nil {
		t.Fatalf("namespace %s created, but %s: %v", ns.name, ns.path, err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns.name, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		namespacesUnavailable(t, "ip netns exec %s ip link set lo up: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
	return ns
}

// del deletes the namespace now (ip netns del): its file disappears, the
// namespace itself lives on while the app process is in it.
func (ns *netNamespace) del(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
}

// readyWriter collects a helper's output and signals its "ready" line.
type readyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte("ready\n")) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// namespaceApp is a sandbox app process running inside a namespace.
type namespaceApp struct {
	ns   *netNamespace
	name string
	cmd  *exec.Cmd
	out  *readyWriter
	done chan struct{}
}

// launch starts this test binary inside ns as TestNSHelperBackend, an app
// on 127.0.0.1:8080 answering name. Call waitReady before using it. The
// process is stopped when the test ends: its stdin is closed (it exits and
// its TestMain removes its temporary directory), and it is killed if it
// does not exit.
func (ns *netNamespace) launch(t testing.TB, name string) *namespaceApp {
	t.Helper()
	// Not /proc/self/exe: ip would resolve that to itself after its exec.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &namespaceApp{ns: ns, name: name, out: &readyWriter{ready: make(chan struct{})}, done: make(chan struct{})}
	a.cmd = exec.Command("ip", "netns", "exec", ns.name, exe, "-test.run=^TestNSHelperBackend$", "-test.count=1")
	a.cmd.Env = append(os.Environ(),
		namespaceHelperEnv+"=backend",
		namespaceHelperNameEnv+"="+name,
		namespaceHelperAddrEnv+"=127.0.0.1:"+strconv.Itoa(namespaceAppPort))
	stdin, err := a.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	a.cmd.Stdout = a.out
	a.cmd.Stderr = a.out
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("starting the app of %s: %v", ns.name, err)
	}
	go func() {
		_ = a.cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-a.done:
		case <-time.After(15 * time.Second):
			t.Errorf("the app in %s did not exit after its stdin closed; killing it", ns.name)
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

// waitReady waits until the app listens.
func (a *namespaceApp) waitReady(t testing.TB) {
	t.Helper()
	select {
	case <-a.out.ready:
	case <-a.done:
		t.Fatalf("the app in %s exited before it was ready:\n%s", a.ns.name, a.out.String())
	case <-time.After(namespaceHelperTimeout):
		t.Fatalf("the app in %s not ready after %v:\n%s", a.ns.name, namespaceHelperTimeout, a.out.String())
	}
}

// connector returns a netns connector for ns.
func (ns *netNamespace) connector() map[string]any {
	return map[string]any{"type": "netns", "path": ns.path}
}

// sandboxHost is the public name of a service of sandbox in workspace team.
func sandboxHost(sandbox, svc string) string {
	return "team--" + sandbox + "--" + svc + "." + domain
}

// metricWhere sums the samples of the metric name whose labels include want;
// found reports whether there was any.
func (p *proc) metricWhere(t testing.TB, name string, want map[string]string) (sum float64, found bool) {
	t.Helper()
	sum, found, err := scrapeMetric(p.adminAddr, name, want)
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	return sum, found
}

// metricMust is metricWhere, failing when no sample matches.
func (p *proc) metricMust(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := p.metricWhere(t, name, want)
	if !ok {
		t.Fatalf("no sample of %s with labels %v on /metrics", name, want)
	}
	return v
}

// instanceLabels selects the per-instance series of sandbox in team.
func instanceLabels(sandbox string) map[string]string {
	return map[string]string{"workspace": "team", "sandbox": sandbox}
}

// freshGet sends one request on a new connection (Connection: close) and
// returns the answer.
func (p *proc) freshGet(t testing.TB, sni, path string) (*http.Response, []byte) {
	t.Helper()
	c, err := p.dialTLS(tlsConfig(sni))
	if err != nil {
		t.Fatalf("TLS handshake with SNI %q: %v", sni, err)
	}
	defer func() { _ = c.Close() }()
	rc := &rawConn{Conn: c, br: bufio.NewReader(c)}
	return rc.roundTrip(t, "GET "+path+" HTTP/1.1\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n")
}

// expectApp checks a 200 answer from the app named want.
func expectApp(t testing.TB, what string, resp *http.Response, body []byte, want string) {
	t.Helper()
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("%s: %d %q (X-Sandbox-App %q); want 200 %q", what, resp.StatusCode, body, resp.Header.Get("X-Sandbox-App"), want)
	}
}
