//go:build unix

package main

import "syscall"

// raiseNoFile sets the open-file limit to its hard limit (Go does this at
// start-up since 1.19; done again here so the figure can be reported).
func raiseNoFile() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}
