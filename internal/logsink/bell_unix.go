//go:build unix

package logsink

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// pipeBell wakes the drain goroutine through the runtime's network poller:
// a byte written to a pipe whose other end the drain goroutine reads (see
// waker).
type pipeBell struct {
	r, w     *os.File
	wrc      syscall.RawConn
	deadline time.Time
	buf      [64]byte
}

func newPipeBell() (waker, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	wrc, err := w.SyscallConn()
	if err == nil {
		// A pipe the runtime's poller did not take has no deadlines (and
		// a read would block a thread): the caller falls back.
		err = r.SetReadDeadline(time.Time{})
	}
	if err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, err
	}
	return &pipeBell{r: r, w: w, wrc: wrc}, nil
}

var ding = []byte{1}

// ring never blocks: a full pipe rings already.
func (b *pipeBell) ring() {
	_ = b.wrc.Write(func(fd uintptr) bool {
		_, _ = syscall.Write(int(fd), ding)
		return true
	})
}

func (b *pipeBell) wait(until time.Time) bool {
	if !until.Equal(b.deadline) {
		_ = b.r.SetReadDeadline(until) // it took one in newPipeBell
		b.deadline = until
	}
	n, err := b.r.Read(b.buf[:])
	switch {
	case n > 0:
		return true
	case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
		// The pipe failed (it is closed only after the drain goroutine
		// has stopped): look at the queue now and then, never spin.
		time.Sleep(10 * time.Millisecond)
		return true
	}
	return false
}

// close closes the write end first: a late ring then does nothing (it
// would get EPIPE from a pipe without a reader).
func (b *pipeBell) close() {
	_ = b.w.Close()
	_ = b.r.Close()
}
