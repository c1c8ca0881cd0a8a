package e2e

// Harness of the control-plane tests (controlplane_test.go): a real
// three-member etcd cluster on loopback (Debian's etcd-server, /usr/bin/etcd,
// installed by scripts/test-deps.sh) whose members can be stopped, killed and
// started again one by one, and two `applistener gateway --store etcd`
// replicas sharing it. The replicas are memGateway processes
// (gateway_harness_test.go: the same launcher, restartable on the same port), the
// supervisors, the edge and `routes watch` are started with launchReady and
// runCommand (discovery_harness_test.go). The fixtures are typed: an
// etcdCluster starts its gateways (startGateways), and etcdGateways start
// supervisors, watches and discovery probes on themselves.
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
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/testutil"
)

// etcdBinary is Debian's etcd-server (3.4, API v3).
const etcdBinary = "/usr/bin/etcd"

const (
	// etcdHeartbeat and etcdElection are the members' raft timings: a lost
	// leader is replaced within about a second, and a loaded 2-core CI
	// machine (where a leader's heartbeats were seen 450 ms late with a
	// 50 ms interval) does not cause elections. The smallest lease the
	// cluster grants is 1.5 election timeouts (2 s, the gateway's minimum
	// anyway).
	etcdHeartbeat = 100 * time.Millisecond
	etcdElection  = 1000 * time.Millisecond
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
	// etcd runs at a higher scheduling priority (nice -10, when allowed):
	// in production it has nodes of its own, here it shares two cores with
	// every test process, and a starved leader stalls for seconds, which
	// no gateway can hide from 2 s route freshness.
	cmd := exec.Command(etcdBinary, args...)
	if nice, err := exec.LookPath("nice"); err == nil && os.Geteuid() == 0 {
		cmd = exec.Command(nice, append([]string{"-n", "-10", etcdBinary}, args...)...)
	}
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
	lastErr := errors.New("no etcd member running")
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
	testutil.Eventually(t, waitTimeout, "quorum lost with one member of three", func() bool { return !c.hasQuorum() })
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

// leader returns the index of the member that is the raft leader (-1 when
// no running member knows one).
func (c *etcdCluster) leader() int {
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		resp, err := etcdHTTP.Post(m.clientURL+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			} `json:"header"`
			Leader string `json:"leader"`
		}
		if json.Unmarshal(body, &st) != nil || st.Leader == "" || st.Leader == "0" {
			continue
		}
		if st.Header.MemberID == st.Leader {
			for i, o := range c.members {
				if o == m {
					return i
				}
			}
		}
	}
	return -1
}

// ---------------------------------------------------------------------------
// gateway replicas on the cluster

// Tokens of the replicas' tokens file (startGateways).
const (
	adminToken = "cp-admin"  // {"admin": true}: the write API
	teamToken  = "cp-team"   // {"workspaces": ["team"]}: discovery of team
	poolToken  = "cp-pool-a" // {"pool": "hosts"}
	pool2Token = "cp-pool-b" // {"pool": "others"}
	hostsPool  = "hosts"
	pool2      = "others"
)

// etcdGateways is two `applistener gateway --store etcd` replicas sharing one
// etcd prefix, one tokens file and one (empty) configuration file: every
// document is written through the admin API.
type etcdGateways struct {
	cluster    *etcdCluster
	prefix     string
	tokensPath string
	configPath string
	replicas   []*memGateway
}

// gatewayToken is one entry of the tokens file.
type gatewayToken map[string]any

// defaultTokens are the tokens every replica set starts with; tests add
// supervisor tokens with supervisorTokenOf.
func defaultTokens() []gatewayToken {
	return []gatewayToken{
		{"token": adminToken, "admin": true},
		{"token": teamToken, "workspaces": []string{"team"}},
		{"token": poolToken, "pool": hostsPool},
		{"token": pool2Token, "pool": pool2},
	}
}

// supervisorTokenOf is a token granting exactly supervisor id.
func supervisorTokenOf(id string) gatewayToken {
	return gatewayToken{"token": "cp-sup-" + id, "supervisor": id}
}

var etcdPrefixSeq struct {
	sync.Mutex
	n int
}

