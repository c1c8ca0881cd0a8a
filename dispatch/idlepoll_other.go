//go:build !linux

package dispatch

import "errors"

// errNoIdlePoller is returned by wait where there is no epoll.
var errNoIdlePoller = errors.New("idle poller: epoll is not available on this system")

// wait fails: without epoll there is no way to wait for a socket without a
// goroutine, so the caller (wsPump.park) keeps its goroutine and waits in
// place for the socket to become readable (waitReadable).
func (p *idlePoller) wait(fd int, wake func()) (uint64, error) {
	return 0, errNoIdlePoller
}

// cancel has nothing to remove: nothing is ever registered.
func (p *idlePoller) cancel(id uint64) bool {
	return false
}
