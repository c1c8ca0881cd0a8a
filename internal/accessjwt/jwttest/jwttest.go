// Package jwttest is a real JWKS server and JWT signer for tests of
// access JWTs: generated RSA, P-256 and Ed25519 keys, a JWKS served over
// HTTP on loopback whose keys can be rotated, that counts its fetches and
// can be made to hang.
package jwttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Key is a signing key with its kid and algorithm.
type Key struct {
	Kid  string
	Alg  string // RS256, ES256 or EdDSA
	Priv crypto.Signer
}

// NewKey generates a key for alg.
func NewKey(t testing.TB, kid, alg string) Key {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch alg {
	case "RS256":
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ES256":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "EdDSA":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("jwttest: algorithm %q", alg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return Key{Kid: kid, Alg: alg, Priv: priv}
}

// JWK returns the public JWK of k.
func (k Key) JWK() map[string]string {
	enc := base64.RawURLEncoding.EncodeToString
	switch pub := k.Priv.Public().(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "kid": k.Kid, "use": "sig", "alg": "RS256", "n": enc(pub.N.Bytes()), "e": enc(big.NewInt(int64(pub.E)).Bytes())}
	case *ecdsa.PublicKey:
		b, _ := pub.Bytes()
		return map[string]string{"kty": "EC", "kid": k.Kid, "crv": "P-256", "x": enc(b[1:33]), "y": enc(b[33:])}
	case ed25519.PublicKey:
		return map[string]string{"kty": "OKP", "kid": k.Kid, "crv": "Ed25519", "x": enc(pub)}
	}
	return nil
}

// Sign returns a JWT of claims signed with k (its kid in the header).
func (k Key) Sign(t testing.TB, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.GetSigningMethod(k.Alg), claims)
	tok.Header["kid"] = k.Kid
	s, err := tok.SignedString(k.Priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Claims returns valid claims for ws/sb (service svc unless nil) expiring
// in ttl.
func Claims(iss, aud, ws, sb string, svc *string, sub string, ttl time.Duration) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"iss": iss, "aud": aud, "iat": now.Unix(), "exp": now.Add(ttl).Unix(),
		"applistener_workspace": ws, "applistener_sandbox": sb}
	if svc != nil {
		c["applistener_service"] = *svc
	}
	if sub != "" {
		c["sub"] = sub
	}
	return c
}

// Server serves a JWKS over HTTP on loopback.
type Server struct {
	URL          string
	CacheControl string // sent when set
	fetches      atomic.Int64
	mu           sync.Mutex
	keys         []Key
	hang         chan struct{} // non-nil: requests wait for it
	ts           *httptest.Server
}

// NewServer starts a JWKS server publishing keys; it stops at the end of
// the test.
func NewServer(t testing.TB, keys ...Key) *Server {
	s := &Server{keys: keys}
	s.ts = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.ts.URL + "/.well-known/jwks.json"
	t.Cleanup(func() {
		s.Hang(false)
		s.ts.Close()
	})
	return s
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.fetches.Add(1)
	s.mu.Lock()
	hang, keys, cc := s.hang, s.keys, s.CacheControl
	s.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		return
	}
	doc := struct {
		Keys []map[string]string `json:"keys"`
	}{}
	for _, k := range keys {
		doc.Keys = append(doc.Keys, k.JWK())
	}
	if cc != "" {
		w.Header().Set("Cache-Control", cc)
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	_ = json.NewEncoder(w).Encode(doc)
}

// SetKeys publishes keys from now on.
func (s *Server) SetKeys(keys ...Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = keys
}

// Hang makes requests wait (until Hang(false) or the client gives up).
func (s *Server) Hang(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case on && s.hang == nil:
		s.hang = make(chan struct{})
	case !on && s.hang != nil:
		close(s.hang)
		s.hang = nil
	}
}

// Fetches returns the number of JWKS requests served.
func (s *Server) Fetches() int64 { return s.fetches.Load() }
