// Package accessjwt verifies the JWTs a platform signs with asymmetric
// keys published as a JWKS, for services in access mode token (issue 26):
// the listener accepts such a JWT where it accepts its own HMAC tokens,
// verifies it once here, and swaps it for its own token (dispatch).
//
// Only RS256, ES256 and EdDSA are accepted; never HS*, never none. The
// JWKS is fetched in the background, kept as long as its HTTP caching
// headers say (within bounds), and fetched again early when a token names
// an unknown kid, at most once per Config.MinRefreshInterval; a request
// waits for such a fetch at most Config.FetchWait.
//
// Claims: iss and aud must be the configured ones, exp is required (nbf
// honoured), and the scope is applistener_workspace, applistener_sandbox,
// applistener_service (absent: every service of the sandbox; "": the
// unnamed one), applistener_generation (the access policy generation,
// default 0) and sub (the user, optional).
package accessjwt

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/applistener/applistener/accesstoken"
)

// Defaults of Config.
const (
	DefaultMinRefreshInterval = 10 * time.Second
	DefaultFetchWait          = 2 * time.Second
	DefaultFetchTimeout       = 10 * time.Second
	// DefaultFreshness is how long a JWKS without caching headers is used.
	DefaultFreshness = time.Hour
	// MaxFreshness bounds a JWKS's max-age.
	MaxFreshness = 24 * time.Hour
	// MaxTokenLen is the longest JWT verified.
	MaxTokenLen = 8192
	// verifiedCacheSize bounds the cache of verified JWTs.
	verifiedCacheSize = 4096
)

// Algorithms are the only JWS algorithms accepted.
var Algorithms = []string{"RS256", "ES256", "EdDSA"}

// Errors of Verify, beyond accesstoken's ErrMalformed, ErrUnknownKey,
// ErrBadSignature and ErrExpired which it wraps where they apply.
var (
	// ErrInvalidClaims is a JWT whose signature is valid but whose
	// issuer, audience, not-before or applistener claims are not.
	ErrInvalidClaims = errors.New("accessjwt: invalid claims")
	// ErrKeysUnavailable is a JWT that could not be checked: no JWKS has
	// been fetched yet.
	ErrKeysUnavailable = errors.New("accessjwt: JWKS not available")
)

// Config configures a Verifier.
type Config struct {
	// JWKSURL is where the keys are published: https, or http to a
	// loopback address.
	JWKSURL string
	// Issuer and Audience are the required iss and aud.
	Issuer, Audience string
	// HTTPClient fetches the JWKS (nil: a client of its own).
	HTTPClient *http.Client
	// MinRefreshInterval is the shortest time between two fetches caused
	// by unknown kids (and the retry delay after a failed fetch).
	MinRefreshInterval time.Duration
	// FetchWait is the longest a request waits for a JWKS fetch.
	FetchWait time.Duration
	// FetchTimeout bounds one fetch.
	FetchTimeout time.Duration
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
}

// CheckURL returns an error unless u is an https URL, or an http one to a
// loopback address.
func CheckURL(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("JWKS URL: %w", err)
	}
	switch p.Scheme {
	case "https":
	case "http":
		h := p.Hostname()
		ip := net.ParseIP(h)
		if h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("JWKS URL %q: http only to a loopback address; use https", u)
		}
	default:
		return fmt.Errorf("JWKS URL %q: scheme must be https", u)
	}
	if p.Host == "" {
		return fmt.Errorf("JWKS URL %q: no host", u)
	}
	return nil
}

// Claims are what a verified JWT grants.
type Claims struct {
	// KeyID is the JWKS kid that signed it.
	KeyID string
	// Workspace and Sandbox name the sandbox it opens.
	Workspace, Sandbox string
	// Service is the one service it opens ("": the unnamed one) unless
	// AllServices (no applistener_service claim).
	Service     string
	AllServices bool
	// Subject is sub ("" none).
	Subject string
	// Generation is applistener_generation (0 when absent).
	Generation uint64
	// Expires is exp.
	Expires time.Time
}

// Verifier verifies JWTs against a JWKS. It is safe for concurrent use;
// Close stops its fetches.
type Verifier struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	own    *http.Transport // the client's when HTTPClient is nil
	parser *jwt.Parser

	keys atomic.Pointer[keySet]

	mu        sync.Mutex
	inflight  chan struct{} // closed when the fetch under way ends; nil: none
	lastFetch time.Time     // when the last fetch started
	trigger   chan struct{}

	cacheMu  sync.Mutex
	verified map[[sha256.Size]byte]Claims

	fetches atomic.Int64
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
}

