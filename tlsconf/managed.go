package tlsconf

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ACMETLS1Protocol is the ALPN protocol of the ACME TLS-ALPN-01 challenge
// (RFC 8737). A listener whose certificates come from [Managed] must list it
// in [tls.Config.NextProtos] (after the application protocols), or the CA's
// validation handshakes fail with "no application protocol". A connection
// that negotiated it carries no application data and should be closed after
// the handshake.
const ACMETLS1Protocol = "acme-tls/1"

// ManagedConfig configures [NewManaged].
type ManagedConfig struct {
	// CA is the ACME directory URL, e.g.
	// https://acme-v02.api.letsencrypt.org/directory. Required.
	CA string
	// Email is the ACME account contact; may be empty.
	Email string
	// CacheDir is the directory where the ACME account, the issued
	// certificates and their keys and the issuance locks are kept (certmagic
	// file storage). Required. Instances sharing the directory share the
	// certificates and coordinate issuance through lock files in it.
	CacheDir string
	// CARoots are the roots trusted for the ACME server's own HTTPS
	// endpoint; nil means the system roots.
	CARoots *x509.CertPool
	// ChallengeAddress is the host:port the TLS listener that serves
	// GetCertificate is bound to (e.g. ":8443"). The CA validates
	// TLS-ALPN-01 challenges by connecting to port 443 of the hostname,
	// which must reach that listener. Before each challenge certmagic tries
	// to bind this address itself; because the listener already holds it,
	// certmagic leaves the challenge to GetCertificate instead of starting a
	// server of its own. Required. The HTTP-01 challenge is disabled.
	ChallengeAddress string
	// Allowed is the on-demand decision: it reports whether a certificate
	// may be obtained (or renewed) for a hostname, and must answer true
	// only for currently installed routes. It receives the server name in
	// lower case without a trailing dot and is called during handshakes, so
	// it must be fast and safe for concurrent use. Required.
	Allowed func(name string) bool
	// Fallback, if not nil, serves the handshake when no managed
	// certificate is available: for a server name that is not allowed and
	// when issuance fails or is cancelled (e.g. the Secret directory
	// [Store.GetCertificate]). It is never used for ACME challenge
	// handshakes.
	Fallback func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Logger receives certmagic's logs (attribute component=certmagic) and
	// the decisions; nil means [slog.Default].
	Logger *slog.Logger
}

// Managed serves certificates obtained from an ACME CA on demand, during the
// first handshake for a hostname, through certmagic. A certificate is
// requested only for a hostname that [ManagedConfig.Allowed] accepts at that
// moment: the server name is checked before certmagic is asked at all, and
// certmagic's on-demand decision function asks Allowed again before it loads
// a certificate from the cache directory, obtains one or renews one. No
// hostname is managed in advance, so nothing else makes it contact the CA.
//
// Keys are ECDSA P-256. Certificates are kept in memory and in
// [ManagedConfig.CacheDir] and are renewed during handshakes when they
// approach expiry (or when the CA's renewal information says so), again
// only while Allowed accepts the name.
//
// Concurrency and rate (certmagic's own mechanisms): concurrent handshakes
// for a name share one load or issuance; a failed issuance is retried with
// backoff (1 min, 2 min, ...) within one handshake, which waits at most
// 180 s for it; new orders are throttled to 10 per 10 s per CA and account;
// and issuance of a name is serialized across instances by a lock file in
// CacheDir.
type Managed struct {
	magic    *certmagic.Config
	cache    *certmagic.Cache
	allowed  func(string) bool
	fallback func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	logger   *slog.Logger

	ctx    context.Context // cancelled by Close; bounds in-flight issuance
	cancel context.CancelFunc

	expiries managedExpiries // hostnames served, for ExpiryCollector

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
	stopOnce sync.Once
}

