package storebench

import "syscall"

// dieWithParent has the kernel kill the child when this process exits.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
