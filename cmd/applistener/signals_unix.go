//go:build unix

package main

import (
	"os"
	"syscall"
)

// reopenSignals reopen the log files (logrotate's convention).
var reopenSignals = []os.Signal{syscall.SIGUSR1}
