//go:build unix && !linux

package e2e

import (
	"os"
	"syscall"
)

// browserProcAttr: elsewhere only the process group (the e2e tests run on
// Linux; this keeps the package vetting on other systems).
func browserProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killProcessGroup kills p with the process group browserProcAttr gave it.
func killProcessGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }
