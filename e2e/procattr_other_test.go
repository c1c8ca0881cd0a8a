//go:build !linux

package e2e

import "syscall"

// browserProcAttr: elsewhere only the process group (the e2e tests run on
// Linux; this keeps the package vetting on other systems).
func browserProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
