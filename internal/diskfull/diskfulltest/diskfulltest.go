// Package diskfulltest gives tests a disk that fills on demand (Disk)
// and runs a test as a child process (Child): Pebble ends the process
// that hits ENOSPC on its write-ahead log, so what a full disk does to a
// store is seen from outside it.
package diskfulltest

import (
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Disk is a memory file system that can be made full: then every write
// fails with ENOSPC and GetDiskUsage reports no free byte, as a real
// disk does.
type Disk struct {
	mem  *vfs.MemFS
	full atomic.Bool
}

// New is an empty disk with room.
func New() *Disk {
	d := &Disk{mem: vfs.NewMem()}
	d.SetFull(false)
	return d
}

// SetFull fills the disk, or frees it.
func (d *Disk) SetFull(full bool) {
	d.full.Store(full)
	u := vfs.DiskUsage{AvailBytes: 1 << 40, TotalBytes: 1 << 40}
	if full {
		u = vfs.DiskUsage{TotalBytes: 1 << 40, UsedBytes: 1 << 40}
	}
	d.mem.TestingSetDiskUsage(u)
}

// Full says whether the disk is full.
func (d *Disk) Full() bool { return d.full.Load() }

// FS is the disk's file system.
func (d *Disk) FS() vfs.FS {
	return errorfs.Wrap(d.mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFilePreallocate:
			if d.full.Load() {
				return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
			}
		}
		return nil
	}))
}

// Child runs the test named test of this test binary as a child
// process with env set to 1 (the child skips without it) and fails t
// unless its output holds every line of want, in any order, and it
// passed.
func Child(t *testing.T, test, env string, want ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v=false")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Fatalf("child (%v) did not print %q:\n%s", err, w, out)
		}
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
