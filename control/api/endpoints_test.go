package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/controltest"
	"github.com/applistener/applistener/internal/testutil"
)

func TestParseGatewayEndpoints(t *testing.T) {
	e, err := api.ParseGatewayEndpoints(" https://a:8080/ , http://127.0.0.1:9000,https://b/prefix", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.All(); len(got) != 3 || got[0] != "https://a:8080" || got[2] != "https://b/prefix" || e.Current() != "https://a:8080" {
		t.Fatalf("endpoints %q, current %q", got, e.Current())
	}
	if e.String() != "https://a:8080,http://127.0.0.1:9000,https://b/prefix" || e.Len() != 3 {
		t.Errorf("String %q", e.String())
	}
	boom := errors.New("boom")
	if next := e.Failed("https://b/prefix", boom); next != "https://a:8080" {
		t.Errorf("a failure of an endpoint not in use moved the client to %s", next)
	}
	if next := e.Failed("https://a:8080", boom); next != "http://127.0.0.1:9000" {
		t.Errorf("after a failure: %s", next)
	}
	e.Failed("http://127.0.0.1:9000", boom)
	if next := e.Failed("https://b/prefix", boom); next != "https://a:8080" {
		t.Errorf("no wrap-around: %s", next)
	}
	for _, bad := range []string{"", " , ", "gateway:8080", "ftp://a", "https://a,https://a/", "https://a?x=1", "https://u:p@a", "https://"} {
		if _, err := api.ParseGatewayEndpoints(bad, nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	one, _ := api.ParseGatewayEndpoints("https://a", nil)
	if one.Failed("https://a", boom) != "https://a" {
		t.Error("a single endpoint")
	}
	if api.IsGatewayFailover(&api.DiscoveryStatusError{Code: 403}) || !api.IsGatewayFailover(&api.DiscoveryStatusError{Code: 503}) ||
		!api.IsGatewayFailover(fmt.Errorf("x: %w", &api.GatewayConnError{Err: boom})) || api.IsGatewayFailover(boom) || api.IsGatewayFailover(nil) {
		t.Error("IsGatewayFailover")
	}
}

// deadURL returns the URL of a loopback port nobody listens on (and
// nobody can be given while the test runs: a port closed again once went
// to a gateway the test started next, listed twice).
func deadURL(t *testing.T) string {
	t.Helper()
	return "http://127.0.0.1:" + strconv.Itoa(testutil.DeadLoopbackPort(t))
}

// switchable is a discovery endpoint whose answer can be switched to a
// status code, and whose open watches can be ended.
type switchable struct {
	srv    *httptest.Server
	status atomic.Int64
	hits   atomic.Int64
	mu     sync.Mutex
	ends   []chan struct{}
}

func newSwitchable(t *testing.T, rev string) *switchable {
	s := &switchable{}
	s.srv, _ = discFakeGateway(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		s.hits.Add(1)
		if code := int(s.status.Load()); code != 0 {
			http.Error(w, http.StatusText(code), code)
			return
		}
		if r.URL.Query().Get("watch") != "1" {
			_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", rev))
			return
		}
		end := make(chan struct{})
		s.mu.Lock()
		s.ends = append(s.ends, end)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", rev))
		w.(http.Flusher).Flush()
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-end:
				return // a clean end (the watch's lifetime)
			case <-tk.C:
				_, _ = fmt.Fprint(w, `{"keepalive":true}`+"\n")
				w.(http.Flusher).Flush()
			}
		}
	})
	return s
}

func (s *switchable) endWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.ends {
		close(ch)
	}
	s.ends = nil
}

