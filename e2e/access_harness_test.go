package e2e

// The harness of the access policy tests (issue 26, the contract in
// DESIGN.md "Access policy"): a keys file and token minting, an app that
// records everything it receives so that a test can show it never saw a
// credential, a routes document with access policies, and a listener
// started with --access-keys-file.

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
	"github.com/gorilla/websocket"
)

// Names of the access credentials (the contract).
const (
	tokenHeader = "X-Applistener-Token"
	tokenCookie = "__Host-applistener-token"
	tokenQuery  = "_al_token"
	userHeader  = "X-Forwarded-User"
)

// ---------------------------------------------------------------------------
// keys and tokens

// accessKeys is a keys file on disk and the key set it holds, for minting.
type accessKeys struct {
	path string
	keys map[string]accesstoken.Key // by id
}

// newAccessKeys makes one random key per id and writes them as the keys
// file dir/keys.json.
func newAccessKeys(t testing.TB, dir string, ids ...string) *accessKeys {
	t.Helper()
	k := &accessKeys{path: filepath.Join(dir, "keys.json"), keys: map[string]accesstoken.Key{}}
	for _, id := range ids {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			t.Fatal(err)
		}
		k.keys[id] = accesstoken.Key{ID: id, Secret: secret}
	}
	k.write(t, ids...)
	return k
}

// write writes the keys file with the keys of ids (all known to k).
func (k *accessKeys) write(t testing.TB, ids ...string) {
	t.Helper()
	type fileKey struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	var f struct {
		Keys []fileKey `json:"keys"`
	}
	f.Keys = []fileKey{}
	for _, id := range ids {
		key, ok := k.keys[id]
		if !ok {
			t.Fatalf("key %q unknown", id)
		}
		f.Keys = append(f.Keys, fileKey{ID: id, Secret: base64.StdEncoding.EncodeToString(key.Secret)})
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	// The keys file is a Secret: private to its owner.
	writeAtomic(t, k.path, data)
	if err := os.Chmod(k.path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tokenSpec is what a test token opens and how it is signed.
type tokenSpec struct {
	keyID      string // "": k1
	workspace  string // "": team
	sandbox    string
	service    string // "" with allServices unset: the unnamed service
	all        bool   // every service of the sandbox
	subject    string
	generation uint64
	issued     time.Time     // zero: now
	ttl        time.Duration // 0: one hour
}

// mint signs a token with the key of spec.keyID, which need not be in the
// keys file (an unknown key id).
func (k *accessKeys) mint(t testing.TB, spec tokenSpec) string {
	t.Helper()
	if spec.keyID == "" {
		spec.keyID = "k1"
	}
	key, ok := k.keys[spec.keyID]
	if !ok {
		key = accesstoken.Key{ID: spec.keyID, Secret: bytes.Repeat([]byte{'u'}, 32)}
	}
	ks, err := accesstoken.NewKeySet(key)
	if err != nil {
		t.Fatal(err)
	}
	issued := spec.issued
	if issued.IsZero() {
		issued = time.Now()
	}
	ttl := spec.ttl
	if ttl == 0 {
		ttl = time.Hour
	}
	tok, err := ks.Mint(spec.keyID, accesstoken.Claims{
		Workspace: cmpOr(spec.workspace, "team"), Sandbox: spec.sandbox,
		Service: spec.service, AllServices: spec.all, Subject: spec.subject,
		Generation: spec.generation, IssuedAt: issued, Expires: issued.Add(ttl),
	})
	if err != nil {
		t.Fatalf("minting %+v: %v", spec, err)
	}
	return tok
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ---------------------------------------------------------------------------
// the recording app

// accessApp is an app on loopback that records every request it receives
// (method, URI, headers) and serves:
//
//	/ws      a WebSocket echo
//	/api     a JSON answer naming the app, the method, the subject it saw
//	         (X-Forwarded-User) and the body it got
//	/stream  a response that sends one event and then stays open, as an
//	         HMR or server-sent-events stream does, until the client or the
//	         app goes
//	/login   a login page (the policy's login_url points here)
//	else     an HTML page saying "hello from NAME"
type accessApp struct {
	name string
	srv  *httptest.Server
	port int

	mu   sync.Mutex
	reqs []*recorded
	ws   wsEchoes
	stop chan struct{} // closed when the app closes: ends /stream
}

func newAccessApp(t testing.TB, name string) *accessApp {
	t.Helper()
	a := &accessApp{name: name, stop: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serveHTTP))
	a.port = a.srv.Listener.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		close(a.stop)
		a.ws.closeAll()
		a.srv.CloseClientConnections()
		a.srv.Close()
		a.ws.wg.Wait()
	})
	return a
}

func (a *accessApp) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rec := &recorded{
		Method: r.Method, URI: r.RequestURI, Host: r.Host, Proto: r.Proto,
		Header: r.Header.Clone(), ContentLength: r.ContentLength, Body: body, BodyErr: err,
	}
	a.mu.Lock()
	a.reqs = append(a.reqs, rec)
	a.mu.Unlock()
	switch r.URL.Path {
	case "/ws":
		a.serveWS(w, r)
	case "/api":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{
			"app": a.name, "method": r.Method, "user": r.Header.Get(userHeader), "body": string(body),
		})
	case "/stream":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = io.WriteString(w, "data: hello\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-a.stop:
		}
	case "/login":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>login</title><p>please log in</p>")
	default:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, "<!doctype html><title>%s</title><p>hello from %s</p>", a.name, a.name)
	}
}

