package dispatch

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

// appHangups notes which app connections the app has closed (or reset),
// for all the routes of a Server, so that reusing a pooled connection
// needs no system call of its own (backendPool.get): every app connection
// is registered once, when dialled, in one epoll instance
// (sock.HangupWatch) that is woken by a hang-up, never by bytes, and one
// non-blocking poll, at most every hangupPollEvery, collects what hung up
// for every connection at once. A busy route thus pays about one system
// call per millisecond instead of one per request (HAProxy likewise learns
// of a closed idle server connection from its event loop, not by probing
// it before reuse). It has no goroutine.
//
// The epoll instance is opened by the first registration and closed when
// the last registered connection is closed. Where epoll is missing it
// stays nil, and pooled connections are probed one by one (sock.IdleProbe).
type appHangups struct {
	mu       sync.Mutex
	w        *sock.HangupWatch // nil while nothing is registered
	disabled bool              // no epoll here: never try again
	next     uint64
	conns    map[uint64]*backendConn // registered, not yet hung up nor closed
	// polled is when the last poll ran (UnixNano).
	polled atomic.Int64
}

// hangupPollEvery is the most often the hang-ups are polled: a busy
// route's many reuses share one poll, and a connection the app closed is
// seen by a reuse at most this long after its FIN reached the listener.
const hangupPollEvery = time.Millisecond

// watch registers bc, just dialled; bc stays unwatched (and is probed
// before reuse) when it has no socket or epoll is missing.
func (h *appHangups) watch(bc *backendConn) {
	if h == nil {
		return
	}
	fd, ok := sock.FD(bc.conn)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.disabled {
		return
	}
	if h.w == nil {
		w, err := sock.OpenHangupWatch()
		if err != nil {
			h.disabled = true
			return
		}
		h.w = w
		h.conns = make(map[uint64]*backendConn)
	}
	h.next++
	if err := h.w.Add(fd, h.next); err != nil {
		h.closeIfEmptyLocked()
		return
	}
	bc.hangups, bc.watchID = h, h.next
	h.conns[h.next] = bc
}

// unwatch forgets bc, which is being closed or leaves the pool for good (a
// WebSocket): its socket's registration ends with the socket.
func (h *appHangups) unwatch(bc *backendConn) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if bc.watchID != 0 {
		delete(h.conns, bc.watchID)
		bc.watchID = 0
		h.closeIfEmptyLocked()
	}
	h.mu.Unlock()
}

// closeIfEmptyLocked closes the epoll instance when nothing is registered.
func (h *appHangups) closeIfEmptyLocked() {
	if h.w != nil && len(h.conns) == 0 {
		_ = h.w.Close()
		h.w = nil
	}
}

// hungUp reports whether the app has closed bc, as of a poll at most
// hangupPollEvery before now (it polls when the last one is older).
func (h *appHangups) hungUp(bc *backendConn, now time.Time) bool {
	if bc.appClosed.Load() {
		return true
	}
	last := h.polled.Load()
	if now.UnixNano()-last < int64(hangupPollEvery) || !h.polled.CompareAndSwap(last, now.UnixNano()) {
		// Polled recently, or being polled by another reuse right now.
		return false
	}
	h.mu.Lock()
	if h.w != nil {
		_ = h.w.Poll(h.note)
		h.closeIfEmptyLocked()
	}
	h.mu.Unlock()
	return bc.appClosed.Load()
}

// note marks the connection registered under id as closed by the app
// (under mu, from Poll); it is forgotten, as its registration has fired.
func (h *appHangups) note(id uint64) {
	if bc, ok := h.conns[id]; ok {
		bc.appClosed.Store(true)
		delete(h.conns, id)
		bc.watchID = 0
	}
}
