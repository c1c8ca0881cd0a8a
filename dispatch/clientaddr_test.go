package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/proxyproto"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/listener"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// The real client behind a trusted TCP proxy, as its PROXY header says.
const proxiedClient = "203.0.113.7"

// caEnv is the real listener (listener.New, PROXY protocol step included)
// in front of a Server, with an app that reports the forwarding headers it
// received, over plain requests and a WebSocket.
type caEnv struct {
	addr   string
	ca     *tlsconf.Authority
	logMu  sync.Mutex
	logBuf bytes.Buffer
}

func (e *caEnv) Write(b []byte) (int, error) {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.logBuf.Write(b)
}

func (e *caEnv) accessLog() string {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.logBuf.String()
}

// forwardingHeaders is what the app reports.
type forwardingHeaders struct {
	XFF       []string `json:"X-Forwarded-For"`
	Forwarded []string `json:"Forwarded"`
	Proto     string   `json:"Proto"`
}

// caApp answers /headers with the forwarding headers as JSON and upgrades
// /ws, sending them as its first WebSocket message.
func caApp(t *testing.T) *httptest.Server {
	up := websocket.Upgrader{}
	report := func(r *http.Request) []byte {
		b, _ := json.Marshal(forwardingHeaders{XFF: r.Header.Values("X-Forwarded-For"), Forwarded: r.Header.Values("Forwarded"), Proto: r.Proto})
		return b
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			_ = c.WriteMessage(websocket.TextMessage, report(r))
			_, _, _ = c.ReadMessage() // until the client closes
			return
		}
		_, _ = w.Write(report(r))
	}))
	t.Cleanup(app.Close)
	return app
}

