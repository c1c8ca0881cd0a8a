package supervisor

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// GatewayClient holds the supervisor's session with the gateway: a push
// session (?watch=1, NDJSON documents and keepalives) first, polling with
// If-None-Match whenever the push session is down, retries with exponential
// backoff and jitter. Every successful delivery renews the routes: a
// document applied, a 304, a keepalive on an accepted push session. A
// document that cannot be parsed renews nothing.
//
// Every request names the process's session (Session): the push session
// asks for keepalives every Freshness/3 (&keepalive=), and when the gateway
// grants a longer interval (X-Applistener-Keepalive; 5 s when it says
// nothing) the client also polls every Freshness/3 while the push session
// is up, so a healthy quiet session never lets a route expire.
//
// Endpoint may list several replicas of the gateway: the client uses one at
// a time, moves to the next on a connection error or a 5xx, and stays on
// one that works. The Advertiser and Withdraw use the same endpoint.
type GatewayClient struct {
	// Endpoint is the gateway's URL, https://gateway:8080, or a
	// comma-separated list of the URLs of its replicas.
	Endpoint     string
	SupervisorID string
	// Session is this process's session id: 32 lowercase hex characters,
	// the same on every reconnection to any endpoint. Init makes one
	// (NewSessionID) when it is empty.
	Session   string
	TokenFile string // re-read before every request, so a rotated token is picked up; empty: no token
	// CAFile is a PEM bundle that verifies the gateway (system roots when
	// empty), re-read when it changes before a new connection is made.
	CAFile string
	Sink   Sink
	// Freshness is how long a delivered route stays valid (the table's
	// freshness; routes.DefaultFreshness when 0). Renewals are arranged to
	// arrive at least every Freshness/3.
	Freshness time.Duration
	// PollInterval is the time between polls while the push session is down.
	PollInterval time.Duration
	// StreamIdleTimeout ends a push session that sent nothing (not even a
	// keepalive) for this long; at least three granted keepalive intervals.
	StreamIdleTimeout time.Duration
	// MaxBackoff caps the retry delay.
	MaxBackoff time.Duration
	Logger     *slog.Logger
	Metrics    *Metrics
	// OCSF receives a record per rejected instance entry; nil: none.
	OCSF *ocsf.Emitter
	// OnConnected is told when the session becomes accepted (true) and when
	// it is lost (false). It may be nil.
	OnConnected func(bool)

	client    *http.Client
	endpoints *api.GatewayEndpoints
	// order is the order the gateway gave this session
	// (api.SessionOrderHeader), 0 until it said; every request sends it
	// back (?order=), so that once this session is superseded the gateway
	// never lets it take the supervisor id back.
	order     atomic.Int64
	connected atomic.Bool
	// validUntil is when the routes this session delivered stop being
	// valid (unix nanoseconds; 0 before the first delivery): the last
	// renewal plus Freshness. It bounds the retry delays (api.RetryBound).
	validUntil atomic.Int64
	// sessionTTL is the session TTL the gateway told (api.SessionTTLHeader;
	// nanoseconds, 0 until it said): polls while the push session is down
	// are at most a third of it apart.
	sessionTTL atomic.Int64
	// withdrawing is set by Withdraw: the session is over, Run reconnects
	// no more (the gateway would refuse the withdrawn session with 409).
	withdrawing atomic.Bool
	mu          sync.Mutex
	lastErr     string
	lastErrs    map[string]string // the last failure logged, by kind
	lastGrant   string            // the keepalive note last logged

	// applyMu orders the deliveries of the push session and of the polls
	// that run beside it: a poll's document is applied only when no other
	// document was applied since the poll was sent.
	applyMu sync.Mutex
	applied uint64 // documents applied
	etag    string // If-None-Match of the next poll
}

// Defaults of the gateway client.
const (
	DefaultPollInterval      = 10 * time.Second
	DefaultStreamIdleTimeout = 15 * time.Second
	DefaultMaxBackoff        = 30 * time.Second
	// DefaultGatewayKeepalive is the keepalive interval a gateway uses
	// when its answer to a push request does not say which it granted.
	DefaultGatewayKeepalive = 5 * time.Second
)

