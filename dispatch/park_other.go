//go:build !unix

package dispatch

import "net"

// waitReadable returns at once where the socket cannot be peeked at: the
// WebSocket direction then waits in its read, holding its buffer.
func waitReadable(net.Conn) error { return nil }
