package accesstoken

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/routes"
)

// fuzzKeys is the key set of the fuzz tests: two ids, so that a token can
// name the wrong one.
func fuzzKeys(t testing.TB) *KeySet {
	return mustKeySet(t, Key{ID: "k1", Secret: secret(1)}, Key{ID: "k2", Secret: secret(2)})
}

// FuzzParse feeds arbitrary strings to Verify: it never panics, refuses
// with one of its errors, and accepts only a token that is byte for byte
// what Mint produces for the claims it returns (so every accepted token was
// minted with the key, and has one encoding only).
func FuzzParse(f *testing.F) {
	ks := fuzzKeys(f)
	good := mint(f, ks, "k1", Claims{Workspace: "team", Sandbox: "demo", Service: "web", Subject: "alice",
		Generation: 2, IssuedAt: t0, Expires: t0.Add(time.Hour)})
	f.Add(good, "team", "demo", "web")
	f.Add(good[:len(good)-1], "team", "demo", "web")
	f.Add("v1.k1..", "team", "demo", "")
	f.Add("v1.k1."+strings.Repeat("A", 60)+"."+strings.Repeat("A", 43), "team", "demo", "")
	f.Add("Bearer "+strings.Repeat(".", 2000), "team", "demo", "")
	f.Add("v1.k1.AQ==.x", "a", "b", "c")
	f.Fuzz(func(t *testing.T, token, ws, sb, svc string) {
		req := &Request{Workspace: ws, Sandbox: sb, Service: svc, Now: t0.Add(time.Minute)}
		c, err := ks.Verify(token, req)
		if err != nil {
			for _, known := range []error{ErrMalformed, ErrUnknownKey, ErrBadSignature, ErrExpired, ErrNotYetValid, ErrLifetime, ErrWrongScope, ErrRevoked} {
				if err == known {
					return
				}
			}
			t.Fatalf("unexpected error %v", err)
		}
		again, merr := ks.Mint(c.KeyID, c)
		if merr != nil {
			t.Fatalf("accepted claims %+v cannot be minted: %v", c, merr)
		}
		if again != token {
			t.Fatalf("accepted %q, but its claims mint %q", token, again)
		}
	})
}

// FuzzVerify mints a token from fuzzed claims and checks that it verifies
// with its key, with the claims it was minted with, and that any change to
// it, or another key with the same id, is refused.
func FuzzVerify(f *testing.F) {
	ks := fuzzKeys(f)
	impostor := mustKeySet(f, Key{ID: "k1", Secret: secret(3)}, Key{ID: "k2", Secret: secret(4)})
	f.Add("team", "demo", "web", false, "alice", uint64(1), int64(3600), uint(5), byte('A'))
	f.Add("a", "b", "", false, "", uint64(0), int64(1), uint(0), byte('.'))
	f.Add("ws-1", "sb-2", "", true, "~", ^uint64(0), int64(MaxLifetime/time.Second), uint(200), byte('\n'))
	f.Fuzz(func(t *testing.T, ws, sb, svc string, all bool, sub string, gen uint64, ttl int64, at uint, with byte) {
		kid := "k1"
		if gen%2 == 1 {
			kid = "k2"
		}
		c := Claims{Workspace: ws, Sandbox: sb, Service: svc, AllServices: all, Subject: sub, Generation: gen,
			IssuedAt: t0, Expires: t0.Add(time.Duration(ttl) * time.Second)}
		tok, err := ks.Mint(kid, c)
		if err != nil {
			return // claims Mint refuses: covered by TestMintRefuses
		}
		req := &Request{Workspace: ws, Sandbox: sb, Service: svc, Generation: gen, Now: t0}
		got, err := ks.Verify(tok, req)
		if err != nil {
			t.Fatalf("fresh token %q: %v", tok, err)
		}
		if got.KeyID != kid || got.Workspace != ws || got.Sandbox != sb || got.Service != svc && !all ||
			got.AllServices != all || got.Subject != sub || got.Generation != gen || !got.Expires.Equal(c.Expires) {
			t.Fatalf("claims %+v from %+v", got, c)
		}
		if _, err := impostor.Verify(tok, req); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("verified by another secret of the same id: %v", err)
		}
		// Change one byte, insert one or cut the token: never accepted.
		i := int(at % uint(len(tok)))
		for _, changed := range []string{
			tok[:i] + string(with) + tok[i+1:],
			tok[:i] + string(with) + tok[i:],
			tok[:i] + tok[i+1:],
		} {
			if changed == tok {
				continue
			}
			if _, err := ks.Verify(changed, req); err == nil {
				t.Fatalf("modified token %q (of %q) verified", changed, tok)
			}
		}
	})
}

// FuzzNameRules: a token's names follow the hostname rules exactly
// (routes.ValidName), so that every routable service can get a token and
// no token names a service that cannot exist.
func FuzzNameRules(f *testing.F) {
	for _, s := range []string{"web", "a", "a-b", "a--b", "-a", "a-", "Web", "", strings.Repeat("a", 63), strings.Repeat("a", 64), "a_b", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ours := checkName("service", s) == nil
		theirs := routes.ValidName(s) == nil
		if ours != theirs || validNameBytes([]byte(s)) != ours {
			t.Fatalf("%q: accesstoken says %v, routes.ValidName %v", s, ours, theirs)
		}
	})
}
