//go:build linux

package connector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests here create their own network namespaces (ip netns add) and run
// this test binary inside them as a helper process (TestNSHelperProcess)
// that listens on the namespace's loopback. With CI set they fail when
// namespaces cannot be created; otherwise they skip.

const (
	nsHelperEnv     = "APPLISTENER_CONNECTOR_NS_HELPER" // "echo": act as the app in a namespace
	nsHelperNameEnv = "APPLISTENER_CONNECTOR_NS_NAME"   // what the helper answers with
	nsHelperAddrEnv = "APPLISTENER_CONNECTOR_NS_ADDR"   // where it listens
	// nsPort is the helper's port on the namespace's loopback.
	nsPort = 7070
)

// TestNSHelperProcess is not a test: run inside a namespace with
// APPLISTENER_CONNECTOR_NS_HELPER=echo, it listens on the namespace's
// loopback, prints "ready", answers each line with "<name> <line>" and
// returns when its stdin reaches EOF. Without the variable it passes at once.
func TestNSHelperProcess(t *testing.T) {
	if os.Getenv(nsHelperEnv) != "echo" {
		return
	}
	ln, err := net.Listen("tcp", os.Getenv(nsHelperAddrEnv))
	if err != nil {
		t.Fatalf("helper: listen: %v", err)
	}
	name := os.Getenv(nsHelperNameEnv)
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
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
				serveLines(c, name)
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			})
		}
	})
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin or dies
	_ = ln.Close()
	mu.Lock()
	for c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
	wg.Wait()
}

var nsSeq atomic.Int64

// nsUnavailable fails the test when CI is set and skips it otherwise.
func nsUnavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("network namespaces are required when CI is set, but cannot be created: %s", msg)
	}
	t.Skipf("SKIP: network namespaces unavailable (needs root and iproute2; with CI set this is a failure): %s", msg)
}

// nsNamespace is a named network namespace created for one test.
type nsNamespace struct {
	name, path string
}

