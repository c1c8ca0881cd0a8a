//go:build !linux

package routes

import "runtime"

// yield steps aside with runtime.Gosched: without an eventfd there is no
// way to wait for exactly one pass of the network poller. This is the
// fallback Linux uses when no eventfd can be opened (yield_linux.go), so
// y.ev stays nil and close has nothing to release.
func (y *yielder) yield() {
	runtime.Gosched()
}