// appSubprotocol is the WebSocket subprotocol the app speaks when the
// client offers it, as Vite's HMR server does with "vite-hmr".
const appSubprotocol = "vite-hmr"

// serveWS is a WebSocket echo that selects appSubprotocol when offered.
func (a *accessApp) serveWS(w http.ResponseWriter, r *http.Request) {
	var h http.Header
	for _, p := range websocket.Subprotocols(r) {
		if p == appSubprotocol {
			h = http.Header{"Sec-Websocket-Protocol": {p}}
		}
	}
	c, err := wsUpgrader.Upgrade(w, r, h)
	if err != nil {
		return
	}
	a.ws.track(c)
}

// requests returns a copy of what the app received so far.
func (a *accessApp) requests() []*recorded {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*recorded(nil), a.reqs...)
}

// requestsSince returns the requests after the first n, but for the
// browser's own /favicon.ico (it may come late from an earlier page).
func (a *accessApp) requestsSince(n int) []*recorded {
	var out []*recorded
	for _, r := range a.requests()[n:] {
		if r.URI != "/favicon.ico" {
			out = append(out, r)
		}
	}
	return out
}

// received returns the requests whose path (URI without query) is path.
func (a *accessApp) received(path string) []*recorded {
	var out []*recorded
	for _, r := range a.requests() {
		if p, _, _ := strings.Cut(r.URI, "?"); p == path {
			out = append(out, r)
		}
	}
	return out
}

// waitReceived waits until the app has received a request for path and
// returns the last one.
func (a *accessApp) waitReceived(t testing.TB, path string) *recorded {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "app "+a.name+" to receive "+path, func() bool {
		return len(a.received(path)) > 0
	})
	got := a.received(path)
	return got[len(got)-1]
}

