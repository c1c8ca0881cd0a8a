package api

// What every client of a gateway shares — the supervisor's session and
// advertiser, the discovery client, the admin CLI: a list of gateway
// endpoints used one at a time with failover, and an HTTP transport whose
// CA bundle follows its file.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/applistener/applistener/control/internal/pollfile"
)

// GatewayEndpoints is an ordered list of equivalent gateway base URLs (the
// replicas of one gateway). A client uses one at a time, the current one;
// when a request to it fails with a connection error or a 5xx it moves to
// the next (Failed), and it stays on an endpoint that works: a recovered
// earlier endpoint is not preferred. It is safe for concurrent use, so a
// supervisor's session and its advertiser share one.
type GatewayEndpoints struct {
	urls   []string
	logger *slog.Logger

	mu  sync.Mutex
	cur int
}

// ParseGatewayEndpoints parses a comma-separated list of gateway base URLs
// (http(s)://host[:port], an optional path prefix; no query or fragment).
// Spaces around the commas are ignored; an empty list, an empty entry and a
// URL listed twice are errors. logger (slog.Default() when nil) is told
// when the client moves to another endpoint.
func ParseGatewayEndpoints(list string, logger *slog.Logger) (*GatewayEndpoints, error) {
	if logger == nil {
		logger = slog.Default()
	}
	e := &GatewayEndpoints{logger: logger}
	if strings.TrimSpace(list) == "" {
		return nil, errors.New("no gateway URL")
	}
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimRight(strings.TrimSpace(s), "/")
		u, err := url.Parse(s)
		if s == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" ||
			u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("gateway %q: want http(s)://host[:port]", s)
		}
		if seen[s] {
			return nil, fmt.Errorf("gateway %q listed twice", s)
		}
		seen[s] = true
		e.urls = append(e.urls, s)
	}
	return e, nil
}

// Current returns the endpoint in use (without a trailing slash).
func (e *GatewayEndpoints) Current() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.urls[e.cur]
}

// All returns the endpoints in their configured order.
func (e *GatewayEndpoints) All() []string { return append([]string(nil), e.urls...) }

// Len returns the number of endpoints.
func (e *GatewayEndpoints) Len() int { return len(e.urls) }

// String returns the list as it is configured, comma-separated.
func (e *GatewayEndpoints) String() string { return strings.Join(e.urls, ",") }

// Failed reports that a request to endpoint failed with a connection error
// or a 5xx (see IsGatewayFailover). When endpoint is still the current one
// the client moves to the next (wrapping around); when another user of the
// list has moved on already, nothing changes, so two clients that see the
// same failure skip no endpoint. It returns the endpoint now in use.
func (e *GatewayEndpoints) Failed(endpoint string, err error) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.urls) > 1 && e.urls[e.cur] == endpoint {
		e.cur = (e.cur + 1) % len(e.urls)
		e.logger.Warn("gateway endpoint failed; moving to the next one", "failed", endpoint,
			"next", e.urls[e.cur], "err", err)
	}
	return e.urls[e.cur]
}

// GatewayConnError is a failure to reach a gateway endpoint or to hear from
// it: the connection could not be made (refused, TLS verification, timeout)
// or broke, or a stream went silent. A client moves to the next endpoint
// after one.
type GatewayConnError struct {
	Err error
}

func (e *GatewayConnError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *GatewayConnError) Unwrap() error { return e.Err }

// GatewayStatusCode is implemented by the errors of the gateway's non-2xx
// answers; IsGatewayFailover reads it.
type GatewayStatusCode interface {
	StatusCode() int
}

// StatusCode returns the HTTP status of the answer.
func (e *DiscoveryStatusError) StatusCode() int { return e.Code }

// IsGatewayFailover reports whether err means that the endpoint, not the
// request, is the problem: a *GatewayConnError, or an answer of 500 or
// above (a replica that cannot vouch for its state answers 503). A refusal
// (4xx), a bad document or a local error (an unreadable token file) is the
// same at every endpoint and moves nothing.
func IsGatewayFailover(err error) bool {
	if err == nil {
		return false
	}
	var ce *GatewayConnError
	if errors.As(err, &ce) {
		return true
	}
	var sc GatewayStatusCode
	return errors.As(err, &sc) && sc.StatusCode() >= 500
}

