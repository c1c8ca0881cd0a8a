package dispatch

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"

	"go.uber.org/goleak"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/routes"
)

// verifyNoLeaks checks for leaked goroutines after every other cleanup of
// the test (t.Cleanup runs last-registered first).
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// loopbackApp accepts TCP connections on 127.0.0.1 and hands their server
// side to the test.
type loopbackApp struct {
	ln    net.Listener
	conns chan net.Conn
	wg    sync.WaitGroup
	mu    sync.Mutex
	all   []net.Conn
}

func newLoopbackApp(t *testing.T) *loopbackApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &loopbackApp{ln: ln, conns: make(chan net.Conn, 64)}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.all = append(a.all, c)
			a.mu.Unlock()
			a.conns <- c
		}
	}()
	t.Cleanup(a.close)
	return a
}

func (a *loopbackApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *loopbackApp) close() {
	_ = a.ln.Close()
	a.wg.Wait()
	a.mu.Lock()
	for _, c := range a.all {
		_ = c.Close()
	}
	a.mu.Unlock()
}

// dialPair dials through the pool and returns the pool side and the app side.
func (a *loopbackApp) dialPair(t *testing.T, p *backendPool) (*backendConn, net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := p.dial(ctx)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	select {
	case peer := <-a.conns:
		return bc, peer
	case <-time.After(5 * time.Second):
		t.Fatal("app did not accept")
	}
	return nil, nil
}

// peerSeesEOF reports whether the app side of a connection sees the
// listener's close (EOF) within a deadline.
func peerSeesEOF(t *testing.T, peer net.Conn) bool {
	t.Helper()
	_ = peer.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [1]byte
	_, err := peer.Read(b[:])
	return errors.Is(err, io.EOF)
}

