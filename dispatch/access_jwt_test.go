package dispatch

import (
	"crypto/x509"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/applistener/applistener/internal/accessjwt"
	"github.com/applistener/applistener/internal/accessjwt/jwttest"
	"github.com/applistener/applistener/internal/testutil"
)

const (
	jwtIssuer   = "https://idp.example.com"
	jwtAudience = "applistener-test"
)

// jwtEnv is an access test listener that also accepts JWTs of a real
// JWKS server publishing an RSA and an Ed25519 key.
type jwtEnv struct {
	*accessEnv
	js      *jwttest.Server
	v       *accessjwt.Verifier
	rsa, ed jwttest.Key
}

func newJWTEnv(t *testing.T, configure func(*jwtEnv, *accessjwt.Config)) *jwtEnv {
	t.Helper()
	j := &jwtEnv{rsa: jwttest.NewKey(t, "rsa-1", "RS256"), ed: jwttest.NewKey(t, "ed-1", "EdDSA")}
	// Started inside newAccessEnv (after its goroutine snapshot), so that
	// the verifier and the JWKS server stop before its leak check.
	j.accessEnv = newAccessEnv(t, func(c *Config) {
		j.js = jwttest.NewServer(t, j.rsa, j.ed)
		cfg := accessjwt.Config{JWKSURL: j.js.URL, Issuer: jwtIssuer, Audience: jwtAudience,
			MinRefreshInterval: 200 * time.Millisecond, FetchWait: 5 * time.Second, FetchTimeout: 10 * time.Second}
		if configure != nil {
			configure(j, &cfg)
		}
		v, err := accessjwt.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		j.v = v
		t.Cleanup(v.Close) // after the listener's shutdown (cleanups run last-in first-out)
		c.AccessJWT = v
	})
	return j
}

func strPtr(s string) *string { return &s }

// claims are valid claims for team/<sb>/<svc> as alice.
func (j *jwtEnv) claims(sb, svc string, ttl time.Duration) jwt.MapClaims {
	return jwttest.Claims(jwtIssuer, jwtAudience, "team", sb, strPtr(svc), "alice", ttl)
}

// swappedCookie returns the listener's token in a Set-Cookie, failing
// unless it is one minted with k1 (the keys file's first key).
func swappedCookie(t *testing.T, r accessResp) string {
	t.Helper()
	sc := r.header.Get("Set-Cookie")
	prefix := accessCookie + "=v1.k1."
	if !strings.HasPrefix(sc, prefix) {
		t.Fatalf("Set-Cookie %q: want the listener's own token (key k1)", sc)
	}
	for _, part := range []string{"Path=/", "Secure", "HttpOnly", "SameSite=Lax", "Max-Age="} {
		if !strings.Contains(sc, part) {
			t.Fatalf("Set-Cookie %q lacks %q", sc, part)
		}
	}
	tok, _, _ := strings.Cut(sc[len(accessCookie)+1:], ";")
	return tok
}

// A JWT in X-Applistener-Token (RS256) or Authorization: Bearer (EdDSA,
// on the bearer service) passes, is removed before the app, and the
// response sets the listener's own token as the cookie; the next request
// with only that cookie passes without a JWKS fetch.
func TestAccessJWTHeaderSwap(t *testing.T) {
	j := newJWTEnv(t, nil)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		for _, tc := range []struct {
			name, host, svc, field, prefix string
			key                            jwttest.Key
		}{
			{"header RS256", accWeb, "web", "X-Applistener-Token", "", j.rsa},
			{"bearer EdDSA", accAPI, "api", "Authorization", "Bearer ", j.ed},
		} {
			jwtTok := tc.key.Sign(t, j.claims("demo", tc.svc, time.Hour))
			r := j.do(c, "GET", tc.host, "/data", with(fetchFrom(accOrigin), tc.field, tc.prefix+jwtTok))
			wantProto(t, r, h2)
			s := seen(t, r)
			if s.Header.Get("X-Forwarded-User") != "alice" || s.Header.Get(tc.field) != "" {
				t.Fatalf("%s: app saw %v", tc.name, s.Header)
			}
			if r.header.Get("Access-Control-Allow-Origin") != accOrigin {
				t.Fatalf("%s: CORS fields missing: %v", tc.name, r.header)
			}
			tok := swappedCookie(t, r)
			fetches := j.js.Fetches()
			r = j.do(c, "GET", tc.host, "/next", with(fetchFrom(accOrigin), "Cookie", accessCookie+"="+tok))
			if s := seen(t, r); s.Header.Get("X-Forwarded-User") != "alice" || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("%s: cookie request: app saw %v, Set-Cookie %q", tc.name, s.Header, r.header.Get("Set-Cookie"))
			}
			if n := j.js.Fetches(); n != fetches {
				t.Fatalf("%s: the cookie request fetched the JWKS (%d → %d)", tc.name, fetches, n)
			}
		}
	})
	if log := j.logText(); !strings.Contains(log, `"credential":"header"`) || !strings.Contains(log, `"credential":"bearer"`) {
		t.Fatalf("access log:\n%s", log)
	}
}

