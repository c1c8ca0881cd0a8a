package dispatch

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// appProxy is the listener in front of one app written by the test: real
// TLS (ALPN h2 and http/1.1) with a certificate for *.apps.test, the SNI
// looked up in a real route table (testHost routes to the app), then
// ServeH2 or ServeConn of a Server with the test's Config. Clients are
// net/http's, over HTTP/1.1 or HTTP/2.
type appProxy struct {
	t   *testing.T
	app *httptest.Server
	ca  *tlsconf.Authority
	srv *Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// newAppProxy starts app (an HTTP/1.1 server on loopback) and the listener
// in front of it. Both end on cleanup. The caller checks for leaks
// (h2Verify), once for parallel subtests.
func newAppProxy(t *testing.T, cfg Config, app http.Handler) *appProxy {
	t.Helper()
	p := &appProxy{t: t}
	ca, err := tlsconf.NewAuthority("app proxy test CA")
	if err != nil {
		t.Fatal(err)
	}
	p.ca = ca
	certPEM, keyPEM, err := ca.Issue([]string{"*.apps.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	p.app = httptest.NewServer(app)
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r1","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"web","port":%d,"revision":1}]}]}`, p.appPort()))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(doc)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p.srv = New(cfg)
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRoutesTLS(&p.wg, p.ln, cert, table, p.srv)
	t.Cleanup(func() {
		_ = p.ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = p.srv.Shutdown(ctx)
		cancel()
		table.Close()
		p.wg.Wait()
		p.app.CloseClientConnections()
		p.app.Close()
	})
	return p
}

// appPort is the app's port: the app sees Host 127.0.0.1:appPort.
func (p *appProxy) appPort() int { return p.app.Listener.Addr().(*net.TCPAddr).Port }

// port is the listener's port.
func (p *appProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// client returns a client that speaks proto ("h1" or "h2") to the
// listener, whatever the URL's host and port, and never follows
// redirects.
func (p *appProxy) client(proto string) *http.Client {
	var protocols http.Protocols
	if proto == "h2" {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetHTTP1(true)
	}
	tr := &http.Transport{
		Protocols: &protocols,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", p.ln.Addr().String())
		},
		TLSClientConfig:    &tls.Config{RootCAs: p.ca.Pool(), ServerName: testHost},
		DisableCompression: true,
	}
	p.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
}

// protocols are the client protocols every request-path test runs with.
var protocols = []string{"h1", "h2"}

// checkProto fails the test when resp did not come over proto.
func checkProto(t *testing.T, resp *http.Response, proto string) {
	t.Helper()
	if want := map[string]int{"h1": 1, "h2": 2}[proto]; resp.ProtoMajor != want {
		t.Fatalf("response over %s; want %s", resp.Proto, proto)
	}
}
