package h2engine

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer serves the engine on a loopback listener, over TLS (ALPN h2)
// or plain TCP (HTTP/2 with prior knowledge).
type testServer struct {
	t      testing.TB
	ln     net.Listener
	addr   string
	tlsCfg *tls.Config // nil: plain TCP
	pool   *x509.CertPool
	cfg    Config
	h      Handler
	sndBuf int
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  []*Conn
	events []ErrorEvent
	errs   []error // what Serve returned
}

// testCert issues a certificate for 127.0.0.1 and localhost.
func testCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	ca, err := tlsconf.NewAuthority("h2engine test CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue([]string{"localhost", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert, ca.Pool()
}

// withSndBuf shrinks the send buffer of accepted connections, so that a
// client that reads nothing blocks the server's writes quickly.
func withSndBuf(n int) func(*testServer) { return func(s *testServer) { s.sndBuf = n } }

func newTestServer(t testing.TB, useTLS bool, cfg Config, h Handler, opts ...func(*testServer)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{t: t, ln: ln, addr: ln.Addr().String(), cfg: cfg, h: h}
	for _, o := range opts {
		o(s)
	}
	if useTLS {
		cert, pool := testCert(t)
		s.pool = pool
		s.tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	}
	user := cfg.OnError
	s.cfg.OnError = func(ev ErrorEvent) {
		s.mu.Lock()
		s.events = append(s.events, ev)
		s.mu.Unlock()
		if user != nil {
			user(ev)
		}
	}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *testServer) accept() {
	defer s.wg.Done()
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			nc := raw
			if tc, ok := raw.(*net.TCPConn); ok && s.sndBuf > 0 {
				_ = tc.SetWriteBuffer(s.sndBuf)
			}
			if s.tlsCfg != nil {
				tc := tls.Server(raw, s.tlsCfg)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					_ = raw.Close()
					return
				}
				_ = tc.SetDeadline(time.Time{})
				nc = rawCloser{tc, raw}
			}
			c := NewConn(nc, s.cfg, s.h)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			err := c.Serve()
			s.mu.Lock()
			s.errs = append(s.errs, err)
			s.mu.Unlock()
		}()
	}
}

// rawCloser is a TLS connection whose Close closes the TCP connection
// under it (as dispatch hands connections over).
type rawCloser struct {
	*tls.Conn
	raw net.Conn
}

func (c rawCloser) Close() error { return c.raw.Close() }

func (s *testServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	conns := append([]*Conn(nil), s.conns...)
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	s.wg.Wait()
}

// eventsWith returns the events whose reason contains sub.
func (s *testServer) eventsWith(sub string) []ErrorEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ErrorEvent
	for _, ev := range s.events {
		if strings.Contains(ev.Reason, sub) {
			out = append(out, ev)
		}
	}
	return out
}

func (s *testServer) served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs)
}

// testBody is what the test handler answers GET / with.
const testBody = "hello from h2engine\n"

// testHandler is the handler of the tests and of h2spec:
//
//	GET /                200, testBody
//	HEAD /               200, no body
//	POST /echo           200, the request body, its trailers as trailers
//	GET /size/N          200, N bytes
//	GET /block           waits until the stream is reset
//	any other method     200, testBody after reading the request body
func testHandler(st *Stream) {
	switch {
	case st.Path == "/block":
		<-st.Done()
		return
	case strings.HasPrefix(st.Path, "/size/"):
		n, _ := strconv.Atoi(strings.TrimPrefix(st.Path, "/size/"))
		_ = st.WriteHeaders(200, []HeaderField{{Name: "content-length", Value: strconv.Itoa(n)}}, false)
		chunk := bytes.Repeat([]byte("x"), 32<<10)
		for n > 0 {
			m := min(n, len(chunk))
			if _, err := st.Write(chunk[:m]); err != nil {
				return
			}
			n -= m
		}
		_ = st.End()
		return
	case st.Path == "/echo":
		body, err := io.ReadAll(st)
		if err != nil {
			return
		}
		_ = st.WriteHeaders(200, []HeaderField{{Name: "content-type", Value: "application/octet-stream"}}, false)
		if _, err := st.Write(body); err != nil {
			return
		}
		_ = st.WriteTrailers(st.Trailer)
		return
	}
	if _, err := io.Copy(io.Discard, st); err != nil {
		return
	}
	fields := []HeaderField{{Name: "content-type", Value: "text/plain"}, {Name: "content-length", Value: strconv.Itoa(len(testBody))}}
	if st.Method == "HEAD" {
		_ = st.WriteHeaders(200, fields, true)
		return
	}
	_ = st.WriteHeaders(200, fields, false)
	_ = st.WriteLast([]byte(testBody))
}

// transport returns Go's HTTP/2 client (net/http's, which is x/net's
// http2 bundled) for s, HTTP/2 only.
func (s *testServer) transport() *http.Transport {
	var p http.Protocols
	p.SetHTTP2(true)
	return &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.pool, ServerName: "localhost", MinVersion: tls.VersionTLS12},
		Protocols:       &p,
	}
}
