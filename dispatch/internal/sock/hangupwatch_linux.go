//go:build linux

package sock

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// HangupWatch notes which of its sockets the peer has closed or reset,
// without a goroutine and without a system call per socket: each socket is
// registered once in an epoll instance, for the peer's FIN (EPOLLRDHUP), a
// hang-up or an error and never for bytes, so a connection in use costs
// nothing; Poll collects what happened since the last Poll with one
// epoll_wait that does not block. A registration is one-shot (a socket
// hangs up once) and is never removed by descriptor number: closing the
// socket removes it (the kernel drops a file's epoll registrations when
// the file is released), so a number reused after a close cannot be
// confused. Its owner serialises Add, Poll and Close.
type HangupWatch struct {
	fd     int
	events []unix.EpollEvent
}

// OpenHangupWatch creates a watch; it fails outside Linux.
func OpenHangupWatch() (*HangupWatch, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	return &HangupWatch{fd: fd, events: make([]unix.EpollEvent, 32)}, nil
}

// Add watches fd under id.
func (w *HangupWatch) Add(fd int, id uint64) error {
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT}
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
	if err := unix.EpollCtl(w.fd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	return nil
}

// Poll hands note the id of every watched socket that has hung up since
// the last Poll, without blocking.
func (w *HangupWatch) Poll(note func(id uint64)) error {
	for {
		n, err := unix.EpollWait(w.fd, w.events, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range w.events[:n] {
			note(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32)
		}
		if n < len(w.events) {
			return nil
		}
	}
}

// Close closes the watch.
func (w *HangupWatch) Close() error { return unix.Close(w.fd) }
