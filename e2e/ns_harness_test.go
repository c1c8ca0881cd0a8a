package e2e

// Helpers for the shared-host tests: network namespaces created per test,
// a sandbox app running inside each (this test binary as a helper process,
// TestNSHelperBackend), routes documents with several instances, and
// labelled /metrics samples. Every identifier here starts with "ns".

import (
	"bufio"
	"bytes"
	"cmp"
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
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

const (
	// nsHelperEnv set to "backend" makes TestNSHelperBackend act as a
	// sandbox app.
	nsHelperEnv = "APPLISTENER_E2E_NS_HELPER"
	// nsHelperNameEnv is what the app answers with.
	nsHelperNameEnv = "APPLISTENER_E2E_NS_NAME"
	// nsHelperAddrEnv is where it listens (default 127.0.0.1:8080).
	nsHelperAddrEnv = "APPLISTENER_E2E_NS_ADDR"
	// nsAppPort is the app's port on every sandbox's loopback.
	nsAppPort = 8080
	// nsHelperTimeout bounds a helper's start: its process runs this test
	// binary's TestMain (which builds the applistener binary, cached) first.
	nsHelperTimeout = 60 * time.Second
)

// TestNSHelperBackend is not a test. With APPLISTENER_E2E_NS_HELPER=backend
// (the shared-host tests run it inside a network namespace) it is a sandbox
// app on 127.0.0.1:8080: GET / answers its name, /ws is a WebSocket echo,
// /slow blocks until the request ends; it prints "ready" once listening and
// returns when its stdin reaches EOF. Without the variable it passes at once.
func TestNSHelperBackend(t *testing.T) {
	if os.Getenv(nsHelperEnv) != "backend" {
		return
	}
	addr := cmp.Or(os.Getenv(nsHelperAddrEnv), "127.0.0.1:"+strconv.Itoa(nsAppPort))
	if err := nsServeApp(os.Getenv(nsHelperNameEnv), addr, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// nsAppServer is the sandbox app of TestNSHelperBackend.
type nsAppServer struct {
	name string
	wg   sync.WaitGroup
	ws   wsEchoes
}

// nsServeApp serves the sandbox app on addr until stdin reaches EOF.
func nsServeApp(name, addr string, stdin io.Reader, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	a := &nsAppServer{name: name}
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

func (a *nsAppServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

var nsSeq atomic.Int64

// nsUnavailable fails the test when CI is set (namespaces are required
// there) and skips it otherwise.
func nsUnavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("network namespaces are required when CI is set, but cannot be created: %s", msg)
	}
	t.Skipf("SKIP: network namespaces unavailable (needs Linux, root and iproute2; with CI set this is a failure): %s", msg)
}

// nsNamespace is a named network namespace owned by one test.
type nsNamespace struct {
	name string
	path string // /run/netns/NAME
}

// nsCreate creates a uniquely named network namespace (al-PID-N) with its
// loopback up; it is removed when the test ends.
func nsCreate(t testing.TB) *nsNamespace {
	t.Helper()
	if runtime.GOOS != "linux" {
		nsUnavailable(t, "not Linux (%s)", runtime.GOOS)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		nsUnavailable(t, "the ip command (iproute2) is missing: %v", err)
	}
	ns := &nsNamespace{name: fmt.Sprintf("al-%d-%d", os.Getpid(), nsSeq.Add(1))}
	if out, err := exec.Command("ip", "netns", "add", ns.name).CombinedOutput(); err != nil {
		nsUnavailable(t, "ip netns add %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
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
		nsUnavailable(t, "ip netns exec %s ip link set lo up: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
	return ns
}

// del deletes the namespace now (ip netns del): its file disappears, the
// namespace itself lives on while the app process is in it.
func (ns *nsNamespace) del(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
}

// nsReadyWriter collects a helper's output and signals its "ready" line.
type nsReadyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (w *nsReadyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte("ready\n")) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

func (w *nsReadyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// nsApp is a sandbox app process running inside a namespace.
type nsApp struct {
	ns   *nsNamespace
	name string
	cmd  *exec.Cmd
	out  *nsReadyWriter
	done chan struct{}
}

// nsLaunch starts this test binary inside ns as TestNSHelperBackend, an app
// on 127.0.0.1:8080 answering name. Call waitReady before using it. The
// process is stopped when the test ends: its stdin is closed (it exits and
// its TestMain removes its temporary directory), and it is killed if it
// does not exit.
func nsLaunch(t testing.TB, ns *nsNamespace, name string) *nsApp {
	t.Helper()
	// Not /proc/self/exe: ip would resolve that to itself after its exec.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &nsApp{ns: ns, name: name, out: &nsReadyWriter{ready: make(chan struct{})}, done: make(chan struct{})}
	a.cmd = exec.Command("ip", "netns", "exec", ns.name, exe, "-test.run=^TestNSHelperBackend$", "-test.count=1")
	a.cmd.Env = append(os.Environ(),
		nsHelperEnv+"=backend",
		nsHelperNameEnv+"="+name,
		nsHelperAddrEnv+"=127.0.0.1:"+strconv.Itoa(nsAppPort))
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
func (a *nsApp) waitReady(t testing.TB) {
	t.Helper()
	select {
	case <-a.out.ready:
	case <-a.done:
		t.Fatalf("the app in %s exited before it was ready:\n%s", a.ns.name, a.out.String())
	case <-time.After(nsHelperTimeout):
		t.Fatalf("the app in %s not ready after %v:\n%s", a.ns.name, nsHelperTimeout, a.out.String())
	}
}

// nsInstance is one instance entry of a routes document in workspace team.
type nsInstance struct {
	sandbox   string
	connector map[string]any
	limits    map[string]any // nil: none
	services  []service
}

// nsNetns returns a netns connector for ns.
func nsNetns(ns *nsNamespace) map[string]any {
	return map[string]any{"type": "netns", "path": ns.path}
}

// nsDoc returns a routes document with the given instances.
func nsDoc(insts ...nsInstance) []byte {
	list := []any{}
	for _, in := range insts {
		e := map[string]any{
			"workspace":  "team",
			"sandbox":    in.sandbox,
			"generation": "1",
			"connector":  in.connector,
			"services":   in.services,
		}
		if in.limits != nil {
			e["limits"] = in.limits
		}
		list = append(list, e)
	}
	b, err := json.Marshal(map[string]any{
		"revision":  fmt.Sprintf("ns%d", revCounter.Add(1)),
		"instances": list,
	})
	if err != nil {
		panic(err)
	}
	return b
}

// nsHostname is the public name of a service of sandbox in workspace team.
func nsHostname(sandbox, svc string) string {
	return "team--" + sandbox + "--" + svc + "." + domain
}

// nsMetric sums the samples of the metric name whose labels include want;
// found reports whether there was any.
func nsMetric(t testing.TB, p *proc, name string, want map[string]string) (sum float64, found bool) {
	t.Helper()
	sum, found, err := gwMetric(p.adminAddr, name, want)
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	return sum, found
}

// nsMetricMust is nsMetric, failing when no sample matches.
func nsMetricMust(t testing.TB, p *proc, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := nsMetric(t, p, name, want)
	if !ok {
		t.Fatalf("no sample of %s with labels %v on /metrics", name, want)
	}
	return v
}

// nsInstanceLabels selects the per-instance series of sandbox in team.
func nsInstanceLabels(sandbox string) map[string]string {
	return map[string]string{"workspace": "team", "sandbox": sandbox}
}

// nsFreshGet sends one request on a new connection (Connection: close) and
// returns the answer.
func nsFreshGet(t testing.TB, p *proc, sni, path string) (*http.Response, []byte) {
	t.Helper()
	c, err := p.dialTLS(tlsConfig(sni))
	if err != nil {
		t.Fatalf("TLS handshake with SNI %q: %v", sni, err)
	}
	defer func() { _ = c.Close() }()
	rc := &rawConn{Conn: c, br: bufio.NewReader(c)}
	return rc.roundTrip(t, "GET "+path+" HTTP/1.1\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n")
}

// nsExpectApp checks a 200 answer from the app named want.
func nsExpectApp(t testing.TB, what string, resp *http.Response, body []byte, want string) {
	t.Helper()
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("%s: %d %q (X-Sandbox-App %q); want 200 %q", what, resp.StatusCode, body, resp.Header.Get("X-Sandbox-App"), want)
	}
}

// nsEcho sends msg on c and expects it back, returning the failure (for use
// off the test goroutine).
func nsEcho(c *websocket.Conn, msg string) error {
	_ = c.SetWriteDeadline(time.Now().Add(waitTimeout))
	if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		return fmt.Errorf("write %q: %w", msg, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	typ, got, err := c.ReadMessage()
	if err != nil {
		return fmt.Errorf("read echo of %q: %w", msg, err)
	}
	if typ != websocket.TextMessage || string(got) != msg {
		return fmt.Errorf("echo of %q: type %d %q", msg, typ, got)
	}
	return nil
}

// nsExpectClose checks that a WebSocket read ended with a close frame
// carrying code.
func nsExpectClose(t testing.TB, what string, err error, code int) {
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
