package listener

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

const testDomain = "apps.test"

// recordingHandler is a Handler that records the connections handed to it
// and ends each at once.
type recordingHandler struct {
	mu    sync.Mutex
	conns []handed
}

type handed struct {
	proto string
	c     Conn
}

func (h *recordingHandler) serve(proto string, c Conn) {
	h.mu.Lock()
	h.conns = append(h.conns, handed{proto, c})
	h.mu.Unlock()
	_ = c.Raw.Close()
	c.Done()
	c.Done() // a second call must be harmless (the listener's Done is once)
}

func (h *recordingHandler) ServeConn(c Conn)               { h.serve("http/1.1", c) }
func (h *recordingHandler) ServeH2(c Conn)                 { h.serve("h2", c) }
func (h *recordingHandler) Shutdown(context.Context) error { return nil }

func (h *recordingHandler) handedOff() []handed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]handed(nil), h.conns...)
}

// newTestListener serves a real TLS listener on loopback with one route,
// team--demo--web.apps.test.
func newTestListener(t *testing.T) (*Listener, *recordingHandler, *tlsconf.Authority) {
	t.Helper()
	return newTestListenerWith(t, nil)
}

// newTestListenerWith is newTestListener with its metrics in reg and
// its configuration changed by opts.
func newTestListenerWith(t *testing.T, reg prometheus.Registerer, opts ...func(*Config)) (*Listener, *recordingHandler, *tlsconf.Authority) {
	t.Helper()
	testutil.VerifyNone(t)
	ca, err := tlsconf.NewAuthority("listener test CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue([]string{"*." + testDomain}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	table := routes.NewTable(routes.Options{Domain: testDomain, Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(table.Close)
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(doc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &recordingHandler{}
	cfg := Config{
		TLS:    &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		Routes: table, Handler: h, HandshakeTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Registerer: reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	l := New(ln, cfg)
	served := make(chan error, 1)
	go func() { served <- l.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l, h, ca
}

// TestHandoff: after the handshake the listener hands the handler one
// Conn per connection: the TLS connection, the TCP connection under it,
// the normalized SNI, the route it names, the write batcher of the
// replaying transport and Done; HTTP/1.1 and h2 go to their own method.
// Done releases the connection slot and Shutdown returns.
func TestHandoff(t *testing.T) {
	l, h, ca := newTestListener(t)
	for i, alpn := range []string{"http/1.1", "h2"} {
		tc, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{
			ServerName: "Team--Demo--Web.Apps.Test", RootCAs: ca.Pool(), NextProtos: []string{alpn},
		})
		if err != nil {
			t.Fatalf("%s: %v", alpn, err)
		}
		_ = tc.Close()
		testutil.Eventually(t, 5*time.Second, "the handoff of the "+alpn+" connection", func() bool {
			return len(h.handedOff()) == i+1
		})
		got := h.handedOff()[i]
		if got.proto != alpn {
			t.Errorf("%s connection handed to the %s method", alpn, got.proto)
		}
		c := got.c
		tlsConn, ok := c.Conn.(*tls.Conn)
		if !ok {
			t.Fatalf("%s: Conn is %T; want *tls.Conn", alpn, c.Conn)
		}
		if p := tlsConn.ConnectionState().NegotiatedProtocol; p != alpn {
			t.Errorf("handed connection negotiated %q; want %q", p, alpn)
		}
		if c.SNI != "team--demo--web."+testDomain {
			t.Errorf("SNI %q; want the normalized name", c.SNI)
		}
		if c.Route == nil || c.Route.Host != c.SNI || c.Route.Port != 8080 {
			t.Errorf("route %+v; want the one the SNI names", c.Route)
		}
		if c.Raw == nil || c.Raw == c.Conn {
			t.Error("Raw is not the TCP connection under the TLS one")
		}
		if c.Client.String() != tc.LocalAddr().String() {
			t.Errorf("Client %v; want the peer's own address %v", c.Client, tc.LocalAddr())
		}
		if c.Batcher == nil {
			t.Error("no write batcher from the replaying transport")
		}
		if c.Done == nil {
			t.Error("no Done")
		}
	}
}

// TestUnknownNameRefusedBeforeTheHandler: a name without a route gets the
// unrecognized_name alert and never reaches the handler.
func TestUnknownNameRefusedBeforeTheHandler(t *testing.T) {
	l, h, ca := newTestListener(t)
	_, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: "team--other--web." + testDomain, RootCAs: ca.Pool()})
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("handshake error %v; want the unrecognized_name alert", err)
	}
	if n := len(h.handedOff()); n != 0 {
		t.Errorf("%d connections handed to the handler", n)
	}
}

// pausedWriter pauses after the first 5 bytes of its first Write: the
// ClientHello reaches the listener in two parts, pause apart.
type pausedWriter struct {
	net.Conn
	pause time.Duration
	once  sync.Once
}

func (p *pausedWriter) Write(b []byte) (int, error) {
	var n int
	p.once.Do(func() {
		if len(b) > 5 {
			n, _ = p.Conn.Write(b[:5])
			time.Sleep(p.pause)
		}
	})
	m, err := p.Conn.Write(b[n:])
	return n + m, err
}

// handshakeHistogram returns the sample count and sum of
// applistener_tls_handshake_seconds and its bucket bounds.
func handshakeHistogram(t *testing.T, g prometheus.Gatherer) (count uint64, sum float64, bounds []float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "applistener_tls_handshake_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		return h.GetSampleCount(), h.GetSampleSum(), bounds
	}
	t.Fatal("no applistener_tls_handshake_seconds")
	return 0, 0, nil
}

// TestHandshakeSeconds: applistener_tls_handshake_seconds observes each
// completed handshake from accept on, so a slow ClientHello counts; a
// refused name and a failed handshake are not observed.
func TestHandshakeSeconds(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, h, ca := newTestListenerWith(t, reg)
	name := "team--demo--web." + testDomain
	tc, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: name, RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	_ = tc.Close()
	const pause = 200 * time.Millisecond
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	slow := tls.Client(&pausedWriter{Conn: raw, pause: pause}, &tls.Config{ServerName: name, RootCAs: ca.Pool()})
	if err := slow.Handshake(); err != nil {
		t.Fatal(err)
	}
	_ = slow.Close()
	// Refused: no route for the name. Failed: the client does not trust
	// the certificate and aborts.
	if c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: "team--other--web." + testDomain, RootCAs: ca.Pool()}); err == nil {
		_ = c.Close()
		t.Fatal("handshake for an unknown name succeeded")
	}
	if c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{ServerName: name}); err == nil {
		_ = c.Close()
		t.Fatal("handshake with an untrusted certificate succeeded")
	}
	testutil.Eventually(t, 5*time.Second, "two handoffs and the failed handshake counted", func() bool {
		return len(h.handedOff()) == 2 && promtestutil.ToFloat64(l.m.rejections.WithLabelValues("handshake")) == 1
	})
	count, sum, bounds := handshakeHistogram(t, reg)
	if count != 2 {
		t.Errorf("%d handshakes observed, want 2 (completed only)", count)
	}
	if sum < pause.Seconds() || sum > 5 {
		t.Errorf("sum %.4fs; want at least the %v ClientHello pause", sum, pause)
	}
	if len(bounds) < 10 || math.Abs(bounds[0]-100e-6) > 1e-9 || math.Abs(bounds[len(bounds)-1]-10) > 1e-9 {
		t.Errorf("buckets %v; want 100 µs … 10 s", bounds)
	}
}
