//go:build linux

package dispatch

import (
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
	"github.com/applistener/applistener/internal/fairshare"
	"github.com/applistener/applistener/internal/testutil"
	"github.com/applistener/applistener/routes"
)

// tcpPairFD returns the client end of a loopback TCP connection and the
// descriptor of its server end, both closed when the test ends.
func tcpPairFD(t *testing.T) (net.Conn, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close() })
	fd, ok := sock.FD(server)
	if !ok {
		t.Fatal("no descriptor")
	}
	return client, fd
}

// TestPollNowDelivers: pollNow hands a parked socket whose bytes arrived
// to its wake without the poller's goroutine (none runs here), once, and
// forgets the registration; with nothing parked, or within pollNowEvery of
// the last look, it does nothing.
func TestPollNowDelivers(t *testing.T) {
	ep, err := sock.OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	// No run goroutine: only pollNow can deliver. It retires the
	// instance once nothing waits (closing it).
	p := &idlePoller{ep: ep, waiting: make(map[uint64]idleWait)}
	client, fd := tcpPairFD(t)
	woke := make(chan struct{}, 2)
	const id = 1
	if err := ep.Add(fd, id); err != nil {
		t.Fatal(err)
	}
	p.waiting[id] = idleWait{fd: fd, wake: func() { woke <- struct{}{} }}

	p.lastPoll.Store(0)
	p.pollNow(false)
	if p.waiters() != 1 {
		t.Fatal("delivered before any byte arrived")
	}
	if _, err := client.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.waiters() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("pollNow never delivered the readable socket")
		}
		p.lastPoll.Store(0) // not throttled
		p.pollNow(false)
	}
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("the wake did not run")
	}
	p.mu.Lock()
	retired := p.ep == nil
	p.mu.Unlock()
	if !retired {
		t.Error("the epoll instance outlived its last registration")
	}

	// Throttled: a look within pollNowEvery of the last one is skipped
	// (the last look is put an hour ahead, so that a test preempted for
	// longer than pollNowEvery here still finds it within).
	p.lastPoll.Store(int64(time.Since(pollEpoch) + time.Hour))
	before := p.lastPoll.Load()
	p.pollNow(false)
	if p.lastPoll.Load() != before {
		t.Error("pollNow looked again within pollNowEvery")
	}
	select {
	case <-woke:
		t.Error("a socket woken twice")
	default:
	}
}

// TestPollNowDeliversOneAtATime: with several parked sockets readable at
// once, each pollNow delivers one of them (pollNowMax), the others stay
// parked for the next look: a second goroutine started with the first
// would wait behind the whole run queue.
func TestPollNowDeliversOneAtATime(t *testing.T) {
	ep, err := sock.OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	p := &idlePoller{ep: ep, waiting: make(map[uint64]idleWait)} // no run goroutine
	const n = 3
	woke := make(chan uint64, n)
	for id := uint64(1); id <= n; id++ {
		client, fd := tcpPairFD(t)
		if err := ep.Add(fd, id); err != nil {
			t.Fatal(err)
		}
		p.waiting[id] = idleWait{fd: fd, wake: func() { woke <- id }}
		if _, err := client.Write([]byte("GET")); err != nil {
			t.Fatal(err)
		}
	}
	for want := n - 1; want >= 0; want-- {
		deadline := time.Now().Add(5 * time.Second)
		for p.waiters() > want {
			if time.Now().After(deadline) {
				t.Fatalf("%d parked, want %d", p.waiters(), want)
			}
			p.lastPoll.Store(0) // not throttled
			p.pollNow(false)
			if got := p.waiters(); got < want {
				t.Fatalf("one pollNow delivered %d sockets", want+1-got)
			}
		}
	}
	seen := map[uint64]bool{}
	for range n {
		select {
		case id := <-woke:
			seen[id] = true
		case <-time.After(5 * time.Second):
			t.Fatal("a wake did not run")
		}
	}
	if len(seen) != n {
		t.Errorf("woken %v, want each of the %d once", seen, n)
	}
}

