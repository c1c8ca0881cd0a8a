//go:build unix

package accesstoken

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used, user and system: a
// benchmark's cost on a machine whose cores other processes share.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
