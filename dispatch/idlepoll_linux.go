//go:build linux

package dispatch

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// wait registers fd; wake then runs in a new goroutine once fd is readable,
// has hung up or failed. It returns the registration's id for cancel.
func (p *idlePoller) wait(fd int, wake func()) (uint64, error) {
	p.mu.Lock()
	if p.ep == nil {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			p.mu.Unlock()
			return 0, fmt.Errorf("epoll_create1: %w", err)
		}
		if err := unix.SetNonblock(epfd, true); err != nil {
			p.mu.Unlock()
			_ = unix.Close(epfd)
			return 0, fmt.Errorf("epoll non-blocking: %w", err)
		}
		// A non-blocking descriptor joins the runtime's poller.
		p.ep, p.epfd = os.NewFile(uintptr(epfd), "idle-epoll"), epfd
		if p.waiting == nil {
			p.waiting = make(map[uint64]idleWait)
		}
		go p.run(p.ep)
	}
	p.next++
	id := p.next
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT}
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		ep := p.closeIfEmptyLocked()
		p.mu.Unlock()
		if ep != nil {
			_ = ep.Close()
		}
		return 0, fmt.Errorf("epoll_ctl add: %w", err)
	}
	p.waiting[id] = idleWait{fd: fd, wake: wake}
	p.mu.Unlock()
	return id, nil
}

// cancel removes registration id before its socket is closed. It reports
// whether it was still waiting: if not, its wake has run or is starting.
func (p *idlePoller) cancel(id uint64) bool {
	p.mu.Lock()
	w, ok := p.waiting[id]
	if ok {
		delete(p.waiting, id)
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, w.fd, nil)
	}
	ep := p.closeIfEmptyLocked()
	p.mu.Unlock()
	if ep != nil {
		_ = ep.Close() // outside mu: run may be waiting for mu with ep in use
	}
	return ok
}

// closeIfEmptyLocked retires the epoll instance when nothing waits and
// returns it for the caller to close after unlocking.
func (p *idlePoller) closeIfEmptyLocked() *os.File {
	if p.ep == nil || len(p.waiting) > 0 {
		return nil
	}
	ep := p.ep
	p.ep, p.epfd = nil, -1
	return ep
}

// run delivers the events of epoll instance ep until it is closed.
func (p *idlePoller) run(ep *os.File) {
	rc, err := ep.SyscallConn()
	if err != nil {
		return
	}
	events := make([]unix.EpollEvent, 64)
	var woke []func()
	for {
		woke = woke[:0]
		err := rc.Read(func(fd uintptr) bool {
			n, err := unix.EpollWait(int(fd), events, 0)
			for err == unix.EINTR {
				n, err = unix.EpollWait(int(fd), events, 0)
			}
			if err != nil || n <= 0 {
				return false // nothing pending: park until ep is readable
			}
			p.mu.Lock()
			for _, ev := range events[:n] {
				id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
				if w, ok := p.waiting[id]; ok {
					delete(p.waiting, id)
					_ = unix.EpollCtl(int(fd), unix.EPOLL_CTL_DEL, w.fd, nil)
					woke = append(woke, w.wake)
				}
			}
			p.mu.Unlock()
			return true
		})
		for _, wake := range woke {
			go wake()
		}
		if err != nil {
			return // ep was closed
		}
		p.mu.Lock()
		var retired *os.File
		if p.ep == ep {
			retired = p.closeIfEmptyLocked()
		}
		p.mu.Unlock()
		if retired != nil {
			_ = retired.Close()
			return
		}
	}
}