// neverSawCredentials fails the test if any request the app received
// carried one of tokens (anywhere in its URI or a header value), a
// credential header, the listener's cookie or the query parameter.
func (a *accessApp) neverSawCredentials(t testing.TB, tokens ...string) {
	t.Helper()
	for _, r := range a.requests() {
		where := fmt.Sprintf("app %s, %s %s", a.name, r.Method, r.URI)
		if strings.Contains(r.URI, tokenQuery) {
			t.Errorf("%s: the URI carries %s", where, tokenQuery)
		}
		if r.Header.Get(tokenHeader) != "" {
			t.Errorf("%s: the app saw the header %s", where, tokenHeader)
		}
		for _, c := range r.Header.Values("Cookie") {
			if strings.Contains(c, tokenCookie) {
				t.Errorf("%s: the app saw the cookie %s", where, tokenCookie)
			}
		}
		for _, p := range r.Header.Values("Sec-Websocket-Protocol") {
			if strings.Contains(p, "applistener.token.") {
				t.Errorf("%s: the app saw the token subprotocol", where)
			}
		}
		for _, tok := range tokens {
			if strings.Contains(r.URI, tok) {
				t.Errorf("%s: the token is in the URI", where)
			}
			for name, vs := range r.Header {
				for _, v := range vs {
					if strings.Contains(v, tok) {
						t.Errorf("%s: the token is in the header %s", where, name)
					}
				}
			}
		}
	}
}

// neverLogged fails the test if the listener's output (its logs, the
// access log) contains one of tokens, or the MAC that ends it.
func (p *proc) neverLogged(t testing.TB, tokens ...string) {
	t.Helper()
	out := p.output()
	for _, tok := range tokens {
		mac := tok[strings.LastIndexByte(tok, '.')+1:]
		if strings.Contains(out, tok) || len(mac) >= 16 && strings.Contains(out, mac) {
			t.Errorf("the listener logged a token (%.12s...)", tok)
		}
	}
}

// ---------------------------------------------------------------------------
// routes documents with access policies

// accessService is one service of privateRoutesDoc.
type accessService struct {
	name     string
	port     int
	protocol string         // "": http1
	access   map[string]any // nil: public (no "access")
}

// accessSandbox is one instance of privateRoutesDoc.
type accessSandbox struct {
	sandbox  string
	services []accessService
}

// privateRoutesDoc is a routes document of team/<sandbox> instances under a fresh
// revision, and that revision.
func privateRoutesDoc(sbs ...accessSandbox) ([]byte, string) {
	rev := fmt.Sprintf("r%d", revCounter.Add(1))
	var list []any
	for _, sb := range sbs {
		var svcs []any
		for _, s := range sb.services {
			m := map[string]any{"name": s.name, "port": s.port, "revision": 1}
			if s.protocol != "" {
				m["protocol"] = s.protocol
			}
			if s.access != nil {
				m["access"] = s.access
			}
			svcs = append(svcs, m)
		}
		list = append(list, map[string]any{
			"workspace": "team", "sandbox": sb.sandbox, "generation": "1",
			"connector": map[string]any{"type": "tcp", "host": "127.0.0.1"},
			"services":  svcs,
		})
	}
	b, err := json.Marshal(map[string]any{"revision": rev, "instances": list})
	if err != nil {
		panic(err)
	}
	return b, rev
}

// tokenPolicy is an access policy of mode token.
func tokenPolicy(generation int, loginURL string, origins ...string) map[string]any {
	m := map[string]any{"mode": "token", "generation": generation}
	if loginURL != "" {
		m["login_url"] = loginURL
	}
	if len(origins) > 0 {
		m["cors_origins"] = origins
	}
	return m
}

// accessHost is the public hostname of team/<sandbox>/<service>.
func accessHost(sandbox, service string) string {
	return routes.Hostname("team", sandbox, service, domain)
}

// startAccessProc starts the listener on doc with the keys file, JSON logs
// and the JSON access log, plus extra flags.
func startAccessProc(t testing.TB, doc []byte, keys *accessKeys, extra ...string) *proc {
	t.Helper()
	args := append([]string{"--access-keys-file", keys.path, "--access-log", "json"}, extra...)
	return startProc(t, doc, args...)
}