// TestPollNowRunsTheDeliveredFirstOnOneCore: on one core (GOMAXPROCS=1, as
// the bench pins the listener), a request pollNow(true) delivers (a flood's
// request steps aside) runs before its caller goes on, ahead of the
// goroutines already queued. Without the yield it ran only once the caller
// blocked, and whatever the caller started or woke meanwhile pushed it
// behind every queued goroutine. pollNow(false) (a light instance's
// request) goes on first. The scheduler looks at its global queue first
// on one pick in 61 (where the yield puts the caller), and a preemption or
// a GC can reorder an attempt: most attempts, not every one, must show the
// order.
func TestPollNowRunsTheDeliveredFirstOnOneCore(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector randomises the run order; `make test` runs this without it")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	client, fd := tcpPairFD(t)
	if _, err := client.Write([]byte("GET")); err != nil { // readable from now on
		t.Fatal(err)
	}

	const attempts = 40
	for _, yield := range []bool{true, false} {
		want := "caller"
		if yield {
			want = "delivered"
		}
		got := 0
		var orders [][]string
		for range attempts {
			var p idlePoller
			var ran testutil.RunOrder
			note := ran.Note
			var wg sync.WaitGroup
			wg.Add(1)
			if _, err := p.wait(fd, func() { defer wg.Done(); note("delivered") }); err != nil {
				t.Fatal(err)
			}
			// Stand-ins for the flood's goroutines, queued before the
			// delivery (the poller's own goroutine, started by wait,
			// queues too: it cannot deliver before pollNow).
			for range 4 {
				wg.Go(func() { note("queued") })
			}
			for p.waiters() != 0 {
				p.lastPoll.Store(0) // not throttled
				p.pollNow(yield)
			}
			note("caller")
			wg.Wait()
			order := ran.Names()
			if order[0] == want {
				got++
			} else if len(orders) < 3 {
				orders = append(orders, order)
			}
		}
		if got < attempts*3/4 {
			t.Errorf("pollNow(%v): %q ran first in %d of %d attempts (want at least %d); run orders of some others: %v", yield, want, got, attempts, attempts*3/4, orders)
		}
	}
}

// TestStepsAside: a request steps aside for the neighbours' requests it
// delivers only when its own instance is busy (more than fairLightStreams
// requests in flight, its own included), never a light instance's request
// giving its slot back while it waits for its app.
func TestStepsAside(t *testing.T) {
	inst := &routes.Instance{}
	for n := 1; n <= fairLightStreams+2; n++ {
		if !inst.Acquire() {
			t.Fatal("no slot")
		}
		if got, want := stepsAside(inst), n > fairLightStreams; got != want {
			t.Errorf("%d requests in flight: stepsAside %v, want %v", n, got, want)
		}
	}
}

// TestQueueingDelivers: a request about to queue for admission delivers a
// parked connection's request that has arrived (pollBeforeQueueing), so a
// flood whose requests queue and wait for their apps, none of them ending,
// still delivers its neighbours'. The poller has no goroutine of its own
// here: only the admission can deliver.
func TestQueueingDelivers(t *testing.T) {
	sched := fairshare.New(fairshare.Config{Slots: 1, Lease: time.Hour})
	defer sched.Close()
	s := &Server{cfg: Config{Fair: sched}}
	ep, err := sock.OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	s.idleH1.ep, s.idleH1.waiting = ep, make(map[uint64]idleWait)
	client, fd := tcpPairFD(t)
	woke := make(chan struct{}, 1)
	if err := ep.Add(fd, 1); err != nil {
		t.Fatal(err)
	}
	s.idleH1.waiting[1] = idleWait{fd: fd, wake: func() { woke <- struct{}{} }}
	// On loopback the bytes are in the socket's queue, and its epoll
	// event pending, once Write returns.
	if _, err := client.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}

	held, _ := sched.TryAdmit() // the one slot: the next admission queues
	var flood routes.Instance
	admitted := make(chan bool, 1)
	go func() {
		_, ok := s.admitFair(&flood, nil)
		admitted <- ok
	}()
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("a request queueing for admission did not deliver the parked connection")
	}
	sched.Release(held)
	if !<-admitted {
		t.Fatal("the queued request was not admitted")
	}
}