// Several gateways: a refused connection and a 503 move the watch on; a
// cleanly ended watch reconnects to the same endpoint even when an earlier
// one has recovered; a failing endpoint moves it on again. Get tries each
// endpoint once.
func TestDiscoveryClientFailover(t *testing.T) {
	dead := deadURL(t)
	a, b := newSwitchable(t, "a"), newSwitchable(t, "b")
	a.status.Store(http.StatusServiceUnavailable)
	c := &api.DiscoveryClient{Gateway: dead + "," + a.srv.URL + "," + b.srv.URL, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}
	defer c.CloseIdleConnections()

	s, err := c.Get(context.Background(), "team")
	if err != nil || s.Revision != "b" {
		t.Fatalf("Get: %+v %v; want the third endpoint's snapshot", s, err)
	}

	col := controltest.NewCollector()
	cancel, _ := controltest.RunWatch(t, func(ctx context.Context) error { return c.Watch(ctx, "team", col.Add) })
	if s := col.Next(t, 2*time.Second); s.Revision != "b" {
		t.Fatalf("watch: %+v", s)
	}
	a.status.Store(0)
	hitsA := a.hits.Load()
	for range 3 {
		b.endWatches()
		if s := col.Next(t, 2*time.Second); s.Revision != "b" {
			t.Fatalf("after a clean end: snapshot of %q; want b (sticky)", s.Revision)
		}
	}
	if n := a.hits.Load() - hitsA; n != 0 {
		t.Errorf("%d requests to the recovered endpoint while the current one worked", n)
	}
	b.status.Store(http.StatusServiceUnavailable)
	b.endWatches()
	if s := col.Next(t, 2*time.Second); s.Revision != "a" {
		t.Fatalf("after the current endpoint failed: snapshot of %q; want a", s.Revision)
	}
	cancel()

	// A refusal is the same everywhere: no failover.
	a.status.Store(http.StatusForbidden)
	if _, err := c.Get(context.Background(), "team"); !api.IsDiscoveryRefusal(err) {
		t.Errorf("Get at a refusing endpoint: %v", err)
	}
	if b.hits.Load() == 0 || a.hits.Load() == 0 {
		t.Error("hits")
	}
}

// discCA is a throw-away certificate authority.
type discCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newDiscCA(t *testing.T) *discCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "discovery test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &discCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *discCA) leaf(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writeFileAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// The CA file is re-read when it changes: a gateway moved to a certificate
// of a new CA is trusted once the file names that CA, without a new client.
// A broken file keeps the bundle in use. The transport speaks HTTP/2.
func TestDiscoveryClientCARotation(t *testing.T) {
	ca1, ca2 := newDiscCA(t), newDiscCA(t)
	var cert atomic.Pointer[tls.Certificate]
	leaf1 := ca1.leaf(t)
	cert.Store(&leaf1)
	var protos sync.Map
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos.Store(r.Proto, true)
		_, _ = fmt.Fprint(w, discSnapshotLine(t, "team", "1"))
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*cert.Load()}, NextProtos: []string{"h2", "http/1.1"}}, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFileAtomic(t, caFile, ca1.pem)
	logs := &strings.Builder{}
	var logMu sync.Mutex
	c := &api.DiscoveryClient{Gateway: srv.URL, CAFile: caFile,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, logs}, nil))}
	defer c.CloseIdleConnections()
	if _, err := c.Get(context.Background(), "team"); err != nil {
		t.Fatal(err)
	}
	if _, ok := protos.Load("HTTP/2.0"); !ok {
		t.Error("not HTTP/2")
	}

	leaf2 := ca2.leaf(t)
	cert.Store(&leaf2)
	c.CloseIdleConnections()
	if _, err := c.Get(context.Background(), "team"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a certificate of another CA: %v", err)
	}
	writeFileAtomic(t, caFile, ca2.pem)
	if _, err := c.Get(context.Background(), "team"); err != nil {
		t.Fatalf("after the CA file was replaced: %v", err)
	}
	writeFileAtomic(t, caFile, []byte("garbage\n"))
	c.CloseIdleConnections()
	if _, err := c.Get(context.Background(), "team"); err != nil {
		t.Fatalf("a broken CA file replaced the bundle in use: %v", err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "gateway CA file reloaded") || !strings.Contains(logs.String(), "keeping the previous bundle") {
		t.Errorf("logs:\n%s", logs.String())
	}
	if _, err := api.NewGatewayTransport(api.GatewayTransportOptions{CAFile: caFile}); err == nil {
		t.Error("a transport was made from a CA file without certificates")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
