package e2e

// End to end: a sandbox with a 36-character UUID id, served through the
// listener, the gateway's discovery and the edge, on HTTP/1.1 and HTTP/2,
// under the hashed hostname of the service whose readable label does not
// fit (README "Long names").

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

const (
	longUUID    = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	longService = "jupyter-lab-notebook"
	// longHashed is Hostname("team", longUUID, longService, "apps.test"):
	// the readable label team--<uuid>--jupyter-lab-notebook has 64
	// characters, one more than a DNS label holds.
	longHashed   = "h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq." + domain
	longReadable = "team--" + longUUID + "--" + longService + "." + domain // too long: never a route
	longWeb      = "team--" + longUUID + "--web." + domain                 // fits: stays readable
)

// longGet sends GET / to addr with TLS server name sni and Host host over
// HTTP/1.1 or (h2) HTTP/2 on a new connection, verifying the certificate
// for sni, and returns the status, the protocol and the body.
func longGet(addr string, pool *x509.CertPool, sni, host string, h2 bool) (int, string, string, error) {
	cfg := &tls.Config{RootCAs: pool, ServerName: sni, NextProtos: []string{"http/1.1"}}
	if h2 {
		cfg.NextProtos = []string{"h2"}
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig:   cfg,
		ForceAttemptHTTP2: h2,
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+sni+"/", nil)
	if err != nil {
		return 0, "", "", err
	}
	req.Host = host
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Proto, strings.TrimSpace(string(b)), err
}

func TestLongSandboxIDEndToEnd(t *testing.T) {
	pki := newSupervisorPKI(t)
	notebook, web := newBackend(t, "notebook"), newBackend(t, "web")
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{
		"sup-1": {{longUUID, map[string]int{longService: notebook.port, "web": web.port}}},
	})
	sup := gw.startSupervisor(t, pki, "sup-1", 101)

	// Discovery publishes the hashed hostname beside the readable names.
	var snap *discoverySnapshot
	testutil.Eventually(t, waitTimeout, "the UUID sandbox's routes in discovery", func() bool {
		snap = gw.snapshot(t)
		return snap.route(longHashed) != nil && snap.route(longWeb) != nil
	})
	if r := snap.route(longHashed); r.Workspace != "team" || r.Sandbox != longUUID || r.Name != longService || r.Supervisor != "sup-1" {
		t.Fatalf("hashed route %+v", r)
	}
	if len(snap.Routes) != 2 || snap.route(longReadable) != nil {
		t.Fatalf("snapshot %+v: want exactly the hashed and the web route", snap.Routes)
	}
	// `routes get` lists it with its sandbox and service; `routes hostname`
	// computes the same name from the names.
	out, errOut, code := runCommandOnce(t, "routes", "get", "--gateway", gw.url(), "--gateway-token-file", teamTokenFile(t), "--workspace", "team")
	if code != 0 || !strings.Contains(out, longHashed+"  ") || !strings.Contains(out, longUUID) || !strings.Contains(out, longService) {
		t.Fatalf("routes get: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Logf("routes get:\n%s", out)
	out, errOut, code = runCommandOnce(t, "routes", "hostname", "--app-domain", domain, "--workspace", "team", "--sandbox", longUUID, "--service", longService)
	if code != 0 || out != longHashed+"\n" {
		t.Fatalf("routes hostname: exit %d %q %q", code, out, errOut)
	}

	edge := gw.startEdge(t)
	for _, via := range []struct{ name, addr string }{{"listener", sup.appAddr}, {"edge", edge.appAddr}} {
		for _, h2 := range []bool{false, true} {
			proto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
			what := proto + " through the " + via.name
			before := len(notebook.requests())
			// The hashed name reaches the notebook app, which sees it as
			// the public host.
			status, gotProto, body, err := longGet(via.addr, pki.pool, longHashed, longHashed, h2)
			if err != nil || status != http.StatusOK || gotProto != proto || body != "hello from notebook" {
				t.Fatalf("%s: GET https://%s/: %d %s %q %v", what, longHashed, status, gotProto, body, err)
			}
			reqs := notebook.requests()
			if len(reqs) != before+1 || reqs[len(reqs)-1].Header.Get("X-Forwarded-Host") != longHashed {
				t.Fatalf("%s: the app saw %d new requests, last X-Forwarded-Host %q", what, len(reqs)-before, reqs[len(reqs)-1].Header.Get("X-Forwarded-Host"))
			}
			// The same sandbox's short service stays readable.
			if status, _, body, err := longGet(via.addr, pki.pool, longWeb, longWeb, h2); err != nil || status != http.StatusOK || body != "hello from web" {
				t.Fatalf("%s: GET https://%s/: %d %q %v", what, longWeb, status, body, err)
			}
			// Domain fronting with the readable-but-too-long name on the
			// hashed name's connection: 421, the app sees nothing.
			status, _, body, err = longGet(via.addr, pki.pool, longHashed, longReadable, h2)
			if err != nil || status != http.StatusMisdirectedRequest {
				t.Fatalf("%s: SNI %s with Host %s: %d %q %v; want 421", what, longHashed, longReadable, status, body, err)
			}
			if n := len(notebook.requests()); n != before+1 {
				t.Fatalf("%s: the misdirected request reached the app", what)
			}
			// The readable-but-too-long name is not a route: no handshake.
			if _, _, _, err := longGet(via.addr, pki.pool, longReadable, longReadable, h2); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
				t.Fatalf("%s: SNI %s: %v; want the alert unrecognized_name", what, longReadable, err)
			}
		}
	}
}