// A navigation with ?_al_token=<JWT> gets the 303 exchange with the
// listener's own token as the cookie; the app never sees the JWT. A
// URL-carried JWT valid for more than 24 h is refused.
func TestAccessJWTNavigationExchange(t *testing.T) {
	j := newJWTEnv(t, nil)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		jwtTok := j.ed.Sign(t, j.claims("demo", "web", time.Hour))
		r := j.do(c, "GET", accWeb, "/p/a?x=1&_al_token="+jwtTok+"&y=2", navigate)
		wantProto(t, r, h2)
		if r.status != 303 || r.header.Get("Location") != "/p/a?x=1&y=2" || r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("exchange: %d Location %q", r.status, r.header.Get("Location"))
		}
		tok := swappedCookie(t, r)
		if j.app.hits.Load() != 0 {
			t.Fatal("the app saw the request that carried the JWT")
		}
		r = j.do(c, "GET", accWeb, "/p/a?x=1&y=2", with(navigate, "Cookie", accessCookie+"="+tok))
		if s := seen(t, r); s.URI != "/p/a?x=1&y=2" || s.Header.Get("X-Forwarded-User") != "alice" {
			t.Fatalf("after the exchange the app saw %+v", s)
		}
		long := j.rsa.Sign(t, j.claims("demo", "web", 48*time.Hour))
		r = j.do(c, "GET", accWeb, "/p?_al_token="+long, navigate)
		if r.status != 303 || !strings.HasPrefix(r.header.Get("Location"), "https://login.example.com/") || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("a 48 h JWT in the URL: %d Location %q", r.status, r.header.Get("Location"))
		}
		j.app.hits.Store(0)
	})
	if log := j.logText(); !strings.Contains(log, `"access_denial":"lifetime"`) {
		t.Fatalf("access log:\n%s", log)
	}
}

// Every JWT that must not pass is refused before the app: 401 (403 for
// another sandbox), without a cookie.
func TestAccessJWTRefused(t *testing.T) {
	j := newJWTEnv(t, nil)
	good := func() jwt.MapClaims { return j.claims("demo", "web", time.Hour) }
	set := func(k string, v any) jwt.MapClaims {
		c := good()
		c[k] = v
		return c
	}
	der, err := x509.MarshalPKIXPublicKey(j.rsa.Priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, good())
	hs.Header["kid"] = j.rsa.Kid
	hsTok, err := hs.SignedString(der)
	if err != nil {
		t.Fatal(err)
	}
	none := jwt.NewWithClaims(jwt.SigningMethodNone, good())
	none.Header["kid"] = j.rsa.Kid
	noneTok, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	unknown := jwttest.NewKey(t, "not-published", "RS256")
	cases := []struct {
		name, tok, reason string
		status            int
	}{
		{"wrong issuer", j.rsa.Sign(t, set("iss", "https://evil.example.com")), denialInvalidClaims, 401},
		{"wrong audience", j.ed.Sign(t, set("aud", "someone-else")), denialInvalidClaims, 401},
		{"expired", j.rsa.Sign(t, set("exp", time.Now().Add(-time.Minute).Unix())), denialExpired, 401},
		{"alg none", noneTok + "c2ln", denialBadSignature, 401},
		{"HS256 with the public key", hsTok, denialBadSignature, 401},
		{"unknown kid", unknown.Sign(t, good()), denialUnknownKey, 401},
		{"another sandbox", j.rsa.Sign(t, j.claims("other", "web", time.Hour)), denialWrongScope, 403},
		{"old generation", j.rsa.Sign(t, set("applistener_generation", -1)), denialInvalidClaims, 401},
	}
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		for _, tc := range cases {
			r := j.do(c, "GET", accWeb, "/data", with(fetchFrom(accOrigin), "X-Applistener-Token", tc.tok))
			if r.status != tc.status || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("%s: %d %q (Set-Cookie %q), want %d", tc.name, r.status, r.body, r.header.Get("Set-Cookie"), tc.status)
			}
		}
		if n := j.app.hits.Load(); n != 0 {
			t.Fatalf("the app got %d refused requests", n)
		}
	})
	log := j.logText()
	for _, tc := range cases {
		if !strings.Contains(log, `"access_denial":"`+tc.reason+`"`) {
			t.Fatalf("%s: no %q denial in the access log:\n%s", tc.name, tc.reason, log)
		}
	}
	// No part of a JWT is logged.
	for _, tc := range cases {
		if parts := strings.Split(tc.tok, "."); strings.Contains(log, parts[len(parts)-1]) {
			t.Fatalf("%s: the JWT's signature is in the access log", tc.name)
		}
	}
}