// peerStillOpen reports whether the app side sees no EOF for a short while.
func peerStillOpen(t *testing.T, peer net.Conn) bool {
	t.Helper()
	_ = peer.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var b [1]byte
	_, err := peer.Read(b[:])
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func newTestBackendPool(app *loopbackApp, maxIdle int, idle time.Duration, lease *routes.Lease) *backendPool {
	return newBackendPool(connector.TCP{Host: "127.0.0.1"}, app.port(), maxIdle, nil, idle, newTestPool(1024), lease)
}

func TestUnitBackendPoolLIFO(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	p := newTestBackendPool(app, 8, time.Minute, lease)
	defer lease.Cancel(routes.ErrWithdrawn)
	var bcs []*backendConn
	var peers []net.Conn
	for range 3 {
		bc, peer := app.dialPair(t, p)
		bcs = append(bcs, bc)
		peers = append(peers, peer)
	}
	if p.get() != nil {
		t.Fatal("empty pool returned a connection")
	}
	for _, bc := range bcs {
		if bc.reused {
			t.Error("fresh connection marked reused")
		}
		p.put(bc)
		if bc.in.buf != nil {
			t.Error("an idle pooled connection keeps its read buffer")
		}
	}
	if n := p.idleCount(); n != 3 {
		t.Fatalf("idleCount = %d; want 3", n)
	}
	for i := 2; i >= 0; i-- {
		got := p.get()
		if got != bcs[i] {
			t.Fatalf("get returned %p; want the most recently put %p (LIFO)", got, bcs[i])
		}
		if !got.reused {
			t.Error("pooled connection not marked reused")
		}
	}
	if p.get() != nil {
		t.Error("drained pool returned a connection")
	}
	for i, peer := range peers {
		if !peerStillOpen(t, peer) {
			t.Errorf("connection %d closed by the pool", i)
		}
	}
	for _, bc := range bcs {
		bc.close()
	}
}

func TestUnitBackendPoolIdleTimeout(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newTestBackendPool(app, 8, 30*time.Millisecond, lease)
	bc1, peer1 := app.dialPair(t, p)
	bc2, peer2 := app.dialPair(t, p)
	p.put(bc1)
	p.put(bc2)
	testutil.Eventually(t, 3*time.Second, "idle connections retired", func() bool { return p.idleCount() == 0 })
	if !peerSeesEOF(t, peer1) || !peerSeesEOF(t, peer2) {
		t.Error("a retired connection was not closed")
	}
	// The reaper stops when the pool is empty and starts again on put.
	bc3, peer3 := app.dialPair(t, p)
	p.put(bc3)
	testutil.Eventually(t, 3*time.Second, "second retirement", func() bool { return p.idleCount() == 0 })
	if !peerSeesEOF(t, peer3) {
		t.Error("connection put after an earlier reap was not retired")
	}
}

func TestUnitBackendPoolReapSelective(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newTestBackendPool(app, 8, time.Minute, lease)
	old, oldPeer := app.dialPair(t, p)
	young, youngPeer := app.dialPair(t, p)
	p.put(old)
	p.put(young)
	p.mu.Lock()
	old.idleSince = time.Now().Add(-2 * time.Minute)
	p.mu.Unlock()
	p.reap()
	if n := p.idleCount(); n != 1 {
		t.Fatalf("after reap idleCount = %d; want 1", n)
	}
	if !peerSeesEOF(t, oldPeer) {
		t.Error("expired connection not closed")
	}
	if !peerStillOpen(t, youngPeer) {
		t.Error("young connection closed")
	}
	p.mu.Lock()
	rescheduled := p.timer != nil
	p.mu.Unlock()
	if !rescheduled {
		t.Error("reap did not reschedule for the remaining connection")
	}
	if got := p.get(); got != young {
		t.Errorf("get = %p; want the young connection", got)
	}
	young.close()
}

func TestUnitBackendPoolGetSkipsExpired(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newTestBackendPool(app, 8, time.Minute, lease)
	a, aPeer := app.dialPair(t, p)
	b, bPeer := app.dialPair(t, p)
	p.put(a)
	p.put(b)
	p.mu.Lock()
	b.idleSince = time.Now().Add(-time.Minute) // exactly the timeout: too old
	p.mu.Unlock()
	if got := p.get(); got != a {
		t.Fatalf("get = %p; want the unexpired connection %p", got, a)
	}
	if !peerSeesEOF(t, bPeer) {
		t.Error("expired connection skipped by get was not closed")
	}
	if !peerStillOpen(t, aPeer) {
		t.Error("returned connection is closed")
	}
	a.close()
}

func TestUnitBackendPoolRevoke(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	p := newTestBackendPool(app, 8, time.Minute, lease)
	if lease.Streams() != 1 {
		t.Fatalf("pool not attached to its lease: %d streams", lease.Streams())
	}
	var peers []net.Conn
	for range 3 {
		bc, peer := app.dialPair(t, p)
		p.put(bc)
		peers = append(peers, peer)
	}
	if n := lease.Cancel(routes.ErrWithdrawn); n != 1 {
		t.Fatalf("lease revoked %d streams; want 1 (the pool)", n)
	}
	if p.idleCount() != 0 {
		t.Errorf("idleCount after Revoke = %d", p.idleCount())
	}
	for i, peer := range peers {
		if !peerSeesEOF(t, peer) {
			t.Errorf("idle connection %d not closed by Revoke", i)
		}
	}
	p.mu.Lock()
	timer := p.timer
	p.mu.Unlock()
	if timer != nil {
		t.Error("reap timer left running after Revoke")
	}
	// Connections that were in use come back after the revocation: closed.
	bc, peer := app.dialPair(t, p)
	p.put(bc)
	if p.idleCount() != 0 || p.get() != nil {
		t.Error("revoked pool accepted a connection")
	}
	if !peerSeesEOF(t, peer) {
		t.Error("connection returned to a revoked pool not closed")
	}
	p.reap() // a late timer on a closed pool does nothing
	p.Revoke(routes.ErrWithdrawn)
}

func TestUnitBackendPoolRevokeNetPipe(t *testing.T) {
	verifyNoLeaks(t)
	p := &backendPool{maxIdle: 4, idleTimeout: time.Minute, bufPool: newTestPool(64)}
	var peers []net.Conn
	for range 2 {
		a, b := net.Pipe()
		p.put(&backendConn{conn: a, in: inbuf{src: a, pool: p.bufPool}})
		peers = append(peers, b)
	}
	p.Revoke(routes.ErrChanged)
	for i, peer := range peers {
		_ = peer.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("pipe %d after Revoke: %v; want EOF", i, err)
		}
		_ = peer.Close()
	}
}

func TestUnitBackendPoolCancelledLease(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	lease.Cancel(routes.ErrExpired)
	p := newTestBackendPool(app, 8, time.Minute, lease)
	bc, peer := app.dialPair(t, p)
	p.put(bc)
	if p.idleCount() != 0 {
		t.Error("pool of a cancelled lease kept a connection")
	}
	if !peerSeesEOF(t, peer) {
		t.Error("connection not closed")
	}
}

func TestUnitBackendPoolMaxIdle(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newTestBackendPool(app, 2, time.Minute, lease)
	var peers []net.Conn
	for range 3 {
		bc, peer := app.dialPair(t, p)
		p.put(bc)
		peers = append(peers, peer)
	}
	if n := p.idleCount(); n != 2 {
		t.Fatalf("idleCount = %d; want maxIdle 2", n)
	}
	// Beyond the bound the oldest goes: the one just used is the one
	// most likely to be used next.
	if !peerStillOpen(t, peers[1]) || !peerStillOpen(t, peers[2]) {
		t.Error("one of the two most recently used connections was closed")
	}
	if !peerSeesEOF(t, peers[0]) {
		t.Error("the oldest connection beyond maxIdle was not closed")
	}
}