// KeepaliveHeader is the response header in which the gateway tells the
// keepalive interval it granted a push session (a Go duration).
const KeepaliveHeader = "X-Applistener-Keepalive"

// NewSessionID returns a new session id: 16 random bytes as 32 lowercase
// hex characters.
func NewSessionID() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:]) // never fails (crypto/rand.Read panics rather)
	return hex.EncodeToString(b[:])
}

// ValidSessionID reports whether s is a session id: 32 lowercase hex
// characters.
func ValidSessionID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CurrentEndpoint returns the gateway endpoint in use.
func (c *GatewayClient) CurrentEndpoint() string { return c.endpoints.Current() }

// Connected reports whether the last delivery succeeded and the push
// session (or polling) is healthy.
func (c *GatewayClient) Connected() bool { return c.connected.Load() }

func (c *GatewayClient) setConnected(v bool) {
	if c.connected.Swap(v) != v {
		if v {
			c.Logger.Info("gateway session accepted", "endpoint", c.endpoints.Current(), "supervisor", c.SupervisorID, "session", c.Session)
		} else {
			c.Logger.Warn("gateway session lost", "endpoint", c.endpoints.Current(), "supervisor", c.SupervisorID, "session", c.Session)
		}
		if c.OnConnected != nil {
			c.OnConnected(v)
		}
	}
}