// startGateways starts two replicas on c with the default tokens plus
// extraTokens, and waits until each has loaded the store (a discovery GET
// answers 200). extra flags are appended to both (e.g. --session-ttl,
// --endpoint-policy, --keepalive). They are stopped on cleanup and their
// output is logged if the test failed.
func (c *etcdCluster) startGateways(t testing.TB, extraTokens []gatewayToken, extra ...string) *etcdGateways {
	t.Helper()
	dir := t.TempDir()
	etcdPrefixSeq.Lock()
	etcdPrefixSeq.n++
	n := etcdPrefixSeq.n
	etcdPrefixSeq.Unlock()
	g := &etcdGateways{
		cluster:    c,
		prefix:     fmt.Sprintf("/e2e-%d/", n),
		tokensPath: filepath.Join(dir, "tokens.json"),
		configPath: filepath.Join(dir, "gateway.json"),
	}
	writeAtomic(t, g.configPath, []byte(`{"supervisors": {}}`))
	g.writeTokens(t, append(defaultTokens(), extraTokens...))
	args := append([]string{"--store", "etcd", "--etcd-endpoints", c.endpoints(), "--etcd-prefix", g.prefix}, extra...)
	for i := range 2 {
		r := &memGateway{
			addr:       freeAddr(t),
			adminAddr:  freeAddr(t),
			configPath: g.configPath,
			tokensPath: g.tokensPath,
			extra:      args,
			stderr:     &syncBuffer{},
		}
		t.Cleanup(func() {
			r.stop(t)
			if t.Failed() {
				t.Logf("gateway replica %d (%s) output:\n%s", i+1, r.addr, lastLines(r.stderr.String(), 60))
			}
		})
		g.replicas = append(g.replicas, r)
	}
	for i := range g.replicas {
		g.start(t, i)
	}
	return g
}

// writeTokens replaces the shared tokens file.
func (g *etcdGateways) writeTokens(t testing.TB, tokens []gatewayToken) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"tokens": tokens})
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, g.tokensPath, b)
}

// start starts replica i (again, on its port) and waits until it serves
// discovery from the store.
func (g *etcdGateways) start(t testing.TB, i int) {
	t.Helper()
	r := g.replicas[i]
	r.start(t)
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("replica %d to serve discovery", i+1), func() bool {
		code, _, _ := g.discovery(i, teamToken, "team")
		return code == http.StatusOK
	})
}

// kill ends replica i with SIGKILL.
func (g *etcdGateways) kill(t testing.TB, i int) { t.Helper(); g.replicas[i].kill(t) }

// url is replica i's base URL.
func (g *etcdGateways) url(i int) string { return g.replicas[i].endpoint() }

// urls is the comma-separated list of the replicas' URLs, in this order.
func (g *etcdGateways) urls(order ...int) string {
	if len(order) == 0 {
		order = []int{0, 1}
	}
	var out []string
	for _, i := range order {
		out = append(out, g.url(i))
	}
	return strings.Join(out, ",")
}

var gatewayHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

// do sends one request with a bearer token to replica i and returns the
// status and body (0 and the error on a transport failure).
func (g *etcdGateways) do(i int, method, path, token string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url(i)+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := gatewayHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// storedInstance is one instance entry of a configuration document (workspace
// team, tcp connector on loopback).
type storedInstance struct {
	Workspace  string            `json:"workspace"`
	Sandbox    string            `json:"sandbox"`
	Generation string            `json:"generation"`
	Connector  map[string]string `json:"connector"`
	Services   []service         `json:"services"`
}

// newStoredInstance is the instance team/sandbox, generation 1, with services by name
// ("" is the unnamed one) on the given app ports.
func newStoredInstance(sandbox string, services map[string]int) storedInstance {
	in := storedInstance{Workspace: "team", Sandbox: sandbox, Generation: "1",
		Connector: map[string]string{"type": "tcp", "host": "127.0.0.1"}, Services: []service{}}
	for name, port := range services {
		in.Services = append(in.Services, service{Name: name, Port: port, Revision: 1})
	}
	return in
}

// put writes instance in of supervisor sup through replica i's admin API.
func (g *etcdGateways) put(t testing.TB, i int, sup string, in storedInstance) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	code, body, err := g.do(i, http.MethodPut, "/v1/supervisors/"+sup+"/instances/"+in.Workspace+"/"+in.Sandbox, adminToken, b)
	if err != nil || code != http.StatusOK {
		t.Fatalf("PUT instance %s/%s of %s on replica %d: %d %s %v", in.Workspace, in.Sandbox, sup, i+1, code, body, err)
	}
}

// del removes instance team/sandbox of supervisor sup through replica i.
func (g *etcdGateways) del(t testing.TB, i int, sup, sandbox string) {
	t.Helper()
	code, body, err := g.do(i, http.MethodDelete, "/v1/supervisors/"+sup+"/instances/team/"+sandbox, adminToken, nil)
	if err != nil || code != http.StatusNoContent {
		t.Fatalf("DELETE instance team/%s of %s on replica %d: %d %s %v", sandbox, sup, i+1, code, body, err)
	}
}

