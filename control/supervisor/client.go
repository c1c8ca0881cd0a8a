package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// GatewayClient holds the supervisor's session with the gateway: a push
// session (?watch=1, NDJSON documents and keepalives) first, polling with
// If-None-Match whenever the push session is down, retries with exponential
// backoff and jitter. Every successful delivery renews the routes: a
// document applied, a 304, a keepalive on an accepted push session. A
// document that cannot be parsed renews nothing.
type GatewayClient struct {
	Endpoint     string // https://gateway:8080
	SupervisorID string
	TokenFile    string // re-read before every request, so a rotated token is picked up; empty: no token
	CAFile       string // PEM bundle to verify the gateway; system roots when empty
	Sink         Sink
	// PollInterval is the time between polls while the push session is down.
	PollInterval time.Duration
	// StreamIdleTimeout ends a push session that sent nothing (not even a
	// keepalive) for this long.
	StreamIdleTimeout time.Duration
	// MaxBackoff caps the retry delay.
	MaxBackoff time.Duration
	Logger     *slog.Logger
	Metrics    *Metrics
	// OnConnected is told when the session becomes accepted (true) and when
	// it is lost (false). It may be nil.
	OnConnected func(bool)

	client    *http.Client
	connected atomic.Bool
	etag      string
	lastErr   string
	mu        sync.Mutex
}

// Defaults of the gateway client.
const (
	DefaultPollInterval      = 10 * time.Second
	DefaultStreamIdleTimeout = 15 * time.Second
	DefaultMaxBackoff        = 30 * time.Second
)

// Connected reports whether the last delivery succeeded and the push
// session (or polling) is healthy.
func (c *GatewayClient) Connected() bool { return c.connected.Load() }

func (c *GatewayClient) setConnected(v bool) {
	if c.connected.Swap(v) != v {
		if v {
			c.Logger.Info("gateway session accepted", "endpoint", c.Endpoint, "supervisor", c.SupervisorID)
		} else {
			c.Logger.Warn("gateway session lost", "endpoint", c.Endpoint, "supervisor", c.SupervisorID)
		}
		if c.OnConnected != nil {
			c.OnConnected(v)
		}
	}
}

// reportErr logs a failure once per distinct message.
func (c *GatewayClient) reportErr(msg string, err error) {
	text := msg + ": " + err.Error()
	c.mu.Lock()
	same := text == c.lastErr
	c.lastErr = text
	c.mu.Unlock()
	if !same {
		c.Logger.Error(msg, "endpoint", c.Endpoint, "supervisor", c.SupervisorID, "err", err)
	}
}

// LastError returns the last failure of the session, "" after a success.
func (c *GatewayClient) LastError() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

func (c *GatewayClient) clearErr() {
	c.mu.Lock()
	c.lastErr = ""
	c.mu.Unlock()
}

// Init validates the settings and builds the HTTP client; Run calls it.
func (c *GatewayClient) Init() error {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.StreamIdleTimeout <= 0 {
		c.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("gateway endpoint %q: want http(s)://host[:port]", c.Endpoint)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return fmt.Errorf("gateway CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("gateway CA file %s: no PEM certificates", c.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	tr := &http.Transport{
		Proxy:                 nil,
		TLSClientConfig:       tlsCfg,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
	}
	c.client = &http.Client{Transport: tr}
	return nil
}

func (c *GatewayClient) configURL(watch bool) string {
	u := strings.TrimRight(c.Endpoint, "/") + "/v1/supervisors/" + url.PathEscape(c.SupervisorID) + "/config"
	if watch {
		u += "?watch=1"
	}
	return u
}

func (c *GatewayClient) token() (string, error) {
	if c.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return "", fmt.Errorf("gateway token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("gateway token file %s is empty", c.TokenFile)
	}
	return t, nil
}

func (c *GatewayClient) newRequest(ctx context.Context, method, url string, body []byte) (*http.Request, error) {
	tok, err := c.token()
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("User-Agent", "applistener-supervisor")
	return req, nil
}

// statusError is a non-success answer from the gateway.
type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("gateway answered %d", e.code)
	if e.body != "" {
		msg += ": " + e.body
	}
	if e.code == http.StatusUnauthorized || e.code == http.StatusForbidden {
		msg += " (check --gateway-token-file and --supervisor-id)"
	}
	return msg
}

func readStatusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return &statusError{code: resp.StatusCode, body: line}
}