// reportErr logs a failure of the session once per distinct message of
// its kind (msg): a push session and the polls that follow it failing in
// turn do not log every attempt.
func (c *GatewayClient) reportErr(msg string, err error) {
	text := msg + ": " + err.Error()
	c.mu.Lock()
	if c.lastErrs == nil {
		c.lastErrs = map[string]string{}
	}
	same := c.lastErrs[msg] == text
	c.lastErrs[msg] = text
	c.lastErr = text
	c.mu.Unlock()
	if !same {
		c.Logger.Error(msg, "endpoint", c.endpoints.Current(), "supervisor", c.SupervisorID, "err", err)
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
	clear(c.lastErrs)
	c.mu.Unlock()
}

// renewed notes a delivery that renewed the routes (a document applied,
// a 304, a keepalive on an accepted push session).
func (c *GatewayClient) renewed() {
	c.validUntil.Store(time.Now().Add(c.Freshness).UnixNano())
}

// retryBound is the cap of the next retry delay: a fraction of the
// validity the delivered routes still hold (api.RetryBound), 0 when they
// hold none.
func (c *GatewayClient) retryBound() time.Duration {
	v := c.validUntil.Load()
	if v == 0 {
		return 0
	}
	return api.RetryBound(time.Unix(0, v), time.Now())
}

// Init validates the settings and builds the HTTP client; Run calls it.
func (c *GatewayClient) Init() error {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.StreamIdleTimeout <= 0 {
		c.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.Freshness <= 0 {
		c.Freshness = routes.DefaultFreshness
	}
	if c.PollInterval <= 0 {
		// DefaultPollInterval, or a third of a shorter freshness.
		c.PollInterval = min(DefaultPollInterval, c.wantKeepalive())
	}
	if c.Session == "" {
		c.Session = NewSessionID()
	} else if !ValidSessionID(c.Session) {
		return fmt.Errorf("session id %q: want 32 lowercase hex characters", c.Session)
	}
	if c.PollInterval >= c.Freshness {
		return fmt.Errorf("poll interval %v cannot keep a session: routes expire after %v without a renewal (want a poll interval below a third of it)",
			c.PollInterval, c.Freshness)
	}
	if c.PollInterval > c.Freshness/3 {
		c.Logger.Warn("the gateway poll interval leaves less than three polls per route-freshness: while the push session is down, one failed poll can let the routes expire",
			"poll_interval", c.PollInterval, "route_freshness", c.Freshness, "want_at_most", c.Freshness/3)
	}
	eps, err := api.ParseGatewayEndpoints(c.Endpoint, c.Logger)
	if err != nil {
		return fmt.Errorf("gateway endpoint: %w", err)
	}
	tr, err := api.NewGatewayTransport(api.GatewayTransportOptions{CAFile: c.CAFile, Logger: c.Logger})
	if err != nil {
		return err
	}
	c.endpoints = eps
	c.client = &http.Client{Transport: tr}
	return nil
}

// wantKeepalive is the keepalive interval the push session asks for (and
// the interval of the polls beside a push session granted a longer one).
func (c *GatewayClient) wantKeepalive() time.Duration {
	return max((c.Freshness / 3).Truncate(time.Millisecond), time.Millisecond)
}

func (c *GatewayClient) supervisorURL(endpoint, tail string) string {
	return endpoint + "/v1/supervisors/" + url.PathEscape(c.SupervisorID) + tail
}

func (c *GatewayClient) configURL(endpoint string, watch bool) string {
	q := url.Values{}
	if watch {
		q.Set("watch", "1")
		q.Set("keepalive", c.wantKeepalive().String())
	}
	c.sessionQuery(q)
	return c.supervisorURL(endpoint, "/config") + "?" + q.Encode()
}

// sessionQuery adds the session and, once the gateway told it, its order
// to q.
func (c *GatewayClient) sessionQuery(q url.Values) {
	q.Set("session", c.Session)
	if o := c.order.Load(); o > 0 {
		q.Set("order", strconv.FormatInt(o, 10))
	}
}

// noteOrder keeps the session order a gateway's answer tells
// (api.SessionOrderHeader); answers that do not say leave it.
func (c *GatewayClient) noteOrder(h http.Header) {
	if n, err := strconv.ParseInt(h.Get(api.SessionOrderHeader), 10, 64); err == nil && n > 0 {
		c.order.Store(n)
	}
	if d, err := time.ParseDuration(h.Get(api.SessionTTLHeader)); err == nil && d > 0 {
		if old := time.Duration(c.sessionTTL.Swap(int64(d))); old != d && c.PollInterval > d/3 {
			c.Logger.Warn("--gateway-poll-interval is too long for the gateway's session TTL: while the push session is down, polling every third of the TTL instead so that the session does not lapse",
				"poll_interval", c.PollInterval, "gateway_session_ttl", d, "polling_every", d/3, "endpoint", c.endpoints.Current())
		}
	}
}

// pollInterval is the time between polls while the push session is down:
// PollInterval, at most a third of the session TTL the gateway told.
func (c *GatewayClient) pollInterval() time.Duration {
	if ttl := time.Duration(c.sessionTTL.Load()); ttl > 0 {
		return min(c.PollInterval, max(ttl/3, time.Millisecond))
	}
	return c.PollInterval
}

// failed moves to the next endpoint when err is a failure of endpoint.
func (c *GatewayClient) failed(endpoint string, err error) {
	if api.IsGatewayFailover(err) {
		c.endpoints.Failed(endpoint, err)
	}
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

// StatusCode returns the HTTP status (api.GatewayStatusCode).
func (e *statusError) StatusCode() int { return e.code }

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
	return &statusError{code: resp.StatusCode, body: api.ReadStatusBody(resp.Body)}
}

// newBackoff returns the retry spacing of one kind of request:
// exponential from 250 ms, capped at MaxBackoff, with ±50 % jitter.
func (c *GatewayClient) newBackoff() ndjson.Backoff {
	return ndjson.Backoff{Base: 250 * time.Millisecond, Max: c.MaxBackoff}
}

// Run holds the session until ctx ends.
//
// Retries share one backoff across the push session, the polls and every
// endpoint: a failure of any of them grows it, a delivery resets it, and
// while the routes are valid no delay exceeds a fraction of the validity
// they still hold (api.RetryBound), so an outage shorter than the
// freshness costs no route.
func (c *GatewayClient) Run(ctx context.Context) error {
	if c.client == nil {
		if err := c.Init(); err != nil {
			return err
		}
	}
	defer c.client.CloseIdleConnections()
	backoff := c.newBackoff()
	// pushFailures counts the push sessions in a row that failed while
	// polls worked: their retries are spaced by a backoff of their own,
	// held low, so that the push session is tried again soon.
	pushBackoff := c.newBackoff()
	for ctx.Err() == nil {
		pushEndpoint := c.endpoints.Current()
		accepted, err := c.guardedPush(ctx, pushEndpoint) // guard.go
		if ctx.Err() != nil || c.withdrawing.Load() {
			break
		}
		c.setConnected(false)
		if accepted {
			backoff.Reset()
			pushBackoff.Reset()
		}
		c.failed(pushEndpoint, err)
		pushRetry := pushBackoff.Next(0)
		var se *statusError
		if errors.As(err, &se) && (se.code == http.StatusNotImplemented || se.code == http.StatusNotFound) {
			// The gateway does not offer push: poll, and ask again later.
			pushRetry = 5 * time.Minute
		}
		if err != nil {
			c.reportErr("gateway push session failed; polling", err)
		}
		// Poll until it is time to try the push session again, or until
		// the client moved to another endpoint (which may offer push).
		retryAt := time.Now().Add(pushRetry)
		for ctx.Err() == nil && !c.withdrawing.Load() {
			endpoint := c.endpoints.Current()
			err := c.guardedPoll(ctx, endpoint, "poll")
			wait := c.pollInterval() // after the poll: its answer may tell the session TTL
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				c.setConnected(false)
				c.reportErr("gateway poll failed", err)
				c.failed(endpoint, err)
				// At most the poll interval, as when nothing is held; while
				// routes are valid, at most a fraction of what they hold.
				limit := c.pollInterval()
				if b := c.retryBound(); b > 0 {
					limit = min(limit, b)
				}
				wait = backoff.Next(limit)
				// The push session is the next attempt when it is due
				// first; it must come no later than the bound either.
				retryAt = minTime(retryAt, time.Now().Add(wait))
			} else {
				backoff.Reset()
				if pushRetry < 5*time.Minute {
					// Polls work but the push session keeps failing:
					// don't hammer it.
					pushBackoff.Hold(3)
				}
			}
			left := time.Until(retryAt)
			if left <= 0 {
				break
			}
			if !ndjson.Sleep(ctx, min(wait, left)) {
				break
			}
			if c.endpoints.Current() != pushEndpoint {
				break
			}
		}
	}
	if c.connected.Swap(false) {
		c.Logger.Info("gateway session ended", "endpoint", c.endpoints.Current(), "supervisor", c.SupervisorID,
			"session", c.Session, "withdrawn", c.withdrawing.Load())
		if c.OnConnected != nil {
			c.OnConnected(false)
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// pollTimeout bounds one poll.
const pollTimeout = 15 * time.Second

// poll fetches the document once from endpoint: 200 applies it, 304
// renews. source labels the delivery ("poll", or "fallback-poll" beside a
// push session).
func (c *GatewayClient) poll(ctx context.Context, endpoint, source string) error {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, c.configURL(endpoint, false), nil)
	if err != nil {
		return err
	}
	c.applyMu.Lock()
	etag, seq := c.etag, c.applied
	c.applyMu.Unlock()
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.Metrics.delivery(source, "error")
		return &api.GatewayConnError{Err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	c.noteOrder(resp.Header)
	switch resp.StatusCode {
	case http.StatusNotModified:
		c.Sink.Renew()
		c.renewed()
		c.Metrics.delivery(source, "renewed")
		c.clearErr()
		c.setConnected(true)
		return nil
	case http.StatusOK:
	default:
		c.Metrics.delivery(source, "refused")
		return readStatusError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, routes.MaxDocumentBytes+1))
	if err != nil {
		c.Metrics.delivery(source, "error")
		return &api.GatewayConnError{Err: fmt.Errorf("read document: %w", err)}
	}
	if len(data) > routes.MaxDocumentBytes {
		c.Metrics.delivery(source, "unparsable")
		return fmt.Errorf("document larger than %d bytes", routes.MaxDocumentBytes)
	}
	if err := c.applyDocument(data, source, &seq, resp.Header.Get("ETag")); err != nil {
		return err
	}
	c.clearErr()
	c.setConnected(true)
	return nil
}

// applyDocument parses and applies a delivered document. A poll passes the
// number of documents applied when it was sent (since) and the answer's
// ETag: when another document was applied meanwhile (by the push session),
// the poll's answer is older than what is installed and is dropped. A push
// passes nil: its documents arrive in order.
func (c *GatewayClient) applyDocument(data []byte, source string, since *uint64, etag string) error {
	doc, err := routes.ParseDocument(data)
	if err != nil {
		c.Metrics.delivery(source, "unparsable")
		return fmt.Errorf("document not applied (routes not renewed): %w", err)
	}
	c.applyMu.Lock()
	if since != nil && *since != c.applied {
		c.applyMu.Unlock()
		c.Metrics.delivery(source, "superseded")
		return nil
	}
	res := c.Sink.Apply(doc)
	c.renewed()
	c.applied++
	if since == nil {
		etag = revisionETag(doc.Revision)
	}
	c.etag = etag
	c.applyMu.Unlock()
	c.Metrics.delivery(source, "applied")
	for _, rj := range doc.Rejected {
		if c.Metrics != nil {
			c.Metrics.rejected.Inc()
		}
		logRejected(c.Logger, rj)
		ocsfRejected(c.OCSF, doc, rj)
	}
	if res.Installed+res.Changed+res.Withdrawn+res.Rejected+len(doc.Rejected) > 0 {
		// rejected: instance entries refused by validation (their routes,
		// if any were installed, are counted in rejected_routes).
		c.Logger.Info("configuration applied", "source", source, "revision", doc.Revision,
			"installed", res.Installed, "changed", res.Changed, "withdrawn", res.Withdrawn,
			"rejected", len(doc.Rejected), "rejected_routes", res.Rejected, "kept", res.Kept)
	}
	return nil
}

// revisionETag is the entity tag the gateway gives a document with this
// revision (DESIGN: If-None-Match: "<revision>"), "" when the revision
// cannot be one (then the next poll fetches the document again).
func revisionETag(rev string) string {
	if rev == "" {
		return ""
	}
	for i := 0; i < len(rev); i++ {
		if ch := rev[i]; ch < 0x21 || ch == '"' || ch > 0x7e {
			return ""
		}
	}
	return `"` + rev + `"`
}

// grantedKeepalive reads the keepalive interval the gateway granted a push
// session; explicit is false when it did not say (DefaultGatewayKeepalive
// is assumed).
func grantedKeepalive(h http.Header) (d time.Duration, explicit bool) {
	v := h.Get(KeepaliveHeader)
	if v == "" {
		return DefaultGatewayKeepalive, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return DefaultGatewayKeepalive, false
	}
	return d, true
}

// noteKeepalive logs, once per distinct situation, that the granted
// keepalive interval does not renew the routes often enough and that the
// client polls beside the push session.
func (c *GatewayClient) noteKeepalive(granted time.Duration, explicit bool) {
	note := fmt.Sprintf("%v/%v", granted, explicit)
	c.mu.Lock()
	same := note == c.lastGrant
	c.lastGrant = note
	c.mu.Unlock()
	if same {
		return
	}
	why := "the gateway granted a keepalive interval longer than route-freshness/3"
	if !explicit {
		why = "the gateway did not say which keepalive interval it granted (" + KeepaliveHeader + "); assuming " + DefaultGatewayKeepalive.String() + ", longer than route-freshness/3"
	}
	c.Logger.Info("polling beside the push session so that quiet sessions keep the routes fresh",
		"reason", why, "requested_keepalive", c.wantKeepalive(), "granted_keepalive", granted,
		"route_freshness", c.Freshness, "poll_every", c.wantKeepalive(), "endpoint", c.endpoints.Current())
}

// fallbackPoll polls endpoint every interval until ctx ends: the renewals a
// push session with too long a keepalive interval does not bring.
func (c *GatewayClient) fallbackPoll(ctx context.Context, endpoint string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A poll that hangs must not hold back the next one for long.
		pctx, cancel := context.WithTimeout(ctx, max(2*interval, time.Second))
		err := c.guardedPoll(pctx, endpoint, "fallback-poll")
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// The push session decides about the endpoint; this only
			// misses renewals.
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				c.Logger.Warn("gateway poll beside the push session failed", "endpoint", endpoint, "err", err)
			}
		default:
			lastErr = ""
		}
	}
}

