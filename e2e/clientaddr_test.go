package e2e

// The real client address through the edge: the edge sends a PROXY
// protocol v2 header, the supervisor takes the client address from it
// (only from the edge's address), real processes of the built binary.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/internal/proxyproto"
	"github.com/applistener/applistener/internal/testutil"
)

// Loopback sources that tell the parties apart: the edge dials supervisors
// from 127.0.0.1, the client behind the edge is 127.0.0.2, a direct
// client is 127.0.0.3.
const (
	caEdgeClient   = "127.0.0.2"
	caDirectClient = "127.0.0.3"
)

// caDialer dials to, whatever the address asked for, from the loopback
// address src.
func caDialer(src, to string) func(ctx context.Context, _, _ string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.DialContext(ctx, "tcp", to)
	}
}

// caGet does GET https://host/path over to (from src) with proto "h1" or
// "h2" and a spoofed X-Forwarded-For, and checks the status and protocol.
func caGet(t *testing.T, src, to string, pool *x509.CertPool, host, path, proto string) {
	t.Helper()
	tr := &http.Transport{
		DialContext:       caDialer(src, to),
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: host},
		DisableKeepAlives: true,
	}
	if proto == "h2" {
		tr.ForceAttemptHTTP2 = true
	} else {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	req.Header.Set("Forwarded", "for=6.6.6.6")
	resp, err := (&http.Client{Transport: tr, Timeout: waitTimeout}).Do(req)
	if err != nil {
		t.Fatalf("%s GET %s via %s: %v", proto, path, to, err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := map[string]int{"h1": 1, "h2": 2}[proto]; resp.StatusCode != http.StatusOK || resp.ProtoMajor != want {
		t.Fatalf("%s GET %s via %s: %s %d %s", proto, path, to, resp.Proto, resp.StatusCode, body)
	}
}

// caWS opens a WebSocket to host over to (from src), exchanges a message
// and closes it.
func caWS(t *testing.T, src, to string, pool *x509.CertPool, host string) {
	t.Helper()
	d := websocket.Dialer{
		NetDialContext:   caDialer(src, to),
		TLSClientConfig:  &tls.Config{RootCAs: pool, ServerName: host},
		HandshakeTimeout: waitTimeout,
	}
	c, resp, err := d.Dial("wss://"+host+"/ws", http.Header{"X-Forwarded-For": {"6.6.6.6"}})
	if err != nil {
		t.Fatalf("WebSocket via %s: %v", to, err)
	}
	_ = resp.Body.Close()
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	_ = c.SetWriteDeadline(time.Now().Add(waitTimeout))
	if err := c.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ReadMessage(); err != nil {
		t.Fatalf("WebSocket via %s: %v", to, err)
	}
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
}

// caClosed sends pre (when not nil) and then tries a TLS handshake for
// host over a connection from src to to; the listener must close it.
func caClosed(t *testing.T, src, to string, pool *x509.CertPool, host string, pre []byte) {
	t.Helper()
	raw, err := caDialer(src, to)(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	_ = raw.SetDeadline(time.Now().Add(waitTimeout))
	if pre != nil {
		if _, err := raw.Write(pre); err != nil {
			t.Fatal(err)
		}
	}
	err = tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host}).Handshake()
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("handshake from %s with preamble %q: %v; want the connection closed", src, pre, err)
	}
}

// TestClientAddressThroughEdge: client (127.0.0.2) → edge → supervisor →
// app. The app's X-Forwarded-For and Forwarded name the client, over
// HTTP/1.1, HTTP/2 and a WebSocket, and a spoofed X-Forwarded-For sent by
// the client is dropped. The supervisor requires the PROXY header from the
// edge's address (127.0.0.1) only: a direct client (127.0.0.3) is served
// with its own address as before, a PROXY header it sends closes its
// connection, and a connection from the edge's address without one is
// closed; both refusals are counted.
func TestClientAddressThroughEdge(t *testing.T) {
	pki := newSupervisorPKI(t)
	app := newBackend(t, "web")
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{"sup-1": {{"demo", map[string]int{"web": app.port}}}})
	sup := gw.startSupervisor(t, pki, "sup-1", 101, "--require-proxy-protocol", "127.0.0.1/32")
	testutil.Eventually(t, waitTimeout, "the route in discovery", func() bool { return gw.snapshot(t).route(demoHost) != nil })
	edge := gw.startEdge(t)

	check := func(uri, want string) {
		t.Helper()
		h := app.last(t, uri).Header
		if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != want {
			t.Errorf("%s: the app got X-Forwarded-For %q, want %q", uri, got, want)
		}
		if got := h.Get("Forwarded"); !strings.HasPrefix(got, "for="+want+";") {
			t.Errorf("%s: the app got Forwarded %q, want for=%s", uri, got, want)
		}
	}
	for _, proto := range []string{"h1", "h2"} {
		caGet(t, caEdgeClient, edge.appAddr, pki.pool, demoHost, "/edge-"+proto, proto)
		check("/edge-"+proto, caEdgeClient)
	}
	caWS(t, caEdgeClient, edge.appAddr, pki.pool, demoHost)
	check("/ws", caEdgeClient)

	// Direct clients are unaffected.
	for _, proto := range []string{"h1", "h2"} {
		caGet(t, caDirectClient, sup.appAddr, pki.pool, demoHost, "/direct-"+proto, proto)
		check("/direct-"+proto, caDirectClient)
	}
	caWS(t, caDirectClient, sup.appAddr, pki.pool, demoHost)
	check("/ws", caDirectClient)

	// A PROXY header from a direct client, and none from the edge's
	// address: closed and counted.
	spoof, err := (&proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort("10.9.9.9:1"),
		Destination: netip.MustParseAddrPort("10.0.0.1:8443")}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	caClosed(t, caDirectClient, sup.appAddr, pki.pool, demoHost, spoof)
	caClosed(t, "127.0.0.1", sup.appAddr, pki.pool, demoHost, nil)
	for _, reason := range []string{"proxy_untrusted", "proxy_required"} {
		name := `applistener_handshake_rejections_total{reason="` + reason + `"}`
		testutil.Eventually(t, waitTimeout, name+" counted", func() bool { return sup.metric(t, name) == 1 })
	}
	if n := sup.metric(t, `applistener_proxy_protocol_headers_total{command="proxy"}`); n != 3 {
		t.Errorf("%v PROXY headers accepted, want 3 (h1, h2, WebSocket through the edge)", n)
	}
	if n := app.count(); n != 6 {
		t.Errorf("the app received %d requests, want 6 (the refused connections reached nothing)", n)
	}
}