// port is the listener's app port.
func (p *proc) port(t testing.TB) string {
	t.Helper()
	_, port, err := net.SplitHostPort(p.appAddr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// origin is https://host:port of the listener.
func (p *proc) origin(t testing.TB, host string) string {
	return "https://" + host + ":" + p.port(t)
}

// applyRoutes writes doc and waits until the listener logs that it applied
// revision rev, with no instance rejected.
func (p *proc) applyRoutes(t testing.TB, doc []byte, rev string) {
	t.Helper()
	p.writeRoutes(t, doc)
	var applied map[string]any
	testutil.Eventually(t, waitTimeout, "the listener to apply routes revision "+rev, func() bool {
		for _, l := range logLines(t, p, "routes file applied") {
			if l["revision"] == rev {
				applied = l
				return true
			}
		}
		return false
	})
	if n, _ := applied["rejected"].(float64); n != 0 {
		t.Fatalf("routes revision %s: %v instances rejected:\n%s", rev, n, grepLines(p.output(), "instance rejected"))
	}
}

// logLines returns the listener's JSON log lines whose msg is msg.
func logLines(t testing.TB, p *proc, msg string) []map[string]any {
	t.Helper()
	return logLinesIn(p.output(), msg)
}

// logLinesIn returns the JSON log lines of output whose msg is msg.
func logLinesIn(output, msg string) []map[string]any {
	var out []map[string]any
	needle := `"msg":` + strconv.Quote(msg)
	for _, line := range strings.Split(output, "\n") {
		if !strings.Contains(line, needle) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			continue // a line cut by a concurrent write: the next poll sees it whole
		}
		out = append(out, m)
	}
	return out
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ---------------------------------------------------------------------------
// Go clients

// protoCase is one client protocol of the listener.
type protoCase struct {
	name  string // "h2" or "http/1.1", as Chromium reports it
	h2    bool
	flags []string // the listener's flags to offer only this protocol to browsers
}

var accessProtocols = []protoCase{
	{name: "h2", h2: true},
	{name: "http/1.1", flags: []string{"--app-http2=false"}},
}

// httpClient returns a client whose connections go to the listener with
// the SNI of each request's host, over HTTP/2 or HTTP/1.1 only, and that
// does not follow redirects.
func (p *proc) httpClient(t testing.TB, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext:           p.dial,
		TLSClientConfig:       tlsConfig(""),
		ResponseHeaderTimeout: waitTimeout,
		DisableCompression:    true,
	}
	tr.TLSClientConfig.ServerName = ""
	if h2 {
		tr.ForceAttemptHTTP2 = true
		var ps http.Protocols
		ps.SetHTTP2(true)
		tr.Protocols = &ps
	} else {
		var ps http.Protocols
		ps.SetHTTP1(true)
		tr.Protocols = &ps
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends req and returns the response with its body read, checking the
// protocol it went over.
func doRequest(t testing.TB, c *http.Client, req *http.Request, h2 bool) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	if want := map[bool]int{true: 2, false: 1}[h2]; resp.ProtoMajor != want {
		t.Fatalf("%s %s went over %s; want HTTP/%d", req.Method, req.URL, resp.Proto, want)
	}
	return resp, string(body)
}

// newRequest is http.NewRequest that fails the test on errors, with
// headers given as name, value pairs.
func newRequest(t testing.TB, method, url string, body string, headers ...string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// expectJSONError checks a denial: status, application/json and the body
// {"error":want}.
func expectJSONError(t testing.TB, what string, resp *http.Response, body string, status int, want string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("%s: status %d (body %.200q); want %d", what, resp.StatusCode, body, status)
		return
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q; want application/json", what, ct)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil || m["error"] != want {
		t.Errorf("%s: body %.200q; want {\"error\":%q}", what, body, want)
	}
	if status == http.StatusUnauthorized {
		if got := resp.Header.Get("WWW-Authenticate"); got != `Bearer realm="applistener"` {
			t.Errorf("%s: WWW-Authenticate %q; want Bearer realm=\"applistener\"", what, got)
		}
	}
}
