package main

import (
	"fmt"
	"log/slog"

	"github.com/applistener/applistener/internal/accessjwt"
)

// validateJWT checks the access JWT flags: all three or none, the URL's
// scheme, and the keys file the swapped tokens are minted with.
func (o *serveOptions) validateJWT() error {
	set := 0
	for _, v := range []string{o.accessJWKSURL, o.accessJWTIssuer, o.accessJWTAudience} {
		if v != "" {
			set++
		}
	}
	switch {
	case set == 0:
		return nil
	case set != 3:
		return usagef("--access-jwks-url, --access-jwt-issuer and --access-jwt-audience go together")
	case o.accessKeysFile == "":
		return usagef("--access-jwks-url requires --access-keys-file (its first key signs the tokens JWTs are swapped for)")
	}
	if err := accessjwt.CheckURL(o.accessJWKSURL); err != nil {
		return usagef("--access-jwks-url: %v", err)
	}
	return nil
}

// newJWTVerifier returns the verifier of access JWTs (nil without
// --access-jwks-url); its first JWKS fetch has started.
func (o *serveOptions) newJWTVerifier(logger *slog.Logger) (*accessjwt.Verifier, error) {
	if o.accessJWKSURL == "" {
		return nil, nil
	}
	v, err := accessjwt.New(accessjwt.Config{
		JWKSURL: o.accessJWKSURL, Issuer: o.accessJWTIssuer, Audience: o.accessJWTAudience, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("--access-jwks-url: %w", err)
	}
	return v, nil
}
