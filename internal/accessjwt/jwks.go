package accessjwt

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxJWKSBytes bounds a JWKS document.
const maxJWKSBytes = 1 << 20

// minRSABits is the smallest RSA modulus accepted.
const minRSABits = 2048

// jwk is one usable key of a JWKS: its algorithm (the only one a token
// signed with it may name) and its public key.
type jwk struct {
	alg string
	key any
}

// keySet is an immutable JWKS, by kid.
type keySet map[string]jwk

// rawJWK is a JWK as published (RFC 7517, 7518, 8037).
type rawJWK struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// parseJWKS returns the signing keys of a JWKS document that this
// package can use (RSA of 2048 bits or more for RS256, P-256 for ES256,
// Ed25519 for EdDSA) with a kid; other keys are skipped, and the number
// skipped is returned. A document without one usable key is an error.
func parseJWKS(data []byte) (keySet, int, error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, 0, fmt.Errorf("jwks: %w", err)
	}
	ks := make(keySet, len(doc.Keys))
	skipped := 0
	for _, raw := range doc.Keys {
		var r rawJWK
		if err := json.Unmarshal(raw, &r); err != nil {
			skipped++
			continue
		}
		k, err := r.key()
		if err != nil || r.Kid == "" || (r.Use != "" && r.Use != "sig") {
			skipped++
			continue
		}
		if _, dup := ks[r.Kid]; dup {
			// Two keys under one kid: neither is trusted.
			delete(ks, r.Kid)
			skipped += 2
			continue
		}
		ks[r.Kid] = k
	}
	if len(ks) == 0 {
		return nil, skipped, errors.New("jwks: no usable signing key (RS256, ES256 or EdDSA, with a kid)")
	}
	return ks, skipped, nil
}

// key returns the key r publishes, refusing one whose alg, when given,
// is not the one its type is used with here.
func (r *rawJWK) key() (jwk, error) {
	switch r.Kty {
	case "RSA":
		if r.Alg != "" && r.Alg != "RS256" {
			return jwk{}, fmt.Errorf("RSA key for %q", r.Alg)
		}
		n, err1 := decodeInt(r.N)
		e, err2 := decodeInt(r.E)
		if err := errors.Join(err1, err2); err != nil {
			return jwk{}, err
		}
		if n.BitLen() < minRSABits || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
			return jwk{}, errors.New("RSA key too small or bad exponent")
		}
		return jwk{alg: "RS256", key: &rsa.PublicKey{N: n, E: int(e.Int64())}}, nil
	case "EC":
		if r.Crv != "P-256" || (r.Alg != "" && r.Alg != "ES256") {
			return jwk{}, fmt.Errorf("EC key on %q for %q", r.Crv, r.Alg)
		}
		x, err1 := b64(r.X)
		y, err2 := b64(r.Y)
		if err := errors.Join(err1, err2); err != nil || len(x) != 32 || len(y) != 32 {
			return jwk{}, errors.New("EC key: bad coordinates")
		}
		// ecdsa.ParseUncompressedPublicKey checks the point is on the curve.
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		if err != nil {
			return jwk{}, fmt.Errorf("EC key: %w", err)
		}
		return jwk{alg: "ES256", key: pub}, nil
	case "OKP":
		if r.Crv != "Ed25519" || (r.Alg != "" && r.Alg != "EdDSA" && r.Alg != "Ed25519") {
			return jwk{}, fmt.Errorf("OKP key on %q for %q", r.Crv, r.Alg)
		}
		x, err := b64(r.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return jwk{}, errors.New("Ed25519 key: bad x")
		}
		return jwk{alg: "EdDSA", key: ed25519.PublicKey(x)}, nil
	}
	return jwk{}, fmt.Errorf("key type %q", r.Kty)
}

func b64(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

func decodeInt(s string) (*big.Int, error) {
	b, err := b64(s)
	if err != nil || len(b) == 0 {
		return nil, errors.New("bad integer")
	}
	return new(big.Int).SetBytes(b), nil
}

// freshness returns how long a JWKS response may be used before it is
// fetched again, from its Cache-Control (max-age; no-cache or no-store:
// lo) or Expires, within [lo, hi]; def without either.
func freshness(h http.Header, now time.Time, def, lo, hi time.Duration) time.Duration {
	d := def
	if cc := h.Get("Cache-Control"); cc != "" {
		for part := range strings.SplitSeq(cc, ",") {
			part = strings.ToLower(strings.TrimSpace(part))
			switch {
			case part == "no-cache" || part == "no-store":
				return lo
			case strings.HasPrefix(part, "max-age="):
				if s, err := strconv.ParseInt(strings.Trim(part[len("max-age="):], `"`), 10, 64); err == nil && s >= 0 {
					d = time.Duration(min(s, int64(hi/time.Second)+1)) * time.Second
					goto clamp
				}
			}
		}
	}
	if e := h.Get("Expires"); e != "" {
		if t, err := http.ParseTime(e); err == nil {
			d = t.Sub(now)
		} else {
			d = lo // an invalid Expires means already expired (RFC 9111)
		}
	}
clamp:
	return min(max(d, lo), hi)
}