// NewManaged validates cfg and starts certmagic's certificate cache (and its
// maintenance goroutine; stop it with [Managed.Close]). It contacts nobody:
// the ACME account is registered with the first issuance.
func NewManaged(cfg ManagedConfig) (*Managed, error) {
	switch {
	case cfg.CA == "":
		return nil, errors.New("tlsconf: managed certificates: no ACME directory URL")
	case cfg.CacheDir == "":
		return nil, errors.New("tlsconf: managed certificates: no cache directory")
	case cfg.Allowed == nil:
		return nil, errors.New("tlsconf: managed certificates: no decision function (Allowed)")
	}
	host, portStr, err := net.SplitHostPort(cfg.ChallengeAddress)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: managed certificates: challenge address %q: %w", cfg.ChallengeAddress, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("tlsconf: managed certificates: challenge address %q: port must be 1 to 65535", cfg.ChallengeAddress)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	zl := zap.New(newSlogCore(logger.Handler().WithAttrs([]slog.Attr{slog.String("component", "certmagic")})))

	m := &Managed{
		allowed:  cfg.Allowed,
		fallback: cfg.Fallback,
		logger:   logger,
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())

	var magic *certmagic.Config
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return magic, nil },
		Logger:           zl,
	})
	magic = certmagic.New(m.cache, certmagic.Config{
		Storage:   &certmagic.FileStorage{Path: cfg.CacheDir},
		KeySource: certmagic.StandardKeyGenerator{KeyType: certmagic.P256},
		OnDemand:  &certmagic.OnDemandConfig{DecisionFunc: m.decide},
		Logger:    zl,
	})
	magic.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(magic, certmagic.ACMEIssuer{
		CA:                   cfg.CA,
		Email:                cfg.Email,
		Agreed:               true,
		TrustedRoots:         cfg.CARoots,
		DisableHTTPChallenge: true,
		ListenHost:           host,
		AltTLSALPNPort:       port,
		Logger:               zl,
	})}
	m.magic = magic
	return m, nil
}

// decide is certmagic's on-demand decision function: the only gate before a
// certificate is loaded from storage, obtained or renewed on demand.
func (m *Managed) decide(_ context.Context, name string) error {
	n := normalizeServerName(name)
	if n == "" || !m.allowed(n) {
		m.logger.Info("managed certificate refused: not an installed route", "server_name", name)
		return fmt.Errorf("%q is not an installed route", name)
	}
	return nil
}

// GetCertificate returns the managed certificate for hello.ServerName,
// obtaining it on demand if [ManagedConfig.Allowed] accepts the name; the
// handshake that triggers issuance waits for it. It answers the CA's
// TLS-ALPN-01 validation handshakes with the challenge certificate. For a
// name that is not allowed, or when issuance fails, it returns the
// fallback's certificate, or an error if there is no fallback. Its
// signature fits [tls.Config.GetCertificate]. After [Managed.Close] it
// always uses the fallback.
func (m *Managed) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if isACMEChallengeHello(hello) {
		// certmagic serves a challenge certificate only while it is solving
		// a challenge for this name; otherwise it fails the handshake.
		return m.fromCertmagic(hello)
	}
	name := normalizeServerName(hello.ServerName)
	if name == "" || !m.allowed(name) {
		m.logger.Debug("no managed certificate: not an installed route", "server_name", hello.ServerName,
			"fallback", m.fallback != nil)
		return m.useFallback(hello, fmt.Errorf("tlsconf: no managed certificate for server name %q: not an installed route", hello.ServerName))
	}
	cert, err := m.fromCertmagic(hello)
	if err != nil {
		m.logger.Warn("managed certificate unavailable", "server_name", name, "error", err,
			"fallback", m.fallback != nil)
		return m.useFallback(hello, err)
	}
	m.expiries.served(name)
	return cert, nil
}

// fromCertmagic asks certmagic with a context that Close cancels.
func (m *Managed) fromCertmagic(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return nil, errManagedClosed
	}
	m.inflight.Add(1)
	m.mu.RUnlock()
	defer m.inflight.Done()

	parent := hello.Context()
	if parent == nil { // a ClientHelloInfo not made by crypto/tls
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()

	cert, err := m.magic.GetCertificateWithContext(ctx, hello)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: managed certificate for %q: %w", hello.ServerName, err)
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, fmt.Errorf("tlsconf: managed certificate for %q: none available", hello.ServerName)
	}
	return cert, nil
}

