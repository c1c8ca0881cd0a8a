package routes

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSilentAfter is how long an open WebSocket must have carried no
// frame to count as silent in Usage (InstanceUsage.WebSocketsSilent).
const DefaultSilentAfter = 5 * time.Minute

// activity is the part of an Instance that tells a person from a
// forgotten tab: when its last request came, when its WebSockets last
// carried a frame, and which of them are open. Recording is lock-free:
// one atomic store per request (NoteRequest) and per frame (Frame, on the
// WebSocket's own tracker, so that busy sockets do not share a cache
// line); only opening and closing a WebSocket takes a lock.
type activity struct {
	lastRequest atomic.Int64 // unix nanos; 0: none yet
	// lastFrame is the last frame of the WebSockets closed so far; an open
	// one's is on its tracker.
	lastFrame atomic.Int64
	mu        sync.Mutex
	open      map[*WebSocketActivity]struct{}
}

// WebSocketActivity tracks the frames of one open WebSocket of an
// instance (Instance.TrackWebSocket). Its methods are safe for concurrent
// use and do nothing on a nil tracker.
type WebSocketActivity struct {
	inst *Instance
	// last is the unix nanos of its last frame in either direction, its
	// opening before the first.
	last   atomic.Int64
	closed atomic.Bool
}

// NoteRequest records that a request for the instance arrived at at (a
// WebSocket handshake included). It is one atomic store.
func (i *Instance) NoteRequest(at time.Time) {
	if i == nil {
		return
	}
	i.act.lastRequest.Store(at.UnixNano())
}

// TrackWebSocket starts tracking a WebSocket of the instance opened at
// open; Close must follow when it ends.
func (i *Instance) TrackWebSocket(open time.Time) *WebSocketActivity {
	if i == nil {
		return nil
	}
	a := &WebSocketActivity{inst: i}
	a.last.Store(open.UnixNano())
	i.act.mu.Lock()
	if i.act.open == nil {
		i.act.open = make(map[*WebSocketActivity]struct{})
	}
	i.act.open[a] = struct{}{}
	i.act.mu.Unlock()
	return a
}

// Frame records a frame at at, in either direction (a control frame
// counts: a ping answered is a live peer). It is one atomic store.
func (a *WebSocketActivity) Frame(at time.Time) {
	if a == nil {
		return
	}
	a.last.Store(at.UnixNano())
}

// Close stops tracking the WebSocket; its last frame stays the
// instance's last frame if it is the latest. A second Close does nothing.
func (a *WebSocketActivity) Close() {
	if a == nil || a.closed.Swap(true) {
		return
	}
	act := &a.inst.act
	act.mu.Lock()
	delete(act.open, a)
	act.mu.Unlock()
	storeMax(&act.lastFrame, a.last.Load())
}

// storeMax raises v to n when n is larger.
func storeMax(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// activityAt returns the instance's last request and last frame (unix
// nanos, 0 when none) and how many of its open WebSockets carried no frame
// for silentAfter or longer at now.
func (i *Instance) activityAt(now time.Time, silentAfter time.Duration) (lastRequest, lastFrame int64, silent int) {
	act := &i.act
	lastRequest = act.lastRequest.Load()
	lastFrame = act.lastFrame.Load()
	cutoff := now.Add(-silentAfter).UnixNano()
	act.mu.Lock()
	for a := range act.open {
		last := a.last.Load()
		lastFrame = max(lastFrame, last)
		if last <= cutoff {
			silent++
		}
	}
	act.mu.Unlock()
	return lastRequest, lastFrame, silent
}
