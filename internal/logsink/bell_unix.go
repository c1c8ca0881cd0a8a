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
		// Pipes take deadlines on Unix; without one the wait would only
		// end at the next ring.
		_ = b.r.SetReadDeadline(until)
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

func (b *pipeBell) close() {
	_ = b.r.Close()
	_ = b.w.Close()
}