// discovery reads workspace ws's discovery snapshot from replica i.
func (g *etcdGateways) discovery(i int, token, ws string) (int, *discoverySnapshot, error) {
	code, body, err := g.do(i, http.MethodGet, "/v1/workspaces/"+ws+"/service-routes", token, nil)
	if err != nil || code != http.StatusOK {
		if err == nil {
			err = fmt.Errorf("discovery GET on replica %d: %d %s", i+1, code, bytes.TrimSpace(body))
		}
		return code, nil, err
	}
	var s discoverySnapshot
	if err := json.Unmarshal(body, &s); err != nil {
		return code, nil, fmt.Errorf("discovery snapshot %s: %v", body, err)
	}
	return code, &s, nil
}

// snapshot reads team's snapshot from replica i, failing the test on an
// error.
func (g *etcdGateways) snapshot(t testing.TB, i int) *discoverySnapshot {
	t.Helper()
	_, s, err := g.discovery(i, teamToken, "team")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitRoute waits until replica i publishes host owned by supervisor sup
// ("" for any owner; absent=true: until host is not published).
func (g *etcdGateways) waitRoute(t testing.TB, i int, host, sup string, absent bool) *discoveryRoute {
	t.Helper()
	var r *discoveryRoute
	what := fmt.Sprintf("%s owned by %q in discovery on replica %d", host, sup, i+1)
	if absent {
		what = fmt.Sprintf("%s gone from discovery on replica %d", host, i+1)
	}
	testutil.Eventually(t, waitTimeout, what, func() bool {
		_, s, err := g.discovery(i, teamToken, "team")
		if err != nil {
			return false
		}
		r = s.route(host)
		if absent {
			return r == nil
		}
		return r != nil && (sup == "" || r.Supervisor == sup)
	})
	return r
}

// ---------------------------------------------------------------------------
// a raw discovery watch

// watchEvent is one line of a discovery watch: a snapshot, when it arrived.
type watchEvent struct {
	at   time.Time
	snap *discoverySnapshot
}

// discoveryWatch is GET /v1/workspaces/team/service-routes?watch=1 on one replica,
// read in the background: every snapshot line is kept with its arrival
// time (keepalives are dropped).
type discoveryWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []watchEvent
	err    error // why the stream ended
	endAt  time.Time
	notify chan struct{}
}

// startWatch opens the watch on replica i; it fails the test unless the
// gateway answers 200.
func (g *etcdGateways) startWatch(t testing.TB, i int) *discoveryWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url(i)+"/v1/workspaces/team/service-routes?watch=1", nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+teamToken)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		cancel()
		t.Fatalf("discovery watch on replica %d: %v", i+1, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		cancel()
		t.Fatalf("discovery watch on replica %d: %d %s", i+1, resp.StatusCode, b)
	}
	w := &discoveryWatch{cancel: cancel, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	go func() {
		defer close(w.done)
		defer func() { _ = resp.Body.Close() }()
		dec := json.NewDecoder(resp.Body)
		for {
			var raw json.RawMessage
			err := dec.Decode(&raw)
			now := time.Now()
			if err != nil {
				w.mu.Lock()
				w.err, w.endAt = err, now
				w.mu.Unlock()
				w.signal()
				return
			}
			var probe struct {
				Keepalive bool            `json:"keepalive"`
				Routes    json.RawMessage `json:"routes"`
			}
			if json.Unmarshal(raw, &probe) == nil && probe.Keepalive && probe.Routes == nil {
				continue
			}
			var s discoverySnapshot
			if err := json.Unmarshal(raw, &s); err != nil {
				w.mu.Lock()
				w.err, w.endAt = fmt.Errorf("watch line %s: %v", raw, err), now
				w.mu.Unlock()
				w.signal()
				return
			}
			w.mu.Lock()
			w.events = append(w.events, watchEvent{at: now, snap: &s})
			w.mu.Unlock()
			w.signal()
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *discoveryWatch) signal() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (w *discoveryWatch) close() {
	w.cancel()
	<-w.done
}

// ended reports whether the stream ended, and when.
func (w *discoveryWatch) ended() (bool, time.Time, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.endAt.IsZero(), w.endAt, w.err
}

// snapshots returns the snapshots received so far.
func (w *discoveryWatch) snapshots() []watchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]watchEvent(nil), w.events...)
}

// waitFor waits for the first snapshot from index from on that satisfies
// cond and returns its index and arrival time.
func (w *discoveryWatch) waitFor(t testing.TB, from int, timeout time.Duration, what string, cond func(*discoverySnapshot) bool) (int, time.Time) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for i := from; i < len(w.events); i++ {
			if cond(w.events[i].snap) {
				ev := w.events[i]
				w.mu.Unlock()
				return i, ev.at
			}
		}
		from = max(from, len(w.events))
		ended, err := !w.endAt.IsZero(), w.err
		w.mu.Unlock()
		if ended {
			t.Fatalf("discovery watch ended (%v) before %s", err, what)
		}
		select {
		case <-w.notify:
		case <-deadline.C:
			t.Fatalf("discovery watch: no snapshot with %s within %v", what, timeout)
		}
	}
}

