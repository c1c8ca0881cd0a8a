//go:build !unix

package sock

import "net"

// WaitReadable returns at once where the socket cannot be peeked at: the
// caller then waits in its read, holding its buffer.
func WaitReadable(net.Conn) error { return nil }
