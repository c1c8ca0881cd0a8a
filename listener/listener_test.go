package listener

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

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
	l := New(ln, Config{
		TLS:    &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		Routes: table, Handler: h, HandshakeTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
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