// nsCreate creates a uniquely named namespace with its loopback up; it is
// removed when the test ends.
func nsCreate(t testing.TB) *nsNamespace {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		nsUnavailable(t, "the ip command (iproute2) is missing: %v", err)
	}
	ns := &nsNamespace{name: fmt.Sprintf("al-%d-%d", os.Getpid(), nsSeq.Add(1))}
	if out, err := exec.Command("ip", "netns", "add", ns.name).CombinedOutput(); err != nil {
		nsUnavailable(t, "ip netns add %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
	ns.path = filepath.Join("/run/netns", ns.name)
	t.Cleanup(func() {
		if _, err := os.Lstat(ns.path); err == nil {
			if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
			}
		}
	})
	if _, err := os.Stat(ns.path); err != nil {
		t.Fatalf("namespace %s created but %s is missing: %v", ns.name, ns.path, err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns.name, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		nsUnavailable(t, "ip netns exec %s ip link set lo up: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
	return ns
}

// del removes the namespace now (ip netns del).
func (ns *nsNamespace) del(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del %s: %v: %s", ns.name, err, bytes.TrimSpace(out))
	}
}

// readyWriter collects a helper's stdout and signals its "ready" line.
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

// nsStartEcho runs this test binary inside ns as TestNSHelperProcess,
// answering with name on 127.0.0.1:nsPort, and waits until it listens. It
// is stopped (stdin closed, then killed) when the test ends.
func nsStartEcho(t testing.TB, ns *nsNamespace, name string) {
	t.Helper()
	// Not /proc/self/exe: ip would resolve that to itself after exec.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns.name, exe, "-test.run=^TestNSHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		nsHelperEnv+"=echo",
		nsHelperNameEnv+"="+name,
		nsHelperAddrEnv+"=127.0.0.1:"+strconv.Itoa(nsPort))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &readyWriter{ready: make(chan struct{})}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the helper in %s: %v", ns.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("helper in %s did not exit after stdin closed; killing it", ns.name)
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case <-out.ready:
	case <-done:
		t.Fatalf("helper in %s exited before it was ready:\n%s", ns.name, out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("helper in %s not ready after 30s:\n%s", ns.name, out.String())
	}
}

// probeInside enters the namespace at path on a locked thread, reads the
// thread's namespace there, and returns to root (the thread is retired if
// it cannot return).
func probeInside(t testing.TB, path string) string {
	t.Helper()
	type result struct {
		ns  string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer func() { _ = unix.Close(self) }()
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer func() { _ = unix.Close(target) }()
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		s, err := os.Readlink("/proc/thread-self/ns/net")
		if unix.Setns(self, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{s, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("probe inside %s: %v", path, r.err)
	}
	return r.ns
}

// netnsOf returns the network namespace of the calling thread
// ("net:[INODE]").
func netnsOf(t testing.TB, path string) string {
	t.Helper()
	s, err := os.Readlink(path)
	if err != nil {
		t.Fatalf("readlink %s: %v", path, err)
	}
	return s
}

// threadsOutside returns the threads of this process whose network
// namespace is not root ("TID net:[INODE]").
func threadsOutside(t testing.TB, root string) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, task := range tasks {
		ns, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		if ns != root {
			bad = append(bad, task.Name()+" "+ns)
		}
	}
	return bad
}

func TestNetNSDial(t *testing.T) {
	ns := nsCreate(t)
	nsStartEcho(t, ns, "inside-"+ns.name)
	root := netnsOf(t, "/proc/self/ns/net")

	var c Connector = NetNS{Path: ns.path}
	if got, want := c.String(), "netns:"+ns.path; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
	for i := range 5 {
		conn, err := c.Dial(testCtx(t), nsPort)
		if err != nil {
			t.Fatalf("Dial %d: %v", i, err)
		}
		want := "inside-" + ns.name + " hello " + strconv.Itoa(i)
		if got := ask(t, conn, "hello "+strconv.Itoa(i)); got != want {
			t.Fatalf("answer %q; want %q", got, want)
		}
		if got := conn.RemoteAddr().String(); got != "127.0.0.1:"+strconv.Itoa(nsPort) {
			t.Errorf("RemoteAddr = %s; want 127.0.0.1:%d", got, nsPort)
		}
		_ = conn.Close()
	}
	if bad := threadsOutside(t, root); len(bad) > 0 {
		t.Fatalf("threads left outside the root network namespace %s: %v", root, bad)
	}

	// The same port in the root namespace is not the helper.
	if conn, err := (TCP{Host: "127.0.0.1"}).Dial(testCtx(t), nsPort); err == nil {
		_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
		_, _ = io.WriteString(conn, "who\n")
		line, _ := bufio.NewReader(conn).ReadString('\n')
		_ = conn.Close()
		if strings.HasPrefix(line, "inside-") {
			t.Fatalf("a root-namespace dial to 127.0.0.1:%d reached the namespace's app: %q", nsPort, line)
		}
	}
}

// Nothing listens in the namespace: refused, which is not ErrUnavailable.
func TestNetNSDialRefused(t *testing.T) {
	ns := nsCreate(t)
	_, err := NetNS{Path: ns.path}.Dial(testCtx(t), nsPort)
	if err == nil {
		t.Fatal("Dial to an empty namespace succeeded")
	}
	if errors.Is(err, ErrUnavailable) {
		t.Errorf("error %v wraps ErrUnavailable; the namespace exists, only the app is not listening", err)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("error %v; want connection refused", err)
	}
}

// A missing namespace path, or a path that is not a namespace, is an
// instance that is gone: ErrUnavailable. No namespace needs to be created.
func TestNetNSDialMissingPath(t *testing.T) {
	missing := fmt.Sprintf("/run/netns/al-missing-%d-%d", os.Getpid(), nsSeq.Add(1))
	regular := filepath.Join(t.TempDir(), "not-a-namespace")
	if err := os.WriteFile(regular, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{missing, regular, t.TempDir()} {
		conn, err := NetNS{Path: path}.Dial(testCtx(t), nsPort)
		if err == nil {
			_ = conn.Close()
			t.Errorf("Dial via %s succeeded", path)
			continue
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("Dial via %s: %v; want an error wrapping ErrUnavailable", path, err)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("Dial via %s: error %q does not name the path", path, err)
		}
	}
}

func TestNetNSAlive(t *testing.T) {
	if err := (NetNS{Path: "/proc/self/ns/net"}).Alive(); err != nil {
		t.Errorf("Alive(/proc/self/ns/net) = %v; want nil", err)
	}
	regular := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{regular, "/run/netns/al-never-created-" + strconv.Itoa(os.Getpid())} {
		if err := (NetNS{Path: p}).Alive(); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Alive(%s) = %v; want an error wrapping ErrUnavailable", p, err)
		}
	}

	ns := nsCreate(t)
	c := NetNS{Path: ns.path}
	if err := c.Alive(); err != nil {
		t.Fatalf("Alive of a fresh namespace: %v", err)
	}
	ns.del(t)
	err := c.Alive()
	if err == nil {
		t.Fatal("Alive after ip netns del = nil; want an error")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Alive after ip netns del = %v; want an error wrapping ErrUnavailable", err)
	}
	if conn, err := c.Dial(testCtx(t), nsPort); !errors.Is(err, ErrUnavailable) {
		if conn != nil {
			_ = conn.Close()
		}
		t.Errorf("Dial after ip netns del: %v; want an error wrapping ErrUnavailable", err)
	}
}

// A namespace deleted while connections dialed into it are open: those
// connections keep working (the kernel keeps the namespace while sockets
// use it), new dials fail with ErrUnavailable.
func TestNetNSDeletedWhileConnected(t *testing.T) {
	ns := nsCreate(t)
	nsStartEcho(t, ns, "app")
	conn, err := NetNS{Path: ns.path}.Dial(testCtx(t), nsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ns.del(t)
	if got := ask(t, conn, "still"); got != "app still" {
		t.Fatalf("answer %q after the namespace file was removed", got)
	}
	if _, err := (NetNS{Path: ns.path}).Dial(testCtx(t), nsPort); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Dial after ip netns del: %v; want ErrUnavailable", err)
	}
}

func TestNetNSDialCanceled(t *testing.T) {
	ns := nsCreate(t)
	nsStartEcho(t, ns, "app")
	root := netnsOf(t, "/proc/self/ns/net")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	conn, err := NetNS{Path: ns.path}.Dial(ctx, nsPort)
	if err == nil {
		_ = conn.Close()
		t.Fatal("Dial with a cancelled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v; want context.Canceled", err)
	}
	if bad := threadsOutside(t, root); len(bad) > 0 {
		t.Fatalf("threads left outside the root namespace after a cancelled dial: %v", bad)
	}
}

// TestNetNSNoLeak proves that entering a namespace to dial never leaks it to
// other goroutines: while 200 dials run concurrently, probe goroutines
// (some locked to their thread, some not) keep reading their thread's
// network namespace and must always see the root one; afterwards every
// thread of the process is in the root namespace.
func TestNetNSNoLeak(t *testing.T) {
	ns := nsCreate(t)
	nsStartEcho(t, ns, "leak-check")
	runtime.LockOSThread()
	root := netnsOf(t, "/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if proc := netnsOf(t, "/proc/self/ns/net"); proc != root {
		t.Fatalf("test goroutine's thread is in %s, the process in %s", root, proc)
	}
	// Positive control: a thread that did enter the namespace is seen by
	// the probe, so the probe cannot pass by accident.
	if got := probeInside(t, ns.path); got == root {
		t.Fatalf("a thread inside %s reads %s, the same as root: the probe cannot tell them apart", ns.path, got)
	}

	const (
		dialers      = 20
		dialsEach    = 10 // 200 dials
		lockedProbes = 8
		freeProbes   = 8
	)
	stop := make(chan struct{})
	var probes sync.WaitGroup
	var probeReads, probeBad atomic.Int64
	var badMu sync.Mutex
	var badSeen []string
	probe := func(locked bool) {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if locked {
				runtime.LockOSThread()
			}
			s, err := os.Readlink("/proc/thread-self/ns/net")
			if locked {
				runtime.UnlockOSThread()
			}
			probeReads.Add(1)
			if err != nil || s != root {
				probeBad.Add(1)
				badMu.Lock()
				if len(badSeen) < 10 {
					badSeen = append(badSeen, fmt.Sprintf("locked=%v ns=%q err=%v", locked, s, err))
				}
				badMu.Unlock()
			}
			runtime.Gosched()
		}
	}
	for range lockedProbes {
		probes.Go(func() { probe(true) })
	}
	for range freeProbes {
		probes.Go(func() { probe(false) })
	}

	var dials sync.WaitGroup
	var dialErrs atomic.Int64
	errc := make(chan error, dialers*dialsEach)
	start := make(chan struct{})
	for d := range dialers {
		dials.Go(func() {
			<-start
			for i := range dialsEach {
				conn, err := NetNS{Path: ns.path}.Dial(context.Background(), nsPort)
				if err != nil {
					dialErrs.Add(1)
					errc <- err
					continue
				}
				msg := fmt.Sprintf("d%d-%d", d, i)
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				_, err = io.WriteString(conn, msg+"\n")
				var line string
				if err == nil {
					line, err = bufio.NewReader(conn).ReadString('\n')
				}
				_ = conn.Close()
				if err != nil || line != "leak-check "+msg+"\n" {
					dialErrs.Add(1)
					errc <- fmt.Errorf("dial %s: answer %q, %v", msg, line, err)
				}
			}
		})
	}
	close(start)
	dials.Wait()
	close(stop)
	probes.Wait()
	close(errc)
	for err := range errc {
		t.Errorf("dial: %v", err)
	}
	if probeBad.Load() > 0 {
		t.Errorf("%d of %d probe reads saw a namespace other than root %s: %v", probeBad.Load(), probeReads.Load(), root, badSeen)
	}
	if probeReads.Load() < 100 {
		t.Errorf("only %d probe reads ran during the dials", probeReads.Load())
	}

	// Every thread of the process is back in the root namespace.
	if bad := threadsOutside(t, root); len(bad) > 0 {
		t.Fatalf("threads outside the root namespace %s after the dials: %v", root, bad)
	}
	// And goroutines scheduled onto any thread now, locked or not, see root:
	// 200 goroutines holding their threads at once cover every idle thread.
	var sweep sync.WaitGroup
	var sweepBad atomic.Int64
	hold := make(chan struct{})
	for i := range 200 {
		sweep.Go(func() {
			if i%2 == 0 {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			if s, err := os.Readlink("/proc/thread-self/ns/net"); err != nil || s != root {
				sweepBad.Add(1)
			}
			<-hold
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(hold)
	sweep.Wait()
	if n := sweepBad.Load(); n > 0 {
		t.Fatalf("%d of 200 sweep goroutines saw a namespace other than root", n)
	}
	t.Logf("200 dials through %s, %d probe reads, all in root %s", ns.path, probeReads.Load(), root)
}
