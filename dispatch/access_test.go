package dispatch

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
	"github.com/applistener/applistener/tlsconf"
)

// The routes of the access tests: team/demo's web (token, a login_url,
// one allowed origin), api (token, bearer, no login_url), rpc (token,
// h2c), grpc (token, h2c, a gRPC server), rpcb (token, bearer, h2c) and
// pub (public); team/other's web (token).
const (
	accWeb    = "team--demo--web." + h2Domain
	accAPI    = "team--demo--api." + h2Domain
	accRPC    = "team--demo--rpc." + h2Domain
	accPub    = "team--demo--pub." + h2Domain
	accOther  = "team--other--web." + h2Domain
	accGRPC   = "team--demo--grpc." + h2Domain
	accRPCB   = "team--demo--rpcb." + h2Domain // h2c, token, bearer
	accOrigin = "https://app.example.com"
	accLogin  = "https://login.example.com/sso?app=1"
)

// accessApp is a real app: every request is answered with what it
// received (method, target, header fields) as JSON; /ws is a WebSocket
// (gorilla, subprotocol "chat") that echoes and reports its upgrade
// request; /events sends one event, then holds the stream open.
type accessApp struct {
	ts       *httptest.Server
	upgrades chan *http.Request
	hits     atomic.Int64
}

type seenRequest struct {
	Method  string
	URI     string
	Header  http.Header
	Trailer http.Header
}

func newAccessApp(t *testing.T, h2cApp bool) *accessApp {
	t.Helper()
	a := &accessApp{upgrades: make(chan *http.Request, 16)}
	up := websocket.Upgrader{Subprotocols: []string{"chat"}, CheckOrigin: func(*http.Request) bool { return true }}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.hits.Add(1)
		switch r.URL.Path {
		case "/ws":
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			a.upgrades <- r
			for {
				op, msg, err := c.ReadMessage()
				if err != nil {
					return
				}
				if err := c.WriteMessage(op, msg); err != nil {
					return
				}
			}
		case "/ws-refused": // an app that refuses the WebSocket
			http.Error(w, "no WebSocket here", http.StatusForbidden)
			return
		case "/upload": // the sleep tests' held bodies
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_, _ = fmt.Fprintf(w, "got %d bytes", n)
			return
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // for its trailers
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(seenRequest{Method: r.Method, URI: r.RequestURI, Header: r.Header, Trailer: r.Trailer})
	})
	a.ts = httptest.NewUnstartedServer(h)
	if h2cApp {
		// Unencrypted HTTP/2 with prior knowledge, as an h2c service speaks.
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		a.ts.Config.Protocols = &p
	}
	a.ts.Start()
	t.Cleanup(a.ts.Close)
	return a
}

func (a *accessApp) port() int { return a.ts.Listener.Addr().(*net.TCPAddr).Port }

// accessEnv is a listener with real TLS, a route table that enforces
// access tokens, and a Server with a key set the test can change.
type accessEnv struct {
	t       *testing.T
	ca      *tlsconf.Authority
	table   *routes.Table
	srv     *Server
	ln      net.Listener
	app     *accessApp
	rpc     *accessApp
	keys    atomic.Pointer[accesstoken.KeySet]
	k1, k2  accesstoken.Key
	logMu   sync.Mutex
	log     strings.Builder
	wg      sync.WaitGroup
	webGen  int64
	webOpts string
	third   *accessApp // when set, team/third's public service pub routes to it
	ocsfOut lockedBuffer
	// grpcPort is a real gRPC server (TestService) routed as team/demo's
	// grpc (h2c, token); grpcMD receives the metadata of each call it gets.
	grpcPort int
	grpcMD   chan metadata.MD
}

// lockedBuffer is a strings.Builder safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (e *accessEnv) Write(p []byte) (int, error) {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.log.Write(p)
}

func (e *accessEnv) logText() string {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.log.String()
}

func newAccessEnv(t *testing.T, configure ...func(*Config)) *accessEnv {
	t.Helper()
	h2Verify(t)
	e := &accessEnv{t: t}
	e.k1 = accesstoken.Key{ID: "k1", Secret: []byte(strings.Repeat("1", 32))}
	e.k2 = accesstoken.Key{ID: "k2", Secret: []byte(strings.Repeat("2", 32))}
	ks, err := accesstoken.NewKeySet(e.k1, e.k2)
	if err != nil {
		t.Fatal(err)
	}
	e.keys.Store(ks)
	ca, cert := wildcardAuthority(t, "access test CA")
	e.ca = ca
	e.app, e.rpc = newAccessApp(t, false), newAccessApp(t, true)
	e.grpcMD = make(chan metadata.MD, 16)
	e.grpcPort = startGRPCApp(t, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		e.grpcMD <- md
		return h(ctx, req)
	}))
	e.table = routes.NewTable(routes.Options{Domain: h2Domain, Logger: slog.New(slog.DiscardHandler), AccessTokens: true})
	e.apply()
	cfg := Config{
		Logger:          slog.New(slog.DiscardHandler),
		AccessKeys:      e.keys.Load,
		AccessLog:       AccessLogJSON,
		AccessLogWriter: e,
		AccessLogRate:   -1, AccessLogTotalRate: -1,
		OCSF: ocsf.NewEmitter(&e.ocsfOut, slog.LevelInfo, ocsf.Product{Version: "test"}),
	}
	for _, f := range configure {
		f(&cfg)
	}
	e.srv = New(cfg)
	e.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRoutesTLS(&e.wg, e.ln, cert, e.table, e.srv)
	t.Cleanup(func() {
		_ = e.ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.srv.Shutdown(ctx)
		cancel()
		e.table.Close()
		e.wg.Wait()
	})
	return e
}

// apply installs the routes; web's policy has generation e.webGen.
func (e *accessEnv) apply() {
	e.t.Helper()
	p := e.app.port()
	doc := fmt.Sprintf(`{"revision":"r","instances":[
	  {"workspace":"team","sandbox":"demo","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},"services":[
	    {"name":"web","port":%d,"access":{"mode":"token","generation":%d,"login_url":%q,"cors_origins":[%q]%s}},
	    {"name":"api","port":%d,"access":{"mode":"token","bearer":true,"cors_origins":[%q]}},
	    {"name":"rpc","port":%d,"protocol":"h2c","access":{"mode":"token"}},
	    {"name":"grpc","port":%d,"protocol":"h2c","access":{"mode":"token"}},
	    {"name":"rpcb","port":%d,"protocol":"h2c","access":{"mode":"token","bearer":true}},
	    {"name":"pub","port":%d}]},
	  {"workspace":"team","sandbox":"other","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},"services":[
	    {"name":"web","port":%d,"access":{"mode":"token"}}]}%s]}`,
		p, e.webGen, accLogin, accOrigin, e.webOpts, p, accOrigin, e.rpc.port(), e.grpcPort, e.rpc.port(), p, p, e.thirdEntry())
	d, err := routes.ParseDocument([]byte(doc))
	if err != nil || len(d.Rejected) > 0 {
		e.t.Fatalf("document: %v %+v", err, d)
	}
	e.table.Apply(d)
}

