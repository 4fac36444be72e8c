//go:build linux || darwin || freebsd

package up

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// locked says whether another process holds the Pebble LOCK file of the
// folder dir (a store, an update log): Pebble takes a POSIX record lock
// on it, which F_GETLK reports without taking one. A folder without a
// LOCK file is not locked.
func locked(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "LOCK"))
	if err != nil {
		return false
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
		return false
	}
	return lk.Type != syscall.F_UNLCK
}
