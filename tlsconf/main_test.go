package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testDomainCert = "*.apps.test"
	testServerName = "team--demo--web.apps.test"
	ioTimeout      = 5 * time.Second
)

// testServer is a TLS echo server on real loopback TCP.
type testServer struct {
	addr   string
	ln     net.Listener
	cfg    *tls.Config
	hsErrs chan error // server-side handshake errors

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// startServer serves cfg on 127.0.0.1:0 and shuts down (closing every
// connection and waiting for its goroutines) when the test ends.
func startServer(t *testing.T, cfg *tls.Config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := &testServer{
		addr:   ln.Addr().String(),
		ln:     ln,
		cfg:    cfg,
		hsErrs: make(chan error, 64),
		conns:  make(map[net.Conn]struct{}),
	}
	s.wg.Add(1)
	go s.acceptLoop()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *testServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *testServer) serve(raw net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, raw)
		s.mu.Unlock()
		_ = raw.Close()
	}()
	conn := tls.Server(raw, s.cfg)
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))
	if err := conn.Handshake(); err != nil {
		select {
		case s.hsErrs <- err:
		default:
		}
		return
	}
	_ = conn.SetDeadline(time.Time{})
	_, _ = io.Copy(conn, conn)
}

// handshakeErr returns the next server-side handshake error.
func (s *testServer) handshakeErr(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.hsErrs:
		return err
	case <-time.After(ioTimeout):
		t.Fatal("no server handshake error reported")
		return nil
	}
}

// clientConfig trusts ca and names testServerName.
func clientConfig(ca *Authority) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool(), ServerName: testServerName}
}

// dial connects and completes the handshake.
func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: ioTimeout}, "tcp", addr, cfg)
}

// mustDial connects, completes the handshake and closes the connection when
// the test ends.
func mustDial(t *testing.T, addr string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	conn, err := dial(addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// echo sends msg and expects it back. Reading also processes TLS 1.3
// post-handshake messages such as session tickets.
func echo(t *testing.T, conn *tls.Conn, msg string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(conn, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("echo = %q, want %q", buf, msg)
	}
}

// peerSerial returns the serial number of the leaf the server presented.
func peerSerial(conn *tls.Conn) string {
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
}

// handshakeSerial dials, returns the presented leaf's serial and closes.
func handshakeSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	conn, err := dial(addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer func() { _ = conn.Close() }()
	return peerSerial(conn)
}

func newTestAuthority(t *testing.T) *Authority {
	t.Helper()
	ca, err := NewAuthority("tlsconf test CA")
	if err != nil {
		t.Fatalf("NewAuthority: %v", err)
	}
	return ca
}

// testPair is an issued certificate pair and its leaf's serial.
type testPair struct {
	certPEM, keyPEM []byte
	serial          string
}

func issue(t *testing.T, ca *Authority, validFor time.Duration, names ...string) testPair {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(names, validFor)
	if err != nil {
		t.Fatalf("Issue(%q): %v", names, err)
	}
	return testPair{certPEM: certPEM, keyPEM: keyPEM, serial: leafOf(t, certPEM).SerialNumber.Text(16)}
}

func leafOf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM block in certificate")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("parse leaf: %v", err)
	}
	return leaf
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) contains(s string) bool { return strings.Contains(b.String(), s) }

func newTestLogger() (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// runWatch runs s.Watch in a goroutine and stops it (waiting for it to
// return) when the test ends.
func runWatch(t *testing.T, s *Store, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Watch(ctx, interval)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(ioTimeout):
			t.Error("Watch did not return after cancel")
		}
	})
}