// token mints a token with key kid for ws/sb/svc ("*" svc: all
// services), valid for ttl from now (negative: expired).
func (e *accessEnv) token(kid, sb, svc, sub string, gen uint64, ttl time.Duration) string {
	e.t.Helper()
	ks, err := accesstoken.NewKeySet(e.k1, e.k2)
	if err != nil {
		e.t.Fatal(err)
	}
	c := accesstoken.Claims{Workspace: "team", Sandbox: sb, Service: svc, Subject: sub, Generation: gen}
	if svc == "*" {
		c.Service, c.AllServices = "", true
	}
	now := time.Now()
	c.IssuedAt, c.Expires = now, now.Add(ttl)
	if ttl < 0 {
		c.IssuedAt, c.Expires = now.Add(2*ttl), now.Add(ttl)
	}
	tok, err := ks.Mint(kid, c)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// client returns an HTTP client speaking only HTTP/1.1 or only HTTP/2 to
// the listener, following no redirect; every request dials anew unless
// keep.
func (e *accessEnv) client(h2 bool) *http.Client {
	e.t.Helper()
	tr := listenerTransport(e.t, e.ca, e.ln.Addr().String(), h2)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type accessResp struct {
	status int
	header http.Header
	body   string
	proto  int
}

func (e *accessEnv) do(c *http.Client, method, host, target string, hdr map[string]string) accessResp {
	e.t.Helper()
	req, err := http.NewRequest(method, "https://"+host+target, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s%s: %v", method, host, target, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s%s: body: %v", method, host, target, err)
	}
	return accessResp{status: resp.StatusCode, header: resp.Header, body: string(b), proto: resp.ProtoMajor}
}

// seen decodes the app's echo of the request it received.
func seen(t *testing.T, r accessResp) seenRequest {
	t.Helper()
	var s seenRequest
	if r.status != 200 || json.Unmarshal([]byte(r.body), &s) != nil {
		t.Fatalf("want the app's echo, got %d %q", r.status, r.body)
	}
	return s
}

// seenRequestOf sends req with c and decodes the app's echo of it.
func seenRequestOf(t *testing.T, c *http.Client, req *http.Request) seenRequest {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return seen(t, accessResp{status: resp.StatusCode, body: string(b)})
}

var navigate = map[string]string{"Sec-Fetch-Mode": "navigate", "Accept": "text/html,application/xhtml+xml"}

func fetchFrom(origin string) map[string]string {
	return map[string]string{"Sec-Fetch-Mode": "cors", "Accept": "application/json", "Origin": origin}
}

func with(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func forBoth(t *testing.T, f func(t *testing.T, h2 bool)) {
	for _, h2 := range []bool{false, true} {
		name := "h1"
		if h2 {
			name = "h2"
		}
		t.Run(name, func(t *testing.T) { f(t, h2) })
	}
}

func wantProto(t *testing.T, r accessResp, h2 bool) {
	t.Helper()
	if want := map[bool]int{false: 1, true: 2}[h2]; r.proto != want {
		t.Fatalf("answered over HTTP/%d, want HTTP/%d", r.proto, want)
	}
}

// No credential: a navigation is sent to login_url with return_to (the
// request's URL), or gets the HTML page where there is none; fetch gets
// 401 JSON, readable by an allowed origin only. Nothing reaches the app.
func TestAccessNoCredential(t *testing.T) {
	e := newAccessEnv(t)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := e.client(h2)
		r := e.do(c, "GET", accWeb, "/page?x=1", navigate)
		wantProto(t, r, h2)
		wantLoc := accLogin + "&return_to=" + url.QueryEscape("https://"+accWeb+"/page?x=1")
		if r.status != 303 || r.header.Get("Location") != wantLoc || r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("navigation: %d Location %q; want 303 %q", r.status, r.header.Get("Location"), wantLoc)
		}
		// Without Sec-Fetch-Mode, Accept: text/html makes a navigation.
		if r := e.do(c, "GET", accWeb, "/", map[string]string{"Accept": "text/html"}); r.status != 303 {
			t.Fatalf("Accept text/html without Sec-Fetch-Mode: %d", r.status)
		}
		r = e.do(c, "GET", accAPI, "/", navigate)
		if r.status != 401 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") || !strings.Contains(r.body, "Sign-in required") {
			t.Fatalf("navigation without login_url: %d %q %q", r.status, r.header.Get("Content-Type"), r.body)
		}
		r = e.do(c, "GET", accWeb, "/data", fetchFrom(accOrigin))
		if r.status != 401 || r.body != `{"error":"unauthenticated"}` || r.header.Get("Content-Type") != "application/json" ||
			r.header.Get("WWW-Authenticate") != `Bearer realm="applistener"` ||
			r.header.Get("Access-Control-Allow-Origin") != accOrigin || r.header.Get("Access-Control-Allow-Credentials") != "true" ||
			r.header.Get("Vary") != "Origin" {
			t.Fatalf("fetch from an allowed origin: %d %v %q", r.status, r.header, r.body)
		}
		r = e.do(c, "POST", accWeb, "/data", fetchFrom("https://evil.example.com"))
		if r.status != 401 || r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("fetch from another origin: %d %v", r.status, r.header)
		}
		// Accept: application/json on a GET without Sec-Fetch-Mode: JSON, never a redirect.
		if r := e.do(c, "GET", accWeb, "/", map[string]string{"Accept": "application/json"}); r.status != 401 || r.body != `{"error":"unauthenticated"}` {
			t.Fatalf("Accept json: %d %q", r.status, r.body)
		}
	})
	if n := e.app.hits.Load(); n != 0 {
		t.Fatalf("the app received %d requests", n)
	}
	if !strings.Contains(e.logText(), `"access_denial":"no_credential"`) {
		t.Fatalf("access log lacks the denial reason:\n%s", e.logText())
	}
	// Each denial is an OCSF HTTP Activity record (denied, with the reason).
	if out := e.ocsfOut.String(); !strings.Contains(out, `"status_detail":"access: no_credential"`) || !strings.Contains(out, `"class_uid":4002`) {
		t.Fatalf("no OCSF denial record:\n%s", out)
	}
	if n := promtestCounter(t, e.srv.m.accessDenials.WithLabelValues(denialNoCredential)); n < 10 {
		t.Fatalf("applistener_access_denials_total{reason=no_credential} = %v", n)
	}
}