// A JWT whose generation is below the policy's is revoked; one at the
// policy's passes.
func TestAccessJWTGeneration(t *testing.T) {
	j := newJWTEnv(t, nil)
	j.webGen = 2
	j.apply()
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		old := j.claims("demo", "web", time.Hour)
		old["applistener_generation"] = 1
		if r := j.do(c, "GET", accWeb, "/", with(fetchFrom(accOrigin), "X-Applistener-Token", j.rsa.Sign(t, old))); r.status != 401 {
			t.Fatalf("generation 1 under policy 2: %d", r.status)
		}
		cur := j.claims("demo", "web", time.Hour)
		cur["applistener_generation"] = 2
		seen(t, j.do(c, "GET", accWeb, "/", with(fetchFrom(accOrigin), "X-Applistener-Token", j.rsa.Sign(t, cur))))
	})
}

// A JWT signed with a key the JWKS published after the listener fetched it
// passes once the unknown kid made it fetch again.
func TestAccessJWTKeyRotation(t *testing.T) {
	j := newJWTEnv(t, nil)
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		next := jwttest.NewKey(t, "rotated-"+map[bool]string{false: "h1", true: "h2"}[h2], "ES256")
		j.js.SetKeys(j.rsa, j.ed, next)
		tok := next.Sign(t, j.claims("demo", "web", time.Hour))
		testutil.Eventually(t, 10*time.Second, "the rotated key's JWT passes", func() bool {
			r := j.do(c, "GET", accWeb, "/", with(fetchFrom(accOrigin), "X-Applistener-Token", tok))
			return r.status == 200
		})
	})
}