func newCAEnv(t *testing.T, trusted, required []netip.Prefix) *caEnv {
	t.Helper()
	h2Verify(t)
	e := &caEnv{}
	ca, cert := wildcardAuthority(t, "client address test CA")
	e.ca = ca
	app := caApp(t)
	discard := slog.New(slog.DiscardHandler)
	table := routes.NewTable(routes.Options{Domain: h2Domain, Freshness: time.Hour, Logger: discard})
	t.Cleanup(table.Close)
	doc, err := routes.ParseDocument(fmt.Appendf(nil, `{"revision":"r","instances":[{"workspace":"team","sandbox":"demo","generation":"1",
		"services":[{"name":"web","port":%d,"revision":1}]}]}`, app.Listener.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(doc)
	srv := New(Config{TrustedProxies: trusted, AccessLog: AccessLogText, AccessLogWriter: e, AccessLogRate: -1, Logger: discard})
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = tcpLn.Addr().String()
	lis := listener.New(tcpLn, listener.Config{
		TLS:                &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		Routes:             table,
		Handler:            srv,
		HandshakeTimeout:   5 * time.Second,
		TrustedProxies:     trusted,
		RequireProxyHeader: required,
		Logger:             discard,
	})
	served := make(chan error, 1)
	go func() { served <- lis.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lis.Shutdown(ctx); err != nil {
			t.Errorf("listener shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return e
}

// dial connects from 127.0.0.1 and, when hdr is not nil, sends it first
// (what a TCP proxy in front of the listener does).
func (e *caEnv) dial(ctx context.Context, hdr *proxyproto.Header) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", e.addr)
	if err != nil || hdr == nil {
		return c, err
	}
	b, err := hdr.Append(nil)
	if err == nil {
		_, err = c.Write(b)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (e *caEnv) tlsConfig(protos ...string) *tls.Config {
	return &tls.Config{ServerName: h2WebHost, RootCAs: e.ca.Pool(), NextProtos: protos}
}

// get asks the app for the headers it received over h1 or h2.
func (e *caEnv) get(t *testing.T, proto string, hdr *proxyproto.Header, extra http.Header) forwardingHeaders {
	t.Helper()
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return e.dial(ctx, hdr) },
		TLSClientConfig: e.tlsConfig(),
	}
	if proto == "h2" {
		tr.ForceAttemptHTTP2 = true
	} else {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+h2WebHost+"/headers", nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s GET: %v", proto, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	want := map[string]string{"h1": "HTTP/1.1", "h2": "HTTP/2.0"}[proto]
	if resp.StatusCode != 200 || resp.Proto != want {
		t.Fatalf("%s GET: %s %d %s", proto, resp.Proto, resp.StatusCode, body)
	}
	var fh forwardingHeaders
	if err := json.Unmarshal(body, &fh); err != nil {
		t.Fatalf("app answer %q: %v", body, err)
	}
	return fh
}

// ws opens a WebSocket and returns the headers its upgrade request carried.
func (e *caEnv) ws(t *testing.T, hdr *proxyproto.Header, extra http.Header) forwardingHeaders {
	t.Helper()
	d := websocket.Dialer{
		NetDialContext:   func(ctx context.Context, _, _ string) (net.Conn, error) { return e.dial(ctx, hdr) },
		TLSClientConfig:  e.tlsConfig("http/1.1"),
		HandshakeTimeout: 10 * time.Second,
	}
	c, resp, err := d.Dial("wss://"+h2WebHost+"/ws", extra)
	if err != nil {
		t.Fatalf("WebSocket dial: %v", err)
	}
	_ = resp.Body.Close()
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("WebSocket read: %v", err)
	}
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	var fh forwardingHeaders
	if err := json.Unmarshal(msg, &fh); err != nil {
		t.Fatalf("app message %q: %v", msg, err)
	}
	return fh
}

// wsH2 opens a WebSocket over HTTP/2 (extended CONNECT) and returns the
// headers the app's upgrade request carried.
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func (e *caEnv) wsH2(t *testing.T, hdr *proxyproto.Header, extra http.Header) forwardingHeaders {
	t.Helper()
	raw, err := e.dial(context.Background(), hdr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, e.tlsConfig("h2"))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc) //nolint:staticcheck // SA1019: see above.
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "https://"+h2WebHost+"/ws", pr)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	req.Header[":protocol"] = []string{"websocket"}
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		_ = pw.Close()
		t.Fatalf("extended CONNECT: %v %v", resp, err)
	}
	c := &h2wsClient{resp: resp, w: pw, r: bufio.NewReader(resp.Body)}
	defer c.close()
	op, msg, err := c.recv()
	if err != nil || op != websocket.TextMessage {
		t.Fatalf("WebSocket over HTTP/2: op %d, %q, %v", op, msg, err)
	}
	var fh forwardingHeaders
	if err := json.Unmarshal(msg, &fh); err != nil {
		t.Fatalf("app message %q: %v", msg, err)
	}
	return fh
}

// TestProxyHeaderClientAddress: behind a trusted TCP proxy (127.0.0.1
// sending a PROXY v2 header), the app sees the header's client address in
// X-Forwarded-For and Forwarded, over HTTP/1.1, HTTP/2 and WebSockets over
// both, and so does the access log. The client's own X-Forwarded-For passes a TCP
// proxy untouched, so it is dropped: the client is not a trusted proxy. A
// LOCAL header keeps the proxy's own address, and a trusted peer without a
// header is served as before (its forwarding headers kept).
func TestProxyHeaderClientAddress(t *testing.T) {
	e := newCAEnv(t, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)
	viaProxy := &proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort(proxiedClient + ":40000"),
		Destination: netip.MustParseAddrPort("10.0.0.1:443"), Authority: h2WebHost}
	spoof := http.Header{"X-Forwarded-For": {"6.6.6.6"}, "Forwarded": {"for=6.6.6.6"}}
	check := func(what string, fh forwardingHeaders, wantXFF, wantFwd string) {
		t.Helper()
		if len(fh.XFF) != 1 || fh.XFF[0] != wantXFF {
			t.Errorf("%s: the app got X-Forwarded-For %q, want %q", what, fh.XFF, wantXFF)
		}
		if len(fh.Forwarded) != 1 || !strings.HasPrefix(fh.Forwarded[0], wantFwd) {
			t.Errorf("%s: the app got Forwarded %q, want it to start with %q", what, fh.Forwarded, wantFwd)
		}
	}
	for _, proto := range []string{"h1", "h2"} {
		check(proto+" via the proxy", e.get(t, proto, viaProxy, spoof), proxiedClient, "for="+proxiedClient)
	}
	check("WebSocket via the proxy", e.ws(t, viaProxy, spoof), proxiedClient, "for="+proxiedClient)
	check("WebSocket over HTTP/2 via the proxy", e.wsH2(t, viaProxy, spoof), proxiedClient, "for="+proxiedClient)

	testutil.Eventually(t, 5*time.Second, "four access-log lines with the proxied client", func() bool {
		return strings.Count(e.accessLog(), "client="+proxiedClient) == 4
	})
	if strings.Contains(e.accessLog(), "client=127.0.0.1") {
		t.Errorf("the access log names the proxy instead of the client:\n%s", e.accessLog())
	}

	local := &proxyproto.Header{Command: proxyproto.Local}
	check("h1 with a LOCAL header", e.get(t, "h1", local, nil), "127.0.0.1", "for=127.0.0.1")
	// A trusted peer without a header is an HTTP-level proxy: its
	// forwarding headers are kept, its address appended.
	check("h2 from the trusted peer without a header", e.get(t, "h2", nil, spoof), "6.6.6.6, 127.0.0.1", "for=6.6.6.6")
}

// TestDirectClientsUnaffected: with no trusted proxies, a direct client is
// served with its own address, and a PROXY header it sends is refused
// before anything reaches the app.
func TestDirectClientsUnaffected(t *testing.T) {
	e := newCAEnv(t, nil, nil)
	for _, proto := range []string{"h1", "h2"} {
		fh := e.get(t, proto, nil, http.Header{"X-Forwarded-For": {"6.6.6.6"}})
		if len(fh.XFF) != 1 || fh.XFF[0] != "127.0.0.1" {
			t.Errorf("%s: X-Forwarded-For %q, want the client's own 127.0.0.1", proto, fh.XFF)
		}
	}
	if fh := e.ws(t, nil, nil); len(fh.XFF) != 1 || fh.XFF[0] != "127.0.0.1" {
		t.Errorf("WebSocket: X-Forwarded-For %q, want 127.0.0.1", fh.XFF)
	}
	if fh := e.wsH2(t, nil, nil); len(fh.XFF) != 1 || fh.XFF[0] != "127.0.0.1" {
		t.Errorf("WebSocket over HTTP/2: X-Forwarded-For %q, want 127.0.0.1", fh.XFF)
	}
	hdr := &proxyproto.Header{Command: proxyproto.Proxy, Source: netip.MustParseAddrPort(proxiedClient + ":1"), Destination: netip.MustParseAddrPort("10.0.0.1:443")}
	c, err := e.dial(context.Background(), hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	tc := tls.Client(c, e.tlsConfig())
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("a handshake after a PROXY header from an untrusted peer succeeded")
	}
}
