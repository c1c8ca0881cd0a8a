//go:build !linux

package sock

import "net"

// PeerHungUp is Linux-only (POLLRDHUP); elsewhere it reports false, and a
// peer that went away is noticed when its connection is next written to.
func PeerHungUp(net.Conn) bool { return false }
