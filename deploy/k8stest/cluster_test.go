package k8stest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// cluster is a Kubernetes control plane on loopback: etcd, kube-apiserver
// (RBAC and admission on), kube-controller-manager, kube-scheduler and kwok,
// which plays the kubelet of a few fake nodes (Pods get IPs and become
// ready; no container runs).
type cluster struct {
	dir        string // certificates, kubeconfigs, etcd data, logs
	kubeconfig string // system:masters client
	client     *kubernetes.Clientset
	procs      []*proc
}

// proc is one child process and its log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// binDir is where `make test-k8s` (tools/k8s) puts the control-plane
// binaries: $APPLISTENER_K8S_BIN, else the user cache for the version that
// tools/k8s/go.mod pins.
func binDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("APPLISTENER_K8S_BIN"); d != "" {
		return d
	}
	b, err := os.ReadFile("../../tools/k8s/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v[0-9.]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("tools/k8s/go.mod does not require k8s.io/kubernetes vX.Y.Z")
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(cache, "applistener", "k8s-"+string(m[1]))
}

// startCluster starts the control plane and stops it when the test ends,
// printing the components' logs on failure.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	bins := binDir(t)
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwok.yaml"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			t.Fatalf("%s is missing from %s: run `make test-k8s`, which builds it (tools/k8s)", b, bins)
		}
	}
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd is not installed: scripts/test-deps.sh installs Debian's etcd-server")
	}
	c := &cluster{dir: t.TempDir()}
	t.Cleanup(func() { c.stop(t) })
	pki := newPKI(t, c.dir)

	// etcd on two free loopback ports.
	etcdClient, etcdPeer := freePort(t), freePort(t)
	c.start(t, "etcd", etcdBin,
		"--name=k8stest", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+etcdClient, "--advertise-client-urls=http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls=http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls=http://127.0.0.1:"+etcdPeer,
		"--initial-cluster=k8stest=http://127.0.0.1:"+etcdPeer, "--log-level=warn", "--logger=zap")
	c.waitHTTP(t, "etcd", "http://127.0.0.1:"+etcdClient+"/health", nil, 60*time.Second)

	apiPort := freePort(t)
	server := "https://127.0.0.1:" + apiPort
	c.start(t, "kube-apiserver", filepath.Join(bins, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:"+etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+apiPort,
		"--tls-cert-file="+pki.file("apiserver.crt"), "--tls-private-key-file="+pki.file("apiserver.key"),
		"--client-ca-file="+pki.file("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki.file("sa.pub"), "--service-account-signing-key-file="+pki.file("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction,PodSecurity,ResourceQuota,LimitRanger,ServiceAccount",
		"--service-cluster-ip-range=10.96.0.0/16",
		// The kubernetes Service's endpoints would be the advertise address,
		// which may not be loopback; nothing here needs that Service.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--cert-dir="+filepath.Join(c.dir, "apiserver-certs"),
		"--profiling=false", "--v=1")
	c.waitHTTP(t, "kube-apiserver", server+"/readyz", pki.adminTLS(t), 120*time.Second)

	c.kubeconfig = pki.kubeconfig(t, "admin", server)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}

	c.start(t, "kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig="+pki.kubeconfig(t, "controller-manager", server),
		"--authentication-kubeconfig="+pki.kubeconfig(t, "controller-manager", server),
		"--authorization-kubeconfig="+pki.kubeconfig(t, "controller-manager", server),
		"--bind-address=127.0.0.1", "--secure-port="+freePort(t),
		"--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file="+pki.file("sa.key"), "--root-ca-file="+pki.file("ca.crt"),
		"--cluster-signing-cert-file="+pki.file("ca.crt"), "--cluster-signing-key-file="+pki.file("ca.key"),
		"--concurrent-deployment-syncs=10",
		// kwok renews the fake nodes' leases; on a loaded machine a renewal
		// can come later than the default 50 s grace, and the node
		// lifecycle controller then marks every Pod on the node not Ready.
		// kwok makes only Pending Pods Ready, so those Pods stayed not
		// Ready for good and a rollout waited past its bound (seen in CI
		// and reproduced: leases renewed 42 s ago, every Pod Ready=False
		// with ContainersReady=True). Node health is not what this test
		// checks: the grace outlasts the test.
		"--node-monitor-grace-period=1h",
		"--v=1")
	c.start(t, "kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig="+pki.kubeconfig(t, "scheduler", server),
		"--authentication-kubeconfig="+pki.kubeconfig(t, "scheduler", server),
		"--authorization-kubeconfig="+pki.kubeconfig(t, "scheduler", server),
		"--bind-address=127.0.0.1", "--secure-port="+freePort(t),
		"--leader-elect=false", "--v=1")
	c.start(t, "kwok", filepath.Join(bins, "kwok"),
		"--config="+filepath.Join(bins, "kwok.yaml"),
		"--kubeconfig="+c.kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--cidr=10.244.0.0/16", "--node-ip=10.0.0.1",
		"--node-lease-duration-seconds=40", "--server-address=127.0.0.1:"+freePort(t))
	c.addNodes(t, 3)
	return c
}

