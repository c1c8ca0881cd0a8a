package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// pageURLApp is a real app behind the listener that rebuilds the absolute
// URL of the page it serves from the forwarded fields, as web frameworks
// behind a proxy do (for canonical links, redirects, OAuth callbacks), by
// three frameworks' documented rules:
//
//	django  HttpRequest.build_absolute_uri with SECURE_PROXY_SSL_HEADER =
//	        ("HTTP_X_FORWARDED_PROTO", "https") and USE_X_FORWARDED_HOST:
//	        the scheme from X-Forwarded-Proto, the host (port included)
//	        from X-Forwarded-Host, else Host.
//	rack    Rack::Request#url (Rails), default forwarded priority: the
//	        authority from the last Forwarded host=, else the last
//	        X-Forwarded-Host, else Host; the scheme from Forwarded proto=,
//	        else X-Forwarded-Proto; a default port left out.
//	spring  Spring's ForwardedHeaderFilter without Forwarded: the scheme
//	        from X-Forwarded-Proto, the host from X-Forwarded-Host, whose
//	        port X-Forwarded-Port overrides; a default port left out.
//
// It answers with the three URLs and the X-Request-Id it got, as JSON.
type pageURLApp struct {
	port int
	mu   sync.Mutex
	seen []string // X-Request-Id of each request, in order
}

func newPageURLApp(t *testing.T) *pageURLApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &pageURLApp{port: ln.Addr().(*net.TCPAddr).Port}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return a
}

// loadPages loads a page from https://host:port over HTTP/1.1 and HTTP/2
// with a real client that resolves host to 127.0.0.1 (the port is the
// URL's, as any client's), checks that the app rebuilt the URL the client
// loaded by each framework's rules and that the client got back the
// X-Request-Id the app saw, and returns those ids.
func loadPages(t *testing.T, cfg *tls.Config, host, port string) []string {
	t.Helper()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	var ids []string
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		tr := &http.Transport{DialContext: dial, TLSClientConfig: cfg.Clone(), ForceAttemptHTTP2: proto == "HTTP/2.0"}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr, Timeout: waitTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		page := fmt.Sprintf("https://%s:%s/docs/page-%d?lang=en&tab=2", host, port, len(ids))
		resp, err := client.Get(page)
		if err != nil {
			t.Fatalf("%s GET %s: %v", proto, page, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Proto != proto {
			t.Fatalf("%s GET %s: %d over %s: %s", proto, page, resp.StatusCode, resp.Proto, body)
		}
		var got map[string]string
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("app answer %q: %v", body, err)
		}
		for _, fw := range []string{"django", "rack", "spring"} {
			if got[fw] != page {
				t.Errorf("%s: the app rebuilt %s by %s's rules; the client loaded %s", proto, got[fw], fw, page)
			}
		}
		if id := resp.Header.Get("X-Request-Id"); len(id) != 32 || id != got["request_id"] {
			t.Errorf("%s: X-Request-Id %q returned, the app saw %q", proto, id, got["request_id"])
		}
		ids = append(ids, got["request_id"])
	}
	return ids
}

