package gateway

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// etcdBinary is Debian's etcd server (package etcd-server), which
// scripts/test-deps.sh installs.
const etcdBinary = "/usr/bin/etcd"

// etcdMember is one etcd server process of a test cluster.
type etcdMember struct {
	name      string
	dataDir   string
	clientURL string
	peerURL   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	logs *bytes.Buffer
}

// etcdCluster is a real etcd cluster on loopback ports, stopped when the
// test ends.
type etcdCluster struct {
	t       testing.TB
	members []*etcdMember
	initial string // --initial-cluster
}

// needEtcd skips the test when the etcd server is not installed, or fails
// it when CI is set (CI must run every test).
func needEtcd(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(etcdBinary); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (apt-get install etcd-server; scripts/test-deps.sh does it): %v", etcdBinary, err)
		}
		t.Skipf("%s is missing (apt-get install etcd-server)", etcdBinary)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// startEtcd starts an n-member cluster with data directories under
// t.TempDir() and waits until it has a leader.
func startEtcd(t testing.TB, n int) *etcdCluster {
	t.Helper()
	needEtcd(t)
	c := &etcdCluster{t: t}
	dir := t.TempDir()
	var initial []string
	for i := range n {
		m := &etcdMember{
			name:      fmt.Sprintf("m%d", i),
			dataDir:   filepath.Join(dir, fmt.Sprintf("m%d", i)),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL)
	}
	c.initial = strings.Join(initial, ",")
	t.Cleanup(c.stopAll)
	for i := range c.members {
		c.start(i, "new")
	}
	c.waitHealthy(15 * time.Second)
	return c
}

// endpoints returns the client URLs of every member.
func (c *etcdCluster) endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL
	}
	return out
}

// start starts member i ("new" for a new cluster, "existing" to restart
// it with its data).
func (c *etcdCluster) start(i int, state string) {
	c.t.Helper()
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		c.t.Fatalf("etcd member %s is running", m.name)
	}
	cmd := exec.Command(etcdBinary,
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", c.initial,
		"--initial-cluster-state", state,
		"--initial-cluster-token", "applistener-test",
		"--heartbeat-interval", "100",
		"--election-timeout", "1000",
		"--logger", "zap",
		"--log-level", "warn",
	)
	m.logs = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &lockedWriter{mu: &m.mu, w: m.logs}, &lockedWriter{mu: &m.mu, w: m.logs}
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start etcd member %s: %v", m.name, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	done := m.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
}

// stop stops member i (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (c *etcdCluster) stop(i int) {
	m := c.members[i]
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (c *etcdCluster) stopAll() {
	for i := range c.members {
		c.stop(i)
	}
	if c.t.Failed() {
		for _, m := range c.members {
			m.mu.Lock()
			c.t.Logf("etcd member %s logs (tail):\n%s", m.name, tail(m.logs.String(), 3000))
			m.mu.Unlock()
		}
	}
}

// waitHealthy waits until every running member answers /health with a
// leader.
func (c *etcdCluster) waitHealthy(within time.Duration) {
	c.t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for i, m := range c.members {
		m.mu.Lock()
		running := m.cmd != nil
		m.mu.Unlock()
		if !running {
			continue
		}
		for {
			resp, err := client.Get(m.clientURL + "/health")
			if err == nil {
				var b [256]byte
				n, _ := resp.Body.Read(b[:])
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK && strings.Contains(string(b[:n]), `"health":"true"`) {
					break
				}
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("etcd member %d not healthy within %v (last error %v)", i, within, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	client.CloseIdleConnections()
}

// lockedWriter serializes writes to w with mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 {
		l.w.Reset()
	}
	return l.w.Write(p)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	return s[max(0, len(s)-n):]
}
