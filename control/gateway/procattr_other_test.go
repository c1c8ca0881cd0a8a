//go:build !linux

package gateway

import "syscall"

// childProcAttr: no parent-death signal outside Linux (the etcd tests run
// on Linux; this keeps the package vetting elsewhere).
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