// A preflight from an allowed origin is answered by the listener (204,
// the requested method and headers allowed), from another origin 403;
// never 401 or a redirect, never the app.
func TestAccessPreflight(t *testing.T) {
	e := newAccessEnv(t)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := e.client(h2)
		pre := map[string]string{"Origin": accOrigin, "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "content-type,x-custom", "Sec-Fetch-Mode": "cors"}
		r := e.do(c, "OPTIONS", accWeb, "/api", pre)
		wantProto(t, r, h2)
		for k, v := range map[string]string{"Access-Control-Allow-Origin": accOrigin, "Access-Control-Allow-Credentials": "true",
			"Access-Control-Allow-Methods": "POST", "Access-Control-Allow-Headers": "content-type,x-custom",
			"Access-Control-Max-Age": "600", "Vary": "Origin"} {
			if got := r.header.Get(k); got != v {
				t.Errorf("preflight %s = %q, want %q", k, got, v)
			}
		}
		if r.status != 204 {
			t.Fatalf("preflight: %d", r.status)
		}
		r = e.do(c, "OPTIONS", accWeb, "/api", with(pre, "Origin", "https://evil.example.com"))
		if r.status != 403 || r.body != `{"error":"origin not allowed"}` || r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("disallowed preflight: %d %v %q", r.status, r.header, r.body)
		}
	})
	if n := e.app.hits.Load(); n != 0 {
		t.Fatalf("the app received %d requests", n)
	}
}

// ?_al_token= on a navigation: 303 to the same URL without it, with the
// cookie; the cookie then passes, the app never sees the token (no
// header, cookie or URL carries it) and gets the subject as
// X-Forwarded-User, never the client's.
func TestAccessQueryTokenExchange(t *testing.T) {
	e := newAccessEnv(t)
	var used []string
	forBoth(t, func(t *testing.T, h2 bool) {
		c := e.client(h2)
		tok := e.token("k1", "demo", "web", "alice", 0, time.Hour)
		used = append(used, tok)
		r := e.do(c, "GET", accWeb, "/p/a?x=1&_al_token="+tok+"&y=2", navigate)
		wantProto(t, r, h2)
		if r.status != 303 || r.header.Get("Location") != "/p/a?x=1&y=2" || r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("exchange: %d Location %q", r.status, r.header.Get("Location"))
		}
		sc := r.header.Get("Set-Cookie")
		for _, part := range []string{accessCookie + "=" + tok, "Path=/", "Secure", "HttpOnly", "SameSite=Lax", "Max-Age=3"} {
			if !strings.Contains(sc, part) {
				t.Fatalf("Set-Cookie %q lacks %q", sc, part)
			}
		}
		if e.app.hits.Load() != 0 {
			t.Fatal("the app saw the request that carried the token")
		}
		cookie := "theme=dark; " + accessCookie + "=" + tok + "; other=1"
		r = e.do(c, "GET", accWeb, "/p/a?x=1&y=2", with(navigate, "Cookie", cookie, "X-Forwarded-User", "mallory"))
		s := seen(t, r)
		if got := s.Header.Get("X-Forwarded-User"); got != "alice" || len(s.Header.Values("X-Forwarded-User")) != 1 {
			t.Fatalf("X-Forwarded-User %q", s.Header.Values("X-Forwarded-User"))
		}
		if got := strings.Join(s.Header.Values("Cookie"), "; "); got != "theme=dark; other=1" {
			t.Fatalf("app cookies %q", got)
		}
		dump, _ := json.Marshal(s)
		if strings.Contains(string(dump), tok[len(tok)-20:]) || strings.Contains(string(dump), "applistener-token") {
			t.Fatalf("the app saw the token: %s", dump)
		}
		// A fetch with the cookie from the allowed origin: the app's
		// answer is readable (CORS headers added).
		r = e.do(c, "GET", accWeb, "/data", with(fetchFrom(accOrigin), "Cookie", accessCookie+"="+tok))
		if r.status != 200 || r.header.Get("Access-Control-Allow-Origin") != accOrigin || r.header.Get("Access-Control-Allow-Credentials") != "true" {
			t.Fatalf("fetch with the cookie: %d %v", r.status, r.header)
		}
		// A token left in the URL of a request that is not a navigation
		// is not a credential, and the app does not see it either.
		r = e.do(c, "GET", accWeb, "/q?_al_token="+tok+"&z=3", with(fetchFrom(accOrigin), "Cookie", accessCookie+"="+tok))
		if s := seen(t, r); s.URI != "/q?z=3" {
			t.Fatalf("app target %q", s.URI)
		}
		if r := e.do(c, "GET", accWeb, "/q?_al_token="+tok, fetchFrom(accOrigin)); r.status != 401 {
			t.Fatalf("query token on a fetch: %d", r.status)
		}
		e.app.hits.Store(0)
	})
	// The access log and the OCSF records never carry a token (neither
	// its payload nor its MAC), only where it came from and its subject.
	log, rec := e.logText(), e.ocsfOut.String()
	for _, tok := range used {
		parts := strings.Split(tok, ".")
		for _, part := range parts[2:] {
			if strings.Contains(log, part) || strings.Contains(rec, part) {
				t.Fatalf("a token part is in the access log or the OCSF records:\n%s\n%s", log, rec)
			}
		}
	}
	if !strings.Contains(log, `"credential":"cookie"`) || !strings.Contains(log, `"credential":"query"`) || !strings.Contains(log, `"user":"alice"`) {
		t.Fatalf("access log fields missing:\n%s", log)
	}
}

