package dispatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/applistener/applistener/accesstoken"
	"github.com/applistener/applistener/dispatch/internal/h2engine"
	"github.com/applistener/applistener/internal/accessjwt"
)

// JWTs signed by the platform with asymmetric keys (Config.AccessJWT,
// internal/accessjwt) are accepted where the listener's own tokens are:
// X-Applistener-Token, Authorization: Bearer (when the policy takes it)
// and ?_al_token= on a navigation. A credential that is no HMAC token but
// has a JWT's shape is verified against the JWKS once, then swapped: the
// listener mints its own token with the same scope, subject, generation
// and expiry (signed with the keys file's first key) and sets it as the
// cookie, on the 303 of a navigation's exchange or on the app's response
// to a header-carried JWT, so the next request pays only the HMAC verify.

// denialInvalidClaims is a JWT with a valid signature whose issuer,
// audience, not-before or applistener claims are not.
const denialInvalidClaims = "invalid_claims"

// accessJWT is what decideAccess needs to swap a JWT (accessInput.jwt).
type accessJWT struct {
	v    *accessjwt.Verifier
	keys *accesstoken.KeySet
	// embed: the cookie's attributes for an embedded service.
	embed bool
}

// accessJWTFor returns the swap state for a route; its v is nil when JWTs
// are not accepted (no verifier, or no key to mint with).
func (s *Server) accessJWTFor(ar *accessRoute, keys *accesstoken.KeySet) accessJWT {
	if s.cfg.AccessJWT == nil || keys.First() == "" {
		return accessJWT{}
	}
	return accessJWT{v: s.cfg.AccessJWT, keys: keys, embed: ar.policy.Embed}
}

// errJWTNoMintKey: the keys file lost its keys; no token can be minted.
var errJWTNoMintKey = errors.New("no access key to mint with")

// swap verifies the JWT token and returns the listener's own token for
// it, verified against req (scope, generation, lifetime) like any other.
func (j *accessJWT) swap(token string, req *accesstoken.Request) (accesstoken.Claims, string, error) {
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	jc, err := j.v.Verify(token, now)
	if err != nil {
		return accesstoken.Claims{}, "", err
	}
	maxLife := req.MaxLifetime
	if maxLife == 0 {
		maxLife = accesstoken.MaxLifetime
	}
	if jc.Expires.Sub(now) > maxLife {
		return accesstoken.Claims{}, "", accesstoken.ErrLifetime
	}
	kid := j.keys.First()
	if kid == "" {
		return accesstoken.Claims{}, "", errJWTNoMintKey
	}
	tok, err := j.keys.Mint(kid, accesstoken.Claims{
		Workspace: jc.Workspace, Sandbox: jc.Sandbox, Service: jc.Service, AllServices: jc.AllServices,
		Subject: jc.Subject, Generation: jc.Generation, IssuedAt: now, Expires: jc.Expires,
	})
	if err != nil {
		// Names or a subject the listener's tokens cannot carry.
		return accesstoken.Claims{}, "", fmt.Errorf("%w: %w", accessjwt.ErrInvalidClaims, err)
	}
	c, err := j.keys.Verify(tok, req)
	if err != nil {
		return accesstoken.Claims{}, "", err
	}
	return c, tok, nil
}

// tryJWT is decideAccess's second chance for a credential that is no HMAC
// token (verr is ErrMalformed): a JWT is verified and swapped. Anything
// else keeps verr.
func tryJWT[T string | []byte](j *accessJWT, src credSource, tok T, s string, verr error, req *accesstoken.Request) (c accesstoken.Claims, minted string, err error) {
	if j.v == nil || (src != credHeader && src != credBearer && src != credQuery) ||
		!errors.Is(verr, accesstoken.ErrMalformed) || !accessjwt.LooksLikeJWT(tok) {
		return c, "", verr
	}
	if s == "" {
		s = string(tok) // longer than the HMAC tokens' bound
	}
	return j.swap(s, req)
}

// addResponseFields adds to an app's response what the decision calls
// for: the CORS fields for an allowed origin, and the cookie of a swapped
// header-carried JWT.
func (d *accessDecision) addResponseFields(resp *response) {
	addAccessCORS(resp, d.origin)
	if d.swapCookie != "" {
		resp.fields = append(resp.fields, headField{name: hdrSetCookie, value: []byte(d.swapCookie)})
	}
}

// appendH2Fields is addResponseFields for a response already in HTTP/2
// fields (an h2c app's, lowercase names).
func (d *accessDecision) appendH2Fields(dst []h2engine.HeaderField) []h2engine.HeaderField {
	if d.origin != nil && !hasField(dst, "access-control-allow-origin") {
		dst = append(dst,
			h2engine.HeaderField{Name: "access-control-allow-origin", Value: string(d.origin)},
			h2engine.HeaderField{Name: "access-control-allow-credentials", Value: "true"})
	}
	if d.swapCookie != "" {
		dst = append(dst, h2engine.HeaderField{Name: "set-cookie", Value: d.swapCookie})
	}
	return dst
}

var hdrSetCookie = []byte("Set-Cookie")
