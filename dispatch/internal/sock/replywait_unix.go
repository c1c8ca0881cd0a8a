//go:build unix

package sock

// rawReadWait: the runtime poller waits inside syscall.RawConn.Read
// (replywait.go).
const rawReadWait = true
