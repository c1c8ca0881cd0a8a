package controltest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Outage is a TCP forwarder on a fixed loopback port in front of a real
// server, for tests of outages: Down closes its listener (connections are
// refused) and cuts every forwarded connection, Up listens on the same port
// again. Clients see a server that goes away and comes back at the same
// address.
type Outage struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewOutage starts a forwarder to target (host:port) and returns it, up.
// It is stopped on cleanup.
func NewOutage(t testing.TB, target string) *Outage {
	t.Helper()
	o := &Outage{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	o.start(ln)
	t.Cleanup(func() {
		o.Down()
		o.wg.Wait()
	})
	return o
}

// Addr returns the forwarder's address, host:port.
func (o *Outage) Addr() string { return o.addr }

// Down refuses new connections and cuts the open ones.
func (o *Outage) Down() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ln != nil {
		_ = o.ln.Close()
		o.ln = nil
	}
	for c := range o.conns {
		_ = c.Close()
	}
}

// Up listens again on the same address (retrying while the port is in
// TIME_WAIT or briefly taken).
func (o *Outage) Up() {
	o.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", o.addr)
		if err == nil {
			o.start(ln)
			return
		}
		if time.Now().After(deadline) {
			o.t.Fatalf("outage forwarder: listen again on %s: %v", o.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (o *Outage) start(ln net.Listener) {
	o.mu.Lock()
	o.ln = ln
	o.mu.Unlock()
	o.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.wg.Go(func() { o.forward(c) })
		}
	})
}

// forward copies between c and a new connection to the target until
// either side ends or Down cuts them.
func (o *Outage) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", o.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	o.mu.Lock()
	if o.ln == nil { // went down meanwhile
		o.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	o.conns[c] = struct{}{}
	o.conns[up] = struct{}{}
	o.mu.Unlock()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // the end of either half (EOF or a cut) ends both
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Go(func() { pipe(up, c) })
	wg.Go(func() { pipe(c, up) })
	wg.Wait()
	o.mu.Lock()
	delete(o.conns, c)
	delete(o.conns, up)
	o.mu.Unlock()
}
