package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// accessWebEnv is one listener (offering browsers HTTP/2, or HTTP/1.1
// only) in front of the sandbox team/demo:
//
//	web    private (mode token), login_url = site's /login, cors_origins = site
//	api    private, no login_url (the HTML 401 page), cors_origins = site
//	site   public: the allowed sibling origin, and the login page
//	other  public: an origin not in cors_origins
//
// and team/demo2 with a private web, all on recording apps, plus extra
// services of team/demo.
type accessWebEnv struct {
	p          *proc
	pc         protoCase
	keys       *accessKeys
	generation int             // of the private services' policies
	extra      []accessService // more services of team/demo

	web, api, site, other, web2 *accessApp
}

func newAccessWebEnv(t testing.TB, pc protoCase, extra ...accessService) *accessWebEnv {
	t.Helper()
	e := &accessWebEnv{
		pc: pc, keys: newAccessKeys(t, t.TempDir(), "k1", "k2"), generation: 1, extra: extra,
		web: newAccessApp(t, "web"), api: newAccessApp(t, "api"), site: newAccessApp(t, "site"),
		other: newAccessApp(t, "other"), web2: newAccessApp(t, "web2"),
	}
	// The policies name the listener's port (origins and the login URL
	// carry it): start with the apps public, then install the policies.
	doc, _ := e.doc("")
	e.p = startAccessProc(t, doc, e.keys, pc.flags...)
	doc, rev := e.doc(e.p.port(t))
	e.p.applyRoutes(t, doc, rev)
	return e
}

// doc is the routes document; port "" makes every service public.
// The private services' policies have generation e.generation.
func (e *accessWebEnv) doc(port string) ([]byte, string) {
	var private, privateNoLogin, private2 map[string]any
	if port != "" {
		site := "https://" + accessHost("demo", "site") + ":" + port
		private = tokenPolicy(e.generation, site+"/login", site)
		privateNoLogin = tokenPolicy(e.generation, "", site)
		private2 = tokenPolicy(e.generation, "")
	}
	demo := []accessService{
		{name: "web", port: e.web.port, access: private},
		{name: "api", port: e.api.port, access: privateNoLogin},
		{name: "site", port: e.site.port},
		{name: "other", port: e.other.port},
	}
	for _, s := range e.extra {
		if port == "" {
			s.access = nil
		}
		demo = append(demo, s)
	}
	return privateRoutesDoc(
		accessSandbox{sandbox: "demo", services: demo},
		accessSandbox{sandbox: "demo2", services: []accessService{
			{name: "web", port: e.web2.port, access: private2},
		}},
	)
}

func (e *accessWebEnv) origin(t testing.TB, sandbox, service string) string {
	return e.p.origin(t, accessHost(sandbox, service))
}

// webToken is a token for team/demo/web with subject alice.
func (e *accessWebEnv) webToken(t testing.TB) string {
	return e.keys.mint(t, tokenSpec{sandbox: "demo", service: "web", subject: "alice", generation: 1})
}

// clearCookies empties the browser's cookie store.
func (b *browser) clearCookies(t testing.TB) {
	t.Helper()
	if err := b.call("Network.clearBrowserCookies", nil, nil); err != nil {
		t.Fatalf("clearing cookies: %v", err)
	}
}

