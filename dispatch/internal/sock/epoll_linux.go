//go:build linux

package sock

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Epoll is an epoll instance whose registrations are one-shot waits for a
// socket to become readable, hang up or fail, each named by a caller's id.
// The instance is itself waited on through the runtime's network poller (it
// is readable while events are pending), so a goroutine in Wait is parked
// like any other, not blocked in a system call. Its owner serialises Add,
// Remove and Close against each other (Wait may run alongside them), and
// removes a socket before anyone may close it, so that a descriptor number
// reused after a close is never removed by mistake.
type Epoll struct {
	f      *os.File
	fd     int
	rc     syscall.RawConn
	events []unix.EpollEvent
	ids    []uint64
	// Poll's own buffers (it may run alongside Wait).
	pollEvents []unix.EpollEvent
	pollIDs    []uint64
}

// OpenEpoll creates an epoll instance; it fails outside Linux.
func OpenEpoll() (*Epoll, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("epoll non-blocking: %w", err)
	}
	// A non-blocking descriptor joins the runtime's poller.
	f := os.NewFile(uintptr(epfd), "idle-epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("epoll raw conn: %w", err)
	}
	return &Epoll{f: f, fd: epfd, rc: rc, events: make([]unix.EpollEvent, 64), ids: make([]uint64, 0, 64),
		pollEvents: make([]unix.EpollEvent, 16), pollIDs: make([]uint64, 0, 16)}, nil
}

// Add registers fd under id, once: its event removes nothing by itself, the
// caller removes fd when it takes the event (Remove).
func (e *Epoll) Add(fd int, id uint64) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT}
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
	if err := unix.EpollCtl(e.fd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	return nil
}

// Remove unregisters fd (best effort: a socket whose event was taken is
// registered no more than a closed one).
func (e *Epoll) Remove(fd int) {
	_ = unix.EpollCtl(e.fd, unix.EPOLL_CTL_DEL, fd, nil)
}

// Close closes the instance; a Wait in progress returns its error.
func (e *Epoll) Close() error { return e.f.Close() }

// Poll returns the ids of at most limit (1 to 16) events pending now,
// without waiting: one epoll_wait with a zero timeout, outside the
// runtime's poller; events beyond limit stay pending for the next Poll or
// Wait. The slice is valid until the next Poll. It may run alongside Wait
// (registrations are one-shot: an event goes to one of them); its callers
// serialise Poll among themselves and against Close.
func (e *Epoll) Poll(limit int) []uint64 {
	limit = min(len(e.pollEvents), limit)
	if limit <= 0 {
		return nil
	}
	n, err := unix.EpollWait(e.fd, e.pollEvents[:limit], 0)
	if err != nil || n <= 0 {
		return nil
	}
	e.pollIDs = e.pollIDs[:0]
	for _, ev := range e.pollEvents[:n] {
		e.pollIDs = append(e.pollIDs, uint64(uint32(ev.Fd))|uint64(uint32(ev.Pad))<<32)
	}
	return e.pollIDs
}

// Wait parks until events are pending and hands their ids to deliver, which
// runs inside the runtime poller's read and must not block. It returns nil
// after one delivery, or the error of an instance closed meanwhile.
func (e *Epoll) Wait(deliver func(ids []uint64)) error {
	return e.rc.Read(func(fd uintptr) bool {
		n, err := unix.EpollWait(int(fd), e.events, 0)
		for err == unix.EINTR {
			n, err = unix.EpollWait(int(fd), e.events, 0)
		}
		if err != nil || n <= 0 {
			return false // nothing pending: park until the instance is readable
		}
		e.ids = e.ids[:0]
		for _, ev := range e.events[:n] {
			e.ids = append(e.ids, uint64(uint32(ev.Fd))|uint64(uint32(ev.Pad))<<32)
		}
		deliver(e.ids)
		return true
	})
}