// Scope, expiry, keys: a token of another service or sandbox is 403, an
// expired one or one of an unknown key 401; the header and (with bearer)
// Authorization carry tokens and are removed; without bearer the app's
// Authorization passes untouched.
func TestAccessTokenChecks(t *testing.T) {
	e := newAccessEnv(t)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := e.client(h2)
		hdr := func(tok string) map[string]string {
			return with(fetchFrom(accOrigin), "X-Applistener-Token", tok)
		}
		for _, tc := range []struct {
			name, host, tok string
			status          int
			body            string
		}{
			{"service A on service B", accWeb, e.token("k1", "demo", "api", "", 0, time.Hour), 403, `{"error":"forbidden"}`},
			{"another sandbox", accOther, e.token("k1", "demo", "*", "", 0, time.Hour), 403, `{"error":"forbidden"}`},
			{"expired", accWeb, e.token("k1", "demo", "web", "", 0, -time.Minute), 401, `{"error":"unauthenticated"}`},
			{"truncated signature", accWeb, func() string { tk := e.token("k1", "demo", "web", "", 0, time.Hour); return tk[:len(tk)-6] }(), 401, `{"error":"unauthenticated"}`},
			{"invalid base64", accWeb, "v1.k1.!!!!.@@@@", 401, `{"error":"unauthenticated"}`},
		} {
			r := e.do(c, "GET", tc.host, "/", hdr(tc.tok))
			if r.status != tc.status || r.body != tc.body {
				t.Errorf("%s: %d %q, want %d %q", tc.name, r.status, r.body, tc.status, tc.body)
			}
		}
		// Issued ten minutes ahead of the listener's clock (beyond
		// accesstoken.MaxClockSkew): 401, reason not_yet_valid.
		future := func() string {
			ks, _ := accesstoken.NewKeySet(e.k1)
			now := time.Now()
			tok, err := ks.Mint("k1", accesstoken.Claims{Workspace: "team", Sandbox: "demo", Service: "web",
				IssuedAt: now.Add(10 * time.Minute), Expires: now.Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}()
		if r := e.do(c, "GET", accWeb, "/", hdr(future)); r.status != 401 || r.body != `{"error":"unauthenticated"}` {
			t.Errorf("issued in the future: %d %q", r.status, r.body)
		}
		if n := promtestCounter(t, e.srv.m.accessDenials.WithLabelValues(denialNotYetValid)); n < 1 {
			t.Errorf("applistener_access_denials_total{reason=not_yet_valid} = %v", n)
		}
		// Unknown key: a key set without k2.
		k2tok := e.token("k2", "demo", "web", "", 0, time.Hour)
		old := e.keys.Load()
		only1, _ := accesstoken.NewKeySet(e.k1)
		e.keys.Store(only1)
		if r := e.do(c, "GET", accWeb, "/", hdr(k2tok)); r.status != 401 {
			t.Errorf("unknown key id: %d", r.status)
		}
		e.keys.Store(old)
		// Valid: the whole sandbox's token on web, via the header.
		tok := e.token("k2", "demo", "*", "bob", 0, time.Hour)
		s := seen(t, e.do(c, "GET", accWeb, "/", with(hdr(tok), "Authorization", "Basic YXBwOnB3")))
		if s.Header.Get("X-Applistener-Token") != "" || s.Header.Get("Authorization") != "Basic YXBwOnB3" || s.Header.Get("X-Forwarded-User") != "bob" {
			t.Fatalf("app saw %v", s.Header)
		}
		// Bearer counts only where the policy says so.
		if r := e.do(c, "GET", accWeb, "/", map[string]string{"Authorization": "Bearer " + tok, "Accept": "application/json"}); r.status != 401 {
			t.Fatalf("Bearer on a service without bearer: %d", r.status)
		}
		s = seen(t, e.do(c, "GET", accAPI, "/", map[string]string{"Authorization": "Bearer " + tok}))
		if s.Header.Get("Authorization") != "" {
			t.Fatalf("the app saw the Bearer token: %v", s.Header)
		}
		// The public service: unchanged, except that X-Forwarded-User
		// from a client never passes.
		s = seen(t, e.do(c, "GET", accPub, "/", map[string]string{"X-Forwarded-User": "mallory", "Accept": "text/html"}))
		if s.Header.Get("X-Forwarded-User") != "" {
			t.Fatalf("public service: the client's X-Forwarded-User passed")
		}
	})
}

