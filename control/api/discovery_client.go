package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/routes"
)

// Defaults of the discovery client.
const (
	// DefaultDiscoveryStreamIdleTimeout ends a watch that sent nothing, not
	// even a keepalive, for this long (three keepalives of the gateway).
	DefaultDiscoveryStreamIdleTimeout = 15 * time.Second
	// EmptyRetryBound caps the delay between reconnections while the
	// client holds no valid route (an edge then refuses every connection
	// of the workspace, so coming back soon matters more than sparing the
	// gateway one request every few seconds).
	EmptyRetryBound = 5 * time.Second
	// DefaultDiscoveryMaxBackoff caps the delay between reconnections.
	DefaultDiscoveryMaxBackoff = 30 * time.Second
)

// DiscoveryStatusError is an answer of the gateway other than 200.
type DiscoveryStatusError struct {
	Code int
	Body string // the first line of the body, cut to 300 bytes
}

func (e *DiscoveryStatusError) Error() string {
	msg := fmt.Sprintf("gateway answered %d", e.Code)
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// Refused reports whether the answer is a refusal that retrying will not
// fix without a change of token, grant or request: 400, 401, 403 or 404.
func (e *DiscoveryStatusError) Refused() bool {
	switch e.Code {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return false
}

// IsDiscoveryRefusal reports whether err is a *DiscoveryStatusError that
// Refused: the token is unknown or not granted the workspace.
func IsDiscoveryRefusal(err error) bool {
	var se *DiscoveryStatusError
	return errors.As(err, &se) && se.Refused()
}

// DiscoveryClient reads a gateway's discovery API: one snapshot (Get) or a
// watch that delivers every change (Watch). It is safe for concurrent use
// once its fields are set; the zero values of the optional fields are the
// defaults.
type DiscoveryClient struct {
	// Gateway is the gateway's base URL, https://gateway:8080 (http:// for
	// a reference gateway on loopback), or a comma-separated list of the
	// URLs of its replicas: the client uses one at a time, moves to the
	// next on a connection error or a 5xx (with the reconnection backoff),
	// and stays on one that works (see GatewayEndpoints).
	Gateway string
	// TokenFile holds the workspace bearer token; it is re-read before
	// every request, so a rotated token is picked up.
	TokenFile string
	// CAFile is a PEM bundle that verifies the gateway; system roots when
	// empty. It is re-read when it changes, before a new connection is
	// made (no restart for a CA rotation).
	CAFile string
	// StreamIdleTimeout ends a watch stream that sent nothing, not even a
	// keepalive, for this long (DefaultDiscoveryStreamIdleTimeout when not
	// positive); the client then reconnects.
	StreamIdleTimeout time.Duration
	// MaxBackoff caps the reconnection delay (DefaultDiscoveryMaxBackoff).
	MaxBackoff time.Duration
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger

	initOnce  sync.Once
	initErr   error
	client    *http.Client
	endpoints *GatewayEndpoints
}

func (c *DiscoveryClient) init() error {
	c.initOnce.Do(func() {
		eps, err := ParseGatewayEndpoints(c.Gateway, c.logger())
		if err != nil {
			c.initErr = fmt.Errorf("discovery: %w", err)
			return
		}
		tr, err := NewGatewayTransport(GatewayTransportOptions{CAFile: c.CAFile, MaxIdleConnsPerHost: 4, Logger: c.logger()})
		if err != nil {
			c.initErr = fmt.Errorf("discovery: %w", err)
			return
		}
		c.endpoints = eps
		c.client = &http.Client{Transport: tr}
	})
	return c.initErr
}

func (c *DiscoveryClient) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

func (c *DiscoveryClient) idleTimeout() time.Duration {
	if c.StreamIdleTimeout > 0 {
		return c.StreamIdleTimeout
	}
	return DefaultDiscoveryStreamIdleTimeout
}

// newBackoff returns the spacing of reconnections: exponential from
// 250 ms, capped at MaxBackoff, with ±50 % jitter.
func (c *DiscoveryClient) newBackoff() ndjson.Backoff {
	return ndjson.Backoff{Base: 250 * time.Millisecond, Max: cmp.Or(max(c.MaxBackoff, 0), DefaultDiscoveryMaxBackoff)}
}

// CloseIdleConnections closes the client's idle connections to the gateway.
func (c *DiscoveryClient) CloseIdleConnections() {
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
}

// request sends one discovery GET to the current endpoint, which it
// returns with the response or the error. Failures to reach the endpoint
// are *GatewayConnError, answers other than 200 *DiscoveryStatusError.
func (c *DiscoveryClient) request(ctx context.Context, ws string, watch bool) (string, *http.Response, error) {
	if err := c.init(); err != nil {
		return "", nil, err
	}
	if err := routes.ValidName(ws); err != nil {
		return "", nil, fmt.Errorf("discovery: workspace: %w", err)
	}
	endpoint := c.endpoints.Current()
	u := endpoint + "/v1/workspaces/" + url.PathEscape(ws) + "/service-routes"
	if watch {
		u += "?watch=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return endpoint, nil, fmt.Errorf("discovery: %w", err)
	}
	tok, err := ReadTokenFile(c.TokenFile)
	if err != nil {
		return endpoint, nil, fmt.Errorf("discovery: %w", err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if watch {
		req.Header.Set("Accept", "application/x-ndjson")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", "applistener-discovery")
	resp, err := c.client.Do(req)
	if err != nil {
		return endpoint, nil, &GatewayConnError{Err: fmt.Errorf("discovery: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		body := ReadStatusBody(resp.Body)
		_ = resp.Body.Close()
		return endpoint, nil, &DiscoveryStatusError{Code: resp.StatusCode, Body: body}
	}
	return endpoint, resp, nil
}

// failed moves to the next endpoint when err is a failure of endpoint.
func (c *DiscoveryClient) failed(endpoint string, err error) {
	if endpoint != "" && IsGatewayFailover(err) {
		c.endpoints.Failed(endpoint, err)
	}
}

// parseSnapshot decodes one snapshot of workspace ws and drops (with a
// warning) the routes that fail CheckRoute. Routes are sorted by hostname;
// of two routes with one hostname the first is kept.
func (c *DiscoveryClient) parseSnapshot(data []byte, ws string) (*RouteSnapshot, error) {
	var s RouteSnapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("discovery: snapshot: %w", err)
	}
	if s.Workspace != ws {
		return nil, fmt.Errorf("discovery: snapshot of workspace %.40q, want %q", s.Workspace, ws)
	}
	kept := make([]ServiceRoute, 0, len(s.Routes))
	for i := range s.Routes {
		if err := CheckRoute(&s.Routes[i], ws); err != nil {
			c.logger().Warn("discovery route ignored", "workspace", ws, "err", err)
			continue
		}
		s.Routes[i].ExpiresAt = s.Routes[i].ExpiresAt.UTC()
		kept = append(kept, s.Routes[i])
	}
	slices.SortStableFunc(kept, func(a, b ServiceRoute) int { return strings.Compare(a.Hostname, b.Hostname) })
	kept = slices.CompactFunc(kept, func(a, b ServiceRoute) bool { return a.Hostname == b.Hostname })
	s.Routes = kept
	return &s, nil
}

// Get returns the current snapshot of workspace ws. A refusal is a
// *DiscoveryStatusError (see IsDiscoveryRefusal). With several gateway
// endpoints, a connection error or a 5xx is retried at the next one (with
// backoff), each endpoint once at most.
func (c *DiscoveryClient) Get(ctx context.Context, ws string) (*RouteSnapshot, error) {
	if err := c.init(); err != nil {
		return nil, err
	}
	backoff := c.newBackoff()
	for attempt := 0; ; attempt++ {
		endpoint, s, err := c.getOnce(ctx, ws)
		if err == nil || !IsGatewayFailover(err) || attempt+1 >= c.endpoints.Len() || ctx.Err() != nil {
			return s, err
		}
		c.failed(endpoint, err)
		if !ndjson.Sleep(ctx, backoff.Next(0)) {
			return nil, err
		}
	}
}

func (c *DiscoveryClient) getOnce(ctx context.Context, ws string) (string, *RouteSnapshot, error) {
	endpoint, resp, err := c.request(ctx, ws, false)
	if err != nil {
		return endpoint, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxDiscoverySnapshotBytes+1))
	if err != nil {
		return endpoint, nil, &GatewayConnError{Err: fmt.Errorf("discovery: read snapshot: %w", err)}
	}
	if len(data) > MaxDiscoverySnapshotBytes {
		return endpoint, nil, fmt.Errorf("discovery: snapshot larger than %d bytes", MaxDiscoverySnapshotBytes)
	}
	s, err := c.parseSnapshot(data, ws)
	return endpoint, s, err
}

// Watch holds a watch of workspace ws until ctx ends and calls fn with
// every snapshot, in order, from one goroutine (the caller's). Lost or
// silent streams (nothing, not even a keepalive, for StreamIdleTimeout) are
// reopened with exponential backoff and jitter; a stream the gateway ends
// cleanly (its maximum lifetime) is reopened at once.
//
// Watch returns ctx.Err() when ctx ends, and a *DiscoveryStatusError at once
// when the gateway refuses the token or the workspace (400, 401, 403, 404;
// see IsDiscoveryRefusal): retrying cannot help, and the caller should stop
// using the routes it has from this workspace. Any other failure (network,
// 429, 503, a malformed line) is retried.
//
// fn sees complete replacements; routes in them still expire at their
// ExpiresAt (see Unexpired and WatchUnexpired).
//
// One backoff spans every endpoint; while the latest snapshot holds routes
// that are still valid, no reconnection is further away than a fraction of
// the validity the earliest of them still has (RetryBound), so an outage
// (or a run of 503s) shorter than the freshness drops no route.
func (c *DiscoveryClient) Watch(ctx context.Context, ws string, fn func(*RouteSnapshot)) error {
	if err := c.init(); err != nil {
		return err
	}
	if err := routes.ValidName(ws); err != nil {
		return fmt.Errorf("discovery: workspace: %w", err)
	}
	log := c.logger().With("workspace", ws)
	backoff := c.newBackoff()
	lastErr := ""
	var held *RouteSnapshot // the latest snapshot delivered to fn
	deliver := func(s *RouteSnapshot) {
		held = s
		fn(s)
	}
	for {
		endpoint, got, err := c.guardedWatchOnce(ctx, ws, deliver) // discovery_guard.go
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if IsDiscoveryRefusal(err) {
			return err
		}
		c.failed(endpoint, err)
		if got {
			backoff.Reset()
		}
		var wait time.Duration
		if err == nil {
			// The gateway ended the stream cleanly (its lifetime bound):
			// reconnect after a short jitter only.
			wait = rand.N(100 * time.Millisecond)
			log.Debug("discovery watch ended by the gateway; reconnecting", "gateway", endpoint)
			lastErr = ""
		} else {
			// Holding nothing valid, the edge refuses every connection of
			// the workspace: reconnect at least every EmptyRetryBound.
			limit := RetryBound(held.validUntil(time.Now()), time.Now())
			if limit <= 0 {
				limit = EmptyRetryBound
			}
			wait = backoff.Next(limit)
			if msg := err.Error(); msg != lastErr {
				log.Warn("discovery watch failed; retrying", "gateway", endpoint, "err", err,
					"retry_in", wait.Round(time.Millisecond), "next_gateway", c.endpoints.Current())
				lastErr = msg
			}
		}
		if !ndjson.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// validUntil returns the earliest ExpiresAt of s's routes that are still
// valid at now: how long everything s holds stays usable. Zero when s holds
// no valid route.
func (s *RouteSnapshot) validUntil(now time.Time) time.Time {
	var until time.Time
	if s == nil {
		return until
	}
	for _, r := range s.Routes {
		if r.ExpiresAt.After(now) && (until.IsZero() || r.ExpiresAt.Before(until)) {
			until = r.ExpiresAt
		}
	}
	return until
}

// watchOnce holds one stream at the current endpoint, which it returns;
// got reports whether a snapshot arrived. err is nil when the gateway ended
// the stream cleanly.
func (c *DiscoveryClient) watchOnce(ctx context.Context, ws string, fn func(*RouteSnapshot)) (endpoint string, got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	endpoint, resp, err := c.request(sctx, ws, true)
	if err != nil {
		return endpoint, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	lines := ndjson.NewReader(resp.Body, MaxDiscoverySnapshotBytes, c.idleTimeout(), cancel)
	defer lines.Stop()
	for {
		line, keepalive, err := lines.Next()
		if err != nil {
			var silent *ndjson.SilentError
			if errors.Is(err, io.EOF) && !errors.As(err, &silent) && ctx.Err() == nil {
				// The gateway ended the stream cleanly.
				return endpoint, got, nil
			}
			return endpoint, got, &GatewayConnError{Err: fmt.Errorf("discovery: watch: %w", err)}
		}
		if keepalive {
			continue
		}
		s, err := c.parseSnapshot(line, ws)
		if err != nil {
			// A line that does not parse: the stream cannot be trusted.
			return endpoint, got, err
		}
		got = true
		fn(s)
	}
}

// WatchUnexpired is Watch for consumers that want the usable set: fn gets
// the unexpired routes of the latest snapshot whenever that set changes,
// including when a route reaches its expires_at while the watch is silent
// (a local timer drops it). fn runs on the caller's goroutine. It returns
// like Watch.
func (c *DiscoveryClient) WatchUnexpired(ctx context.Context, ws string, fn func(*RouteSnapshot)) error {
	return watchUnexpired(ctx, func(ctx context.Context, fn func(*RouteSnapshot)) error {
		return c.Watch(ctx, ws, fn)
	}, fn)
}

// watchUnexpired runs watch in a goroutine it owns and calls fn from the
// calling goroutine with the unexpired set whenever it changes.
func watchUnexpired(ctx context.Context, watch func(context.Context, func(*RouteSnapshot)) error, fn func(*RouteSnapshot)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	latest := make(chan *RouteSnapshot, 1) // holds only the newest snapshot
	done := make(chan error, 1)
	go func() {
		done <- watch(ctx, func(s *RouteSnapshot) {
			select {
			case <-latest:
			default:
			}
			latest <- s
		})
	}()
	var cur, printed *RouteSnapshot
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case err := <-done:
			return err
		case s := <-latest:
			cur = s
		case <-timer.C:
		}
		now := time.Now()
		view := cur.Unexpired(now)
		if view != nil && (printed == nil || !EqualRoutes(view.Routes, printed.Routes)) {
			fn(view)
			printed = view
		}
		timer.Stop()
		if next := view.NextExpiry(); !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		} else {
			timer.Reset(time.Hour)
		}
	}
}
