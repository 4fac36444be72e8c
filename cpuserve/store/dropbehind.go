package store

import (
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// dropBehindFS opens the store's table files (.sst) so that what a read
// brings into the kernel's page cache leaves it again once read
// (Options.DropBehind): the rows a lookup reads go to the hot tier, the
// blocks to Pebble's block cache, and a third copy in the page cache,
// charged to the process's memory cgroup, only crowds its limit. Seen in
// scripts/bench-ltm-e2e.sh: a worker in a 768 MiB group held 313 MiB of
// table pages after its hot tier had warmed up, and every later
// allocation waited on the kernel reclaiming them (BENCHMARKS.md).
type dropBehindFS struct{ vfs.FS }

func (fs dropBehindFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil || !strings.HasSuffix(name, ".sst") || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	return dropBehindFile{File: f, fd: int(f.Fd())}, nil
}

// Unwrap is the file system underneath (vfs.Root).
func (fs dropBehindFS) Unwrap() vfs.FS { return fs.FS }

// pageSize is the kernel's page size (os.Getpagesize), a power of two.
var pageSize = int64(os.Getpagesize())

type dropBehindFile struct {
	vfs.File
	fd int
}

func (f dropBehindFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if n > 0 {
		// The kernel drops only whole pages inside the range, and a 4 KiB
		// block seldom starts on a page: round out to the pages it
		// touches (a neighbouring block's bytes go too; the block cache
		// holds the recent ones).
		start := off &^ (pageSize - 1)
		end := (off + int64(n) + pageSize - 1) &^ (pageSize - 1)
		dropPages(f.fd, start, end-start)
	}
	return n, err
}
