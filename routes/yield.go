package routes

import (
	"os"
	"time"
)

// yieldSlice is how long control-plane work on a large document (parsing,
// applying) runs before it steps aside for the data plane.
const yieldSlice = 500 * time.Microsecond

// yielder lets a long control-plane computation step aside every
// yieldSlice so that the data plane keeps serving while a large document
// is parsed and applied.
//
// With one processor (GOMAXPROCS=1, a supervisor pinned to one core)
// neither runtime.Gosched nor a short sleep is enough. The scheduler polls
// the network only when its run queues are empty: a Gosched puts the
// goroutine straight back on the queue, and a sleeping goroutine's timer
// wakes it ahead of everything else. A trace of a 10,000-instance
// replacement under 5,000 req/s showed 28 ms (Gosched) and 33 ms (20 µs
// sleeps) without a single network wake-up.
//
// So the yielder waits on the network poller itself: it makes an eventfd
// readable and parks until the poller reports it. That report comes from
// the same poll that wakes the connections whose bytes have arrived, so
// every goroutine that was runnable or became ready runs before the
// computation resumes; when nothing else waits, the poll returns at once.
//
// The eventfd wait is Linux-only (yield_linux.go). Elsewhere yield is
// runtime.Gosched (yield_other.go), the fallback Linux also uses when no
// eventfd can be opened.
type yielder struct {
	n      int
	next   time.Time
	ev     *os.File // the eventfd, opened at the first step aside
	failed bool     // no eventfd: fall back to runtime.Gosched
}

func newYielder() *yielder {
	return &yielder{next: time.Now().Add(yieldSlice)}
}

// step is called once per unit of work (an entry, an instance); it reads
// the clock every 16 units and steps aside once per yieldSlice.
func (y *yielder) step() {
	y.n++
	if y.n&15 != 0 {
		return
	}
	if time.Now().Before(y.next) {
		return
	}
	y.yield()
	y.next = time.Now().Add(yieldSlice)
}

// close releases the eventfd.
func (y *yielder) close() {
	if y.ev != nil {
		_ = y.ev.Close()
		y.ev = nil
	}
}
