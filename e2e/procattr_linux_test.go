package e2e

import (
	"os"
	"syscall"
)

// browserProcAttr puts the browser in its own process group, so that Close
// can kill the renderers and helpers with it, and has it killed if the
// launching thread ends, that is if this test process dies without running
// Close (see launch).
func browserProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killProcessGroup kills p with the process group browserProcAttr gave it.
func killProcessGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }
