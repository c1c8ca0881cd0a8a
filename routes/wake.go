package routes

import (
	"errors"
	"time"
)

// Instance states ("state" of an instance entry).
const (
	// StateActive is a running instance: its services are dialled. It is
	// the default; ParseDocument normalizes it to "" (an omitted "state").
	StateActive = "active"
	// StateSleeping is a paused instance: its names stay installed and
	// fresh (the TLS handshake completes) but nothing is dialled; a
	// request may ask for a wake (see WakePolicy).
	StateSleeping = "sleeping"
)

// Wake modes ("wake.on" of a service): which requests for a sleeping
// instance ask for it to be woken.
const (
	// WakeNavigation wakes on top-level browser navigations only (the
	// default): a WebSocket reconnect loop, an SSE reconnect or a CORS
	// preflight never wakes an instance.
	WakeNavigation = "navigation"
	// WakeAny wakes on every authorised request except WebSocket
	// handshakes, SSE reconnects (Accept: text/event-stream) and CORS
	// preflights, which never wake.
	WakeAny = "any"
	// WakeNever wakes on nothing: every request for the sleeping instance
	// is refused (503, Retry-After, {"state":"sleeping"}).
	WakeNever = "never"
)

// Limits of a wake policy.
const (
	// DefaultWakeHoldSeconds is how long a waking request is held when
	// the policy names no hold_seconds.
	DefaultWakeHoldSeconds = 30
	// MaxWakeHoldSeconds is the largest accepted wake.hold_seconds.
	MaxWakeHoldSeconds = 120
)

// ErrSleeping is the revocation cause of the streams of an instance put to
// sleep: WebSockets are closed with 1001 ("going away: sandbox sleeping").
var ErrSleeping = errors.New("instance sleeping")

// WakePolicy is a service's wake policy ("wake" in the document).
type WakePolicy struct {
	// On is WakeNavigation, WakeAny or WakeNever; "" (absent) is
	// WakeNavigation.
	On string `json:"on,omitempty"`
	// HoldSeconds is how long a request that woke (or joined the wake of)
	// a sleeping instance is held before it is answered "starting": 0 to
	// MaxWakeHoldSeconds; 0 asks for the wake and answers at once. nil
	// (absent): DefaultWakeHoldSeconds.
	HoldSeconds *int `json:"hold_seconds,omitempty"`
}

// Mode returns the policy's wake mode, WakeNavigation for nil or "".
func (p *WakePolicy) Mode() string {
	if p == nil || p.On == "" {
		return WakeNavigation
	}
	return p.On
}

// Hold returns how long a waking request is held.
func (p *WakePolicy) Hold() time.Duration {
	if p == nil || p.HoldSeconds == nil {
		return DefaultWakeHoldSeconds * time.Second
	}
	return time.Duration(*p.HoldSeconds) * time.Second
}

// Equal reports whether p and q behave the same: a nil policy equals one
// that spells out the defaults.
func (p *WakePolicy) Equal(q *WakePolicy) bool {
	return p.Mode() == q.Mode() && p.Hold() == q.Hold()
}

// Clone returns a deep copy of p (nil for nil).
func (p *WakePolicy) Clone() *WakePolicy {
	if p == nil {
		return nil
	}
	c := *p
	if p.HoldSeconds != nil {
		h := *p.HoldSeconds
		c.HoldSeconds = &h
	}
	return &c
}

// validate adds the policy's problems to ps; at is the JSON path of
// "wake" and what names the service.
func (p *WakePolicy) validate(ps *problemList, at, what string) {
	switch p.On {
	case "", WakeNavigation, WakeAny, WakeNever:
	default:
		ps.add(at+".on", "%s: wake.on %s not supported (use navigation, any or never)", what, quoteShort(p.On))
	}
	if h := p.HoldSeconds; h != nil && (*h < 0 || *h > MaxWakeHoldSeconds) {
		ps.add(at+".hold_seconds", "%s: wake.hold_seconds %d out of range 0..%d", what, *h, MaxWakeHoldSeconds)
	}
}

// Sleeping reports whether the instance entry is marked sleeping.
func (s *InstanceSpec) Sleeping() bool { return s.State == StateSleeping }

// validateState checks and normalizes the entry's state.
func (s *InstanceSpec) validateState(ps *problemList) {
	switch s.State {
	case "", StateSleeping:
	case StateActive:
		s.State = ""
	default:
		ps.add("state", "state %s not supported (use active or sleeping)", quoteShort(s.State))
	}
}

// wakeOf is the effective wake policy of a service, with its defaults
// filled in: what Route.Wake returns.
func wakeOf(svc *ServiceSpec) *WakePolicy {
	h := int(svc.Wake.Hold() / time.Second)
	return &WakePolicy{On: svc.Wake.Mode(), HoldSeconds: &h}
}
