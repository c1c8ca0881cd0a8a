package e2e

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/testutil"
)

// accessKeysFile is a keys file holding the given ids, each with a secret
// derived from its id.
func accessKeysFile(ids ...string) []byte {
	var keys []string
	for _, id := range ids {
		keys = append(keys, fmt.Sprintf(`{"id":%q,"secret":%q}`, id, base64.StdEncoding.EncodeToString([]byte(strings.Repeat(id, 32)[:32]))))
	}
	return []byte(`{"keys":[` + strings.Join(keys, ",") + `]}`)
}

// accessToken mints a token for team/demo/web with key id (the secret as
// accessKeysFile derives it).
func accessToken(t testing.TB, id, sub string) string {
	t.Helper()
	ks, err := accesstoken.NewKeySet(accesstoken.Key{ID: id, Secret: []byte(strings.Repeat(id, 32)[:32])})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ks.Mint(id, accesstoken.Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: sub,
		Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// accessDoc routes team/demo's web (access mode token) and team/open's
// unnamed service (public) to the same backend.
func accessDoc(port int) []byte {
	return fmt.Appendf(nil, `{"revision":"a%d","instances":[
	  {"workspace":"team","sandbox":"demo","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},
	   "services":[{"name":"web","port":%d,"access":{"mode":"token"}}]},
	  {"workspace":"team","sandbox":"open","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},
	   "services":[{"name":"","port":%d}]}]}`, revCounter.Add(1), port, port)
}

// TestAccessKeysFile: `serve --access-keys-file` enforces a token-mode
// service: 401 without a token, the app reached with one (and never
// seeing it); removing a key id from the file closes the WebSocket
// authenticated with it and refuses its tokens, while the other key's
// still pass; the token is never logged; the denials are counted.
func TestAccessKeysFile(t *testing.T) {
	be := newBackend(t, "app")
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.json")
	writeAtomic(t, keys, accessKeysFile("k1", "k2"))
	p := startProc(t, accessDoc(be.port), "--access-keys-file", keys)
	web := "team--demo--web." + domain
	c, _ := p.client(t, web)

	get := func(tok string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+web+"/page", nil)
		req.Header.Set("Accept", "application/json")
		if tok != "" {
			req.Header.Set("X-Applistener-Token", tok)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	if resp := get(""); resp.StatusCode != 401 {
		t.Fatalf("without a token: %d", resp.StatusCode)
	}
	if be.count() != 0 {
		t.Fatal("the app received a request without a token")
	}
	t1, t2 := accessToken(t, "k1", "alice"), accessToken(t, "k2", "bob")
	if resp := get(t1); resp.StatusCode != 200 {
		t.Fatalf("with a k1 token: %d", resp.StatusCode)
	}
	r := be.last(t, "/page")
	if r.Header.Get("X-Applistener-Token") != "" || r.Header.Get("X-Forwarded-User") != "alice" {
		t.Fatalf("the app saw %v", r.Header)
	}

	// A WebSocket authenticated with k1, on a connection of its own.
	d := websocket.Dialer{NetDialContext: p.dial, TLSClientConfig: tlsConfig(web), HandshakeTimeout: waitTimeout}
	ws, resp, err := d.Dial("wss://"+web+"/ws", http.Header{"Cookie": {"__Host-applistener-token=" + t1}})
	if err != nil {
		t.Fatalf("WebSocket with the k1 cookie: %v %v", resp, err)
	}
	defer func() { _ = ws.Close() }()
	must(t, wsEcho(ws, websocket.TextMessage, []byte("before")))
	if _, resp, err := d.Dial("wss://"+web+"/ws", nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("WebSocket without a token: %v %v", resp, err)
	}

	// k1 leaves the keys file.
	writeAtomic(t, keys, accessKeysFile("k2"))
	// Closed (a close frame, or the connection) within the keys file's
	// poll; wsExpectClosed fails the test otherwise.
	_ = wsExpectClosed(t, ws, waitTimeout)
	testutil.Eventually(t, waitTimeout, "k1 tokens refused", func() bool { return get(t1).StatusCode == 401 })
	if resp := get(t2); resp.StatusCode != 200 {
		t.Fatalf("with a k2 token after the rotation: %d", resp.StatusCode)
	}
	// The public instance is unchanged.
	pc, _ := p.client(t, "team--open."+domain)
	if resp, err := pc.Get("https://team--open." + domain + "/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("public service: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	if n := p.metric(t, "applistener_access_denials_total"); n < 3 {
		t.Fatalf("applistener_access_denials_total = %v, want at least 3", n)
	}
	out := p.output()
	for _, tok := range []string{t1, t2} {
		if strings.Contains(out, tok[len(tok)-43:]) || strings.Contains(out, tok[:40]) {
			t.Fatal("the output contains a token")
		}
	}
	if !strings.Contains(out, `"access_denial":"unknown_key"`) && !strings.Contains(out, "access_denial=unknown_key") {
		t.Fatalf("no access log line with the denial reason:\n%s", out)
	}
}

// TestAccessWithoutKeysFile: a listener without --access-keys-file
// refuses an instance with a token-mode service at install, with one log
// line saying why, and never serves it publicly; other instances serve.
func TestAccessWithoutKeysFile(t *testing.T) {
	be := newBackend(t, "app")
	p := startProc(t, accessDoc(be.port))
	testutil.Eventually(t, waitTimeout, "the refusal logged", func() bool {
		return strings.Contains(p.output(), "access mode token needs access keys: start the listener with --access-keys-file")
	})
	if _, err := p.dialTLS(tlsConfig("team--demo--web." + domain)); err == nil {
		t.Fatal("the private service's route is installed")
	}
	pc, _ := p.client(t, "team--open."+domain)
	resp, err := pc.Get("https://team--open." + domain + "/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("public service: %v %v", resp, err)
	}
	_ = resp.Body.Close()
}
