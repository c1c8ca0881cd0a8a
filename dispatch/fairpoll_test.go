//go:build linux

package dispatch

import (
	"net"
	"testing"
	"time"

	"github.com/applistener/applistener/dispatch/internal/sock"
)

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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Close() }()
	fd, ok := sock.FD(server)
	if !ok {
		t.Fatal("no descriptor")
	}
	woke := make(chan struct{}, 2)
	const id = 1
	if err := ep.Add(fd, id); err != nil {
		t.Fatal(err)
	}
	p.waiting[id] = idleWait{fd: fd, wake: func() { woke <- struct{}{} }}

	p.lastPoll.Store(0)
	p.pollNow()
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
		p.pollNow()
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
	p.pollNow()
	if p.lastPoll.Load() != before {
		t.Error("pollNow looked again within pollNowEvery")
	}
	select {
	case <-woke:
		t.Error("a socket woken twice")
	default:
	}
}
