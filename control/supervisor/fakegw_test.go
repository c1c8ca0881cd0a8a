package supervisor

// A small gateway for the client's tests that speaks the real HTTP protocol
// of the issue 14 contract over real TLS (HTTP/2 offered): push with
// session and keepalive negotiation, poll with ETag, advertisements and
// their withdrawal. The reference gateway (control/gateway) is another
// component; these tests pin the client's side of the wire.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// testCA is a certificate authority that issues 127.0.0.1 server
// certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(cryptorand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a server certificate for 127.0.0.1.
func (ca *testCA) leaf(t testing.TB) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "gateway"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(cryptorand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// writeCAFile writes pems to path by an atomic rename (as a Kubernetes
// volume update does) and returns path.
func writeCAFile(t *testing.T, path string, pems ...[]byte) string {
	t.Helper()
	writeAtomic(t, path, string(bytes.Join(pems, nil)))
	return path
}

// fakeRequest is one request the fake gateway received.
type fakeRequest struct {
	method, path string
	session      string
	order        string // the session order the request named (?order=)
	keepalive    string // the push request's keepalive parameter
	watch        bool
	ifNoneMatch  string
	proto        int // HTTP major version
	body         []byte
	at           time.Time
}

// fakeGateway serves one supervisor's configuration.
type fakeGateway struct {
	t   testing.TB
	srv *httptest.Server
	url string

	cert atomic.Pointer[tls.Certificate]

	mu         sync.Mutex
	doc        []byte
	rev        string
	grant      string        // X-Applistener-Keepalive ("" = not sent)
	keepalive  time.Duration // keepalive lines of push streams
	status     int           // when not 0, every request gets it
	pushCode   int           // when not 0, push requests get it
	deleteCode int           // answer to DELETE installations (204 when 0)
	order      string        // X-Applistener-Session-Order of every answer ("" = not sent)
	sessionTTL string        // X-Applistener-Session-TTL of every answer ("" = not sent)
	requests   []fakeRequest
	streams    map[chan struct{}]struct{} // close one to end its stream
	changed    chan struct{}              // closed and replaced when doc changes
	onDelete   func()
}

// newFakeGateway starts a gateway with a certificate of ca (a CA of its
// own when nil) serving doc.
func newFakeGateway(t testing.TB, ca *testCA, doc string) *fakeGateway {
	t.Helper()
	if ca == nil {
		ca = newTestCA(t, "fake gateway CA")
	}
	g := &fakeGateway{t: t, keepalive: 100 * time.Millisecond, streams: map[chan struct{}]struct{}{},
		changed: make(chan struct{})}
	g.setDoc(doc)
	g.cert.Store(ca.leaf(t))
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(g.serve))
	g.srv.EnableHTTP2 = true
	// Clients send no SNI for an IP address: choose the certificate per
	// connection (httptest installs a certificate of its own otherwise).
	g.srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*g.cert.Load()}, NextProtos: []string{"h2", "http/1.1"}}, nil
	}}
	g.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	g.srv.StartTLS()
	g.url = g.srv.URL
	t.Cleanup(g.close)
	return g
}

func (g *fakeGateway) close() {
	g.endStreams()
	g.srv.Close()
}

// setDoc replaces the document and pushes it to open streams.
func (g *fakeGateway) setDoc(doc string) {
	var d struct {
		Revision string `json:"revision"`
	}
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		g.t.Fatalf("fake gateway document: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.doc, g.rev = []byte(doc), d.Revision
	if g.changed != nil {
		close(g.changed)
	}
	g.changed = make(chan struct{})
}

func (g *fakeGateway) set(f func(g *fakeGateway)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

// endStreams ends every open push stream (the connection stays).
func (g *fakeGateway) endStreams() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ch := range g.streams {
		close(ch)
		delete(g.streams, ch)
	}
}

// rotate serves a certificate of ca from now on and drops every connection.
func (g *fakeGateway) rotate(ca *testCA) {
	g.cert.Store(ca.leaf(g.t))
	g.endStreams()
	g.srv.CloseClientConnections()
}

// log returns the requests so far that match.
func (g *fakeGateway) log(match func(r fakeRequest) bool) []fakeRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []fakeRequest
	for _, r := range g.requests {
		if match == nil || match(r) {
			out = append(out, r)
		}
	}
	return out
}

func isPush(r fakeRequest) bool { return r.method == http.MethodGet && r.watch }
func isPoll(r fakeRequest) bool {
	return r.method == http.MethodGet && !r.watch && strings.HasSuffix(r.path, "/config")
}
func isPut(r fakeRequest) bool    { return r.method == http.MethodPut }
func isDelete(r fakeRequest) bool { return r.method == http.MethodDelete }

const fakeSupervisor = "sup-1"