// headerValue is the value of a response header recorded by the browser
// (names are lower case over HTTP/2, as sent over HTTP/1.1).
func headerValue(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// TestAccessBrowser runs issue 26's browser tests in one real Chromium
// against two listeners, one offering HTTP/2 and one HTTP/1.1 only:
//
//  1. TokenLink: a private app opened with ?_al_token= loads, the address
//     bar ends without the token, the page's own WebSocket (HMR-style)
//     connects on the cookie and echoes, and the app never saw the token;
//     without the cookie, a WebSocket whose only subprotocol is the token
//     connects too.
//  2. CORSFetch: a JSON POST with credentials from the allowed sibling
//     origin passes its preflight (answered 204 by the listener, as its
//     access log says) and the script reads the app's answer;
//     from another origin the script gets a TypeError; without a
//     credential the script reads the 401 JSON body.
//  3. NoCredentialNavigation: the navigation ends at login_url with
//     return_to, or on the HTML 401 page when login_url is unset.
func TestAccessBrowser(t *testing.T) {
	t.Parallel()
	browserAvailable(t)
	envs := make([]*accessWebEnv, len(accessProtocols))
	for i, pc := range accessProtocols {
		envs[i] = newAccessWebEnv(t, pc)
	}
	b := newBrowser(t, testCAFile(t), domain)
	for _, e := range envs {
		t.Run(e.pc.name, func(t *testing.T) {
			t.Run("TokenLink", func(t *testing.T) { accessBrowserTokenLink(t, b, e) })
			t.Run("CORSFetch", func(t *testing.T) { accessBrowserCORSFetch(t, b, e) })
			t.Run("NoCredentialNavigation", func(t *testing.T) { accessBrowserNoCredential(t, b, e) })
		})
	}
}

// openWithToken opens path on team/demo/web with ?_al_token=tok after
// query, and checks that the page loaded over the env's protocol at the
// same URL without the token.
func openWithToken(t *testing.T, b *browser, e *accessWebEnv, tok string) {
	t.Helper()
	origin := e.origin(t, "demo", "web")
	resp := b.navigate(t, origin+"/app?x=1&"+tokenQuery+"="+url.QueryEscape(tok))
	if resp == nil || resp.Status != 200 {
		t.Fatalf("the page opened with %s: %+v; want 200 from the app", tokenQuery, resp)
	}
	if resp.Protocol != e.pc.name {
		t.Errorf("the page came over %q; want %q", resp.Protocol, e.pc.name)
	}
	if got, want := b.eval(t, "location.href"), origin+"/app?x=1"; got != want {
		t.Errorf("the address bar shows %q; want %q (the same URL without %s)", got, want, tokenQuery)
	}
	if got := b.eval(t, "document.body.innerText"); !strings.Contains(got, "hello from web") {
		t.Errorf("the page says %q; want the app's page", got)
	}
}

func accessBrowserTokenLink(t *testing.T, b *browser, e *accessWebEnv) {
	b.clearCookies(t)
	origin := e.origin(t, "demo", "web")
	tok := e.webToken(t)
	minted := time.Now()
	before := len(e.web.received("/app"))
	openWithToken(t, b, e, tok)

	// The cookie the listener set in the 303: host-only, HttpOnly,
	// Secure, SameSite=Lax, expiring with the token (one hour).
	var cookie *browserCookie
	for _, c := range b.cookies(t, origin+"/") {
		if c.Name == tokenCookie {
			cookie = &c
		}
	}
	switch {
	case cookie == nil:
		t.Fatalf("no %s cookie in the browser's store", tokenCookie)
	case cookie.Value != tok:
		t.Errorf("the cookie's value is not the token")
	case !cookie.HTTPOnly || !cookie.Secure || cookie.SameSite != "Lax" || cookie.Domain != accessHost("demo", "web") || cookie.Path != "/":
		t.Errorf("cookie %s: httpOnly %v secure %v sameSite %q domain %q path %q; want HttpOnly, Secure, Lax, host-only %s, /",
			cookie.Name, cookie.HTTPOnly, cookie.Secure, cookie.SameSite, cookie.Domain, accessHost("demo", "web"), cookie.Path)
	case cookie.Session:
		t.Errorf("the cookie is a session cookie; want Max-Age until the token expires")
	default:
		exp := time.Unix(int64(cookie.Expires), 0)
		if want := minted.Add(time.Hour); exp.Before(want.Add(-10*time.Second)) || exp.After(want.Add(10*time.Second)) {
			t.Errorf("the cookie expires at %v; want about %v (the token's expiry)", exp, want)
		}
	}
	if got := b.eval(t, "document.cookie"); strings.Contains(got, tokenCookie) {
		t.Errorf("the page's script can read the token cookie: %q", got)
	}

	// The page's own WebSocket, to its own origin, on the cookie.
	if got := b.eval(t, browserWSOpen); got != "hello from chromium" {
		t.Fatalf("the page's WebSocket echoed %q", got)
	}
	rec := e.web.waitReceived(t, "/ws")
	if got := rec.Header.Get(userHeader); got != "alice" {
		t.Errorf("the app's WebSocket request had %s %q; want alice", userHeader, got)
	}
	wsBefore := len(accessLinesOf(t, e.p, "protocol", "ws"))
	b.eval(t, "window.ws.close(1000)")
	wantTransport := map[string]string{"h2": "h2", "http/1.1": "h1"}[e.pc.name]
	var lines []map[string]any
	testutil.Eventually(t, waitTimeout, "the WebSocket's access-log line", func() bool {
		lines = accessLinesOf(t, e.p, "protocol", "ws")
		return len(lines) > wsBefore
	})
	if l := lines[len(lines)-1]; l["transport"] != wantTransport || l["credential"] != "cookie" || l["user"] != "alice" {
		t.Errorf("the page's WebSocket's access-log line: transport %v, credential %v, user %v; want %s, cookie, alice",
			l["transport"], l["credential"], l["user"], wantTransport)
	}

	// A client that cannot set headers nor hold the cookie: the token as
	// the WebSocket's only subprotocol, which the listener's acceptance
	// names (a browser fails a handshake that names none).
	b.clearCookies(t)
	wsN := len(e.web.received("/ws"))
	subproto := fmt.Sprintf(`new Promise((resolve, reject) => {
		const ws = new WebSocket("wss://" + location.host + "/ws", [%q]);
		ws.onopen = () => ws.send("by subprotocol");
		ws.onmessage = (ev) => { resolve(ws.protocol === %q ? ev.data : "protocol " + ws.protocol); ws.close(1000); };
		ws.onerror = () => reject(new Error("websocket error"));
	})`, "applistener.token."+tok, "applistener.token."+tok)
	if got := b.eval(t, subproto); got != "by subprotocol" {
		t.Errorf("the WebSocket with the token subprotocol only: %q", got)
	}
	if got := e.web.received("/ws")[wsN:]; len(got) != 1 || len(got[0].Header.Values("Sec-Websocket-Protocol")) != 0 {
		t.Errorf("the app got %d WebSocket requests after the subprotocol one; want 1, offered no subprotocol", len(got))
	}

	// The app served the page once (the request that carried the token
	// was answered by the listener) with the token's subject.
	apps := e.web.received("/app")[before:]
	if len(apps) != 1 {
		t.Fatalf("the app received %d requests for /app; want 1 (the one after the 303)", len(apps))
	}
	if apps[0].URI != "/app?x=1" {
		t.Errorf("the app saw %q; want /app?x=1", apps[0].URI)
	}
	if got := apps[0].Header.Get(userHeader); got != "alice" {
		t.Errorf("the app saw %s %q; want alice", userHeader, got)
	}
	e.web.neverSawCredentials(t, tok)
	e.p.neverLogged(t, tok)
}

// corsFetch is a page script: a JSON POST with credentials to url; it
// returns {"status","body"} or, when the fetch fails, {"error","message"}.
func corsFetch(url string) string {
	return fmt.Sprintf(`fetch(%q, {method: "POST", credentials: "include", cache: "no-store",
		headers: {"Content-Type": "application/json"}, body: JSON.stringify({n: 1})})
	.then(async r => JSON.stringify({status: r.status, body: await r.text()}),
	      e => JSON.stringify({error: e.name, message: e.message}))`, url)
}

type fetchResult struct {
	Status  int    `json:"status"`
	Body    string `json:"body"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

func runFetch(t *testing.T, b *browser, js string) fetchResult {
	t.Helper()
	var r fetchResult
	if err := json.Unmarshal([]byte(b.eval(t, js)), &r); err != nil {
		t.Fatalf("the fetch script's result: %v", err)
	}
	return r
}

func accessBrowserCORSFetch(t *testing.T, b *browser, e *accessWebEnv) {
	b.clearCookies(t)
	webOrigin := e.origin(t, "demo", "web")
	siteOrigin := e.origin(t, "demo", "site")
	otherOrigin := e.origin(t, "demo", "other")
	tok := e.webToken(t)
	openWithToken(t, b, e, tok) // the cookie

	// From the allowed sibling origin: the preflight passes, the POST
	// carries the cookie, the script reads the app's answer.
	if resp := b.navigate(t, siteOrigin+"/page"); resp == nil || resp.Status != 200 {
		t.Fatalf("the sibling's page: %+v", resp)
	}
	r := runFetch(t, b, corsFetch(webOrigin+"/api"))
	if r.Error != "" || r.Status != 200 {
		t.Fatalf("fetch from the allowed origin: %+v; want 200 and the app's answer", r)
	}
	var answer map[string]string
	if err := json.Unmarshal([]byte(r.Body), &answer); err != nil {
		t.Fatalf("the app's answer %q: %v", r.Body, err)
	}
	if answer["app"] != "web" || answer["method"] != "POST" || answer["body"] != `{"n":1}` || answer["user"] != "alice" {
		t.Errorf("the app's answer %v; want web, POST, {\"n\":1}, user alice", answer)
	}
	posts := e.web.received("/api")
	if len(posts) == 0 || posts[len(posts)-1].Header.Get("Origin") != siteOrigin {
		t.Errorf("the app did not get the POST from %s", siteOrigin)
	}
	preflights := func(status float64) int {
		n := 0
		for _, l := range accessLinesOf(t, e.p, "method", "OPTIONS") {
			if l["path"] == "/api" && l["status"] == status {
				n++
			}
		}
		return n
	}
	testutil.Eventually(t, waitTimeout, "the access-log line of the preflight the listener answered 204", func() bool {
		return preflights(204) > 0
	})
	for _, rec := range e.web.requests() {
		if rec.Method == "OPTIONS" {
			t.Errorf("the app received a preflight (%s); the listener answers them", rec.URI)
		}
	}
	e.web.neverSawCredentials(t, tok)

	// From an origin not in cors_origins: the preflight is refused, the
	// script sees a TypeError and the app sees nothing.
	if resp := b.navigate(t, otherOrigin+"/page"); resp == nil || resp.Status != 200 {
		t.Fatalf("the other origin's page: %+v", resp)
	}
	n := len(e.web.requests())
	if r := runFetch(t, b, corsFetch(webOrigin+"/api")); r.Error != "TypeError" {
		t.Errorf("fetch from a disallowed origin: %+v; want a TypeError", r)
	}
	if got := e.web.requestsSince(n); len(got) != 0 {
		t.Errorf("a fetch from a disallowed origin reached the app: %s %s", got[0].Method, got[0].URI)
	}
	testutil.Eventually(t, waitTimeout, "the access-log line of the preflight the listener refused 403", func() bool {
		return preflights(403) > 0
	})

	// Without a credential, from the allowed origin: the script reads the
	// 401 and its JSON body.
	b.clearCookies(t)
	if resp := b.navigate(t, siteOrigin+"/page"); resp == nil || resp.Status != 200 {
		t.Fatalf("the sibling's page: %+v", resp)
	}
	n = len(e.web.requests())
	r = runFetch(t, b, corsFetch(webOrigin+"/api"))
	if r.Error != "" || r.Status != 401 {
		t.Fatalf("fetch without a credential: %+v; want a readable 401", r)
	}
	var denial map[string]any
	if err := json.Unmarshal([]byte(r.Body), &denial); err != nil || denial["error"] != "unauthenticated" {
		t.Errorf("the 401's body %q; want {\"error\":\"unauthenticated\"}", r.Body)
	}
	if got := e.web.requestsSince(n); len(got) != 0 {
		t.Errorf("a fetch without a credential reached the app: %s %s", got[0].Method, got[0].URI)
	}
}

func accessBrowserNoCredential(t *testing.T, b *browser, e *accessWebEnv) {
	b.clearCookies(t)
	webOrigin := e.origin(t, "demo", "web")
	siteOrigin := e.origin(t, "demo", "site")
	before := len(e.web.requests())

	// With login_url: the browser ends at the login page with return_to,
	// also when the link carries a token that is not valid (the token is
	// not in return_to).
	for _, link := range []string{"/app?x=1", "/app?x=1&" + tokenQuery + "=v1.k1.bogus.bogus"} {
		resp := b.navigate(t, webOrigin+link)
		if resp == nil || resp.Status != 200 {
			t.Fatalf("navigation to %s: %+v; want to end at the login page", link, resp)
		}
		at, err := url.Parse(b.eval(t, "location.href"))
		if err != nil {
			t.Fatal(err)
		}
		if got := at.Scheme + "://" + at.Host + at.Path; got != siteOrigin+"/login" {
			t.Errorf("navigation to %s ended at %s; want %s/login", link, at, siteOrigin)
		}
		if got, want := at.Query().Get("return_to"), webOrigin+"/app?x=1"; got != want {
			t.Errorf("navigation to %s: return_to %q; want %q", link, got, want)
		}
		if got := b.eval(t, "document.body.innerText"); !strings.Contains(got, "please log in") {
			t.Errorf("the login page says %q", got)
		}
	}
	if got := e.web.requestsSince(before); len(got) != 0 {
		t.Errorf("a navigation without a credential reached the app: %s %s", got[0].Method, got[0].URI)
	}
	e.site.waitReceived(t, "/login")

	// Without login_url: the HTML 401 page, at the same address.
	apiOrigin := e.origin(t, "demo", "api")
	before = len(e.api.requests())
	resp := b.navigate(t, apiOrigin+"/app")
	if resp == nil || resp.Status != 401 {
		t.Fatalf("navigation to a private service without login_url: %+v; want 401", resp)
	}
	if ct := headerValue(resp.Header, "Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("the 401 page's Content-Type %q; want text/html", ct)
	}
	if resp.Protocol != e.pc.name {
		t.Errorf("the 401 page came over %q; want %q", resp.Protocol, e.pc.name)
	}
	if got := b.eval(t, "location.href"); got != apiOrigin+"/app" {
		t.Errorf("the browser is at %q; want %s/app (no redirect)", got, apiOrigin)
	}
	if got := b.eval(t, "document.body.innerText"); strings.TrimSpace(got) == "" {
		t.Errorf("the 401 page is empty")
	}
	if got := e.api.requestsSince(before); len(got) != 0 {
		t.Errorf("a navigation without a credential reached the app: %s %s", got[0].Method, got[0].URI)
	}
}

// accessLinesOf is accessLines for any testing.TB.
func accessLinesOf(t testing.TB, p *proc, key, want string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range logLines(t, p, "access") {
		if m[key] == want {
			out = append(out, m)
		}
	}
	return out
}
