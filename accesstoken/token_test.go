package accesstoken

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"
)

// secret returns a 32-byte secret filled with b.
func secret(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func mustKeySet(t testing.TB, keys ...Key) *KeySet {
	t.Helper()
	ks, err := NewKeySet(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

var t0 = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

func webRequest(now time.Time) *Request {
	return &Request{Workspace: "team", Sandbox: "demo", Service: "web", Now: now}
}

func mint(t testing.TB, ks *KeySet, kid string, c Claims) string {
	t.Helper()
	tok, err := ks.Mint(kid, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMintVerifyRoundTrip(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	c := Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice@example.com",
		Generation: 7, IssuedAt: t0, Expires: t0.Add(time.Hour)}
	tok := mint(t, ks, "k1", c)
	if !strings.HasPrefix(tok, "v1.k1.") || strings.Count(tok, ".") != 3 {
		t.Fatalf("token %q: want v1.k1.<payload>.<mac>", tok)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; !isB64Char(c) && c != '.' {
			t.Fatalf("token %q has %q, not URL-safe", tok, c)
		}
	}
	got, err := ks.Verify(tok, &Request{Workspace: "team", Sandbox: "demo", Service: "web", Generation: 7, Now: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	want := c
	want.KeyID = "k1"
	if !got.IssuedAt.Equal(want.IssuedAt) || !got.Expires.Equal(want.Expires) {
		t.Fatalf("times %v..%v, want %v..%v", got.IssuedAt, got.Expires, want.IssuedAt, want.Expires)
	}
	got.IssuedAt, got.Expires, want.IssuedAt, want.Expires = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if got != want {
		t.Fatalf("claims %+v, want %+v", got, want)
	}
	if got := (&c).Lifetime(); got != time.Hour {
		t.Fatalf("Lifetime %v", got)
	}
}

func TestVerifyScope(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	exp := t0.Add(time.Hour)
	web := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", Service: "web", IssuedAt: t0, Expires: exp})
	unnamed := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", IssuedAt: t0, Expires: exp})
	all := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", AllServices: true, IssuedAt: t0, Expires: exp})
	now := t0.Add(time.Second)
	for _, tc := range []struct {
		name, token        string
		ws, sb, svc        string
		want               error
		wantAll            bool
		wantServiceInClaim string
	}{
		{"service token, its service", web, "team", "demo", "web", nil, false, "web"},
		{"service token, another service", web, "team", "demo", "api", ErrWrongScope, false, ""},
		{"service token, the unnamed service", web, "team", "demo", "", ErrWrongScope, false, ""},
		{"service token, another sandbox", web, "team", "other", "web", ErrWrongScope, false, ""},
		{"service token, another workspace", web, "corp", "demo", "web", ErrWrongScope, false, ""},
		{"unnamed-service token, unnamed service", unnamed, "team", "demo", "", nil, false, ""},
		{"unnamed-service token, named service", unnamed, "team", "demo", "web", ErrWrongScope, false, ""},
		{"sandbox token, a service", all, "team", "demo", "web", nil, true, ""},
		{"sandbox token, the unnamed service", all, "team", "demo", "", nil, true, ""},
		{"sandbox token, another sandbox", all, "team", "demo2", "web", ErrWrongScope, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ks.Verify(tc.token, &Request{Workspace: tc.ws, Sandbox: tc.sb, Service: tc.svc, Now: now})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if err == nil && (c.AllServices != tc.wantAll || c.Service != tc.wantServiceInClaim) {
				t.Fatalf("claims %+v", c)
			}
		})
	}
}

func TestVerifyTimesAndGeneration(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	base := Claims{Workspace: "team", Sandbox: "demo", Service: "web", Generation: 3, IssuedAt: t0}
	hour := base
	hour.Expires = t0.Add(time.Hour)
	day2 := base
	day2.Expires = t0.Add(48 * time.Hour)
	tokHour := mint(t, ks, "k1", hour)
	tok2d := mint(t, ks, "k1", day2)
	for _, tc := range []struct {
		name  string
		token string
		req   Request
		want  error
	}{
		{"valid", tokHour, Request{Now: t0.Add(59 * time.Minute), Generation: 3}, nil},
		{"at expiry", tokHour, Request{Now: t0.Add(time.Hour), Generation: 3}, ErrExpired},
		{"after expiry", tokHour, Request{Now: t0.Add(2 * time.Hour), Generation: 3}, ErrExpired},
		{"older generation than the token", tokHour, Request{Now: t0, Generation: 2}, nil},
		{"policy generation raised", tokHour, Request{Now: t0, Generation: 4}, ErrRevoked},
		{"two days in a header", tok2d, Request{Now: t0, Generation: 3}, nil},
		{"two days in a URL", tok2d, Request{Now: t0, Generation: 3, MaxLifetime: MaxURLLifetime}, ErrLifetime},
		{"two days in a URL, one hour left", tok2d, Request{Now: t0.Add(47 * time.Hour), Generation: 3, MaxLifetime: MaxURLLifetime}, ErrLifetime},
		{"one hour in a URL", tokHour, Request{Now: t0, Generation: 3, MaxLifetime: MaxURLLifetime}, nil},
		{"a bound shorter than the token", tokHour, Request{Now: t0, Generation: 3, MaxLifetime: time.Minute}, ErrLifetime},
		{"issued a minute ahead of the clock", tokHour, Request{Now: t0.Add(-MaxClockSkew), Generation: 3}, nil},
		{"issued more than a minute ahead", tokHour, Request{Now: t0.Add(-MaxClockSkew - time.Second), Generation: 3}, ErrNotYetValid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Workspace, req.Sandbox, req.Service = "team", "demo", "web"
			_, err := ks.Verify(tc.token, &req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

// A request without a time is checked at time.Now(), never as "no
// expiry".
func TestVerifyZeroNowIsNow(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	past := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	old := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", IssuedAt: past, Expires: past.Add(time.Hour)})
	if _, err := ks.Verify(old, &Request{Workspace: "team", Sandbox: "demo", Now: past.Add(time.Minute)}); err != nil {
		t.Fatalf("at its time: %v", err)
	}
	if _, err := ks.Verify(old, &Request{Workspace: "team", Sandbox: "demo"}); !errors.Is(err, ErrExpired) {
		t.Fatalf("zero Now: %v, want ErrExpired", err)
	}
	fresh := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", Expires: time.Now().Add(time.Hour)})
	if _, err := ks.Verify(fresh, &Request{Workspace: "team", Sandbox: "demo"}); err != nil {
		t.Fatalf("zero Now, fresh token: %v", err)
	}
}

func TestMintRefuses(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	ok := Claims{Workspace: "team", Sandbox: "demo", Service: "web", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	for _, tc := range []struct {
		name   string
		kid    string
		change func(c *Claims)
		want   string
	}{
		{"unknown key", "k2", func(*Claims) {}, "unknown key id"},
		{"no expiry", "k1", func(c *Claims) { c.Expires = time.Time{} }, "an expiry is required"},
		{"expiry before issue", "k1", func(c *Claims) { c.Expires = t0.Add(-time.Second) }, "after the issue time"},
		{"expiry at issue", "k1", func(c *Claims) { c.Expires = t0 }, "after the issue time"},
		{"never expires", "k1", func(c *Claims) { c.Expires = t0.AddDate(100, 0, 0) }, "longer than"},
		{"31 days", "k1", func(c *Claims) { c.Expires = t0.Add(31 * 24 * time.Hour) }, "longer than"},
		{"no workspace", "k1", func(c *Claims) { c.Workspace = "" }, "workspace"},
		{"bad sandbox", "k1", func(c *Claims) { c.Sandbox = "De mo" }, "sandbox"},
		{"double dash service", "k1", func(c *Claims) { c.Service = "a--b" }, "service"},
		{"all services and one", "k1", func(c *Claims) { c.AllServices = true }, "names no service"},
		{"subject with a space", "k1", func(c *Claims) { c.Subject = "alice smith" }, "subject"},
		{"subject with CRLF", "k1", func(c *Claims) { c.Subject = "a\r\nX-Evil: 1" }, "subject"},
		{"subject too long", "k1", func(c *Claims) { c.Subject = strings.Repeat("a", MaxSubjectLen+1) }, "subject"},
		{"before 1970", "k1", func(c *Claims) { c.IssuedAt = time.Unix(-10, 0); c.Expires = time.Unix(100, 0) }, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			tok, err := ks.Mint(tc.kid, c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mint = %q, %v; want an error containing %q", tok, err, tc.want)
			}
		})
	}
	// The longest allowed token fits the verifier's bound.
	long := ok
	long.Workspace, long.Sandbox, long.Service = strings.Repeat("w", 63), strings.Repeat("s", 63), strings.Repeat("v", 63)
	long.Subject = strings.Repeat("~", MaxSubjectLen)
	long.Generation = ^uint64(0)
	long.IssuedAt, long.Expires = time.Unix(maxUnixSeconds-100, 0), time.Unix(maxUnixSeconds, 0)
	maxKS := mustKeySet(t, Key{ID: strings.Repeat("K", MaxKeyIDLen), Secret: secret(2)})
	tok := mint(t, maxKS, strings.Repeat("K", MaxKeyIDLen), long)
	if len(tok) > MaxTokenLen {
		t.Fatalf("longest token is %d bytes, more than MaxTokenLen %d", len(tok), MaxTokenLen)
	}
	if _, err := maxKS.Verify(tok, &Request{Workspace: long.Workspace, Sandbox: long.Sandbox, Service: long.Service,
		Generation: long.Generation, Now: time.Unix(maxUnixSeconds-50, 0)}); err != nil {
		t.Fatalf("longest token: %v", err)
	}
}

func TestMintRoundsExpiryUp(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	tok := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", IssuedAt: t0.Add(300 * time.Millisecond),
		Expires: t0.Add(1500 * time.Millisecond)})
	c, err := ks.Verify(tok, &Request{Workspace: "team", Sandbox: "demo", Now: t0.Add(1600 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Expires.Equal(t0.Add(2*time.Second)) || !c.IssuedAt.Equal(t0) {
		t.Fatalf("times %v..%v", c.IssuedAt, c.Expires)
	}
}

func TestVerifyErrors(t *testing.T) {
	k1 := Key{ID: "k1", Secret: secret(1)}
	ks := mustKeySet(t, k1, Key{ID: "k2", Secret: secret(2)})
	c := Claims{Workspace: "team", Sandbox: "demo", Service: "web", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	tok := mint(t, ks, "k1", c)
	otherSecret := mint(t, mustKeySet(t, Key{ID: "k1", Secret: secret(9)}), "k1", c)
	unknown := mint(t, mustKeySet(t, Key{ID: "k3", Secret: secret(1)}), "k3", c)
	wide := c
	wide.Service, wide.AllServices = "", true
	widePayload := strings.Split(mint(t, ks, "k1", wide), ".")[2]
	parts := strings.Split(tok, ".")
	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"empty", "", ErrMalformed},
		{"huge: 1 MiB of dots", strings.Repeat(".", 1<<20), ErrMalformed},
		{"bearer and 1 MiB of dots", "Bearer " + strings.Repeat(".", 1<<20), ErrMalformed},
		{"one byte too long", tok + strings.Repeat("A", MaxTokenLen-len(tok)+1), ErrMalformed},
		{"v2", "v2" + tok[2:], ErrMalformed},
		{"truncated signature", tok[:len(tok)-1], ErrMalformed},
		{"signature removed", strings.Join(parts[:3], ".") + ".", ErrMalformed},
		{"no signature part", strings.Join(parts[:3], "."), ErrMalformed},
		{"extra part", tok + ".x", ErrMalformed},
		{"invalid base64 in payload", parts[0] + "." + parts[1] + ".!!!!" + parts[2][4:] + "." + parts[3], ErrMalformed},
		{"padding", parts[0] + "." + parts[1] + "." + parts[2] + "." + parts[3] + "=", ErrMalformed},
		{"newline in signature", parts[0] + "." + parts[1] + "." + parts[2] + "." + parts[3][:10] + "\n" + parts[3][10:], ErrMalformed},
		{"empty key id", "v1.." + parts[2] + "." + parts[3], ErrMalformed},
		{"key id too long", "v1." + strings.Repeat("k", MaxKeyIDLen+1) + "." + parts[2] + "." + parts[3], ErrMalformed},
		{"unknown key id", unknown, ErrUnknownKey},
		{"other secret", otherSecret, ErrBadSignature},
		{"signed by k1, labelled k2", "v1.k2." + parts[2] + "." + parts[3], ErrBadSignature},
		{"payload of another token", parts[0] + "." + parts[1] + "." + widePayload + "." + parts[3], ErrBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ks.Verify(tc.token, webRequest(t0))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if err != nil && len(tc.token) > 10 && strings.Contains(err.Error(), tc.token[len(tc.token)-10:]) {
				t.Fatalf("error %q contains the token", err)
			}
		})
	}
	// A flipped last character changes the MAC's bits (or its trailing
	// bits, which strict decoding refuses): never accepted.
	last := tok[len(tok)-1]
	for _, r := range "AQgw_-" {
		if byte(r) == last {
			continue
		}
		if _, err := ks.Verify(tok[:len(tok)-1]+string(r), webRequest(t0)); err == nil {
			t.Fatalf("token with last character %q verified", r)
		}
	}
}

func TestNewKeySetRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []Key
		want string
	}{
		{"short secret", []Key{{ID: "k1", Secret: make([]byte, 31)}}, "secret of 31 bytes"},
		{"long secret", []Key{{ID: "k1", Secret: make([]byte, MaxSecretLen+1)}}, "secret of"},
		{"duplicate id", []Key{{ID: "k1", Secret: secret(1)}, {ID: "k1", Secret: secret(2)}}, "duplicate key id"},
		{"empty id", []Key{{ID: "", Secret: secret(1)}}, "key id must be"},
		{"dot in id", []Key{{ID: "k.1", Secret: secret(1)}}, "not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewKeySet(tc.keys...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestKeySetRemoved(t *testing.T) {
	old := mustKeySet(t, Key{ID: "a", Secret: secret(1)}, Key{ID: "b", Secret: secret(2)}, Key{ID: "c", Secret: secret(3)})
	next := mustKeySet(t, Key{ID: "a", Secret: secret(1)}, Key{ID: "b", Secret: secret(9)}, Key{ID: "d", Secret: secret(4)})
	if got := strings.Join(next.Removed(old), ","); got != "b,c" {
		t.Fatalf("Removed = %q, want b,c (b's secret changed, c is gone)", got)
	}
	if got := next.Removed(nil); got != nil {
		t.Fatalf("Removed(nil) = %v", got)
	}
	var none *KeySet
	if got := strings.Join(none.Removed(old), ","); got != "a,b,c" || none.Has("a") || none.IDs() != nil {
		t.Fatalf("nil set: Removed %q", got)
	}
	tok := mint(t, old, "a", Claims{Workspace: "team", Sandbox: "demo", IssuedAt: t0, Expires: t0.Add(time.Hour)})
	if _, err := none.Verify(tok, &Request{Workspace: "team", Sandbox: "demo", Now: t0}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("nil set Verify: %v", err)
	}
	if _, err := none.Mint("a", Claims{}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("nil set Mint: %v", err)
	}
	if got := strings.Join(next.IDs(), ","); got != "a,b,d" || !next.Has("d") || next.Has("c") {
		t.Fatalf("IDs %q", got)
	}
}

// TestKeyRotation: two ids at once both verify; once one is removed its
// tokens are refused as unknown.
func TestKeyRotation(t *testing.T) {
	both := mustKeySet(t, Key{ID: "old", Secret: secret(1)}, Key{ID: "new", Secret: secret(2)})
	c := Claims{Workspace: "team", Sandbox: "demo", Service: "web", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	oldTok, newTok := mint(t, both, "old", c), mint(t, both, "new", c)
	for _, tok := range []string{oldTok, newTok} {
		if _, err := both.Verify(tok, webRequest(t0)); err != nil {
			t.Fatal(err)
		}
	}
	after := mustKeySet(t, Key{ID: "new", Secret: secret(2)})
	if _, err := after.Verify(oldTok, webRequest(t0)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("removed key: %v", err)
	}
	if _, err := after.Verify(newTok, webRequest(t0)); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyAllocations: the warm path, and every refusal, allocate
// nothing; a 1 MiB input is refused without reading it.
func TestVerifyAllocations(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "k1", Secret: secret(1)})
	good := mint(t, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice",
		IssuedAt: t0, Expires: t0.Add(time.Hour)})
	bad := good[:len(good)-2] + "AA"
	parts := strings.Split(good, ".")
	req := webRequest(t0)
	if _, err := ks.Verify(good, req); err != nil { // warm the pool and the subject cache
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token string
		pooled      bool // reaches the MAC: its state comes from a sync.Pool
	}{
		{"valid", good, true},
		{"bad signature", bad, true},
		{"expired", good, true},
		{"huge", "Bearer " + strings.Repeat(".", 1<<20), false},
		{"1 MiB of base64", strings.Repeat("A", 1<<20), false},
		{"invalid character", parts[0] + "." + parts[1] + "." + parts[2] + "." + strings.Repeat("*", len(parts[3])), false},
		{"unknown key id", "v1.zz." + parts[2] + "." + parts[3], false},
	} {
		r := *req
		if tc.name == "expired" {
			r.Now = t0.Add(2 * time.Hour)
		}
		allocs := testing.AllocsPerRun(200, func() { _, _ = ks.Verify(tc.token, &r) })
		switch {
		case allocs == 0:
		case tc.pooled && raceEnabled:
			// The race detector drops pooled items at random; counted
			// without -race.
			t.Logf("%s: %v allocations per Verify under -race", tc.name, allocs)
		default:
			t.Errorf("%s: %v allocations per Verify, want 0", tc.name, allocs)
		}
	}
}

// reportCPU adds the process's CPU time per operation to a benchmark: on
// a machine whose cores other processes share, ns/op (wall time) counts
// waiting for a core too.
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	ks := mustKeySet(b, Key{ID: "k1", Secret: secret(1)}, Key{ID: "k2", Secret: secret(2)})
	good := mint(b, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice@example.com",
		Generation: 1, IssuedAt: t0, Expires: t0.Add(time.Hour)})
	req := webRequest(t0)
	req.Generation = 1
	b.Run("valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(good)))
		done := reportCPU(b)
		for b.Loop() {
			if _, err := ks.Verify(good, req); err != nil {
				b.Fatal(err)
			}
		}
		done()
	})
	b.Run("valid-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := ks.Verify(good, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	bad := good[:len(good)-2] + "AA"
	b.Run("bad-signature", func(b *testing.B) {
		b.ReportAllocs()
		done := reportCPU(b)
		for b.Loop() {
			_, _ = ks.Verify(bad, req)
		}
		done()
	})
	huge := "Bearer " + strings.Repeat(".", 1<<20)
	b.Run("huge-1MiB", func(b *testing.B) {
		b.ReportAllocs()
		done := reportCPU(b)
		for b.Loop() {
			_, _ = ks.Verify(huge, req)
		}
		done()
	})
	// The floor: HMAC-SHA256 of the signed text with a fresh hmac.New,
	// as a caller without pooling would pay.
	b.Run("hmac-new-baseline", func(b *testing.B) {
		b.ReportAllocs()
		text := []byte(good[:strings.LastIndexByte(good, '.')])
		done := reportCPU(b)
		for b.Loop() {
			h := hmac.New(sha256.New, secret(1))
			h.Write(text)
			_ = h.Sum(nil)
		}
		done()
	})
}

func BenchmarkMint(b *testing.B) {
	ks := mustKeySet(b, Key{ID: "k1", Secret: secret(1)})
	c := Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ks.Mint("k1", c); err != nil {
			b.Fatal(err)
		}
	}
}

// TestKeySetFirst: First is the first key given (the keys file's first),
// not the first in id order.
func TestKeySetFirst(t *testing.T) {
	ks := mustKeySet(t, Key{ID: "zz", Secret: secret(1)}, Key{ID: "aa", Secret: secret(2)})
	if got := ks.First(); got != "zz" {
		t.Fatalf("First() = %q, want zz", got)
	}
	var none *KeySet
	if none.First() != "" || mustKeySet(t).First() != "" {
		t.Fatal("an empty or nil set has a first key")
	}
	parsed, err := ParseKeysFile([]byte(`{"keys":[{"id":"k2","secret":"` + b64(secret(2)) + `"},{"id":"k1","secret":"` + b64(secret(1)) + `"}]}`))
	if err != nil || parsed.First() != "k2" {
		t.Fatalf("keys file's first: %q, %v", parsed.First(), err)
	}
}
