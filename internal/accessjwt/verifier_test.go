package accessjwt_test

import (
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/internal/accessjwt"
	"github.com/applistener/applistener/internal/accessjwt/jwttest"
	"github.com/applistener/applistener/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	iss = "https://idp.example.com"
	aud = "applistener"
)

func newVerifier(t *testing.T, url string, mod func(*accessjwt.Config)) *accessjwt.Verifier {
	t.Helper()
	cfg := accessjwt.Config{JWKSURL: url, Issuer: iss, Audience: aud, FetchWait: 5 * time.Second, FetchTimeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	v, err := accessjwt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

func ptr(s string) *string { return &s }

func TestVerifyAlgorithms(t *testing.T) {
	keys := []jwttest.Key{jwttest.NewKey(t, "rsa1", "RS256"), jwttest.NewKey(t, "ec1", "ES256"), jwttest.NewKey(t, "ed1", "EdDSA")}
	js := jwttest.NewServer(t, keys...)
	v := newVerifier(t, js.URL, nil)
	for _, k := range keys {
		t.Run(k.Alg, func(t *testing.T) {
			tok := k.Sign(t, jwttest.Claims(iss, aud, "team", "demo", ptr("web"), "alice", time.Hour))
			c, err := v.Verify(tok, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if c.KeyID != k.Kid || c.Workspace != "team" || c.Sandbox != "demo" || c.Service != "web" || c.AllServices || c.Subject != "alice" || c.Generation != 0 {
				t.Fatalf("claims %+v", c)
			}
		})
	}
	// Without applistener_service: every service; a generation claim.
	cl := jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour)
	cl["applistener_generation"] = 3
	c, err := v.Verify(keys[2].Sign(t, cl), time.Now())
	if err != nil || !c.AllServices || c.Generation != 3 {
		t.Fatalf("claims %+v, %v", c, err)
	}
	if n := js.Fetches(); n != 1 {
		t.Fatalf("JWKS fetched %d times, want 1", n)
	}
}

// TestVerifyRefuses: every JWT that must not pass, with its category.
func TestVerifyRefuses(t *testing.T) {
	rsaKey, edKey := jwttest.NewKey(t, "rsa1", "RS256"), jwttest.NewKey(t, "ed1", "EdDSA")
	js := jwttest.NewServer(t, rsaKey, edKey)
	v := newVerifier(t, js.URL, func(c *accessjwt.Config) { c.MinRefreshInterval = time.Hour })
	good := func() jwt.MapClaims { return jwttest.Claims(iss, aud, "team", "demo", ptr("web"), "alice", time.Hour) }
	with := func(k string, val any) jwt.MapClaims {
		c := good()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	// HS256 keyed with the RSA public key's bytes (the key-confusion attack).
	der, err := x509.MarshalPKIXPublicKey(rsaKey.Priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, good())
	hs.Header["kid"] = "rsa1"
	hsTok, err := hs.SignedString(der)
	if err != nil {
		t.Fatal(err)
	}
	none := jwt.NewWithClaims(jwt.SigningMethodNone, good())
	none.Header["kid"] = "rsa1"
	noneTok, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	// An RS256 header naming the Ed25519 kid.
	mixed := rsaKey
	mixed.Kid = "ed1"
	// A valid signature with the payload changed.
	good1 := rsaKey.Sign(t, good())
	parts := strings.Split(good1, ".")
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"` + iss + `","aud":"` + aud + `","exp":9999999999,"applistener_workspace":"team","applistener_sandbox":"other"}`))
	tampered := strings.Join(parts, ".")
	unknown := jwttest.NewKey(t, "nope", "EdDSA")

	for _, tc := range []struct {
		name string
		tok  string
		want error
	}{
		{"wrong issuer", rsaKey.Sign(t, with("iss", "https://evil.example.com")), accessjwt.ErrInvalidClaims},
		{"wrong audience", rsaKey.Sign(t, with("aud", "other")), accessjwt.ErrInvalidClaims},
		{"no expiry", rsaKey.Sign(t, with("exp", nil)), accessjwt.ErrInvalidClaims},
		{"expired", rsaKey.Sign(t, with("exp", time.Now().Add(-time.Minute).Unix())), accesstoken.ErrExpired},
		{"not yet valid", rsaKey.Sign(t, with("nbf", time.Now().Add(time.Hour).Unix())), accessjwt.ErrInvalidClaims},
		{"no workspace", edKey.Sign(t, with("applistener_workspace", nil)), accessjwt.ErrInvalidClaims},
		{"alg none", noneTok, accesstoken.ErrMalformed}, // an empty signature: not even a JWT's shape
		{"alg none with a signature", noneTok + "AAAA", accesstoken.ErrBadSignature},
		{"HS256 with the public key", hsTok, accesstoken.ErrBadSignature},
		{"alg of another key type", mixed.Sign(t, good()), accesstoken.ErrBadSignature},
		{"tampered payload", tampered, accesstoken.ErrBadSignature},
		{"unknown kid", unknown.Sign(t, good()), accesstoken.ErrUnknownKey},
		{"not a JWT", "v1.k1.abc.def", accesstoken.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(tc.tok, time.Now())
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestKeyRotation: a token signed with a kid the JWKS published since the
// last fetch passes once the JWKS was fetched again; a kid removed from
// the JWKS no longer verifies (even a token verified before).
func TestKeyRotation(t *testing.T) {
	old, next := jwttest.NewKey(t, "2026-11", "RS256"), jwttest.NewKey(t, "2026-12", "EdDSA")
	js := jwttest.NewServer(t, old)
	v := newVerifier(t, js.URL, func(c *accessjwt.Config) { c.MinRefreshInterval = 200 * time.Millisecond })
	oldTok := old.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour))
	if _, err := v.Verify(oldTok, time.Now()); err != nil {
		t.Fatal(err)
	}
	js.SetKeys(next)
	tok := next.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour))
	// Within MinRefreshInterval of the last fetch the kid may be refused
	// at once; after it, the unknown kid fetches the JWKS again.
	testutil.Eventually(t, 10*time.Second, "the new kid verifies", func() bool {
		_, err := v.Verify(tok, time.Now())
		return err == nil
	})
	if _, err := v.Verify(oldTok, time.Now()); !errors.Is(err, accesstoken.ErrUnknownKey) {
		t.Fatalf("token of the removed kid: %v, want unknown key", err)
	}
}

// TestUnknownKidFlood: JWTs with made-up kids cause at most one JWKS fetch
// per MinRefreshInterval, and are refused at once in between.
func TestUnknownKidFlood(t *testing.T) {
	k := jwttest.NewKey(t, "k", "EdDSA")
	js := jwttest.NewServer(t, k)
	const interval = 300 * time.Millisecond
	v := newVerifier(t, js.URL, func(c *accessjwt.Config) { c.MinRefreshInterval = interval })
	if _, err := v.Verify(k.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour)), time.Now()); err != nil {
		t.Fatal(err)
	}
	garbage := make([]string, 64)
	for i := range garbage {
		g := k
		g.Kid = "garbage-" + string(rune('a'+i%26)) + strings.Repeat("x", i)
		garbage[i] = g.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour))
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; time.Since(start) < time.Second; i++ {
				if _, err := v.Verify(garbage[(w*8+i)%len(garbage)], time.Now()); !errors.Is(err, accesstoken.ErrUnknownKey) {
					t.Errorf("garbage kid: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The first fetch, then at most one per interval started during the flood.
	limit := 1 + int64(elapsed/interval) + 1
	if n := js.Fetches(); n > limit {
		t.Fatalf("%d JWKS fetches in %v of garbage kids, want at most %d", n, elapsed, limit)
	}
	if v.Fetches() != js.Fetches() {
		t.Fatalf("verifier counted %d fetches, server %d", v.Fetches(), js.Fetches())
	}
}

// TestHangingJWKS: a JWKS server that never answers holds a request at
// most FetchWait; Close ends the fetch.
func TestHangingJWKS(t *testing.T) {
	k := jwttest.NewKey(t, "k", "ES256")
	js := jwttest.NewServer(t, k)
	js.Hang(true)
	const wait = 300 * time.Millisecond
	v := newVerifier(t, js.URL, func(c *accessjwt.Config) {
		c.FetchWait, c.FetchTimeout, c.MinRefreshInterval = wait, time.Hour, time.Hour
	})
	tok := k.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour))
	start := time.Now()
	_, err := v.Verify(tok, time.Now())
	if d := time.Since(start); d > wait+2*time.Second {
		t.Fatalf("Verify took %v with a hanging JWKS, bound %v", d, wait)
	}
	if !errors.Is(err, accessjwt.ErrKeysUnavailable) {
		t.Fatalf("Verify: %v, want keys unavailable", err)
	}
	// A second request does not wait again (no new fetch may start).
	start = time.Now()
	if _, err := v.Verify(tok, time.Now()); err == nil || time.Since(start) > wait+2*time.Second {
		t.Fatalf("second Verify: %v after %v", err, time.Since(start))
	}
	done := make(chan struct{})
	go func() { v.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the hanging fetch")
	}
}

// TestJWKSCacheHeaders: a verifier refetches when the JWKS's max-age ends.
func TestJWKSCacheHeaders(t *testing.T) {
	k := jwttest.NewKey(t, "k", "EdDSA")
	js := jwttest.NewServer(t, k)
	js.CacheControl = "public, max-age=86400"
	v := newVerifier(t, js.URL, nil)
	tok := k.Sign(t, jwttest.Claims(iss, aud, "team", "demo", nil, "", time.Hour))
	for range 20 {
		if _, err := v.Verify(tok, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n := js.Fetches(); n != 1 {
		t.Fatalf("%d fetches, want 1", n)
	}
}

func TestFreshness(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		h    http.Header
		want time.Duration
	}{
		{http.Header{}, time.Hour},
		{http.Header{"Cache-Control": {"public, max-age=600"}}, 10 * time.Minute},
		{http.Header{"Cache-Control": {"max-age=1"}}, time.Minute},
		{http.Header{"Cache-Control": {"max-age=99999999999"}}, 24 * time.Hour},
		{http.Header{"Cache-Control": {"no-store"}}, time.Minute},
		{http.Header{"Expires": {now.Add(2 * time.Hour).Format(http.TimeFormat)}}, 2 * time.Hour},
		{http.Header{"Expires": {"0"}}, time.Minute},
	} {
		if got := accessjwt.Freshness(tc.h, now, time.Hour, time.Minute, 24*time.Hour); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.h, got, tc.want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for u, ok := range map[string]bool{
		"https://idp.example.com/jwks": true, "http://127.0.0.1:8080/jwks": true, "http://[::1]/jwks": true,
		"http://localhost/jwks": true, "http://idp.example.com/jwks": false, "ftp://x/": false, "https://": false,
	} {
		if err := accessjwt.CheckURL(u); (err == nil) != ok {
			t.Errorf("CheckURL(%q): %v", u, err)
		}
	}
}

func TestParseJWKSSkips(t *testing.T) {
	ed := jwttest.NewKey(t, "ed", "EdDSA").JWK()
	weak := `{"kty":"RSA","kid":"weak","n":"` + base64.RawURLEncoding.EncodeToString([]byte{0xc5, 0x01}) + `","e":"AQAB"}`
	enc := `{"kty":"OKP","kid":"enc","use":"enc","crv":"Ed25519","x":"` + ed["x"] + `"}`
	p384 := `{"kty":"EC","kid":"p384","crv":"P-384","x":"AA","y":"AA"}`
	hs := `{"kty":"oct","kid":"hs","k":"c2VjcmV0"}`
	good := `{"kty":"OKP","kid":"ed","crv":"Ed25519","x":"` + ed["x"] + `"}`
	ks, skipped, err := accessjwt.ParseJWKS([]byte(`{"keys":[` + strings.Join([]string{weak, enc, p384, hs, good}, ",") + `]}`))
	if err != nil || skipped != 4 || len(ks) != 1 {
		t.Fatalf("ParseJWKS: %d keys, %d skipped, %v", len(ks), skipped, err)
	}
	if _, _, err := accessjwt.ParseJWKS([]byte(`{"keys":[` + hs + `]}`)); err == nil {
		t.Fatal("a JWKS without a usable key was accepted")
	}
}
