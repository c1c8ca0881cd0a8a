//go:build linux

package sock

import (
	"net"
	"slices"
	"testing"
	"time"
)

// TestEpoll: of three registered sockets only the one whose peer wrote is
// delivered, with its id (above 32 bits, both halves kept); a removed one is
// never delivered, a quiet one not before it has bytes; closing the instance
// ends a Wait in progress with an error.
func TestEpoll(t *testing.T) {
	ep, err := OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	add := func(c net.Conn, id uint64) {
		t.Helper()
		fd, ok := FD(c)
		if !ok {
			t.Fatal("no descriptor")
		}
		if err := ep.Add(fd, id); err != nil {
			t.Fatal(err)
		}
	}
	quiet, _ := tcpPair(t)
	busy, busyPeer := tcpPair(t)
	removed, removedPeer := tcpPair(t)
	const quietID, busyID, removedID = 1, 1<<40 | 7, 3
	add(quiet, quietID)
	add(busy, busyID)
	add(removed, removedID)
	fd, _ := FD(removed)
	ep.Remove(fd)
	if _, err := removedPeer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := busyPeer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}

	var got []uint64
	if err := ep.Wait(func(ids []uint64) { got = append(got, ids...) }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []uint64{busyID}) {
		t.Fatalf("delivered %v, want [%d]", got, uint64(busyID))
	}
	fd, _ = FD(busy)
	ep.Remove(fd) // one-shot: taken, as the idle poller does

	done := make(chan error, 1)
	go func() { done <- ep.Wait(func(ids []uint64) { got = append(got, ids...) }) }()
	_ = ep.Close() // whether Wait has parked yet or not, it ends
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("Wait on a closed instance returned nil (delivered %v)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the Wait")
	}
}

// TestEpollPoll: Poll returns at once, without a Wait: nothing while no
// registered socket has bytes, then the id of the one whose peer wrote,
// once (registrations are one-shot).
func TestEpollPoll(t *testing.T) {
	ep, err := OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ep.Close() }()
	quiet, _ := tcpPair(t)
	busy, busyPeer := tcpPair(t)
	const quietID, busyID = 5, 1<<33 | 9
	for _, r := range []struct {
		c  net.Conn
		id uint64
	}{{quiet, quietID}, {busy, busyID}} {
		fd, ok := FD(r.c)
		if !ok {
			t.Fatal("no descriptor")
		}
		if err := ep.Add(fd, r.id); err != nil {
			t.Fatal(err)
		}
	}
	if ids := ep.Poll(16); len(ids) != 0 {
		t.Fatalf("Poll with nothing readable = %v", ids)
	}
	if _, err := busyPeer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		got = slices.Clone(ep.Poll(16))
		if len(got) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if !slices.Equal(got, []uint64{busyID}) {
		t.Fatalf("Poll = %v, want [%d]", got, uint64(busyID))
	}
	if ids := ep.Poll(16); len(ids) != 0 {
		t.Fatalf("a one-shot event delivered twice: %v", ids)
	}
}

// TestEpollPollAtMost: Poll(max) returns no more than max events and
// leaves the others pending for the next Poll.
func TestEpollPollAtMost(t *testing.T) {
	ep, err := OpenEpoll()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ep.Close() }()
	var peers []net.Conn
	for id := uint64(1); id <= 3; id++ {
		c, peer := tcpPair(t)
		fd, ok := FD(c)
		if !ok {
			t.Fatal("no descriptor")
		}
		if err := ep.Add(fd, id); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, peer)
	}
	if ids := ep.Poll(0); ids != nil {
		t.Fatalf("Poll(0) = %v", ids)
	}
	for _, p := range peers {
		if _, err := p.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	for deadline := time.Now().Add(5 * time.Second); len(got) < 3 && time.Now().Before(deadline); {
		ids := ep.Poll(1)
		if len(ids) > 1 {
			t.Fatalf("Poll(1) = %v", ids)
		}
		if len(ids) == 0 {
			time.Sleep(time.Millisecond)
		}
		got = append(got, ids...)
	}
	slices.Sort(got)
	if !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("three Poll(1) delivered %v, want each of [1 2 3] once", got)
	}
}