// addNodes creates n fake nodes that kwok keeps Ready.
func (c *cluster) addNodes(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        fmt.Sprintf("kwok-node-%d", i),
				Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
				Labels: map[string]string{
					"type": "kwok", "kubernetes.io/hostname": fmt.Sprintf("kwok-node-%d", i),
					"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				},
			},
			Status: corev1.NodeStatus{
				Allocatable: corev1.ResourceList{"cpu": mustQuantity("32"), "memory": mustQuantity("256Gi"), "pods": mustQuantity("110")},
				Capacity:    corev1.ResourceList{"cpu": mustQuantity("32"), "memory": mustQuantity("256Gi"), "pods": mustQuantity("110")},
			},
		}
		if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating node %s: %v", node.Name, err)
		}
	}
	waitFor(t, "fake nodes Ready", 120*time.Second, func() (bool, string) {
		nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == n, fmt.Sprintf("%d of %d ready", ready, n)
	})
}

func (c *cluster) start(t *testing.T, name, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(c.dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		_ = lf.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = lf.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
}

// stop ends the components in reverse order (SIGTERM, then SIGKILL after
// 10 s) and, when the test failed or a component died early, prints the end
// of each log.
func (c *cluster) stop(t *testing.T) {
	died := false
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		select {
		case <-p.done:
			died = true
			t.Errorf("%s exited before the end of the test: %v", p.name, p.err)
		default:
		}
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	if t.Failed() || died {
		for _, p := range c.procs {
			b, _ := os.ReadFile(p.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("--- end of %s's log:\n%s", p.name, b)
		}
	}
}

// checkAlive fails the test when a component has exited.
func (c *cluster) checkAlive(t *testing.T) {
	t.Helper()
	for _, p := range c.procs {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v", p.name, p.err)
		default:
		}
	}
}

// waitFor polls cond every 200 ms until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v (last: %s)", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitHTTP waits for url to answer 200, failing at once when a component
// has exited.
func (c *cluster) waitHTTP(t *testing.T, what, url string, tr *http.Transport, timeout time.Duration) {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second}
	if tr != nil {
		cl.Transport = tr
	}
	waitFor(t, what+" ready", timeout, func() (bool, string) {
		c.checkAlive(t)
		resp, err := cl.Get(url)
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

var (
	portsMu sync.Mutex
	ports   = map[string]bool{}
)

// freePort returns a loopback port that was free, never the same twice.
func freePort(t *testing.T) string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		_ = l.Close()
		if !ports[p] {
			ports[p] = true
			return p
		}
	}
}

// pki holds the cluster's CA and the files made from it.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	p := &pki{dir: filepath.Join(dir, "pki"), serial: 1}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "k8stest-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caKey = key
	p.writePEM(t, "ca.crt", "CERTIFICATE", der)
	p.writeKey(t, "ca.key", key)
	p.issue(t, "apiserver", pkix.Name{CommonName: "kube-apiserver"}, true)
	p.issue(t, "admin", pkix.Name{CommonName: "k8stest-admin", Organization: []string{"system:masters"}}, false)
	p.issue(t, "controller-manager", pkix.Name{CommonName: "system:kube-controller-manager"}, false)
	p.issue(t, "scheduler", pkix.Name{CommonName: "system:kube-scheduler"}, false)
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs1 := x509.MarshalPKCS1PrivateKey(sa)
	p.writePEM(t, "sa.key", "RSA PRIVATE KEY", pkcs1)
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p.writePEM(t, "sa.pub", "PUBLIC KEY", pub)
	return p
}

func (p *pki) file(n string) string { return filepath.Join(p.dir, n) }

func (p *pki) writePEM(t *testing.T, name, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(p.file(name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (p *pki) writeKey(t *testing.T, name string, k *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p.writePEM(t, name, "EC PRIVATE KEY", der)
}

// issue writes NAME.crt and NAME.key: a serving certificate for loopback
// and the in-cluster names, or a client certificate for subject.
func (p *pki) issue(t *testing.T, name string, subject pkix.Name, serving bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if serving {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.writePEM(t, name+".crt", "CERTIFICATE", der)
	p.writeKey(t, name+".key", key)
}

// kubeconfig writes a kubeconfig for the client certificate NAME.
func (p *pki) kubeconfig(t *testing.T, name, server string) string {
	t.Helper()
	path := p.file(name + ".kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: k8stest
  context: {cluster: k8stest, user: %s}
current-context: k8stest
`, server, p.file("ca.crt"), name, p.file(name+".crt"), p.file(name+".key"), name)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// adminTLS is a transport with the admin client certificate.
func (p *pki) adminTLS(t *testing.T) *http.Transport {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("https://127.0.0.1", "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.CAFile = p.file("ca.crt")
	cfg.CertFile = p.file("admin.crt")
	cfg.KeyFile = p.file("admin.key")
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Transport{TLSClientConfig: tlsCfg}
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