func (g *fakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	q := r.URL.Query()
	req := fakeRequest{method: r.Method, path: r.URL.Path, session: q.Get("session"), order: q.Get("order"), keepalive: q.Get("keepalive"),
		watch: q.Get("watch") == "1", ifNoneMatch: r.Header.Get("If-None-Match"), proto: r.ProtoMajor, body: body, at: time.Now()}
	g.mu.Lock()
	g.requests = append(g.requests, req)
	status, pushCode, deleteCode, onDelete := g.status, g.pushCode, g.deleteCode, g.onDelete
	if g.order != "" {
		w.Header().Set(api.SessionOrderHeader, g.order)
	}
	if g.sessionTTL != "" {
		w.Header().Set(api.SessionTTLHeader, g.sessionTTL)
	}
	g.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer t1" {
		http.Error(w, "401 Unauthorized: unknown token", http.StatusUnauthorized)
		return
	}
	if status != 0 {
		http.Error(w, fmt.Sprintf("%d %s", status, http.StatusText(status)), status)
		return
	}
	base := "/v1/supervisors/" + fakeSupervisor
	switch {
	case r.URL.Path == base+"/config" && r.Method == http.MethodGet && req.watch:
		if pushCode != 0 {
			http.Error(w, http.StatusText(pushCode), pushCode)
			return
		}
		g.servePush(w, r)
	case r.URL.Path == base+"/config" && r.Method == http.MethodGet:
		g.mu.Lock()
		doc, etag := g.doc, `"`+g.rev+`"`
		g.mu.Unlock()
		w.Header().Set("ETag", etag)
		if req.ifNoneMatch == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(doc, '\n'))
	case r.URL.Path == base+"/installations" && r.Method == http.MethodPut:
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == base+"/installations" && r.Method == http.MethodDelete:
		if onDelete != nil {
			onDelete()
		}
		if deleteCode != 0 {
			http.Error(w, http.StatusText(deleteCode), deleteCode)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "404 Not Found", http.StatusNotFound)
	}
}

func (g *fakeGateway) servePush(w http.ResponseWriter, r *http.Request) {
	end := make(chan struct{})
	g.mu.Lock()
	g.streams[end] = struct{}{}
	grant, every := g.grant, g.keepalive
	g.mu.Unlock()
	if grant != "" {
		w.Header().Set(KeepaliveHeader, grant)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var last []byte
	// changed belongs to the document last written: taken under the same
	// lock, so that a setDoc between the write and the wait is not missed.
	var changed chan struct{}
	write := func() bool {
		g.mu.Lock()
		doc := g.doc
		changed = g.changed
		g.mu.Unlock()
		if !bytes.Equal(doc, last) {
			if _, err := w.Write(append(doc, '\n')); err != nil {
				return false
			}
			last = doc
		}
		w.(http.Flusher).Flush()
		return true
	}
	if !write() {
		return
	}
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end:
			return
		case <-changed:
			if !write() {
				return
			}
		case <-tk.C:
			if _, err := w.Write([]byte(`{"keepalive":true}` + "\n")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// ---------------------------------------------------------------------------
// the client under test

const testDomain = "apps.test"

// testDocument is a document with team/demo's web service on port 8080.
func testDocument(rev, generation string) string {
	return fmt.Sprintf(`{"revision":%q,"instances":[{"workspace":"team","sandbox":"demo","generation":%q,`+
		`"services":[{"name":"web","port":8080,"revision":1}]}]}`, rev, generation)
}

const testHost = "team--demo--web." + testDomain

// testClient is a GatewayClient with a real route table, its files and a
// log buffer.
type testClient struct {
	*GatewayClient
	table *routes.Table
	logs  *syncLog
	dir   string
}

// syncLog is a slog destination that tests can read.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newTestClient returns a client of endpoints (comma-separated) trusting
// the CA bundle cas, with a route table of the given freshness.
func newTestClient(t *testing.T, endpoints string, freshness time.Duration, cas ...*testCA) *testClient {
	t.Helper()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("t1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var pems [][]byte
	for _, ca := range cas {
		pems = append(pems, ca.pem)
	}
	logs := &syncLog{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	table := routes.NewTable(routes.Options{Domain: testDomain, Freshness: freshness, Logger: logger})
	t.Cleanup(table.Close)
	c := &GatewayClient{
		Endpoint:          endpoints,
		SupervisorID:      fakeSupervisor,
		TokenFile:         tok,
		CAFile:            writeCAFile(t, filepath.Join(dir, "ca.pem"), pems...),
		Sink:              table,
		Freshness:         freshness,
		PollInterval:      200 * time.Millisecond,
		StreamIdleTimeout: time.Second,
		MaxBackoff:        200 * time.Millisecond,
		Logger:            logger,
		Metrics:           NewMetrics(nil),
	}
	if err := c.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.client.CloseIdleConnections()
		if t.Failed() {
			t.Logf("client log:\n%s", logs.String())
		}
	})
	return &testClient{GatewayClient: c, table: table, logs: logs, dir: dir}
}

// run runs the session (and, with advertise, the Advertiser) until the
// returned stop is called (also on cleanup).
func (c *testClient) run(t testing.TB, advertise bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	if advertise {
		adv := &Advertiser{Client: c.GatewayClient, Table: c.table, Endpoint: api.AdvertisedEndpoint{Host: "10.0.0.7", Port: 8443}}
		wg.Go(func() { adv.Run(ctx) })
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			c.client.CloseIdleConnections()
		})
	}
	t.Cleanup(stop)
	return stop
}

// routed reports whether the test route is installed and fresh.
func (c *testClient) routed() bool {
	r := c.table.Lookup(testHost)
	return r != nil && r.Usable() && c.table.Fresh()
}

func (c *testClient) deliveries(source, result string) float64 {
	return testutil.ToFloat64(c.Metrics.deliveries.WithLabelValues(source, result))
}
