package dispatch

import (
	"os"
	"sync"
)

// idlePoller waits for idle WebSocket directions to become readable without
// a goroutine per connection: an idle direction registers its socket in an
// epoll instance of its own and its goroutine ends; when bytes (or a hang-up)
// arrive, the poller starts a goroutine that resumes the copy. An idle
// WebSocket therefore holds no goroutine stack and no buffer, only its
// connection state.
//
// The epoll instance is itself waited on through the runtime's network
// poller (it is readable while events are pending), so the poller's
// goroutine is parked like any other, not blocked in a system call. It runs
// only while something is registered: it is started by the first wait and
// ends, closing the epoll instance, when the last registration is gone.
//
// A socket is removed from the epoll instance (EPOLL_CTL_DEL) under mu
// before anyone may close it: when its event is delivered, or by cancel,
// which the owner calls before closing. A file descriptor number reused
// after a close can therefore never be removed by mistake.
//
// The epoll code is Linux-only (idlepoll_linux.go). Elsewhere wait always
// fails (idlepoll_other.go), so an idle direction keeps its goroutine and
// waits in place for its socket to become readable, as it does on Linux
// when no epoll instance can be created.
type idlePoller struct {
	mu      sync.Mutex
	ep      *os.File // the current epoll instance; nil while nothing waits
	epfd    int
	next    uint64
	waiting map[uint64]idleWait
}

type idleWait struct {
	fd   int
	wake func()
}

// waiters returns how many registrations are waiting.
func (p *idlePoller) waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}