func (a *pageURLApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-Id")
	a.mu.Lock()
	a.seen = append(a.seen, id)
	a.mu.Unlock()
	full := r.URL.RequestURI()
	out := map[string]string{
		"django":     djangoURL(r.Header, r.Host, full),
		"rack":       rackURL(r.Header, r.Host, full),
		"spring":     springURL(r.Header, r.Host, full),
		"request_id": id,
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func djangoURL(h http.Header, host, full string) string {
	scheme := "http"
	if v := h.Get("X-Forwarded-Proto"); v != "" {
		first, _, _ := strings.Cut(v, ",")
		if strings.TrimSpace(first) == "https" {
			scheme = "https"
		}
	}
	if v := h.Get("X-Forwarded-Host"); v != "" {
		host = v
	}
	return scheme + "://" + host + full
}

// lastListElement is the last element of a comma-separated field.
func lastListElement(h http.Header, name string) string {
	vs := h.Values(name)
	if len(vs) == 0 {
		return ""
	}
	parts := strings.Split(vs[len(vs)-1], ",")
	return strings.TrimSpace(parts[len(parts)-1])
}

// forwardedParam is param of the last Forwarded element, unquoted.
func forwardedParam(h http.Header, param string) string {
	for _, pair := range strings.Split(lastListElement(h, "Forwarded"), ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, param) {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func withoutDefaultPort(scheme, authority string) string {
	if host, port, err := net.SplitHostPort(authority); err == nil &&
		((scheme == "https" && port == "443") || (scheme == "http" && port == "80")) {
		return host
	}
	return authority
}

func rackURL(h http.Header, host, full string) string {
	authority := forwardedParam(h, "host")
	if authority == "" {
		authority = lastListElement(h, "X-Forwarded-Host")
	}
	if authority == "" {
		authority = host
	}
	scheme := forwardedParam(h, "proto")
	if scheme == "" {
		scheme = lastListElement(h, "X-Forwarded-Proto")
	}
	if scheme == "" {
		scheme = "http"
	}
	return scheme + "://" + withoutDefaultPort(scheme, authority) + full
}

func springURL(h http.Header, host, full string) string {
	scheme := h.Get("X-Forwarded-Proto")
	if scheme == "" {
		scheme = "http"
	}
	authority := host
	if v := h.Get("X-Forwarded-Host"); v != "" {
		authority = strings.TrimSpace(strings.Split(v, ",")[0])
	}
	if p := h.Get("X-Forwarded-Port"); p != "" {
		name := authority
		if hn, _, err := net.SplitHostPort(authority); err == nil {
			name = hn
		}
		authority = net.JoinHostPort(name, p)
	}
	return scheme + "://" + withoutDefaultPort(scheme, authority) + full
}

// TestForwardedPortPageURL is issue 30's test 5: an app behind the
// listener on a port other than 443 rebuilds the URL of the page the
// client loaded, by Django's, Rack's and Spring's rules, over HTTP/1.1 and
// HTTP/2 from a real client that resolves the name to the listener and
// names the port as any client does; a client that names no port (443)
// gets URLs without one. Each answer carries the X-Request-Id the app
// saw, and the access-log record of each request carries it too.
func TestForwardedPortPageURL(t *testing.T) {
	t.Parallel()
	app := newPageURLApp(t)
	p := startProc(t, routesDoc(service{Name: "web", Port: app.port, Revision: 1}), "--access-log", "json")
	_, port, err := net.SplitHostPort(p.appAddr)
	if err != nil {
		t.Fatal(err)
	}
	if port == "443" {
		t.Fatalf("the listener is on 443: the test needs another port")
	}
	ids := loadPages(t, tlsConfig(hostWeb), hostWeb, port)

	// A client that names no port in Host (it used 443, as far as it says).
	rc := p.raw(t, hostWeb)
	resp, body := rc.roundTrip(t, "GET /docs/default?x=1 HTTP/1.1\r\nHost: "+hostWeb+"\r\n\r\n")
	var got map[string]string
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil {
		t.Fatalf("no port: %d %q", resp.StatusCode, body)
	}
	want := "https://" + hostWeb + "/docs/default?x=1"
	for _, fw := range []string{"django", "rack", "spring"} {
		if got[fw] != want {
			t.Errorf("no port: the app rebuilt %s by %s's rules, want %s", got[fw], fw, want)
		}
	}
	ids = append(ids, got["request_id"])

	// Every request's access-log record carries the id the app saw.
	app.mu.Lock()
	seen := append([]string(nil), app.seen...)
	app.mu.Unlock()
	if strings.Join(seen, ",") != strings.Join(ids, ",") {
		t.Errorf("the app saw ids %q, the clients got %q", seen, ids)
	}
	for i, id := range ids {
		if len(id) != 32 {
			t.Errorf("request %d: id %q, want 32 hex digits", i, id)
		}
		testutil.Eventually(t, waitTimeout, "the access-log record with request_id "+id, func() bool {
			return len(accessLines(t, p, "request_id", id)) == 1
		})
	}
	if n := len(accessLines(t, p, "msg", "access")); n != len(ids) {
		t.Errorf("%d access-log records for %d requests", n, len(ids))
	}
}

// TestForwardedPortPageURLThroughEdge: behind applistener edge (PROXY v2
// to a supervisor listening on a port of its own), the app rebuilds the
// URL with the edge's port, the one the client used, over HTTP/1.1 and
// HTTP/2: the public port comes from what the client named, not from the
// supervisor's socket.
func TestForwardedPortPageURLThroughEdge(t *testing.T) {
	pki := newSupervisorPKI(t)
	app := newPageURLApp(t)
	gw := newDiscoveryGateway(t, map[string][]discoveryInstance{"sup-1": {{"demo", map[string]int{"web": app.port}}}})
	sup := gw.startSupervisor(t, pki, "sup-1", 101, "--require-proxy-protocol", "127.0.0.1/32")
	testutil.Eventually(t, waitTimeout, "the route in discovery", func() bool { return gw.snapshot(t).route(demoHost) != nil })
	edge := gw.startEdge(t)
	_, edgePort, err := net.SplitHostPort(edge.appAddr)
	if err != nil {
		t.Fatal(err)
	}
	if _, supPort, _ := net.SplitHostPort(sup.appAddr); supPort == edgePort {
		t.Fatalf("the edge and the supervisor share port %s: the test needs two", edgePort)
	}
	ids := loadPages(t, &tls.Config{RootCAs: pki.pool, ServerName: demoHost}, demoHost, edgePort)
	app.mu.Lock()
	defer app.mu.Unlock()
	if strings.Join(app.seen, ",") != strings.Join(ids, ",") {
		t.Errorf("the app saw ids %q, the client got %q", app.seen, ids)
	}
}
