package wake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The platform's wake hook (docs/operations.md, "Sleeping and waking").
//
// Request: POST <hook URL>, Content-Type: application/json,
//
//	{"workspace":"team","sandbox":"demo","generation":"7","supervisor":"sup-1"}
//
// with "Authorization: Bearer <token>" when a token is configured.
// Answers:
//   - 200, 202 or 204: the platform accepted; it marks the instance active
//     (write API, `applistener instances put`, or the document) once the
//     sandbox runs. The body is ignored.
//   - 409 or 422: the instance cannot be woken (deleted, over quota, ...):
//     not retried, and remembered for the negative cache's TTL (30 s). An
//     optional JSON body {"reason":"..."} says why (one line, cut to
//     MaxReasonLen bytes).
//   - 429, 5xx, a connection error or no answer within the attempt
//     timeout: retried with exponential backoff (Retry-After, in seconds,
//     is honoured up to MaxHookBackoff).
//   - any other status: the hook is misconfigured: not retried.

// Defaults and limits of a Hook.
const (
	DefaultHookTimeout  = 5 * time.Second
	DefaultHookAttempts = 4
	DefaultHookBackoff  = 250 * time.Millisecond
	// MaxHookBackoff caps the delay between two attempts.
	MaxHookBackoff = 5 * time.Second
	// MaxReasonLen bounds the reason of a refusal.
	MaxReasonLen = 200
	// maxHookBody bounds the answer read from the hook.
	maxHookBody = 16 << 10
)

// HookOptions configure a Hook.
type HookOptions struct {
	// URL is the platform's hook: an absolute http or https URL.
	URL string
	// Supervisor is the "supervisor" of a request whose Key names none:
	// the id of the supervisor whose instance is woken.
	Supervisor string
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// Client sends the requests (a client with no overall timeout of its
	// own; each attempt is bounded by Timeout). nil: a default client.
	Client *http.Client
	// Timeout bounds one attempt (DefaultHookTimeout when 0).
	Timeout time.Duration
	// Attempts is how many times a wake is tried (DefaultHookAttempts
	// when 0).
	Attempts int
	// Backoff is the first delay between attempts, doubled after each
	// (with jitter), at most MaxHookBackoff (DefaultHookBackoff when 0).
	Backoff time.Duration
}

// Hook is a Waker that POSTs to the platform's wake hook.
type Hook struct {
	opts HookOptions
}

// NewHook checks opts and returns a Hook.
func NewHook(opts HookOptions) (*Hook, error) {
	if err := CheckHookURL(opts.URL); err != nil {
		return nil, err
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Transport: http.DefaultTransport}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultHookTimeout
	}
	if opts.Attempts <= 0 {
		opts.Attempts = DefaultHookAttempts
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultHookBackoff
	}
	return &Hook{opts: opts}, nil
}

// CheckHookURL reports why u cannot be a wake hook: it must be an absolute
// http or https URL without user information or fragment.
func CheckHookURL(u string) error {
	pu, err := url.Parse(u)
	switch {
	case err != nil:
		return fmt.Errorf("wake hook %q: %w", u, err)
	case pu.Scheme != "http" && pu.Scheme != "https":
		return fmt.Errorf("wake hook %q: must be an http or https URL", u)
	case pu.Host == "":
		return fmt.Errorf("wake hook %q: has no host", u)
	case pu.User != nil:
		return fmt.Errorf("wake hook %q: must not contain user information (use a token file)", u)
	case pu.Fragment != "":
		return fmt.Errorf("wake hook %q: must not contain a fragment", u)
	}
	return nil
}

// hookRequest is the body of a hook request.
type hookRequest struct {
	Workspace  string `json:"workspace"`
	Sandbox    string `json:"sandbox"`
	Generation string `json:"generation"`
	Supervisor string `json:"supervisor"`
}

// Wake asks the platform to wake key (see the protocol above).
func (h *Hook) Wake(ctx context.Context, key Key) error {
	sup := key.Supervisor
	if sup == "" {
		sup = h.opts.Supervisor
	}
	body, err := json.Marshal(hookRequest{key.Workspace, key.Sandbox, key.Generation, sup})
	if err != nil {
		return fmt.Errorf("wake hook: encode the request: %w", err)
	}
	delay := h.opts.Backoff
	var last error
	for attempt := 1; ; attempt++ {
		retryAfter, err := h.once(ctx, body)
		if err == nil {
			return nil
		}
		var perm *permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		last = err
		if attempt >= h.opts.Attempts || ctx.Err() != nil {
			break
		}
		wait := delay/2 + rand.N(delay/2+1) // jitter over the upper half
		wait = max(wait, min(retryAfter, MaxHookBackoff))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wake hook: %w (after %v)", ctx.Err(), last)
		}
		delay = min(2*delay, MaxHookBackoff)
	}
	return fmt.Errorf("wake hook: %d attempts: %w", h.opts.Attempts, last)
}

// permanentError is an answer that is not retried.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

// once makes one attempt. It returns the answer's Retry-After (0 when
// none) and nil, a *permanentError, or an error to retry.
func (h *Hook) once(ctx context.Context, body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.opts.URL, bytes.NewReader(body))
	if err != nil {
		return 0, &permanentError{fmt.Errorf("wake hook: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "applistener-wake")
	if h.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.opts.Token)
	}
	resp, err := h.opts.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("POST: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxHookBody))
	switch code := resp.StatusCode; {
	case code == http.StatusOK || code == http.StatusAccepted || code == http.StatusNoContent:
		return 0, nil
	case code == http.StatusConflict || code == http.StatusUnprocessableEntity:
		return 0, &permanentError{&CannotWakeError{Reason: RefusalReason(data)}}
	case code == http.StatusTooManyRequests || code >= 500:
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return time.Duration(max(ra, 0)) * time.Second, fmt.Errorf("the platform answered %d", code)
	default:
		return 0, &permanentError{fmt.Errorf("wake hook: the platform answered %d (not retried: check --wake-hook)", code)}
	}
}

// RefusalReason reads the reason of a "cannot be woken" answer: the
// "reason" string of a JSON object, one line, at most MaxReasonLen bytes;
// "" when there is none.
func RefusalReason(body []byte) string {
	var v struct {
		Reason string `json:"reason"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	r := strings.Map(func(c rune) rune {
		if c < ' ' || c == 0x7f || c == '\u2028' || c == '\u2029' || c == '\u0085' {
			return ' '
		}
		return c
	}, v.Reason)
	if len(r) > MaxReasonLen {
		n := MaxReasonLen
		for n > 0 && !utf8.RuneStart(r[n]) {
			n--
		}
		r = r[:n]
	}
	return r
}
