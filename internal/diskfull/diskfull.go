// Package diskfull keeps a Pebble folder working on a full disk: a
// write is refused before it begins when the disk lacks room for it and
// a memtable flush (Room), and Pebble's own writes that hit ENOSPC wait
// before their retry instead of spinning (Wait). Pebble ends the process
// when a write to its write-ahead log fails ("fatal commit error"), and
// retries a failed flush or compaction at once, without end: a worker or
// router then died at its first write once the disk filled, and
// restarted it spun a core in Open, logging thousands of lines a second,
// until space was freed.
package diskfull

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/flagval"
)

// Room returns an error wrapping cause when the disk of dir (on fs) has
// less free than n bytes and reserve (the memtable's flush) together,
// naming what (the store, the update log), and nil otherwise: the caller
// refuses the write. A file system that cannot say its free space (an
// in-memory one) is not checked.
func Room(fs vfs.FS, dir, what string, n int, reserve uint64, cause error) error {
	u, err := fs.GetDiskUsage(dir)
	if err != nil {
		return nil
	}
	need := uint64(n) + reserve
	if u.AvailBytes >= need {
		return nil
	}
	return fmt.Errorf("%s %q: %s free on its disk, below the %s a write of %s needs with room to flush the memtable; free disk space and retry: %w",
		what, dir, flagval.FormatBytes(int64(u.AvailBytes)), flagval.FormatBytes(int64(need)), flagval.FormatBytes(int64(n)), cause)
}

// Pause is how long writes wait after one failed for a full disk,
// before it is tried again.
const Pause = time.Second

// Wait wraps fs so that a write failing with ENOSPC waits (every write
// does meanwhile: vfs.OnDiskFull) and is tried once more: Pause while
// the disk has less than reserve free (the caller refuses its own writes
// then anyway), a twentieth of it while it has more (a compaction larger
// than the space left, which should not hold up writes long). logf says
// why, once a minute.
func Wait(fs vfs.FS, dir, what string, reserve uint64, logf func(format string, args ...any)) vfs.FS {
	var last time.Time
	return vfs.OnDiskFull(fs, func() {
		// Called by one write at a time.
		pause := Pause
		if u, err := fs.GetDiskUsage(dir); err == nil && u.AvailBytes >= reserve {
			pause /= 20
		}
		if time.Since(last) > time.Minute {
			last = time.Now()
			logf("%s %q: its disk is full (no space left on device): writes are retried every %v until space is freed", what, dir, pause)
		}
		time.Sleep(pause)
	})
}
