//go:build !unix

package sock

// rawReadWait: outside Unix a request is written as usual (replywait.go).
const rawReadWait = false