// Key rotation: tokens of both key ids work; once k1 leaves the keys file
// its tokens are refused, and a connection authenticated with it is
// closed (an open HTTP/2 stream ends), while one authenticated with k2
// stays open.
func TestAccessKeyRotation(t *testing.T) {
	e := newAccessEnv(t)
	t1 := e.token("k1", "demo", "web", "", 0, time.Hour)
	t2 := e.token("k2", "demo", "web", "", 0, time.Hour)
	c1, c2 := e.client(true), e.client(true)
	for _, tc := range []struct {
		c   *http.Client
		tok string
	}{{c1, t1}, {c2, t2}} {
		seen(t, e.do(tc.c, "GET", accWeb, "/", map[string]string{"X-Applistener-Token": tc.tok}))
	}
	streams := map[string]*bufio.Reader{}
	for name, tc := range map[string]struct {
		c   *http.Client
		tok string
	}{"k1": {c1, t1}, "k2": {c2, t2}} {
		req, _ := http.NewRequest("GET", "https://"+accWeb+"/events", nil)
		req.Header.Set("X-Applistener-Token", tc.tok)
		resp, err := tc.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
			t.Fatalf("%s: first event %q %v", name, line, err)
		}
		streams[name] = br
	}
	only2, _ := accesstoken.NewKeySet(e.k2)
	e.keys.Store(only2)
	start := time.Now()
	if n := e.srv.RevokeAccessKeys([]string{"k1"}); n != 1 {
		t.Fatalf("revoked %d connections, want 1", n)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, streams["k1"])
		ended <- err
	}()
	select {
	case err := <-ended:
		if d := time.Since(start); d > time.Second {
			t.Errorf("the k1 stream ended after %v (%v)", d, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream authenticated with the removed key stayed open")
	}
	if r := e.do(e.client(false), "GET", accWeb, "/", map[string]string{"X-Applistener-Token": t1, "Accept": "application/json"}); r.status != 401 {
		t.Fatalf("token of the removed key: %d", r.status)
	}
	seen(t, e.do(c2, "GET", accWeb, "/", map[string]string{"X-Applistener-Token": t2}))
}

// WebSockets over HTTP/1.1 and HTTP/2: without a credential the handshake
// is 401 (never a redirect, even from a browser-like request); the token
// as a subprotocol passes and the app sees only the other subprotocols.
func TestAccessWebSocket(t *testing.T) {
	e := newAccessEnv(t)
	tok := e.token("k1", "demo", "web", "", 0, time.Hour)
	t.Run("h1", func(t *testing.T) {
		d := listenerWSDialer(e.ca, e.ln.Addr().String(), accWeb)
		hdr := http.Header{"Accept": {"text/html"}, "Origin": {accOrigin}}
		_, resp, err := d.Dial("wss://"+accWeb+"/ws", hdr)
		if err == nil || resp == nil || resp.StatusCode != 401 {
			t.Fatalf("without a credential: %v %v", resp, err)
		}
		d.Subprotocols = []string{"chat", accessSubprotocol + tok}
		conn, resp, err := d.Dial("wss://"+accWeb+"/ws", hdr)
		if err != nil {
			t.Fatalf("with the subprotocol token: %v %v", resp, err)
		}
		defer func() { _ = conn.Close() }()
		if conn.Subprotocol() != "chat" {
			t.Fatalf("subprotocol %q", conn.Subprotocol())
		}
		up := <-e.app.upgrades
		if got := up.Header.Values("Sec-Websocket-Protocol"); strings.Join(got, ",") != "chat" {
			t.Fatalf("the app saw subprotocols %q", got)
		}
		if err := conn.WriteMessage(websocket.TextMessage, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, msg, err := conn.ReadMessage(); err != nil || string(msg) != "hi" {
			t.Fatalf("echo %q %v", msg, err)
		}
		// A client that offers the token's subprotocol alone (a browser's
		// new WebSocket(url, ["applistener.token.<t>"])) gets it named in
		// the answer, or it would fail the handshake; the app sees none.
		d.Subprotocols = []string{accessSubprotocol + tok}
		conn2, resp, err := d.Dial("wss://"+accWeb+"/ws", hdr)
		if err != nil {
			t.Fatalf("with the token's subprotocol alone: %v %v", resp, err)
		}
		defer func() { _ = conn2.Close() }()
		if conn2.Subprotocol() != accessSubprotocol+tok {
			t.Fatalf("subprotocol %q", conn2.Subprotocol())
		}
		if up := <-e.app.upgrades; len(up.Header.Values("Sec-Websocket-Protocol")) != 0 {
			t.Fatalf("the app saw subprotocols %q", up.Header.Values("Sec-Websocket-Protocol"))
		}
	})
	t.Run("h2", func(t *testing.T) {
		cc := e.dialH2Access(accWeb)
		c, err := openAccessWS(t, cc, accWeb, "/ws", http.Header{"Accept": {"text/html"}, "Sec-Fetch-Mode": {"websocket"}})
		if err != nil || c.resp.StatusCode != 401 {
			t.Fatalf("without a credential: %v %v", c, err)
		}
		c, err = openAccessWS(t, cc, accWeb, "/ws", http.Header{"Sec-Websocket-Protocol": {"chat, " + accessSubprotocol + tok}})
		if err != nil || c.resp.StatusCode != 200 {
			t.Fatalf("with the subprotocol token: %v %v", c, err)
		}
		up := <-e.app.upgrades
		if got := up.Header.Values("Sec-Websocket-Protocol"); strings.Join(got, ",") != "chat" {
			t.Fatalf("the app saw subprotocols %q", got)
		}
		c.echo(t, websocket.TextMessage, []byte("over h2"))
		// The token's subprotocol alone: named in the answer, not seen by the app.
		c, err = openAccessWS(t, cc, accWeb, "/ws", http.Header{"Sec-Websocket-Protocol": {accessSubprotocol + tok}})
		if err != nil || c.resp.StatusCode != 200 || c.resp.Header.Get("Sec-Websocket-Protocol") != accessSubprotocol+tok {
			t.Fatalf("with the token's subprotocol alone: %v %v", c, err)
		}
		if up := <-e.app.upgrades; len(up.Header.Values("Sec-Websocket-Protocol")) != 0 {
			t.Fatalf("the app saw subprotocols %q", up.Header.Values("Sec-Websocket-Protocol"))
		}
		// The cookie, as a browser's WebSocket sends it.
		c, err = openAccessWS(t, cc, accWeb, "/ws", http.Header{"Cookie": {accessCookie + "=" + tok}, "Origin": {accOrigin}})
		if err != nil || c.resp.StatusCode != 200 {
			t.Fatalf("with the cookie: %v %v", c, err)
		}
		if up := <-e.app.upgrades; up.Header.Get("Cookie") != "" {
			t.Fatalf("the app saw the cookie %q", up.Header.Get("Cookie"))
		}
		c.echo(t, websocket.TextMessage, []byte("cookie"))
	})
}

// gRPC (an h2c service) without a credential: UNAUTHENTICATED; with a
// token of another service: PERMISSION_DENIED; with one: the app, which
// sees no token.
func TestAccessGRPC(t *testing.T) {
	e := newAccessEnv(t)
	c := e.client(true)
	grpcHdr := map[string]string{"Content-Type": "application/grpc", "Te": "trailers"}
	r := e.do(c, "POST", accRPC, "/pkg.Svc/Call", grpcHdr)
	if r.status != 200 || r.header.Get("Grpc-Status") != "16" || r.header.Get("Grpc-Message") != "unauthenticated" {
		t.Fatalf("no credential: %d %v", r.status, r.header)
	}
	r = e.do(c, "POST", accRPC, "/pkg.Svc/Call", with(grpcHdr, "X-Applistener-Token", e.token("k1", "demo", "web", "", 0, time.Hour)))
	if r.status != 200 || r.header.Get("Grpc-Status") != "7" {
		t.Fatalf("another service's token: %d %v", r.status, r.header)
	}
	tok := e.token("k1", "demo", "rpc", "carol", 0, time.Hour)
	s := seen(t, e.do(c, "GET", accRPC, "/x?_al_token=a", map[string]string{"X-Applistener-Token": tok, "Cookie": accessCookie + "=" + tok + "; a=b"}))
	if s.Header.Get("X-Applistener-Token") != "" || s.Header.Get("Cookie") != "a=b" || s.Header.Get("X-Forwarded-User") != "carol" || s.URI != "/x" {
		t.Fatalf("h2c app saw %+v", s)
	}
}

// A real gRPC client and server (h2c): UNAUTHENTICATED without a token,
// PERMISSION_DENIED with another service's, the call with one; the server
// never sees the token in its metadata and gets the subject.
func TestAccessGRPCClient(t *testing.T) {
	e := newAccessEnv(t)
	creds := credentials.NewTLS(&tls.Config{ServerName: accGRPC, RootCAs: e.ca.Pool()})
	cc, err := grpc.NewClient("passthrough:///"+e.ln.Addr().String(), grpc.WithTransportCredentials(creds), grpc.WithAuthority(accGRPC))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	client := testpb.NewTestServiceClient(cc)
	call := func(tok string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if tok != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-applistener-token", tok)
		}
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 3})
		return err
	}
	if err := call(""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want Unauthenticated", err)
	}
	if err := call(e.token("k1", "demo", "web", "", 0, time.Hour)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("with another service's token: %v, want PermissionDenied", err)
	}
	select {
	case md := <-e.grpcMD:
		t.Fatalf("the server got a refused call: %v", md)
	default:
	}
	tok := e.token("k2", "demo", "grpc", "dave", 0, time.Hour)
	if err := call(tok); err != nil {
		t.Fatalf("with a token: %v", err)
	}
	md := <-e.grpcMD
	if len(md.Get("x-applistener-token")) != 0 || strings.Join(md.Get("x-forwarded-user"), ",") != "dave" {
		t.Fatalf("the server saw %v", md)
	}
}