var errManagedClosed = errors.New("tlsconf: managed certificates are closed")

func (m *Managed) useFallback(hello *tls.ClientHelloInfo, err error) (*tls.Certificate, error) {
	if m.fallback == nil {
		return nil, err
	}
	return m.fallback(hello)
}

// Close cancels issuance in progress, waits for the handshakes inside
// certmagic to return and stops certmagic's maintenance goroutine.
// Afterwards GetCertificate serves only the fallback. Close is idempotent.
//
// Goroutines certmagic starts on its own and that no API stops: a lock file
// refresher per issuance, which ends within 5 s after the lock is released;
// one rate limiter per CA and account, for the life of the process; and,
// when a handshake finds its certificate due for renewal while still valid
// (or its renewal information stale), a background renewal (at most 5 min)
// or renewal-information update (at most 8 min). Keep-alive connections to
// the CA stay open until the CA closes them.
func (m *Managed) Close() {
	m.stopOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		m.cancel()
		m.inflight.Wait()
		m.cache.Stop()
	})
}

// isACMEChallengeHello reports whether hello is a TLS-ALPN-01 validation
// handshake: it offers exactly the acme-tls/1 protocol and names a server.
func isACMEChallengeHello(hello *tls.ClientHelloInfo) bool {
	return hello.ServerName != "" && len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == ACMETLS1Protocol
}

// normalizeServerName lower-cases name and removes one trailing dot.
func normalizeServerName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// PreferECDSA combines certificate sources (each with the signature of
// [tls.Config.GetCertificate]; nil sources are skipped). It asks the sources
// in order and returns the first ECDSA certificate the client supports
// ([tls.ClientHelloInfo.SupportsCertificate], which also checks the server
// name); otherwise the first certificate the client supports; otherwise the
// first certificate any source returned (the handshake decides). It fails
// only when no source returns a certificate, with the first source's
// error. Sources after a supported ECDSA certificate are not asked.
func PreferECDSA(sources ...func(*tls.ClientHelloInfo) (*tls.Certificate, error)) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	sources = slices.DeleteFunc(slices.Clone(sources), func(s func(*tls.ClientHelloInfo) (*tls.Certificate, error)) bool {
		return s == nil
	})
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		var first, supported *tls.Certificate
		var firstErr error
		for _, src := range sources {
			cert, err := src(hello)
			if err != nil || cert == nil || len(cert.Certificate) == 0 {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			if first == nil {
				first = cert
			}
			if hello.SupportsCertificate(cert) != nil {
				continue
			}
			if isECDSACert(cert) {
				return cert, nil
			}
			if supported == nil {
				supported = cert
			}
		}
		switch {
		case supported != nil:
			return supported, nil
		case first != nil:
			return first, nil
		case firstErr != nil:
			return nil, firstErr
		}
		return nil, errNoCertificate
	}
}

// isECDSACert reports whether cert's private key is an ECDSA key.
func isECDSACert(cert *tls.Certificate) bool {
	if cert.Leaf != nil {
		_, ok := cert.Leaf.PublicKey.(*ecdsa.PublicKey)
		return ok
	}
	if signer, ok := cert.PrivateKey.(crypto.Signer); ok {
		_, ok := signer.Public().(*ecdsa.PublicKey)
		return ok
	}
	return false
}

// slogCore is a zapcore.Core that writes to a slog.Handler, so that
// certmagic (which logs with zap) logs like the rest of the program.
type slogCore struct {
	h slog.Handler
}

func newSlogCore(h slog.Handler) zapcore.Core { return slogCore{h: h} }

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	return slogCore{h: c.h.WithAttrs(zapAttrs(fields))}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if name := strings.TrimPrefix(e.LoggerName, "."); name != "" {
		r.AddAttrs(slog.String("logger", name))
	}
	r.AddAttrs(zapAttrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// zapAttrs converts zap fields to slog attributes, sorted by key.
func zapAttrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	return attrs
}
