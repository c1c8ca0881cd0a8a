//go:build unix

package sock

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// replyWaitPair is a real loopback TCP connection: c (the listener's side,
// prepared for WriteAwait) and the app's side.
func replyWaitPair(t *testing.T) (c net.Conn, w *ReplyWait, app net.Conn) {
	t.Helper()
	c, app = tcpPair(t)
	w = &ReplyWait{}
	w.Init(c)
	return c, w, app
}

// readable reports, without blocking or reading, whether c has bytes.
func readable(t *testing.T, c net.Conn) bool {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	_ = rc.Control(func(fd uintptr) {
		var one [1]byte
		n, _, _ = unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	})
	return n > 0
}

// TestReplyWaitReturnsOnceAnswered: WriteAwait writes the request and
// returns only once the app's answer can be read (so that the read that
// follows finds it, instead of failing with EAGAIN first), and the answer
// is read whole afterwards.
func TestReplyWaitReturnsOnceAnswered(t *testing.T) {
	c, w, app := replyWaitPair(t)
	go func() {
		br := bufio.NewReader(app)
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
			_, _ = app.Write([]byte("answer\n"))
		}
	}()
	for i := range 50 {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, at, err := w.WriteAwait([]byte("request\n"))
		if err != nil || n != len("request\n") {
			t.Fatalf("request %d: wrote %d bytes: %v", i, n, err)
		}
		if at.IsZero() || time.Since(at) < 0 {
			t.Fatalf("request %d: write time %v", i, at)
		}
		if !readable(t, c) {
			t.Fatalf("request %d: WriteAwait returned before the answer was readable", i)
		}
		buf := make([]byte, 7)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "answer\n" {
			t.Fatalf("request %d: read %q: %v", i, buf, err)
		}
	}
}

// TestReplyWaitDeadline: an app that does not answer holds WriteAwait until
// the read deadline only; the request was written, and the read that
// follows reports the timeout.
func TestReplyWaitDeadline(t *testing.T) {
	c, w, app := replyWaitPair(t)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	n, _, err := w.WriteAwait([]byte("request\n"))
	if err != nil || n != len("request\n") {
		t.Fatalf("wrote %d bytes: %v", n, err)
	}
	got := make([]byte, 8)
	_ = app.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(app, got); err != nil || string(got) != "request\n" {
		t.Fatalf("the app read %q: %v", got, err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the wait: %v, want the deadline", err)
	}
}

// TestReplyWaitClosed: on a connection closed locally the request is not
// written and the write's error is returned.
func TestReplyWaitClosed(t *testing.T) {
	c, w, _ := replyWaitPair(t)
	_ = c.Close()
	if n, _, err := w.WriteAwait([]byte("request\n")); err == nil || n != 0 {
		t.Fatalf("wrote %d bytes on a closed connection: %v", n, err)
	}
}

// TestReplyWaitAppHangsUp: an app that closes its side after reading the
// request ends the wait (the read that follows sees EOF).
func TestReplyWaitAppHangsUp(t *testing.T) {
	c, w, app := replyWaitPair(t)
	go func() {
		_, _ = bufio.NewReader(app).ReadString('\n')
		_ = app.Close()
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := w.WriteAwait([]byte("request\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the app hung up: %v, want EOF", err)
	}
}

// TestReplyWaitSpin: WriteAwaitSpin polls for the answer for up to its
// spin after the write: an answer that comes within it returns without
// parking (spun), one that comes later is waited for as WriteAwait does.
func TestReplyWaitSpin(t *testing.T) {
	c, w, app := replyWaitPair(t)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answerAfter := func(d time.Duration) {
		go func() {
			var b [8]byte
			_, _ = io.ReadFull(app, b[:])
			time.Sleep(d)
			_, _ = app.Write([]byte("answer\n"))
		}()
	}
	read := func() {
		t.Helper()
		if !readable(t, c) {
			t.Fatal("returned before the answer was readable")
		}
		var b [7]byte
		if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "answer\n" {
			t.Fatalf("answer %q, %v", b, err)
		}
	}

	// Within the spin (a generous one: the app's goroutine must run).
	answerAfter(20 * time.Millisecond)
	if n, _, err, spun := w.WriteAwaitSpin([]byte("request\n"), 5*time.Second); n != 8 || err != nil || !spun {
		t.Fatalf("answer within the spin: n %d, err %v, spun %v; want 8, nil, true", n, err, spun)
	}
	read()

	// After the spin: parked, then woken by the answer.
	answerAfter(200 * time.Millisecond)
	start := time.Now()
	n, _, err, spun := w.WriteAwaitSpin([]byte("request\n"), 10*time.Microsecond)
	if n != 8 || err != nil || spun {
		t.Fatalf("answer after the spin: n %d, err %v, spun %v; want 8, nil, false", n, err, spun)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("returned after %v, before the answer", d)
	}
	read()

	// No spin: WriteAwait's behaviour, never spun.
	answerAfter(0)
	if _, _, err, spun := w.WriteAwaitSpin([]byte("request\n"), 0); err != nil || spun {
		t.Fatalf("no spin: err %v, spun %v", err, spun)
	}
	read()
}