// GatewayTransportOptions tune NewGatewayTransport.
type GatewayTransportOptions struct {
	// CAFile is a PEM bundle that verifies the gateway; system roots when
	// empty. It is checked (stat) before every new connection and re-read
	// when it changed, so a rotated CA needs no restart. A changed file
	// that holds no usable certificate keeps the previous bundle (logged).
	CAFile string
	// MaxIdleConnsPerHost bounds the idle connections kept per endpoint (2
	// when not positive).
	MaxIdleConnsPerHost int
	// Logger receives CA reloads and their failures; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Timeouts of the gateway transport.
const (
	gatewayDialTimeout      = 10 * time.Second
	gatewayHandshakeTimeout = 10 * time.Second
)

// NewGatewayTransport returns the HTTP transport of a gateway client: no
// proxy, TLS 1.2 or later, HTTP/2 when the gateway offers it, response
// heads within 15 s, and with a CA file, a CA bundle that follows the file
// (see GatewayTransportOptions.CAFile). It fails when the CA file cannot
// be read or holds no certificate.
func NewGatewayTransport(opts GatewayTransportOptions) (*http.Transport, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	idle := opts.MaxIdleConnsPerHost
	if idle <= 0 {
		idle = 2
	}
	dialer := &net.Dialer{Timeout: gatewayDialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   gatewayHandshakeTimeout,
		ResponseHeaderTimeout: 15 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   idle,
	}
	if opts.CAFile == "" {
		return tr, nil
	}
	ca := &reloadingCA{path: opts.CAFile, logger: logger}
	if err := ca.load(); err != nil {
		return nil, err
	}
	// A TLS dial of our own: the bundle is looked at before every new
	// connection, and crypto/tls gets a config with the current one.
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := &tls.Config{
			MinVersion: tls.VersionTLS12,
			RootCAs:    ca.pool(),
			ServerName: host,
			NextProtos: []string{"h2", "http/1.1"},
		}
		raw, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hctx, cancel := context.WithTimeout(ctx, gatewayHandshakeTimeout)
		defer cancel()
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return tc, nil
	}
	return tr, nil
}

// reloadingCA is a CA bundle read from a file, re-read when the file's
// identity changes.
type reloadingCA struct {
	path   string
	logger *slog.Logger

	mu      sync.Mutex
	id      pollfile.Identity
	certs   *x509.CertPool
	lastErr string
}

// maxCABundleBytes bounds the CA file.
const maxCABundleBytes = 4 << 20

// load reads the bundle at start: any failure is an error.
func (c *reloadingCA) load() error {
	id, err := pollfile.Stat(c.path)
	if err != nil {
		return fmt.Errorf("gateway CA file: %w", err)
	}
	certs, err := c.read()
	if err != nil {
		return err
	}
	c.id, c.certs = id, certs
	return nil
}

func (c *reloadingCA) read() (*x509.CertPool, error) {
	pem, err := pollfile.ReadLimited(c.path, maxCABundleBytes)
	if err != nil {
		return nil, fmt.Errorf("gateway CA file: %w", err)
	}
	certs := x509.NewCertPool()
	if !certs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("gateway CA file %s: no PEM certificates", c.path)
	}
	return certs, nil
}

// pool returns the current bundle, re-reading the file first when it
// changed. A missing or unusable new file keeps the previous bundle.
func (c *reloadingCA) pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := pollfile.Stat(c.path)
	if err == nil && id == c.id {
		return c.certs
	}
	var certs *x509.CertPool
	if err == nil {
		certs, err = c.read()
	}
	if err != nil {
		if msg := err.Error(); msg != c.lastErr {
			c.lastErr = msg
			c.logger.Warn("gateway CA file changed but cannot be used; keeping the previous bundle", "path", c.path, "err", err)
		}
		return c.certs
	}
	c.id, c.certs, c.lastErr = id, certs, ""
	c.logger.Info("gateway CA file reloaded", "path", c.path)
	return c.certs
}

// ReadTokenFile returns the bearer token in path (surrounding whitespace
// removed); an empty path means no token. Clients call it before every
// request, so a rotated token is picked up.
func ReadTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := pollfile.ReadLimited(path, 64<<10)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return t, nil
}

// ReadStatusBody returns the first line of an error answer's body, cut for
// a log line or a message.
func ReadStatusBody(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 512))
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return OneLineReason(line)
}