// Raising the policy's generation is a route change: an open WebSocket
// (both protocols) and an open HTTP/2 stream authenticated under the old
// generation close within 100 ms of the new document; a stream of a
// public service of another instance stays open; the old token is then
// refused.
func TestAccessGenerationRevokes(t *testing.T) {
	e := newAccessEnv(t)
	pubApp := newAccessApp(t, false)
	// The other instance's public service: its own document entry.
	tok := e.token("k1", "demo", "web", "", 0, time.Hour)
	hdr := http.Header{"X-Applistener-Token": {tok}}
	// HTTP/1.1 WebSocket.
	d := listenerWSDialer(e.ca, e.ln.Addr().String(), accWeb)
	ws1, _, err := d.Dial("wss://"+accWeb+"/ws", hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ws1.Close() }()
	<-e.app.upgrades
	// HTTP/2 WebSocket and an HTTP/2 stream.
	cc := e.dialH2Access(accWeb)
	ws2, err := openAccessWS(t, cc, accWeb, "/ws", hdr)
	if err != nil || ws2.resp.StatusCode != 200 {
		t.Fatalf("h2 websocket: %v", err)
	}
	<-e.app.upgrades
	events := openEvents(t, e.client(true), accWeb, tok)
	// A public service of another instance, its stream open.
	e.third = pubApp
	e.apply()
	pubEvents := openEvents(t, e.client(true), "team--third--pub."+h2Domain, "")

	ended := make(chan string, 3)
	go func() {
		for {
			if _, _, err := ws1.ReadMessage(); err != nil {
				ended <- "h1 websocket"
				return
			}
		}
	}()
	go func() {
		for {
			if _, _, err := ws2.recv(); err != nil {
				ended <- "h2 websocket"
				return
			}
		}
	}()
	go func() {
		_, _ = io.Copy(io.Discard, events)
		ended <- "h2 stream"
	}()
	pubEnded := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, pubEvents)
		close(pubEnded)
	}()
	e.webGen = 1
	start := time.Now()
	e.apply()
	for range 3 {
		select {
		case what := <-ended:
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Errorf("%s closed %v after the new generation, want within 100 ms", what, d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a stream of the old generation stayed open")
		}
	}
	select {
	case <-pubEnded:
		t.Fatal("the public service's stream was closed")
	case <-time.After(50 * time.Millisecond):
	}
	if r := e.do(e.client(false), "GET", accWeb, "/", map[string]string{"X-Applistener-Token": tok, "Accept": "application/json"}); r.status != 401 {
		t.Fatalf("a token of the old generation: %d", r.status)
	}
	seen(t, e.do(e.client(false), "GET", accWeb, "/", map[string]string{"X-Applistener-Token": e.token("k1", "demo", "web", "", 1, time.Hour)}))
}

// thirdEntry is team/third's document entry ("" without e.third).
func (e *accessEnv) thirdEntry() string {
	if e.third == nil {
		return ""
	}
	return fmt.Sprintf(`,{"workspace":"team","sandbox":"third","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},"services":[{"name":"pub","port":%d}]}`, e.third.port())
}

