package e2e

// Harness of the control-plane tests (controlplane_test.go): a real
// three-member etcd cluster on loopback (Debian's etcd-server, /usr/bin/etcd,
// installed by scripts/test-deps.sh) whose members can be stopped, killed and
// started again one by one, and two `applistener gateway --store etcd`
// replicas sharing it. The replicas are gwGateway processes
// (gw_harness_test.go: the same launcher, restartable on the same port), the
// supervisors, the edge and `routes watch` are started with discStart and
// discRun (disc_harness_test.go). Everything here is prefixed etcd or cp.
//
// The cluster is inspected through etcd's own JSON gateway (/v3/kv/range,
// /health), so the tests need no etcd client library and see exactly what
// the server holds.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// etcdBinary is Debian's etcd-server (3.4, API v3).
const etcdBinary = "/usr/bin/etcd"

const (
	// etcdHeartbeat and etcdElection are the members' raft timings: fast
	// enough that a lost leader is replaced within about a second, slow
	// enough that a loaded 2-core CI machine does not cause elections. The
	// smallest lease the cluster grants is 1.5 election timeouts (1 s).
	etcdHeartbeat = 50 * time.Millisecond
	etcdElection  = 600 * time.Millisecond
)

// etcdAvailable skips the test when /usr/bin/etcd is missing, or fails it
// when CI is set.
func etcdAvailable(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(etcdBinary); err == nil {
		return
	}
	msg := "control-plane test needs " + etcdBinary + " (Debian etcd-server): run scripts/test-deps.sh as root"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// ---------------------------------------------------------------------------
// the etcd cluster

// etcdMember is one member process. Its ports and data directory stay the
// same across stop and start.
type etcdMember struct {
	name      string
	clientURL string
	peerURL   string
	dataDir   string
	stderr    *syncBuffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// etcdCluster is a three-member cluster bootstrapped statically
// (--initial-cluster) on loopback.
type etcdCluster struct {
	t       testing.TB
	dir     string
	token   string
	members []*etcdMember
}

var etcdClusterSeq struct {
	sync.Mutex
	n int
}

// etcdStartCluster starts a new three-member cluster and waits until every
// member is healthy (a leader, a committed read). It is stopped and its data
// removed on cleanup; member output is logged if the test failed.
func etcdStartCluster(t testing.TB) *etcdCluster {
	t.Helper()
	etcdAvailable(t)
	etcdClusterSeq.Lock()
	etcdClusterSeq.n++
	seq := etcdClusterSeq.n
	etcdClusterSeq.Unlock()
	// Data on tmpfs when there is one: fsync on a loaded disk is what makes
	// etcd miss heartbeats.
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "applistener-etcd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &etcdCluster{t: t, dir: dir, token: fmt.Sprintf("e2e-%d-%d", os.Getpid(), seq)}
	t.Cleanup(func() {
		for _, m := range c.members {
			m.kill()
		}
		if t.Failed() {
			for _, m := range c.members {
				t.Logf("etcd member %s (client %s) output:\n%s", m.name, m.clientURL, lastLines(m.stderr.String(), 40))
			}
		}
		_ = os.RemoveAll(dir)
	})
	for attempt := 1; ; attempt++ {
		c.members = nil
		for i := range 3 {
			name := fmt.Sprintf("m%d", i+1)
			c.members = append(c.members, &etcdMember{
				name:      name,
				clientURL: "http://" + freeAddr(t),
				peerURL:   "http://" + freeAddr(t),
				dataDir:   filepath.Join(dir, fmt.Sprintf("%s-%d", name, attempt)),
				stderr:    &syncBuffer{},
			})
		}
		for _, m := range c.members {
			if err := c.launch(m); err != nil {
				t.Fatal(err)
			}
		}
		err := c.waitHealthy(waitTimeout+5*time.Second, c.members...)
		if err == nil {
			return c
		}
		portRace := false
		for _, m := range c.members {
			if !m.running() && strings.Contains(m.stderr.String(), "address already in use") {
				portRace = true
			}
			m.kill()
		}
		if portRace && attempt < 5 {
			continue
		}
		for _, m := range c.members {
			t.Logf("etcd member %s output:\n%s", m.name, lastLines(m.stderr.String(), 40))
		}
		t.Fatalf("etcd cluster did not become healthy: %v", err)
	}
}

// initialCluster is the --initial-cluster value.
func (c *etcdCluster) initialCluster() string {
	var parts []string
	for _, m := range c.members {
		parts = append(parts, m.name+"="+m.peerURL)
	}
	return strings.Join(parts, ",")
}

// launch starts m's process (new cluster state; ignored by etcd when the
// data directory already holds a member).
func (c *etcdCluster) launch(m *etcdMember) error {
	args := []string{
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", c.initialCluster(),
		"--initial-cluster-state", "new",
		"--initial-cluster-token", c.token,
		"--heartbeat-interval", strconv.Itoa(int(etcdHeartbeat / time.Millisecond)),
		"--election-timeout", strconv.Itoa(int(etcdElection / time.Millisecond)),
		"--pre-vote=true",
		"--snapshot-count", "10000",
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "warn",
	}
	cmd := exec.Command(etcdBinary, args...)
	cmd.Stdout, cmd.Stderr = m.stderr, m.stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd member %s: %v", m.name, err)
	}
	done := make(chan struct{})
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

func (m *etcdMember) running() bool {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig and waits for the process to exit (SIGKILL after 10 s).
func (m *etcdMember) signal(sig syscall.Signal) error {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("etcd member %s did not exit within 10s of %v", m.name, sig)
	}
}

func (m *etcdMember) kill() { _ = m.signal(syscall.SIGKILL) }

// endpoints is the comma-separated client URLs (--etcd-endpoints).
func (c *etcdCluster) endpoints() string {
	var urls []string
	for _, m := range c.members {
		urls = append(urls, m.clientURL)
	}
	return strings.Join(urls, ",")
}

// stop ends member i with SIGTERM (a leader hands its leadership over first)
// and waits until it has exited.
func (c *etcdCluster) stop(t testing.TB, i int) {
	t.Helper()
	if err := c.members[i].signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// kill ends member i with SIGKILL.
func (c *etcdCluster) kill(t testing.TB, i int) {
	t.Helper()
	c.members[i].kill()
}

// start starts the stopped member i again (same ports, same data) and waits
// until it is healthy. With fewer than two members running it returns
// once the process runs (a single member cannot be healthy).
func (c *etcdCluster) start(t testing.TB, i int) {
	t.Helper()
	m := c.members[i]
	if m.running() {
		t.Fatalf("etcd member %s is running", m.name)
	}
	if err := c.launch(m); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, o := range c.members {
		if o.running() {
			running++
		}
	}
	if running < 2 {
		return
	}
	if err := c.waitHealthy(waitTimeout, m); err != nil {
		t.Fatalf("etcd member %s after restart: %v\noutput:\n%s", m.name, err, lastLines(m.stderr.String(), 40))
	}
}

// running returns the indexes of the members whose process runs.
func (c *etcdCluster) running() []int {
	var out []int
	for i, m := range c.members {
		if m.running() {
			out = append(out, i)
		}
	}
	return out
}

var etcdHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 3 * time.Second}

// healthy reports whether member m answers /health with true: it has a
// leader and a quorum-backed read succeeded.
func (m *etcdMember) healthy() error {
	resp, err := etcdHTTP.Get(m.clientURL + "/health")
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	var h struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return fmt.Errorf("/health: %d %q", resp.StatusCode, body)
	}
	if h.Health != "true" {
		return fmt.Errorf("/health: %s", bytes.TrimSpace(body))
	}
	return nil
}

// waitHealthy polls the members until each is healthy or timeout passes.
func (c *etcdCluster) waitHealthy(timeout time.Duration, members ...*etcdMember) error {
	deadline := time.Now().Add(timeout)
	for {
		var err error
		for _, m := range members {
			if !m.running() {
				err = fmt.Errorf("etcd member %s exited", m.name)
				break
			}
			if e := m.healthy(); e != nil {
				err = fmt.Errorf("etcd member %s: %v", m.name, e)
				break
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if strings.HasSuffix(err.Error(), "exited") {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasQuorum reports whether a running member has a healthy view of the
// cluster.
func (c *etcdCluster) hasQuorum() bool {
	for _, m := range c.members {
		if m.running() && m.healthy() == nil {
			return true
		}
	}
	return false
}

// etcdKV is one key-value pair read from the cluster.
type etcdKV struct {
	Key   string
	Value []byte
	Lease int64
}

// list reads every key under prefix (a linearizable read through any
// running member).
func (c *etcdCluster) list(prefix string) ([]etcdKV, error) {
	end := []byte(prefix)
	end[len(end)-1]++
	req, _ := json.Marshal(map[string]string{
		"key":       base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end": base64.StdEncoding.EncodeToString(end),
	})
	var lastErr error = errors.New("no etcd member running")
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, m.clientURL+"/v3/kv/range", bytes.NewReader(req))
		if err != nil {
			cancel()
			return nil, err
		}
		resp, err := etcdHTTP.Do(r)
		if err != nil {
			cancel()
			lastErr = err
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("etcd range: %d %s", resp.StatusCode, body)
			continue
		}
		var out struct {
			Kvs []struct {
				Key   string `json:"key"`
				Value string `json:"value"`
				Lease string `json:"lease"`
			} `json:"kvs"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			return nil, fmt.Errorf("etcd range %s: %v", body, err)
		}
		var kvs []etcdKV
		for _, kv := range out.Kvs {
			k, err1 := base64.StdEncoding.DecodeString(kv.Key)
			v, err2 := base64.StdEncoding.DecodeString(kv.Value)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("etcd range: bad base64 in %s", body)
			}
			lease, _ := strconv.ParseInt(kv.Lease, 10, 64)
			kvs = append(kvs, etcdKV{Key: string(k), Value: v, Lease: lease})
		}
		return kvs, nil
	}
	return nil, lastErr
}

// keys returns the keys under prefix, failing the test on an error.
func (c *etcdCluster) keys(t testing.TB, prefix string) []string {
	t.Helper()
	kvs, err := c.list(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range kvs {
		out = append(out, kv.Key)
	}
	return out
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d earlier lines]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// TestEtcdHarness checks the cluster fixture itself: three members form a
// cluster; with one stopped it keeps a quorum and serves reads; with two
// stopped it has none; started again, the members rejoin with their data
// and their old ports.
func TestEtcdHarness(t *testing.T) {
	t.Parallel()
	c := etcdStartCluster(t)
	if _, err := c.list("/e2e/"); err != nil {
		t.Fatalf("read from a healthy cluster: %v", err)
	}
	c.stop(t, 0)
	if err := c.waitHealthy(waitTimeout, c.members[1], c.members[2]); err != nil {
		t.Fatalf("two of three members: %v", err)
	}
	c.kill(t, 1)
	eventually(t, waitTimeout, "quorum lost with one member of three", func() bool { return !c.hasQuorum() })
	if _, err := c.list("/e2e/"); err == nil {
		t.Fatal("a linearizable read succeeded without a quorum")
	}
	c.start(t, 0)
	c.start(t, 1)
	if err := c.waitHealthy(waitTimeout, c.members...); err != nil {
		t.Fatalf("after restarting two members: %v", err)
	}
	if got := c.running(); len(got) != 3 {
		t.Fatalf("running members %v", got)
	}
}
