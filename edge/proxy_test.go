package edge

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/proxyproto"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/tlsconf"
)

// newProxyReadingSupervisor is a TLS server that first reads a PROXY v2
// header with proxyproto.Read, then completes the TLS handshake on the
// bytes that follow and greets with "source destination authority sni".
// A connection that does not start with a valid header gets "no header: ERR".
func newProxyReadingSupervisor(t *testing.T, ca *tlsconf.Authority) api.RouteEndpoint {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue([]string{"*.apps.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				h, err := proxyproto.Read(c, 0)
				if err != nil {
					_, _ = fmt.Fprintf(c, "no header: %v\n", err)
					return
				}
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
				if err := tc.Handshake(); err != nil {
					return
				}
				_, _ = fmt.Fprintf(tc, "%s %s %s %s\n", h.Source, h.Destination, h.Authority, tc.ConnectionState().ServerName)
				_, _ = io.Copy(io.Discard, tc)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return api.RouteEndpoint{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
}

// TestEdgeSendsProxyHeader: with ProxyProtocol the supervisor reads, before
// the ClientHello, a PROXY v2 header whose source is the client's address
// (dialled from 127.0.0.2), whose destination is the edge address the
// client connected to, and whose authority is the name; the ClientHello
// that follows is intact (the handshake, verified end to end, succeeds).
func TestEdgeSendsProxyHeader(t *testing.T) {
	testutil.VerifyNone(t)
	ca, err := tlsconf.NewAuthority("edge proxy test CA")
	if err != nil {
		t.Fatal(err)
	}
	ep := newProxyReadingSupervisor(t, ca)
	src := newFakeSource()
	f := newEdgeFixtureConfig(t, Config{
		Source: src, Workspaces: []string{"team"}, HelloTimeout: 2 * time.Second, WithdrawGrace: -1,
		ProxyProtocol: true, Logger: slog.New(slog.DiscardHandler),
	}, ca.Pool())
	src.send(t, "team", api.ServiceRoute{Hostname: hostB, Workspace: "team", Sandbox: "b", Name: "web",
		Supervisor: "sup-p", InstallationVersion: 1, ExpiresAt: time.Now().Add(time.Hour), Endpoint: ep})

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 2 * time.Second}
	raw, err := d.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	tc := tls.Client(raw, &tls.Config{RootCAs: ca.Pool(), ServerName: "Team--B--Web.Apps.Test", MinVersion: tls.VersionTLS12})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake through the edge: %v", err)
	}
	line, err := bufio.NewReader(tc).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s %s %s %s", raw.LocalAddr(), f.addr, hostB, "Team--B--Web.Apps.Test")
	if got := strings.TrimSpace(line); got != want {
		t.Fatalf("the supervisor read %q, want %q", got, want)
	}
}

// TestEdgeWithoutProxyProtocol: with ProxyProtocol off the supervisor's
// first bytes are the ClientHello (a PROXY-reading supervisor finds none).
func TestEdgeWithoutProxyProtocol(t *testing.T) {
	testutil.VerifyNone(t)
	ca, err := tlsconf.NewAuthority("edge proxy test CA")
	if err != nil {
		t.Fatal(err)
	}
	ep := newProxyReadingSupervisor(t, ca)
	src := newFakeSource()
	f := newEdgeFixtureConfig(t, Config{
		Source: src, Workspaces: []string{"team"}, HelloTimeout: 2 * time.Second, WithdrawGrace: -1,
		Logger: slog.New(slog.DiscardHandler),
	}, ca.Pool())
	src.send(t, "team", api.ServiceRoute{Hostname: hostB, Workspace: "team", Sandbox: "b", Name: "web",
		Supervisor: "sup-p", InstallationVersion: 1, ExpiresAt: time.Now().Add(time.Hour), Endpoint: ep})
	raw, err := net.DialTimeout("tcp", f.addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	tc := tls.Client(raw, &tls.Config{RootCAs: ca.Pool(), ServerName: hostB, MinVersion: tls.VersionTLS12})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake succeeded: the supervisor found a PROXY header")
	}
}
