//go:build !unix

package sock

// rawReadWait: outside Unix a request is written as usual (replywait.go).
const rawReadWait = false

// peekReadable is never called outside Unix (no raw wait there).
func peekReadable(uintptr) bool { return true }
