package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/flagval"
)

// ErrDiskFull is a write refused before it began: the store's disk has
// too little room for it (Store.room). Nothing was written; the same
// write succeeds once space is freed.
var ErrDiskFull = errors.New("disk full")

// room refuses a write of n bytes to the write-ahead log when the
// store's disk lacks room for it and for a flush of the memtable. Pebble
// ends the process when a write to its log fails ("fatal commit error":
// a worker serving reads died at its first update once the disk filled),
// and a store reopened over a log it cannot flush waits in Open until
// space is freed. Refused here, the write alone fails and the store goes
// on serving reads. A file system that cannot say its free space is not
// checked; nor is a write that frees disk (a drop), which must stay
// possible.
func (s *Store) room(n int) error {
	u, err := s.popts.FS.GetDiskUsage(s.dir)
	if err != nil {
		return nil
	}
	need := uint64(n) + s.opts.MemTableBytes
	if u.AvailBytes >= need {
		return nil
	}
	return fmt.Errorf("store %q: %s free on its disk, below the %s a write of %s needs with room to flush the memtable; free disk space and retry: %w",
		s.dir, flagval.FormatBytes(int64(u.AvailBytes)), flagval.FormatBytes(int64(need)), flagval.FormatBytes(int64(n)), ErrDiskFull)
}

// diskFullPause is how long writes wait after one failed for a full
// disk, before it is tried again.
const diskFullPause = time.Second

// waitWhenFull wraps fs so that a write failing with ENOSPC waits
// (every write does meanwhile) and is tried once more: diskFullPause
// while the disk has less than reserve free (the store refuses updates
// then anyway), a twentieth of it while it has more (a compaction
// larger than the space left, which should not hold up updates long).
// Pebble retries a failed flush or compaction at once, without end:
// reopened over a write-ahead log on a full disk, Open spun a core and
// logged thousands of lines a second until space was freed; so did a
// drop's compaction (prism store versions --drop, run to free disk).
// They now retry at most once per pause, and go on once space is freed.
func waitWhenFull(fs vfs.FS, dir string, logger pebble.Logger, reserve uint64) vfs.FS {
	var last time.Time
	return vfs.OnDiskFull(fs, func() {
		// Called by one write at a time.
		pause := diskFullPause
		if u, err := fs.GetDiskUsage(dir); err == nil && u.AvailBytes >= reserve {
			pause /= 20
		}
		if time.Since(last) > time.Minute {
			last = time.Now()
			logger.Errorf("store %q: its disk is full (no space left on device): writes are retried every %v until space is freed", dir, pause)
		}
		time.Sleep(pause)
	})
}
