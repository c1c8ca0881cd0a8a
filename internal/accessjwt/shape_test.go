package accessjwt_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/applistener/applistener/internal/accessjwt"
)

// looksLikeJWTSpec is LooksLikeJWT written plainly: three non-empty
// base64url parts, the first starting with the encoding of `{"`.
func looksLikeJWTSpec(s string) bool {
	if len(s) > accessjwt.MaxTokenLen {
		return false
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "eyJ") {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return false
		}
	}
	return true
}

func TestLooksLikeJWT(t *testing.T) {
	hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"k"}`))
	for s, want := range map[string]bool{
		hdr + ".eyJzdWIiOiJhIn0.c2ln": true,
		hdr + ".eyJzdWIiOiJhIn0.":     false,
		hdr + "..c2ln":                false,
		hdr + ".a.b.c":                false,
		hdr + ".a=.b":                 false,
		"v1.k1.AAAA.BBBB":             false,
		"eyJ":                         false,
		"":                            false,
		"eyJ.a.b":                     true,
	} {
		if got := accessjwt.LooksLikeJWT(s); got != want || got != looksLikeJWTSpec(s) {
			t.Errorf("LooksLikeJWT(%q) = %v, want %v", s, got, want)
		}
		if got := accessjwt.LooksLikeJWT([]byte(s)); got != want {
			t.Errorf("LooksLikeJWT([]byte(%q)) = %v, want %v", s, got, want)
		}
	}
	tok := []byte(hdr + ".eyJzdWIiOiJhIn0.c2ln")
	if a := testing.AllocsPerRun(100, func() { accessjwt.LooksLikeJWT(tok) }); a != 0 {
		t.Fatalf("LooksLikeJWT allocates %v", a)
	}
}

func FuzzLooksLikeJWT(f *testing.F) {
	f.Add("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln")
	f.Add("v1.k1.AAAA.BBBB")
	f.Add("eyJ..")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := accessjwt.LooksLikeJWT(s), looksLikeJWTSpec(s); got != want {
			t.Fatalf("LooksLikeJWT(%q) = %v, spec %v", s, got, want)
		}
		if accessjwt.LooksLikeJWT(s) != accessjwt.LooksLikeJWT([]byte(s)) {
			t.Fatalf("string and []byte forms differ on %q", s)
		}
	})
}
