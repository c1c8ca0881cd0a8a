package main

import (
	"strings"
	"testing"
)

// TestValidateAccessJWTFlags: the JWT flags go together, need the keys
// file (the swapped tokens are minted with its first key) and an https
// JWKS URL (http only to loopback); each refusal is one line.
func TestValidateAccessJWTFlags(t *testing.T) {
	keys := writeAccessKeys(t, "k1")
	for _, tc := range []struct {
		name                string
		url, iss, aud, file string
		want                string // "" valid
	}{
		{"none", "", "", "", "", ""},
		{"all with keys", "https://idp.example.com/jwks", "https://idp.example.com", "applistener", keys, ""},
		{"loopback http", "http://127.0.0.1:9000/jwks", "i", "a", keys, ""},
		{"no audience", "https://idp.example.com/jwks", "i", "", keys, "go together"},
		{"issuer alone", "", "i", "", keys, "go together"},
		{"no keys file", "https://idp.example.com/jwks", "i", "a", "", "requires --access-keys-file"},
		{"plain http", "http://idp.example.com/jwks", "i", "a", keys, "loopback"},
		{"other scheme", "ftp://idp.example.com/jwks", "i", "a", keys, "https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &serveOptions{accessJWKSURL: tc.url, accessJWTIssuer: tc.iss, accessJWTAudience: tc.aud, accessKeysFile: tc.file}
			err := o.validateJWT()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n")):
				t.Fatalf("error %v, want one line with %q", err, tc.want)
			}
		})
	}
}