// New checks cfg and returns a Verifier whose first JWKS fetch has
// started.
func New(cfg Config) (*Verifier, error) {
	if err := CheckURL(cfg.JWKSURL); err != nil {
		return nil, err
	}
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("accessjwt: issuer and audience are required")
	}
	if cfg.MinRefreshInterval <= 0 {
		cfg.MinRefreshInterval = DefaultMinRefreshInterval
	}
	if cfg.FetchWait <= 0 {
		cfg.FetchWait = DefaultFetchWait
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	v := &Verifier{cfg: cfg, log: cfg.Logger, client: cfg.HTTPClient, trigger: make(chan struct{}, 1),
		verified: make(map[[sha256.Size]byte]Claims), done: make(chan struct{})}
	if v.log == nil {
		v.log = slog.Default()
	}
	if v.client == nil {
		v.own = http.DefaultTransport.(*http.Transport).Clone()
		v.client = &http.Client{Transport: v.own, CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("too many redirects")
			}
			return CheckURL(req.URL.String()) // never a redirect to plain http elsewhere than loopback
		}}
	}
	v.parser = jwt.NewParser(jwt.WithValidMethods(Algorithms), jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(cfg.Audience), jwt.WithExpirationRequired(), jwt.WithStrictDecoding())
	v.ctx, v.cancel = context.WithCancel(context.Background())
	v.inflight, v.lastFetch = make(chan struct{}), time.Now()
	go v.run()
	return v, nil
}

// Close stops the fetches and waits for them to end.
func (v *Verifier) Close() {
	v.cancel()
	<-v.done
	if v.own != nil {
		v.own.CloseIdleConnections()
	}
}

// Fetches returns the number of JWKS fetches started.
func (v *Verifier) Fetches() int64 { return v.fetches.Load() }

