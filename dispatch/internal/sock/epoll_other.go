//go:build !linux

package sock

import "errors"

// errNoEpoll is OpenEpoll's error outside Linux.
var errNoEpoll = errors.New("sock: epoll is not available on this system")

// Epoll is Linux-only: OpenEpoll fails elsewhere, so a caller keeps its
// goroutine and waits in place (WaitReadable).
type Epoll struct{}

// OpenEpoll fails outside Linux.
func OpenEpoll() (*Epoll, error) { return nil, errNoEpoll }

// Add fails: nothing can be registered.
func (e *Epoll) Add(int, uint64) error { return errNoEpoll }

// Remove has nothing to remove.
func (e *Epoll) Remove(int) {}

// Close has nothing to close.
func (e *Epoll) Close() error { return nil }

// Wait fails at once.
func (e *Epoll) Wait(func([]uint64)) error { return errNoEpoll }

// Poll has nothing pending.
func (e *Epoll) Poll(int) []uint64 { return nil }
