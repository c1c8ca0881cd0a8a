package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// greetHandler answers each connection the supervisor's listener hands
// over with "<sni> <client address>" and closes it.
type greetHandler struct{}

func (greetHandler) ServeConn(c listener.Conn) {
	defer c.Done()
	_, _ = fmt.Fprintf(c.Conn, "%s %s\n", c.SNI, c.Client.Addr())
	_ = c.Conn.Close()
}
func (h greetHandler) ServeH2(c listener.Conn)      { h.ServeConn(c) }
func (greetHandler) Shutdown(context.Context) error { return nil }

// newListenerSupervisor is the supervisor's real app listener (package
// listener) for hostB with the PROXY protocol policy given (nil, nil: its
// defaults), logging to logs.
func newListenerSupervisor(t *testing.T, ca *tlsconf.Authority, trusted, required []netip.Prefix, logs *syncLog) api.RouteEndpoint {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue([]string{"*.apps.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	table := routes.NewTable(routes.Options{Domain: "apps.test", Freshness: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(table.Close)
	doc, err := routes.ParseDocument([]byte(`{"revision":"r","instances":[{"workspace":"team","sandbox":"b","generation":"1",
		"services":[{"name":"web","port":8080,"revision":1}]}]}`))
	if err != nil || len(doc.Rejected) > 0 {
		t.Fatalf("document: %v %+v", err, doc)
	}
	table.Apply(doc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := listener.New(ln, listener.Config{
		TLS:    &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Routes: table, Handler: greetHandler{}, HandshakeTimeout: 5 * time.Second,
		TrustedProxies: trusted, RequireProxyHeader: required,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	served := make(chan error, 1)
	go func() { served <- l.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Shutdown(ctx)
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("the supervisor's Serve ended with %v", err)
		}
	})
	return api.RouteEndpoint{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
}

// greetThroughEdge connects from 127.0.0.2 through the edge to hostB and
// returns the supervisor's greeting (its client address).
func greetThroughEdge(f *edgeFixture, pool *tlsconf.Authority) (string, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 2 * time.Second}
	raw, err := d.Dial("tcp", f.addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = raw.Close() }()
	tc := tls.Client(raw, &tls.Config{RootCAs: pool.Pool(), ServerName: hostB, MinVersion: tls.VersionTLS12})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(tc).ReadString('\n')
	return strings.TrimSpace(line), err
}

func newAutoEdge(t *testing.T, ca *tlsconf.Authority, ep api.RouteEndpoint, proxy, fallback bool) (*edgeFixture, *syncLog) {
	t.Helper()
	logs := &syncLog{}
	src := newFakeSource()
	f := newEdgeFixtureConfig(t, Config{
		Source: src, Workspaces: []string{"team"}, HelloTimeout: 2 * time.Second, WithdrawGrace: -1,
		ProxyProtocol: proxy, ProxyFallback: fallback, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	}, ca.Pool())
	src.send(t, "team", api.ServiceRoute{Hostname: hostB, Workspace: "team", Sandbox: "b", Name: "web",
		Supervisor: "sup-p", InstallationVersion: 1, ExpiresAt: time.Now().Add(time.Hour), Endpoint: ep})
	return f, logs
}

// The auto mode (the edge's default) with a supervisor started with its
// defaults (no trusted proxies): the first connection's header is refused,
// the edge redials without one and the client is served (its address is
// then the edge's); both sides log the mismatch; later connections send
// no header, so the supervisor refuses nothing more.
func TestEdgeProxyAutoWithDefaultSupervisor(t *testing.T) {
	testutil.VerifyNone(t)
	ca := newCA(t)
	supLogs := &syncLog{}
	ep := newListenerSupervisor(t, ca, nil, nil, supLogs)
	f, edgeLogs := newAutoEdge(t, ca, ep, true, true)
	for i := range 3 {
		got, err := greetThroughEdge(f, ca)
		if err != nil || got != hostB+" 127.0.0.1" {
			t.Fatalf("connection %d through the edge: %q, %v; want the greeting with the edge's address", i, got, err)
		}
	}
	if n := strings.Count(supLogs.String(), `"reason":"proxy_untrusted"`); n != 1 {
		t.Errorf("the supervisor refused %d PROXY headers; want 1 (then none was sent):\n%s", n, supLogs.String())
	}
	if !strings.Contains(supLogs.String(), "list its address in --trusted-proxies") {
		t.Errorf("the supervisor's refusal does not say what to do:\n%s", supLogs.String())
	}
	if n := strings.Count(edgeLogs.String(), "PROXY protocol mismatch"); n != 1 {
		t.Errorf("the edge logged the mismatch %d times; want 1:\n%s", n, edgeLogs.String())
	}
}

// The auto mode with a supervisor that trusts the edge: the header is
// accepted and the client's own address reaches the supervisor.
func TestEdgeProxyAutoWithTrustingSupervisor(t *testing.T) {
	testutil.VerifyNone(t)
	ca := newCA(t)
	supLogs := &syncLog{}
	ep := newListenerSupervisor(t, ca, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil, supLogs)
	f, edgeLogs := newAutoEdge(t, ca, ep, true, true)
	for i := range 2 {
		got, err := greetThroughEdge(f, ca)
		if err != nil || got != hostB+" 127.0.0.2" {
			t.Fatalf("connection %d through the edge: %q, %v; want the client's address", i, got, err)
		}
	}
	if strings.Contains(edgeLogs.String(), "mismatch") || strings.Contains(supLogs.String(), "refused") {
		t.Errorf("a mismatch was logged:\nedge: %s\nsupervisor: %s", edgeLogs.String(), supLogs.String())
	}
}

// The mismatches the auto mode does not repair are explained on both
// sides: an edge with --proxy-protocol off in front of a supervisor that
// requires the header, and one with v2 in front of a default supervisor.
func TestEdgeProxyMismatchLogged(t *testing.T) {
	for _, c := range []struct {
		name              string
		proxy             bool
		required          []netip.Prefix
		supReason, hint   string
		proxyHeaderLogged string
	}{
		{"off to requiring", false, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, "proxy_required",
			"run the edge with --proxy-protocol auto or v2", `"proxy_header_sent":false`},
		{"v2 to default", true, nil, "proxy_untrusted", "run the edge with --proxy-protocol auto", `"proxy_header_sent":true`},
	} {
		t.Run(c.name, func(t *testing.T) {
			testutil.VerifyNone(t)
			ca := newCA(t)
			supLogs := &syncLog{}
			ep := newListenerSupervisor(t, ca, nil, c.required, supLogs)
			f, edgeLogs := newAutoEdge(t, ca, ep, c.proxy, false)
			if got, err := greetThroughEdge(f, ca); err == nil {
				t.Fatalf("served (%q) despite the mismatch", got)
			}
			testutil.Eventually(t, 5*time.Second, "both sides' log lines", func() bool {
				return strings.Contains(supLogs.String(), `"reason":"`+c.supReason+`"`) &&
					strings.Contains(edgeLogs.String(), "closed a connection without answering its ClientHello")
			})
			for _, want := range []string{c.hint, c.proxyHeaderLogged} {
				if !strings.Contains(edgeLogs.String(), want) {
					t.Errorf("the edge's log lacks %s:\n%s", want, edgeLogs.String())
				}
			}
		})
	}
}
