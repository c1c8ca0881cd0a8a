//go:build unix

package dispatch

// rawReadWait: the runtime poller waits inside syscall.RawConn.Read (appwait.go).
const rawReadWait = true