// ---------------------------------------------------------------------------
// supervisors, the edge

// etcdSupervisor is a shared-mode supervisor with a gateway session.
type etcdSupervisor struct {
	*proc
	id        string
	tokenFile string
}

// etcdSupervisorConfig tunes startSupervisor.
type etcdSupervisorConfig struct {
	id        string
	token     string        // bearer token (cp-sup-<id> when empty)
	gateways  string        // --gateway-endpoint (both replicas, replica 1 first, when empty)
	freshness time.Duration // --route-freshness (discoveryFreshness when 0)
	advertise string        // --advertise-address (127.0.0.1 when empty)
	extra     []string
	// noWait: return once the admin endpoint answers, without waiting for
	// an accepted configuration.
	noWait bool
}

// startSupervisor starts `applistener serve --mode shared` against the
// replicas and waits until it is ready (an accepted configuration). It is
// stopped with SIGTERM on cleanup.
func (g *etcdGateways) startSupervisor(t testing.TB, cfg etcdSupervisorConfig) *etcdSupervisor {
	t.Helper()
	tok := cfg.token
	if tok == "" {
		tok = "cp-sup-" + cfg.id
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeAtomic(t, tokenFile, []byte(tok+"\n"))
	tlsDir := writeTLSDir(t, dir)
	gws := cfg.gateways
	if gws == "" {
		gws = g.urls()
	}
	fresh := cfg.freshness
	if fresh == 0 {
		fresh = discoveryFreshness
	}
	adv := cfg.advertise
	if adv == "" {
		adv = "127.0.0.1"
	}
	ready := func(p *proc) bool { return p.readyz() == http.StatusOK }
	if cfg.noWait {
		ready = func(p *proc) bool { return p.readyz() != 0 }
	}
	p := launchReady(t, "supervisor "+cfg.id, func(addr, admin string) []string {
		return append([]string{"serve", "--mode", "shared",
			"--gateway", gws, "--supervisor-id", cfg.id, "--gateway-token-file", tokenFile,
			"--gateway-poll-interval", "500ms", "--gateway-stream-timeout", "2s",
			"--advertise-address", adv, "--trusted-proxies", "127.0.0.1/32", // the edge's PROXY headers
			"--app-listener", "--app-domain", domain, "--app-address", addr, "--app-tls-dir", tlsDir,
			"--admin-address", admin, "--address", freeAddr(t), "--route-freshness", fresh.String(),
			"--drain-timeout", "1s", "--log-format", "json"}, cfg.extra...)
	}, ready)
	return &etcdSupervisor{proc: p, id: cfg.id, tokenFile: tokenFile}
}

// startEdgeOn starts `applistener edge` for workspace team reading
// discovery from gateways (a URL list) and waits until it has a snapshot.
func startEdgeOn(t testing.TB, gateways string) *proc {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeAtomic(t, tokenFile, []byte(teamToken+"\n"))
	return launchReady(t, "edge", func(addr, admin string) []string {
		return []string{"edge", "--address", addr, "--gateway", gateways, "--gateway-token-file", tokenFile,
			"--workspace", "team", "--admin-address", admin, "--gateway-stream-timeout", "2s",
			"--drain-timeout", "1s", "--log-format", "json"}
	}, func(p *proc) bool { return p.readyz() == http.StatusOK })
}

// edgeGet does one GET https://host/ through the edge on a new
// connection and returns the body (the backend's greeting).
func edgeGet(edgeAddr, host string) (string, error) {
	body, _, err := getThroughEdge(edgeAddr, caPool, host)
	return body, err
}

// edgeWS opens a WebSocket to host through the edge.
func edgeWS(edgeAddr, host string) (*websocket.Conn, error) {
	return wsDialVia(func(ctx context.Context, _, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", edgeAddr)
	}, host)
}

// metricOrNegative reads a metric of a process's admin endpoint (0 when absent).
func (p *proc) metricOrNegative(name string, labels map[string]string) float64 {
	v, _, err := scrapeMetric(p.adminAddr, name, labels)
	if err != nil {
		return -1
	}
	return v
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// revision returns the cluster's current revision (every write adds one).
func (c *etcdCluster) revision() (int64, error) {
	req, _ := json.Marshal(map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/")), "count_only": true})
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		resp, err := etcdHTTP.Post(m.clientURL+"/v3/kv/range", "application/json", bytes.NewReader(req))
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var out struct {
			Header struct {
				Revision string `json:"revision"`
			} `json:"header"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
			continue
		}
		return strconv.ParseInt(out.Header.Revision, 10, 64)
	}
	return 0, errors.New("no etcd member answered")
}