// A flood of JWTs with made-up kids makes at most one JWKS fetch per
// MinRefreshInterval (here: none beyond the first).
func TestAccessJWTGarbageKidFlood(t *testing.T) {
	j := newJWTEnv(t, func(_ *jwtEnv, c *accessjwt.Config) { c.MinRefreshInterval = time.Hour })
	testutil.Eventually(t, 10*time.Second, "the first JWKS fetch", func() bool { return j.js.Fetches() == 1 })
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 25 {
					g := j.ed
					g.Kid = "garbage-" + strings.Repeat("x", w*25+i)
					req, _ := getWithField("https://"+accWeb+"/", "X-Applistener-Token", g.Sign(t, j.claims("demo", "web", time.Hour)))
					resp, err := c.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_ = resp.Body.Close()
					if resp.StatusCode != 401 {
						t.Errorf("garbage kid: %d", resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
	})
	if n := j.js.Fetches(); n != 1 {
		t.Fatalf("%d JWKS fetches for 200 garbage kids, want 1", n)
	}
}

// A JWKS server that never answers holds a request at most FetchWait.
func TestAccessJWTHangingJWKS(t *testing.T) {
	const wait = 500 * time.Millisecond
	j := newJWTEnv(t, func(j *jwtEnv, c *accessjwt.Config) {
		j.js.Hang(true)
		c.FetchWait, c.MinRefreshInterval = wait, 100*time.Millisecond
	})
	testutil.Eventually(t, 10*time.Second, "the first JWKS fetch", func() bool { return j.js.Fetches() >= 1 })
	forBoth(t, func(t *testing.T, h2 bool) {
		c := j.client(h2)
		tok := j.rsa.Sign(t, j.claims("demo", "web", time.Hour))
		start := time.Now()
		r := j.do(c, "GET", accWeb, "/", with(fetchFrom(accOrigin), "X-Applistener-Token", tok))
		if d := time.Since(start); r.status != 401 || d > wait+3*time.Second {
			t.Fatalf("with a hanging JWKS: %d after %v (bound %v)", r.status, d, wait)
		}
	})
}

// getWithField is a GET with one header field.
func getWithField(url, name, value string) (*http.Request, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(name, value)
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// BenchmarkAccessJWT is the cost of the swap: a request with a JWT never
// seen (the asymmetric verify, the mint), the same JWT again (its
// verification cached), and the request after, with the listener's cookie
// only (the HMAC verify), each through the HTTP/1.1 decision.
func BenchmarkAccessJWT(b *testing.B) {
	ar, ks, _ := accessBenchRoute(b, false)
	keys := []jwttest.Key{jwttest.NewKey(b, "rsa", "RS256"), jwttest.NewKey(b, "ec", "ES256"), jwttest.NewKey(b, "ed", "EdDSA")}
	js := jwttest.NewServer(b, keys...)
	v, err := accessjwt.New(accessjwt.Config{JWKSURL: js.URL, Issuer: jwtIssuer, Audience: jwtAudience})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(v.Close)
	j := accessJWT{v: v, keys: ks}
	var c clientConn
	parse := func(b *testing.B, field string) *request {
		return parsedHead(b, head("GET /api HTTP/1.1", "Host: "+testHost, "Accept: application/json", field))
	}
	decide := func(b *testing.B, req *request) accessDecision {
		var in accessInput[[]byte]
		in.method, in.path = req.method, req.path
		for i := range req.fields {
			in.field(req.fields[i].name, req.fields[i].value, false)
		}
		in.jwt = j
		d := decideAccess(ar, ks, &in, time.Now(), c.tokenString)
		if d.verdict != accessAllow {
			b.Fatalf("%s (%s)", d.reason, d.source)
		}
		return d
	}
	claims := func(i int) jwt.MapClaims {
		cl := jwttest.Claims(jwtIssuer, jwtAudience, "team", "demo", strPtr("web"), "alice", time.Hour)
		cl["jti"] = strconv.Itoa(i)
		return cl
	}
	var cookie string
	for _, k := range keys {
		b.Run("first-"+k.Alg, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				req := parse(b, "X-Applistener-Token: "+k.Sign(b, claims(i)))
				b.StartTimer()
				d := decide(b, req)
				cookie = d.token
			}
		})
		b.Run("again-"+k.Alg, func(b *testing.B) {
			req := parse(b, "X-Applistener-Token: "+k.Sign(b, claims(-1)))
			b.ReportAllocs()
			for b.Loop() {
				decide(b, req)
			}
		})
	}
	b.Run("cookie", func(b *testing.B) {
		req := parse(b, "Cookie: "+accessCookie+"="+cookie)
		b.ReportAllocs()
		for b.Loop() {
			decide(b, req)
		}
	})
}

// TestAccessJWTHeaderSwapH2C: a JWT carried in a header is answered with
// the listener's own token in a cookie on every app protocol, h2c
// services included (it was missing there: every call verified the JWT
// again).
func TestAccessJWTHeaderSwapH2C(t *testing.T) {
	j := newJWTEnv(t, nil)
	c := j.client(true)
	for _, tc := range []struct{ name, host, svc, field, prefix string }{
		{"web (HTTP/1.1 app)", accWeb, "web", "X-Applistener-Token", ""},
		{"rpc (h2c app)", accRPC, "rpc", "X-Applistener-Token", ""},
		{"rpcb (h2c app, bearer)", accRPCB, "rpcb", "Authorization", "Bearer "},
	} {
		jwtTok := j.rsa.Sign(t, j.claims("demo", tc.svc, time.Hour))
		r := j.do(c, "GET", tc.host, "/data", with(fetchFrom(accOrigin), tc.field, tc.prefix+jwtTok))
		s := seen(t, r)
		if s.Header.Get("X-Forwarded-User") != "alice" || s.Header.Get(tc.field) != "" {
			t.Fatalf("%s: app saw %v", tc.name, s.Header)
		}
		if sc := r.header.Get("Set-Cookie"); !strings.HasPrefix(sc, accessCookie+"=") {
			t.Errorf("%s: Set-Cookie %q, want the swapped token (response %v)", tc.name, sc, r.header)
		}
	}
}
