//go:build linux && (amd64 || arm64)

package storebench

import (
	"os"
	"syscall"
	"time"
)

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fadviseDontNeed asks the kernel to drop f's cached pages.
func fadviseDontNeed(f *os.File) error {
	const posixFadvDontNeed = 4
	_, _, e := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, posixFadvDontNeed, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