// push holds one push session with endpoint. It reports whether the
// session was accepted (a document applied) before it ended.
func (c *GatewayClient) push(ctx context.Context, endpoint string) (accepted bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	req, err := c.newRequest(sctx, http.MethodGet, c.configURL(endpoint, true), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.client.Do(req)
	if err != nil {
		return false, &api.GatewayConnError{Err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return false, readStatusError(resp)
	}
	c.noteOrder(resp.Header)
	granted, explicit := grantedKeepalive(resp.Header)
	idleFor := c.StreamIdleTimeout
	if explicit {
		// The gateway said how often it writes: never call a stream that
		// keeps its word silent.
		idleFor = max(idleFor, 3*granted)
	}
	if want := c.wantKeepalive(); granted > want {
		c.noteKeepalive(granted, explicit)
		wg.Go(func() { c.fallbackPoll(sctx, endpoint, want) })
	}
	// A silent stream is a dead stream: cancel it after idleFor.
	lines := ndjson.NewReader(resp.Body, routes.MaxDocumentBytes, idleFor, cancel)
	defer lines.Stop()
	for {
		line, keepalive, err := lines.Next()
		if err != nil {
			return accepted, &api.GatewayConnError{Err: fmt.Errorf("push session: %w", err)}
		}
		if keepalive {
			if accepted {
				c.Sink.Renew()
				c.renewed()
				c.Metrics.delivery("push", "renewed")
			}
			continue
		}
		if err := c.applyDocument(line, "push", nil, ""); err != nil {
			// What cannot be applied renews nothing: the session is not
			// accepted until a document applies, so the keepalives that
			// follow renew nothing either and the routes go stale on time
			// (their streams close, as for a rejected configuration).
			accepted = false
			c.setConnected(false)
			c.reportErr("gateway push document rejected", err)
			continue
		}
		accepted = true
		c.clearErr()
		c.setConnected(true)
	}
}

// withdrawTimeout bounds one DELETE of Withdraw.
const withdrawTimeout = 2 * time.Second

// Withdraw asks the gateway to stop publishing this process's routes and
// to end its session: DELETE /v1/supervisors/{id}/installations?session=
// (204). It tries the current endpoint and, on a connection error or a
// 5xx, the next ones, until ctx ends. The supervisor calls it on shutdown
// before its app listener closes, so that discovery drops the names first;
// stop the Advertiser before, or it may advertise them again.
//
// The session is over from then on: Run makes no new request once its
// current push stream ends (the gateway ends it), and the routes keep the
// freshness they have, so a drain shorter than the route freshness is not
// cut short.
func (c *GatewayClient) Withdraw(ctx context.Context) error {
	if c.client == nil {
		return errors.New("gateway client not initialised")
	}
	c.withdrawing.Store(true)
	var err error
	for range c.endpoints.Len() {
		endpoint := c.endpoints.Current()
		if err = c.withdrawAt(ctx, endpoint); err == nil {
			c.Logger.Info("installations withdrawn from the gateway", "endpoint", endpoint,
				"supervisor", c.SupervisorID, "session", c.Session)
			return nil
		}
		if ctx.Err() != nil || !api.IsGatewayFailover(err) {
			break
		}
		c.failed(endpoint, err)
	}
	return err
}

func (c *GatewayClient) withdrawAt(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, withdrawTimeout)
	defer cancel()
	q := url.Values{}
	c.sessionQuery(q)
	u := c.supervisorURL(endpoint, "/installations") + "?" + q.Encode()
	req, err := c.newRequest(ctx, http.MethodDelete, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return &api.GatewayConnError{Err: fmt.Errorf("DELETE installations: %w", err)}
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		return readStatusError(resp)
	}
	return nil
}
