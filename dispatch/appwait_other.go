//go:build !unix

package dispatch

// rawReadWait: outside Unix a request is written as usual (appwait.go).
const rawReadWait = false
