package store

import (
	"errors"

	"github.com/prism-serve/prism/internal/diskfull"
)

// ErrDiskFull is a write refused before it began: the store's disk has
// too little room for it (Store.room). Nothing was written; the same
// write succeeds once space is freed.
var ErrDiskFull = errors.New("disk full")

// room refuses a write of n bytes to the write-ahead log when the
// store's disk lacks room for it and for a flush of the memtable
// (diskfull.Room): Pebble would end the process at the failed write
// (a worker serving reads died at its first update once the disk
// filled). Refused here, the write alone fails and the store goes on
// serving reads. A write that frees disk (a drop) is not checked: it
// must stay possible.
func (s *Store) room(n int) error {
	return diskfull.Room(s.popts.FS, s.dir, "store", n, s.opts.MemTableBytes, ErrDiskFull)
}
