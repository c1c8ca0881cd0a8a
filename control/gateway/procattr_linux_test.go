package gateway

import "syscall"

// childProcAttr has a test's etcd member killed when the test process
// dies without cleaning up.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
