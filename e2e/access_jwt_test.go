package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/accessjwt/jwttest"
)

// TestAccessJWKS: `serve --access-jwks-url` accepts a platform JWT (from a
// real JWKS server) in X-Applistener-Token, swaps it for the listener's
// own token as the cookie, and the cookie alone then passes without
// another JWKS fetch; a JWT of an unpublished key is refused.
func TestAccessJWKS(t *testing.T) {
	be := newBackend(t, "app")
	keys := filepath.Join(t.TempDir(), "keys.json")
	writeAtomic(t, keys, accessKeysFile("k1", "k2"))
	signer := jwttest.NewKey(t, "platform-1", "EdDSA")
	js := jwttest.NewServer(t, signer)
	const iss, aud = "https://idp.example.com", "applistener-e2e"
	p := startProc(t, accessDoc(be.port), "--access-keys-file", keys,
		"--access-jwks-url", js.URL, "--access-jwt-issuer", iss, "--access-jwt-audience", aud)
	web := "team--demo--web." + domain
	c, _ := p.client(t, web)
	get := func(field, value string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+web+"/page", nil)
		req.Header.Set("Accept", "application/json")
		req.Header.Set(field, value)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	svc := "web"
	jwtTok := signer.Sign(t, jwttest.Claims(iss, aud, "team", "demo", &svc, "alice", time.Hour))
	resp := get("X-Applistener-Token", jwtTok)
	if resp.StatusCode != 200 {
		t.Fatalf("with a platform JWT: %d", resp.StatusCode)
	}
	if r := be.last(t, "/page"); r.Header.Get("X-Applistener-Token") != "" || r.Header.Get("X-Forwarded-User") != "alice" {
		t.Fatalf("the app saw %v", r.Header)
	}
	sc := resp.Header.Get("Set-Cookie")
	if !strings.HasPrefix(sc, "__Host-applistener-token=v1.k1.") {
		t.Fatalf("Set-Cookie %q: want the listener's token minted with k1", sc)
	}
	cookie, _, _ := strings.Cut(sc, ";")
	fetches := js.Fetches()
	if resp := get("Cookie", cookie); resp.StatusCode != 200 {
		t.Fatalf("with the swapped cookie: %d", resp.StatusCode)
	}
	if n := js.Fetches(); n != fetches {
		t.Fatalf("the cookie request fetched the JWKS (%d → %d)", fetches, n)
	}
	other := jwttest.NewKey(t, "unpublished", "EdDSA")
	if resp := get("X-Applistener-Token", other.Sign(t, jwttest.Claims(iss, aud, "team", "demo", &svc, "eve", time.Hour))); resp.StatusCode != 401 {
		t.Fatalf("a JWT of an unpublished key: %d", resp.StatusCode)
	}
	out := p.output()
	if strings.Contains(out, jwtTok[len(jwtTok)-40:]) || strings.Contains(out, cookie[len(cookie)-40:]) {
		t.Fatal("the output contains a credential")
	}
}
