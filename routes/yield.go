package routes

import (
	"encoding/binary"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// yieldSlice is how long control-plane work on a large document (parsing,
// applying) runs before it steps aside for the data plane.
const yieldSlice = 500 * time.Microsecond

// yieldBackstop bounds one step aside should the wake-up never come.
const yieldBackstop = 20 * time.Millisecond

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

// yield parks until the network poller has run once.
func (y *yielder) yield() {
	if y.ev == nil && !y.failed {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			y.failed = true
		} else {
			y.ev = os.NewFile(uintptr(fd), "yield")
		}
	}
	if y.failed {
		runtime.Gosched()
		return
	}
	rc, err := y.ev.SyscallConn()
	if err != nil {
		runtime.Gosched()
		return
	}
	_ = y.ev.SetReadDeadline(time.Now().Add(yieldBackstop))
	var buf [8]byte
	first := true
	_ = rc.Read(func(fd uintptr) bool {
		if first {
			// Made readable only now, after the poller's read state was
			// reset for this wait, so the wake-up cannot be lost.
			first = false
			binary.NativeEndian.PutUint64(buf[:], 1)
			_, werr := unix.Write(int(fd), buf[:])
			return werr != nil
		}
		_, _ = unix.Read(int(fd), buf[:]) // drain; the wait is over either way
		return true
	})
}

// close releases the eventfd.
func (y *yielder) close() {
	if y.ev != nil {
		_ = y.ev.Close()
		y.ev = nil
	}
}
