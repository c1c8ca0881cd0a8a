package e2e

import (
	"os"
	"syscall"
)

// browserProcAttr: Windows has no process groups of this kind (the e2e tests
// run on Linux; this keeps the package vetting on Windows).
func browserProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// killProcessGroup kills p alone: Windows has no process group to kill.
func killProcessGroup(p *os.Process) { _ = p.Kill() }