func TestUnitBackendPoolUnreadBytes(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	defer lease.Cancel(routes.ErrWithdrawn)
	p := newTestBackendPool(app, 8, time.Minute, lease)
	bc, peer := app.dialPair(t, p)
	// The app sent bytes beyond its response.
	if _, err := peer.Write([]byte("HTTP/1.1 200 OK\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = bc.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if err := bc.in.fill(); err != nil {
		t.Fatal(err)
	}
	if bc.in.buffered() == 0 {
		t.Fatal("nothing buffered")
	}
	p.put(bc)
	if p.idleCount() != 0 {
		t.Error("a connection with unread bytes was pooled")
	}
	if !peerSeesEOF(t, peer) {
		t.Error("a connection with unread bytes was not closed")
	}
	if bc.in.buf != nil {
		t.Error("the read buffer of a closed connection was not given back")
	}
}

// TestUnitBackendPoolConcurrent exercises get/put/reap/Revoke together
// under the race detector.
func TestUnitBackendPoolConcurrent(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	p := newTestBackendPool(app, 4, 5*time.Millisecond, lease)
	var conns []*backendConn
	for range 8 {
		bc, _ := app.dialPair(t, p)
		conns = append(conns, bc)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			bc := conns[i]
			for range 200 {
				p.put(bc)
				if got := p.get(); got != nil {
					bc = got
				} else {
					// Ours was closed (full or retired) or taken by another
					// goroutine: stop.
					return
				}
			}
			bc.close()
		})
	}
	wg.Wait()
	lease.Cancel(routes.ErrWithdrawn)
	if p.idleCount() != 0 {
		t.Errorf("idleCount after Revoke = %d", p.idleCount())
	}
}

func TestUnitBackendPoolDialError(t *testing.T) {
	// A port nobody listens on: dial fails with an error, no panic.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	p := &backendPool{connector: connector.TCP{Host: "127.0.0.1"}, port: port, maxIdle: 1, idleTimeout: time.Second, bufPool: newTestPool(64)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if bc, err := p.dial(ctx); err == nil {
		bc.close()
		t.Fatalf("dial to closed port %s succeeded", strconv.Itoa(port))
	}
}

// waitFINAtSocket waits until the app's close of bc has reached the
// listener's socket (as bc's own probe sees it).
func waitFINAtSocket(t *testing.T, bc *backendConn) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "the app's FIN to reach the listener", func() bool { return !bc.probe.Usable() })
}

// ageIdle makes the pool's idle connections look idle for d longer.
func ageIdle(p *backendPool, d time.Duration) {
	p.mu.Lock()
	for _, bc := range p.idle {
		bc.idleSince = bc.idleSince.Add(-d)
	}
	p.mu.Unlock()
}

// TestUnitBackendPoolHangupWatch: with the hang-up watch, the reuse of one
// connection polls for all of them (at most every hangupPollEvery): a
// connection the app closed while idle is known closed before it is
// popped, and discarded without a probe of its own; the watch's epoll
// instance lives only while connections are registered.
func TestUnitBackendPoolHangupWatch(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	p := newTestBackendPool(app, 8, time.Minute, lease)
	defer lease.Cancel(routes.ErrWithdrawn)
	h := &appHangups{}
	p.hangups = h
	var stale atomic.Int64
	p.onStale = func() { stale.Add(1) }
	a, peerA := app.dialPair(t, p)
	b, _ := app.dialPair(t, p)
	if a.hangups != h || b.hangups != h {
		t.Fatal("dialled connections are not watched")
	}
	p.put(a)
	p.put(b)
	_ = peerA.Close()
	waitFINAtSocket(t, a)
	ageIdle(p, 2*probeIdleAfter)
	h.polled.Store(0) // no poll since: the next reuse polls
	if got := p.get(); got != b {
		t.Fatalf("get = %p; want the open connection %p", got, b)
	}
	if !a.appClosed.Load() {
		t.Fatal("the poll made by the reuse of b did not note a's close")
	}
	if got := p.get(); got != nil {
		t.Fatalf("get = %p; want nil (the closed connection discarded)", got)
	}
	if n := stale.Load(); n != 1 {
		t.Fatalf("stale connections counted: %d; want 1", n)
	}
	b.close()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w != nil || len(h.conns) != 0 {
		t.Fatalf("watch still open (%v) with %d registrations after every connection closed", h.w != nil, len(h.conns))
	}
}

// TestUnitBackendPoolProbeAfterLongIdle: a connection idle for
// probeAllAfter is probed before reuse even when the watch has not (yet)
// seen the app's close: the reuse of a connection the app may just have
// timed out is exact.
func TestUnitBackendPoolProbeAfterLongIdle(t *testing.T) {
	verifyNoLeaks(t)
	app := newLoopbackApp(t)
	lease := routes.NewLease()
	p := newTestBackendPool(app, 8, time.Minute, lease)
	defer lease.Cancel(routes.ErrWithdrawn)
	h := &appHangups{}
	p.hangups = h
	bc, peer := app.dialPair(t, p)
	p.put(bc)
	_ = peer.Close()
	waitFINAtSocket(t, bc)
	ageIdle(p, probeAllAfter)
	// The last poll looks recent: the watch will not poll again.
	h.polled.Store(time.Now().Add(time.Hour).UnixNano())
	if got := p.get(); got != nil {
		t.Fatalf("get = %p; want nil (closed by the app, found by the probe)", got)
	}
}