// openEvents opens /events on host (with the token unless "") and returns
// its body after the first event.
func openEvents(t *testing.T, c *http.Client, host, tok string) io.Reader {
	t.Helper()
	req, _ := http.NewRequest("GET", "https://"+host+"/events", nil)
	if tok != "" {
		req.Header.Set("X-Applistener-Token", tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/%d", resp.ProtoMajor)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	return br
}

// dialH2Access is h2Env.dialH2 for this env.
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func (e *accessEnv) dialH2Access(host string) *http2.ClientConn {
	e.t.Helper()
	tc, err := tls.Dial("tcp", e.ln.Addr().String(), &tls.Config{ServerName: host, RootCAs: e.ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc) //nolint:staticcheck // SA1019: see above.
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// openAccessWS is openWS for another host.
//
//nolint:staticcheck // SA1019: x/net's ClientConn, for extended CONNECT.
func openAccessWS(t *testing.T, cc *http2.ClientConn, host, path string, hdr http.Header) (*h2wsClient, error) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "https://"+host+path, pr)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header[":protocol"] = []string{"websocket"}
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		_ = pw.Close()
		return nil, err
	}
	c := &h2wsClient{resp: resp, w: pw, r: bufio.NewReader(resp.Body)}
	t.Cleanup(c.close)
	return c, nil
}

// accessDecideH1 is the HTTP/1.1 extract-and-verify step alone, on a
// parsed head.
func accessDecideH1(c *clientConn, ar *accessRoute, ks *accesstoken.KeySet, req *request, now time.Time) accessDecision {
	var in accessInput[[]byte]
	in.method, in.path, in.websocket = req.method, req.path, req.upgrade
	for i := range req.fields {
		f := &req.fields[i]
		in.field(f.name, f.value, ar.policy.Bearer)
	}
	return decideAccess(ar, ks, &in, now, c.tokenString)
}

func accessBenchRoute(tb testing.TB, bearer bool) (*accessRoute, *accesstoken.KeySet, string) {
	tb.Helper()
	return accessRouteAt(tb, bearer, time.Now())
}

// accessRouteAt is accessBenchRoute with a token issued at now.
func accessRouteAt(tb testing.TB, bearer bool, now time.Time) (*accessRoute, *accesstoken.KeySet, string) {
	tb.Helper()
	ks, err := accesstoken.NewKeySet(accesstoken.Key{ID: "k1", Secret: []byte(strings.Repeat("s", 32))})
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := ks.Mint("k1", accesstoken.Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice",
		IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		tb.Fatal(err)
	}
	rt := &routes.Route{Workspace: "team", Sandbox: "demo", Service: "web",
		Access: routes.AccessPolicy{Mode: routes.AccessToken, Bearer: bearer, CORSOrigins: []string{accOrigin}}}
	return newAccessRoute(rt), ks, tok
}

func parsedHead(tb testing.TB, h []byte) *request {
	tb.Helper()
	var req request
	if err := parseRequestHead(&req, h, 100); err != nil {
		tb.Fatal(err)
	}
	return &req
}

// Malformed and huge credentials are refused (401) at a constant, small
// number of allocations: nothing of them is copied or decoded.
func TestAccessMalformedCredentialAllocs(t *testing.T) {
	ar, ks, tok := accessBenchRoute(t, true)
	huge := strings.Repeat(".", 1<<20)
	var c clientConn
	now := time.Now()
	for _, tc := range []struct{ name, field string }{
		{"bearer of 1 MiB of dots", "Authorization: Bearer " + huge},
		{"header of 1 MiB", "X-Applistener-Token: v1.k1." + huge},
		{"cookie of 1 MiB", "Cookie: " + accessCookie + "=" + huge},
		{"invalid base64", "X-Applistener-Token: v1.k1.%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%.@@@@"},
		{"truncated signature", "X-Applistener-Token: " + tok[:len(tok)-5]},
		{"signature altered", "X-Applistener-Token: " + tok[:len(tok)-2] + "AA"},
	} {
		req := parsedHead(t, head("GET / HTTP/1.1", "Host: "+testHost, "Accept: application/json", tc.field))
		d := accessDecideH1(&c, ar, ks, req, now)
		if d.verdict != accessUnauthenticated {
			t.Fatalf("%s: verdict %d reason %q, want 401", tc.name, d.verdict, d.reason)
		}
		if a := answerFor(ar, &d, &accessRequestInfo{host: testHost, path: "/"}); a.status != 401 {
			t.Fatalf("%s: answer %d", tc.name, a.status)
		}
		allocs := testing.AllocsPerRun(20, func() { accessDecideH1(&c, ar, ks, req, now) })
		if allocs > maxAllocs(1) {
			t.Errorf("%s: %.0f allocations per decision, want at most 1", tc.name, allocs)
		}
	}
}

// The warm path allocates nothing: a valid cookie on a keep-alive
// connection (the token converted once per connection).
func TestAccessCookieNoAllocs(t *testing.T) {
	ar, ks, tok := accessBenchRoute(t, false)
	req := parsedHead(t, head("GET /page HTTP/1.1", "Host: "+testHost, "Accept: text/html", "Sec-Fetch-Mode: navigate",
		"Cookie: a=b; "+accessCookie+"="+tok+"; c=d"))
	var c clientConn
	now := time.Now()
	if d := accessDecideH1(&c, ar, ks, req, now); d.verdict != accessAllow || d.source != credCookie || d.claims.Subject != "alice" {
		t.Fatalf("decision %+v", d)
	}
	if a := testing.AllocsPerRun(100, func() { accessDecideH1(&c, ar, ks, req, now) }); a > maxAllocs(0) {
		t.Fatalf("%.1f allocations per warm decision, want 0", a)
	}
	// HTTP/2: the engine's strings, nothing converted.
	in := accessInput[string]{method: "GET", path: "/page", accept: "text/html", cookie: tok, hasCookie: true}
	if a := testing.AllocsPerRun(100, func() { decideAccess(ar, ks, &in, now, identityString) }); a > maxAllocs(0) {
		t.Fatalf("HTTP/2: %.1f allocations per warm decision, want 0", a)
	}
}

// maxAllocs is n, or n plus the MAC state a verification makes when the
// race detector dropped the pooled one (raceEnabled).
func maxAllocs(n float64) float64 {
	if raceEnabled {
		return n + 4
	}
	return n
}

// BenchmarkAccessCookie is the CPU an authenticated request adds on the
// warm path: collecting the fields of an HTTP/1.1 head, finding the
// cookie, verifying the token.
func BenchmarkAccessCookie(b *testing.B) {
	ar, ks, tok := accessBenchRoute(b, false)
	req := parsedHead(b, head("GET /page HTTP/1.1", "Host: "+testHost, "User-Agent: Mozilla/5.0", "Accept: text/html",
		"Sec-Fetch-Mode: navigate", "Accept-Language: en", "Cookie: a=b; "+accessCookie+"="+tok+"; c=d"))
	var c clientConn
	b.Run("decision", func(b *testing.B) {
		b.ReportAllocs()
		start := processCPU()
		for b.Loop() {
			if d := accessDecideH1(&c, ar, ks, req, time.Now()); d.verdict != accessAllow {
				b.Fatal(d.reason)
			}
		}
		b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
	})
	// The verification alone, for comparison: the rest is the decision's.
	b.Run("verify-only", func(b *testing.B) {
		b.ReportAllocs()
		start := processCPU()
		for b.Loop() {
			r := ar.scope
			r.Now = time.Now()
			if _, err := ks.Verify(tok, &r); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
	})
}

// Unit checks of the helpers the forwarding uses.
func TestAccessHelpers(t *testing.T) {
	for in, want := range map[string]string{
		"/a?_al_token=x":           "/a",
		"/a?b=1&_al_token=x&c=2":   "/a?b=1&c=2",
		"/a?b=1":                   "/a?b=1",
		"/a?_al_token=x&_al_token": "/a",
		"/a?x_al_token=1":          "/a?x_al_token=1",
	} {
		if got := withoutQueryParam(in, accessQueryParam); got != want {
			t.Errorf("withoutQueryParam(%q) = %q, want %q", in, got, want)
		}
	}
	if v, removed := withoutCrumb([]byte("a=1; "+accessCookie+"=t; b=2"), accessCookie); !removed || string(v) != "a=1; b=2" {
		t.Errorf("withoutCrumb: %q %v", v, removed)
	}
	if v, removed := withoutTokenSubprotocols([]byte("chat, applistener.token.abc")); !removed || string(v) != "chat" {
		t.Errorf("withoutTokenSubprotocols: %q %v", v, removed)
	}
	if !isGRPCType("application/grpc+proto") || isGRPCType("application/grpcx") || !isGRPCType([]byte("Application/GRPC")) {
		t.Error("isGRPCType")
	}
	for in, want := range map[string]string{"//evil.example/x": "/evil.example/x", "/\\evil.example": "/evil.example", "/a//b": "/a//b"} {
		if got := sameOriginLocation(in); got != want {
			t.Errorf("sameOriginLocation(%q) = %q, want %q", in, got, want)
		}
	}
	exp := time.Now().Add(time.Hour)
	if c := accessSetCookie("T", exp, true); !strings.HasSuffix(c, "; Secure; HttpOnly; SameSite=None; Partitioned") ||
		!strings.HasPrefix(c, accessCookie+"=T; Path=/; Max-Age=3") {
		t.Errorf("embed cookie %q", c)
	}
	ri := &accessRequestInfo{host: accWeb, port: 8443, path: "/p?q=1&_al_token=x"}
	if got, want := loginRedirect("https://login.example.com/in", ri), "https://login.example.com/in?return_to="+url.QueryEscape("https://"+accWeb+":8443/p?q=1"); got != want {
		t.Errorf("loginRedirect = %q, want %q", got, want)
	}
	if errors.Is(nil, accesstoken.ErrMalformed) {
		t.Fatal("unreachable")
	}
}

func promtestCounter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return promtest.ToFloat64(c)
}

// TestAccessBearerBesideAnotherAuthorization: a request that carries the
// listener's Bearer token and the app's own credential in two
// Authorization fields reaches the app with the app's only, on every app
// protocol; the listener's token is never forwarded, whatever the fields'
// order.
func TestAccessBearerBesideAnotherAuthorization(t *testing.T) {
	e := newAccessEnv(t)
	tok := e.token("k1", "demo", "*", "carol", 0, time.Hour)
	for _, h2 := range []bool{false, true} {
		c := e.client(h2)
		for _, host := range []string{accAPI, accRPCB} {
			if host == accRPCB && !h2 {
				continue // h2c services speak HTTP/2 only
			}
			for _, order := range [][]string{{"Bearer " + tok, "Basic YXBwOnB3"}, {"Basic YXBwOnB3", "Bearer " + tok}} {
				req, err := http.NewRequest("GET", "https://"+host+"/", nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range order {
					req.Header.Add("Authorization", v)
				}
				s := seenRequestOf(t, c, req)
				got := s.Header.Values("Authorization")
				if len(got) != 1 || got[0] != "Basic YXBwOnB3" {
					t.Errorf("h2=%v %s, Authorization %q first: the app saw Authorization %q; want only the app's own", h2, host, order[0][:6], got)
				}
			}
		}
	}
}

// TestAccessCredentialsNotForwardedInTrailers: request trailers to an h2c
// app follow the same rules as the head: the listener's cookie and a
// client's X-Request-Id never reach the app in them either; other
// trailers do. (net/http's server refuses Authorization as a trailer, so
// the Bearer token's case is TestUnitAccessTrailerValue's.)
func TestAccessCredentialsNotForwardedInTrailers(t *testing.T) {
	e := newAccessEnv(t)
	tok := e.token("k1", "demo", "*", "carol", 0, time.Hour)
	c := e.client(true)
	req, err := http.NewRequest("POST", "https://"+accRPCB+"/", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Trailer = http.Header{
		"Cookie":       {accessCookie + "=" + tok + "; app=1"},
		"X-Request-Id": {"client-chosen"},
		"X-Keep":       {"yes"},
	}
	s := seenRequestOf(t, c, req)
	if got := s.Trailer.Get("X-Keep"); got != "yes" {
		t.Fatalf("trailer X-Keep %q, want yes (trailers %v)", got, s.Trailer)
	}
	if got := s.Trailer.Get("Cookie"); got != "app=1" {
		t.Errorf("trailer Cookie %q, want app=1 (the listener's cookie removed)", got)
	}
	if got := s.Trailer.Values("X-Request-Id"); len(got) != 0 {
		t.Errorf("the client's X-Request-Id reached the app in a trailer: %q", got)
	}
}

// TestUnitAccessTrailerValue: the listener's credentials are taken out of
// request trailers as out of the head.
func TestUnitAccessTrailerValue(t *testing.T) {
	bearer := &accessForward{bearer: true}
	for _, tc := range []struct {
		af          *accessForward
		name, value string
		want        string
		keep        bool
	}{
		{bearer, "authorization", "Bearer v1.k1.abc.def", "", false},
		{bearer, "authorization", "Basic YXBwOnB3", "Basic YXBwOnB3", true},
		{&accessForward{}, "authorization", "Bearer app-own", "Bearer app-own", true},
		{bearer, "cookie", accessCookie + "=v1.k1.abc.def; app=1", "app=1", true},
		{bearer, "cookie", accessCookie + "=v1.k1.abc.def", "", false},
		{bearer, "x-applistener-token", "v1.k1.abc.def", "", false},
		{bearer, "x-other", "v", "v", true},
		{nil, "authorization", "Bearer v1.k1.abc.def", "Bearer v1.k1.abc.def", true},
	} {
		got, keep := tc.af.trailerValue(tc.name, tc.value)
		if got != tc.want || keep != tc.keep {
			t.Errorf("%s: %q → %q, %v; want %q, %v", tc.name, tc.value, got, keep, tc.want, tc.keep)
		}
	}
}

// TestAccessWebSocketRefusalFields: an app's refusal of a WebSocket
// upgrade reaches the client with the CORS fields of an allowed origin on
// both protocols, as every other answer of the app does.
func TestAccessWebSocketRefusalFields(t *testing.T) {
	e := newAccessEnv(t)
	tok := e.token("k1", "demo", "web", "", 0, time.Hour)
	hdr := map[string]string{"Origin": accOrigin, "X-Applistener-Token": tok, "Connection": "Upgrade", "Upgrade": "websocket",
		"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	r := e.do(e.client(false), "GET", accWeb, "/ws-refused", hdr)
	if r.status != 403 || r.header.Get("Access-Control-Allow-Origin") != accOrigin {
		t.Errorf("HTTP/1.1: %d, Access-Control-Allow-Origin %q; want 403, %q", r.status, r.header.Get("Access-Control-Allow-Origin"), accOrigin)
	}
	ws, err := openAccessWS(t, e.dialH2Access(accWeb), accWeb, "/ws-refused",
		http.Header{"Origin": {accOrigin}, "X-Applistener-Token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	if ws.resp.StatusCode != 403 || ws.resp.Header.Get("Access-Control-Allow-Origin") != accOrigin {
		t.Errorf("HTTP/2: %d, Access-Control-Allow-Origin %q; want 403, %q", ws.resp.StatusCode, ws.resp.Header.Get("Access-Control-Allow-Origin"), accOrigin)
	}
}
