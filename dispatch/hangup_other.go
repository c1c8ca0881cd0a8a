//go:build !linux

package dispatch

import "net"

// peerHungUp is Linux-only (POLLRDHUP); elsewhere an HTTP/1.1 client that
// goes away while its request waits for a starting app is noticed when the
// answer is written, at the end of the start grace.
func peerHungUp(net.Conn) bool { return false }
