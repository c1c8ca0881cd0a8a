package routes

import (
	"slices"
	"strings"
	"time"
)

// DefaultUsageRetention is how long Usage reports a withdrawn instance.
const DefaultUsageRetention = 15 * time.Minute

type retiredInstance struct {
	inst *Instance
	at   time.Time
}

// InstanceUsage is the traffic of one instance since it was installed:
// monotonic counters that survive renewals (and a withdrawal followed by a
// re-install within the retention). Requests, bytes and WebSocket lifetimes
// are counted when they end; the seconds of WebSockets still open are added
// to WebSocketSeconds as they pass, and ActiveStreams and WebSocketsOpen say
// whether anything is in flight (an auto-pauser must not pause an instance
// whose last_activity is old but whose WebSocket is open).
type InstanceUsage struct {
	Workspace        string     `json:"workspace"`
	Sandbox          string     `json:"sandbox"`
	BytesIn          uint64     `json:"bytes_in"`          // body and stream bytes from clients to the app
	BytesOut         uint64     `json:"bytes_out"`         // from the app to clients
	Requests         uint64     `json:"requests"`          // requests admitted, WebSocket upgrades included
	WebSocketSeconds float64    `json:"websocket_seconds"` // ended WebSockets' lifetimes plus open ones' so far
	WebSocketsOpen   int64      `json:"websockets_open"`
	ActiveStreams    int64      `json:"active_streams"` // requests in flight and open WebSockets
	LastActivity     *time.Time `json:"last_activity"`  // end of the last request or WebSocket; null if none
	// LastRequest is when the last request arrived (a WebSocket handshake
	// included); null if none.
	LastRequest *time.Time `json:"last_request"`
	// LastWebSocketFrame is when a WebSocket of the instance last carried
	// a frame, in either direction; null if none.
	LastWebSocketFrame *time.Time `json:"last_websocket_frame"`
	// WebSocketsSilent are the open WebSockets that carried no frame for
	// the silence threshold or longer (UsageOptions.SilentAfter): an HMR
	// socket left open overnight is open but silent.
	WebSocketsSilent int        `json:"websockets_silent"`
	Installed        bool       `json:"installed"`
	WithdrawnAt      *time.Time `json:"withdrawn_at,omitempty"`
}

// UsageOptions change what Usage reports.
type UsageOptions struct {
	// SilentAfter is the silence threshold of WebSocketsSilent
	// (DefaultSilentAfter when not positive).
	SilentAfter time.Duration
}

// Usage returns the usage of every installed instance and of the instances
// withdrawn less than UsageRetention ago, in key order, with the default
// silence threshold. It is not bounded by MaxInstanceLabels.
func (t *Table) Usage() []InstanceUsage { return t.UsageWith(UsageOptions{}) }

// UsageWith is Usage with options.
func (t *Table) UsageWith(opts UsageOptions) []InstanceUsage {
	if opts.SilentAfter <= 0 {
		opts.SilentAfter = DefaultSilentAfter
	}
	now := t.clock.Now()
	t.mu.Lock()
	type entry struct {
		inst      *Instance
		withdrawn *time.Time
	}
	list := make([]entry, 0, len(t.instances)+len(t.retired))
	for _, i := range t.instances {
		list = append(list, entry{inst: i})
	}
	t.pruneRetiredLocked(now)
	for _, r := range t.retired {
		at := r.at.UTC()
		list = append(list, entry{r.inst, &at})
	}
	t.mu.Unlock()
	out := make([]InstanceUsage, 0, len(list))
	for _, e := range list {
		i := e.inst
		open, openNanos := i.openWebSocketNanos(now)
		u := InstanceUsage{
			Workspace: i.Key.Workspace, Sandbox: i.Key.Sandbox,
			BytesIn: i.bytesToApp.Load(), BytesOut: i.bytesToClient.Load(),
			Requests:         i.requests.Load(),
			WebSocketSeconds: time.Duration(i.wsNanos.Load() + openNanos).Seconds(),
			WebSocketsOpen:   open,
			ActiveStreams:    max(i.active.Load(), 0),
			Installed:        e.withdrawn == nil,
			WithdrawnAt:      e.withdrawn,
		}
		if ns := i.lastActivity.Load(); ns != 0 {
			at := time.Unix(0, ns).UTC()
			u.LastActivity = &at
		}
		lastRequest, lastFrame, silent := i.activityAt(now, opts.SilentAfter)
		u.LastRequest, u.LastWebSocketFrame, u.WebSocketsSilent = unixTime(lastRequest), unixTime(lastFrame), silent
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b InstanceUsage) int {
		if n := strings.Compare(a.Workspace, b.Workspace); n != 0 {
			return n
		}
		return strings.Compare(a.Sandbox, b.Sandbox)
	})
	return out
}

// pruneRetiredLocked forgets the instances withdrawn UsageRetention ago
// or earlier (on every withdrawal and every Usage call, so that churn
// without readers stays bounded by the retention).
func (t *Table) pruneRetiredLocked(now time.Time) {
	for key, r := range t.retired {
		if now.Sub(r.at) >= t.opts.UsageRetention {
			delete(t.retired, key)
		}
	}
}

// unixTime is unix nanos ns as a UTC time, nil for 0.
func unixTime(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	at := time.Unix(0, ns).UTC()
	return &at
}
