package dispatch

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

// idlePoller waits for idle WebSocket directions to become readable without
// a goroutine per connection: an idle direction registers its socket in an
// epoll instance of its own and its goroutine ends; when bytes (or a hang-up)
// arrive, the poller starts a goroutine that resumes the copy. An idle
// WebSocket therefore holds no goroutine stack and no buffer, only its
// connection state.
//
// The epoll instance (sock.Epoll) is itself waited on through the runtime's
// network poller, so the poller's goroutine is parked like any other, not
// blocked in a system call. It runs only while something is registered: it
// is started by the first wait and ends, closing the epoll instance, when
// the last registration is gone.
//
// A socket is removed from the epoll instance (EPOLL_CTL_DEL) under mu
// before anyone may close it: when its event is delivered, or by cancel,
// which the owner calls before closing. A file descriptor number reused
// after a close can therefore never be removed by mistake.
//
// Epoll is Linux-only. Elsewhere wait always fails (sock.OpenEpoll does),
// so an idle direction keeps its goroutine and waits in place for its
// socket to become readable, as it does on Linux when no epoll instance can
// be created.
type idlePoller struct {
	mu      sync.Mutex
	ep      *sock.Epoll // the current epoll instance; nil while nothing waits
	next    uint64
	waiting map[uint64]idleWait

	// lastPoll is when pollNow last looked (nanoseconds since pollEpoch).
	lastPoll atomic.Int64
}

// pollEpoch is pollNow's clock origin.
var pollEpoch = time.Now()

// pollNowEvery is how often, at most, pollNow looks for events.
const pollNowEvery = 20 * time.Microsecond

// pollNowMax is how many events pollNow delivers at most: one. Only the
// goroutine started last runs at once (it holds the processor's next
// place); any other started with it would go to the back of the run
// queue, behind a flood's whole backlog, which is what pollNow is there
// to spare it. The next event waits for the next pollNow instead (at
// most pollNowEvery later while the flood runs), or for the runtime's
// poller once the run queue is empty (run delivers everything pending).
const pollNowMax = 1

// pollNow delivers an event pending now (pollNowMax), without waiting
// and without the runtime's poller (the wake runs in a new goroutine, as
// run's do); at most once per pollNowEvery, one epoll_wait. A flood's
// requests call it (fairpoll.go): Go polls the network only when its run queue is empty,
// which behind a flood on one core can take milliseconds, and a quiet
// connection's next request would wait for that. With yield, when it
// delivered something, the caller steps aside so that the delivered
// requests run before it goes on.
func (p *idlePoller) pollNow(yield bool) {
	now := int64(time.Since(pollEpoch))
	last := p.lastPoll.Load()
	if now-last < int64(pollNowEvery) || !p.lastPoll.CompareAndSwap(last, now) {
		return
	}
	var buf [16]func()
	woke := buf[:0]
	p.mu.Lock()
	if p.ep != nil && len(p.waiting) > 0 {
		for _, id := range p.ep.Poll(pollNowMax) {
			if w, ok := p.waiting[id]; ok {
				delete(p.waiting, id)
				p.ep.Remove(w.fd)
				woke = append(woke, w.wake)
			}
		}
	}
	retired := p.closeIfEmptyLocked()
	p.mu.Unlock()
	if retired != nil {
		_ = retired.Close() // its goroutine ends
	}
	for _, wake := range woke {
		go wake()
	}
	if yield && len(woke) > 0 {
		// The goroutine started last holds the processor's next place,
		// which whatever the caller starts or wakes next would take,
		// pushing it behind every goroutine already queued: the caller
		// steps aside so that it runs now, and queues behind the others
		// (runtime.Gosched puts it on the global run queue).
		runtime.Gosched()
	}
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

// wait registers fd; wake then runs in a new goroutine once fd is readable,
// has hung up or failed. It returns the registration's id for cancel.
func (p *idlePoller) wait(fd int, wake func()) (uint64, error) {
	p.mu.Lock()
	if p.ep == nil {
		ep, err := sock.OpenEpoll()
		if err != nil {
			p.mu.Unlock()
			return 0, err
		}
		p.ep = ep
		if p.waiting == nil {
			p.waiting = make(map[uint64]idleWait)
		}
		go p.run(p.ep)
	}
	p.next++
	id := p.next
	if err := p.ep.Add(fd, id); err != nil {
		ep := p.closeIfEmptyLocked()
		p.mu.Unlock()
		if ep != nil {
			_ = ep.Close()
		}
		return 0, err
	}
	p.waiting[id] = idleWait{fd: fd, wake: wake}
	p.mu.Unlock()
	return id, nil
}

// cancel removes registration id before its socket is closed. It reports
// whether it was still waiting: if not, its wake has run or is starting.
func (p *idlePoller) cancel(id uint64) bool {
	p.mu.Lock()
	w, ok := p.waiting[id]
	if ok {
		delete(p.waiting, id)
		p.ep.Remove(w.fd)
	}
	ep := p.closeIfEmptyLocked()
	p.mu.Unlock()
	if ep != nil {
		_ = ep.Close() // outside mu: run may be waiting for mu with ep in use
	}
	return ok
}

// closeIfEmptyLocked retires the epoll instance when nothing waits and
// returns it for the caller to close after unlocking.
func (p *idlePoller) closeIfEmptyLocked() *sock.Epoll {
	if p.ep == nil || len(p.waiting) > 0 {
		return nil
	}
	ep := p.ep
	p.ep = nil
	return ep
}

// run delivers the events of epoll instance ep until it is closed.
func (p *idlePoller) run(ep *sock.Epoll) {
	var woke []func()
	deliver := func(ids []uint64) {
		p.mu.Lock()
		for _, id := range ids {
			if w, ok := p.waiting[id]; ok {
				delete(p.waiting, id)
				ep.Remove(w.fd)
				woke = append(woke, w.wake)
			}
		}
		p.mu.Unlock()
	}
	for {
		woke = woke[:0]
		err := ep.Wait(deliver)
		for _, wake := range woke {
			go wake()
		}
		if err != nil {
			return // ep was closed
		}
		p.mu.Lock()
		var retired *sock.Epoll
		if p.ep == ep {
			retired = p.closeIfEmptyLocked()
		}
		p.mu.Unlock()
		if retired != nil {
			_ = retired.Close()
			return
		}
	}
}