// backoff returns the delay for attempt n (0-based): exponential from
// 250 ms, capped, with ±50 % jitter.
func (c *GatewayClient) backoff(n int) time.Duration {
	d := 250 * time.Millisecond << min(n, 10)
	d = min(d, c.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

// Run holds the session until ctx ends.
func (c *GatewayClient) Run(ctx context.Context) error {
	if c.client == nil {
		if err := c.Init(); err != nil {
			return err
		}
	}
	defer c.client.CloseIdleConnections()
	failures := 0
	for ctx.Err() == nil {
		accepted, err := c.push(ctx)
		if ctx.Err() != nil {
			break
		}
		c.setConnected(false)
		if accepted {
			failures = 0
		}
		pushRetry := c.backoff(failures)
		var se *statusError
		if errors.As(err, &se) && (se.code == http.StatusNotImplemented || se.code == http.StatusNotFound) {
			// The gateway does not offer push: poll, and ask again later.
			pushRetry = 5 * time.Minute
		}
		if err != nil {
			c.reportErr("gateway push session failed; polling", err)
		}
		failures++
		// Poll until it is time to try the push session again.
		retryAt := time.Now().Add(pushRetry)
		pollFailures := 0
		for ctx.Err() == nil {
			wait := c.PollInterval
			if err := c.poll(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				c.setConnected(false)
				c.reportErr("gateway poll failed", err)
				wait = min(c.backoff(pollFailures), c.PollInterval)
				pollFailures++
			} else {
				pollFailures = 0
				if failures > 3 && pushRetry < 5*time.Minute {
					// Polls work but the push session keeps failing:
					// don't hammer it.
					failures = 3
				}
			}
			left := time.Until(retryAt)
			if left <= 0 {
				break
			}
			if !sleepCtx(ctx, min(wait, left)) {
				break
			}
		}
	}
	c.setConnected(false)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// poll fetches the document once: 200 applies it, 304 renews.
func (c *GatewayClient) poll(ctx context.Context) error {
	req, err := c.newRequest(ctx, http.MethodGet, c.configURL(false), nil)
	if err != nil {
		return err
	}
	if c.etag != "" {
		req.Header.Set("If-None-Match", c.etag)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.Metrics.delivery("poll", "error")
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusNotModified:
		c.Sink.Renew()
		c.Metrics.delivery("poll", "renewed")
		c.clearErr()
		c.setConnected(true)
		return nil
	case http.StatusOK:
	default:
		c.Metrics.delivery("poll", "refused")
		return readStatusError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, routes.MaxDocumentBytes+1))
	if err != nil {
		c.Metrics.delivery("poll", "error")
		return fmt.Errorf("read document: %w", err)
	}
	if len(data) > routes.MaxDocumentBytes {
		c.Metrics.delivery("poll", "unparsable")
		return fmt.Errorf("document larger than %d bytes", routes.MaxDocumentBytes)
	}
	if err := c.applyDocument(data, "poll"); err != nil {
		return err
	}
	c.etag = resp.Header.Get("ETag")
	c.clearErr()
	c.setConnected(true)
	return nil
}

func (c *GatewayClient) applyDocument(data []byte, source string) error {
	doc, err := routes.ParseDocument(data)
	if err != nil {
		c.Metrics.delivery(source, "unparsable")
		return fmt.Errorf("document not applied (routes not renewed): %w", err)
	}
	res := c.Sink.Apply(doc)
	c.Metrics.delivery(source, "applied")
	for _, rj := range doc.Rejected {
		if c.Metrics != nil {
			c.Metrics.rejected.Inc()
		}
		c.Logger.Warn("instance rejected", "class_uid", 5019, "index", rj.Index,
			"workspace", rj.Workspace, "sandbox", rj.Sandbox, "reason", rj.Reason)
	}
	if res.Installed+res.Changed+res.Withdrawn+res.Rejected > 0 {
		c.Logger.Info("configuration applied", "source", source, "revision", doc.Revision,
			"installed", res.Installed, "changed", res.Changed, "withdrawn", res.Withdrawn,
			"rejected", res.Rejected, "kept", res.Kept)
	}
	return nil
}

// push holds one push session. It reports whether the session was accepted
// (a document applied) before it ended.
func (c *GatewayClient) push(ctx context.Context) (accepted bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.newRequest(sctx, http.MethodGet, c.configURL(true), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.client.Do(req)
	if err != nil {
		return false, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return false, readStatusError(resp)
	}
	// A silent stream is a dead stream: cancel it after StreamIdleTimeout.
	idle := time.AfterFunc(c.StreamIdleTimeout, cancel)
	defer idle.Stop()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := api.ReadLine(br, routes.MaxDocumentBytes)
		if err != nil {
			if sctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("push session silent for %v", c.StreamIdleTimeout)
			}
			return accepted, err
		}
		idle.Reset(c.StreamIdleTimeout)
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if isKeepalive(line) {
			if accepted {
				c.Sink.Renew()
				c.Metrics.delivery("push", "renewed")
			}
			continue
		}
		if err := c.applyDocument(line, "push"); err != nil {
			c.reportErr("gateway push document rejected", err)
			continue
		}
		accepted = true
		c.clearErr()
		c.setConnected(true)
	}
}

var keepaliveLine = []byte(`{"keepalive":true}`)

func isKeepalive(line []byte) bool {
	if bytes.Equal(line, keepaliveLine) {
		return true
	}
	// Tolerate whitespace variations: {"keepalive": true}
	compact := bytes.ReplaceAll(line, []byte(" "), nil)
	return bytes.Equal(compact, keepaliveLine)
}