// run fetches the JWKS when it is due or asked for (refreshNow).
func (v *Verifier) run() {
	defer close(v.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	first := true
	for {
		forced := first
		if !first {
			select {
			case <-v.ctx.Done():
				return
			case <-timer.C:
				forced = true
			case <-v.trigger:
			}
		}
		first = false
		v.mu.Lock()
		if v.inflight == nil {
			if !forced && time.Since(v.lastFetch) < v.cfg.MinRefreshInterval {
				v.mu.Unlock() // a stale trigger
				continue
			}
			v.inflight, v.lastFetch = make(chan struct{}), time.Now()
		}
		done := v.inflight
		v.mu.Unlock()
		next := v.fetch()
		v.mu.Lock()
		close(done)
		v.inflight = nil
		v.mu.Unlock()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// fetch gets the JWKS once and returns when to fetch it next.
func (v *Verifier) fetch() time.Duration {
	v.fetches.Add(1)
	retry := max(v.cfg.MinRefreshInterval, 5*time.Second)
	ctx, cancel := context.WithTimeout(v.ctx, v.cfg.FetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		v.log.Error("access JWKS: request", "err", err)
		return retry
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := v.client.Do(req)
	if err != nil {
		if v.ctx.Err() == nil {
			v.log.Warn("access JWKS: fetch failed; keeping the keys held", "url", v.cfg.JWKSURL, "err", err)
		}
		return retry
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	switch {
	case err != nil:
	case resp.StatusCode != http.StatusOK:
		err = fmt.Errorf("status %d", resp.StatusCode)
	case len(body) > maxJWKSBytes:
		err = fmt.Errorf("document larger than %d bytes", maxJWKSBytes)
	}
	if err != nil {
		v.log.Warn("access JWKS: fetch failed; keeping the keys held", "url", v.cfg.JWKSURL, "err", err)
		return retry
	}
	ks, skipped, err := parseJWKS(body)
	if err != nil {
		v.log.Warn("access JWKS: unusable document; keeping the keys held", "url", v.cfg.JWKSURL, "err", err)
		return retry
	}
	if skipped > 0 {
		v.log.Info("access JWKS: keys skipped (not RS256 >= 2048 bits, ES256 P-256 or Ed25519 signing keys with a kid)", "skipped", skipped)
	}
	v.keys.Store(&ks)
	return freshness(resp.Header, time.Now(), DefaultFreshness, max(v.cfg.MinRefreshInterval, time.Minute), MaxFreshness)
}

// refreshNow asks for a fetch for an unknown kid and returns the channel
// closed when it ends; nil when none may start (one started less than
// MinRefreshInterval ago).
func (v *Verifier) refreshNow() chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.inflight != nil {
		return v.inflight
	}
	if time.Since(v.lastFetch) < v.cfg.MinRefreshInterval {
		return nil
	}
	v.inflight, v.lastFetch = make(chan struct{}), time.Now()
	select {
	case v.trigger <- struct{}{}:
	default:
	}
	return v.inflight
}

// lookup returns the key kid names, waiting (at most FetchWait) for a
// fetch when it is unknown.
func (v *Verifier) lookup(kid string) (jwk, error) {
	if ks := v.keys.Load(); ks != nil {
		if k, ok := (*ks)[kid]; ok {
			return k, nil
		}
	}
	if ch := v.refreshNow(); ch != nil {
		t := time.NewTimer(v.cfg.FetchWait)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
	ks := v.keys.Load()
	if ks == nil {
		return jwk{}, ErrKeysUnavailable
	}
	if k, ok := (*ks)[kid]; ok {
		return k, nil
	}
	return jwk{}, fmt.Errorf("accessjwt: kid %q: %w", kid, accesstoken.ErrUnknownKey)
}

// hasKey reports whether the current JWKS holds kid.
func (v *Verifier) hasKey(kid string) bool {
	ks := v.keys.Load()
	if ks == nil {
		return false
	}
	_, ok := (*ks)[kid]
	return ok
}

// jwtClaims are the claims read from a JWT.
type jwtClaims struct {
	jwt.RegisteredClaims
	Workspace  string  `json:"applistener_workspace"`
	Sandbox    string  `json:"applistener_sandbox"`
	Service    *string `json:"applistener_service"`
	Generation uint64  `json:"applistener_generation"`
}

// Verify checks a JWT's shape, signature (against the JWKS) and claims
// (exp and nbf against the clock; now decides whether a remembered
// verification still holds), and returns what it grants. A JWT verified before (and whose kid is
// still published) is not verified again until it expires.
func (v *Verifier) Verify(token string, now time.Time) (Claims, error) {
	if len(token) > MaxTokenLen || !LooksLikeJWT(token) {
		return Claims{}, accesstoken.ErrMalformed
	}
	sum := sha256.Sum256([]byte(token))
	v.cacheMu.Lock()
	c, ok := v.verified[sum]
	v.cacheMu.Unlock()
	if ok && now.Before(c.Expires) && v.hasKey(c.KeyID) {
		return c, nil
	}
	var cl jwtClaims
	var kid string
	_, err := v.parser.ParseWithClaims(token, &cl, func(t *jwt.Token) (any, error) {
		kid, _ = t.Header["kid"].(string)
		if kid == "" {
			return nil, errors.New("no kid")
		}
		k, err := v.lookup(kid)
		if err != nil {
			return nil, err
		}
		if k.alg != t.Method.Alg() {
			return nil, fmt.Errorf("kid %q is a %s key, not %s: %w", kid, k.alg, t.Method.Alg(), accesstoken.ErrBadSignature)
		}
		return k.key, nil
	})
	if err != nil {
		return Claims{}, classify(err)
	}
	if cl.Workspace == "" || cl.Sandbox == "" {
		return Claims{}, fmt.Errorf("%w: applistener_workspace and applistener_sandbox are required", ErrInvalidClaims)
	}
	c = Claims{KeyID: kid, Workspace: cl.Workspace, Sandbox: cl.Sandbox, Subject: cl.Subject,
		Generation: cl.Generation, Expires: cl.ExpiresAt.Time, AllServices: cl.Service == nil}
	if cl.Service != nil {
		c.Service = *cl.Service
	}
	v.cacheMu.Lock()
	if len(v.verified) >= verifiedCacheSize {
		for k, e := range v.verified {
			if !now.Before(e.Expires) || len(v.verified) >= verifiedCacheSize {
				delete(v.verified, k)
			}
		}
	}
	v.verified[sum] = c
	v.cacheMu.Unlock()
	return c, nil
}

// classify maps golang-jwt's errors onto accesstoken's (for the denial
// reasons) and ErrInvalidClaims.
func classify(err error) error {
	switch {
	case errors.Is(err, accesstoken.ErrUnknownKey), errors.Is(err, ErrKeysUnavailable):
		return err
	case errors.Is(err, jwt.ErrTokenExpired):
		return fmt.Errorf("%w: %w", accesstoken.ErrExpired, err)
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fmt.Errorf("%w: %w", accesstoken.ErrMalformed, err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable),
		errors.Is(err, accesstoken.ErrBadSignature):
		return fmt.Errorf("%w: %w", accesstoken.ErrBadSignature, err)
	}
	return fmt.Errorf("%w: %w", ErrInvalidClaims, err)
}

// LooksLikeJWT reports whether t has a compact JWS's shape: three
// non-empty base64url parts, the first a JSON object ("eyJ", the encoding
// of `{"`). It allocates nothing; the listener's own tokens (v1.<kid>.…,
// four parts) never look like one.
func LooksLikeJWT[T string | []byte](t T) bool {
	if len(t) < 3 || len(t) > MaxTokenLen || t[0] != 'e' || t[1] != 'y' || t[2] != 'J' {
		return false
	}
	dots, last := 0, -1
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.':
			if i == last+1 {
				return false
			}
			dots++
			last = i
		default:
			return false
		}
	}
	return dots == 2 && last < len(t)-1
}
