package dispatch

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/httpgrammar"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// testHost is the public hostname (SNI) used throughout the unit tests.
const testHost = "team--demo--web.apps.test"

// head builds a request or response head from lines: each line gets CRLF and
// an empty line ends the head.
func head(lines ...string) []byte {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	return []byte(b.String())
}

// get is a minimal valid request head with extra header lines.
func get(extra ...string) []byte {
	return head(append([]string{"GET / HTTP/1.1", "Host: " + testHost}, extra...)...)
}

// newTestPool returns a buffer pool of size-byte buffers.
func newTestPool(size int) *sync.Pool {
	return &sync.Pool{New: func() any { b := make([]byte, size); return &b }}
}

// newInbuf returns an inbuf over r with size-byte buffers.
func newInbuf(r io.Reader, size int) *inbuf {
	return &inbuf{src: r, pool: newTestPool(size)}
}

// asParseError returns the *parseError in err, or fails the test.
func asParseError(t *testing.T, err error) *parseError {
	t.Helper()
	var pe *parseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *parseError", err, err)
	}
	return pe
}

// headerLines splits a produced head into its start line and its field
// lines, failing the test when the head is not CRLF-framed or a field line
// is not "Name: value".
func headerLines(t testing.TB, out []byte) (start string, fields [][2]string) {
	t.Helper()
	s := string(out)
	if !strings.HasSuffix(s, "\r\n\r\n") {
		t.Fatalf("head does not end with CRLFCRLF: %q", s)
	}
	s = strings.TrimSuffix(s, "\r\n\r\n")
	lines := strings.Split(s, "\r\n")
	for _, l := range lines {
		if strings.ContainsAny(l, "\r\n") {
			t.Fatalf("bare CR or LF in produced line %q", l)
		}
	}
	start = lines[0]
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ": ")
		if !ok || name == "" || !httpgrammar.IsToken([]byte(name)) {
			t.Fatalf("malformed produced field line %q in %q", l, out)
		}
		fields = append(fields, [2]string{name, value})
	}
	return start, fields
}

// values returns every value of the field name (any case) in fields.
func values(fields [][2]string, name string) []string {
	var vs []string
	for _, f := range fields {
		if strings.EqualFold(f[0], name) {
			vs = append(vs, f[1])
		}
	}
	return vs
}

// errAfterReader returns the bytes of data, then err.
type errAfterReader struct {
	data []byte
	err  error
}

func (r *errAfterReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

var errMidway = errors.New("connection reset midway")

// recConn is a net.Conn that records writes; Read blocks until Close.
type recConn struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	closed   bool
	closedCh chan struct{}
	writeErr error
}

func newRecConn() *recConn { return &recConn{closedCh: make(chan struct{})} }

func (c *recConn) Read([]byte) (int, error) {
	<-c.closedCh
	return 0, io.EOF
}

func (c *recConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.writeErr != nil {
		return 0, c.writeErr
	}
	return c.buf.Write(p)
}

func (c *recConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.closedCh)
	}
	return nil
}

func (c *recConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *recConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.buf.Bytes()...)
}

func (c *recConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *recConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *recConn) SetDeadline(time.Time) error      { return nil }
func (c *recConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recConn) SetWriteDeadline(time.Time) error { return nil }

func (c *recConn) setWriteErr(err error) {
	c.mu.Lock()
	c.writeErr = err
	c.mu.Unlock()
}

// waitIdleStale waits until pool holds idle connections and the app has
// closed every one of them, as a probe of the socket sees it, and each has
// been idle for probeIdleAfter (younger ones are reused unchecked). The
// listener must then find them closed by itself (backendConn.usable).
func waitIdleStale(t *testing.T, pool *backendPool) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "the app's close to reach the pooled connections", func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		if len(pool.idle) == 0 {
			return false
		}
		for _, bc := range pool.idle {
			if time.Since(bc.idleSince) < probeIdleAfter || bc.probe.Usable() {
				return false
			}
		}
		return true
	})
}

// oneRouteTLS issues a wildcard certificate from a new CA and installs a
// table with the one route team--demo--web to port on 127.0.0.1 (closed at
// the end of tb). srvCfg and cliCfg are the server's and the client's TLS
// configurations for HTTP/1.1 to that route.
func oneRouteTLS(tb testing.TB, port int) (table *routes.Table, srvCfg, cliCfg *tls.Config) {
	tb.Helper()
	ca, cert := wildcardAuthority(tb, "one route test CA")
	table = routes.NewTable(routes.Options{Domain: h2Domain, Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	tb.Cleanup(table.Close)
	doc, err := routes.ParseDocument([]byte(fmt.Sprintf(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",`+
		`"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":%d,"revision":1}]}]}`, port)))
	if err != nil {
		tb.Fatal(err)
	}
	table.Apply(doc)
	srvCfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	cliCfg = &tls.Config{ServerName: "team--demo--web." + h2Domain, RootCAs: ca.Pool(), NextProtos: []string{"http/1.1"}}
	return table, srvCfg, cliCfg
}
