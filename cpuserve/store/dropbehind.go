package store

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"

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
//
// With direct set (Options.DirectReads), a table file's random reads
// skip the page cache altogether (O_DIRECT, Linux; direct_linux.go): no
// page is allocated, charged, read into and dropped again per block, and
// a lookup's missed row costs one device read into a buffer of the
// process. What Pebble reads in sequence still goes through the page
// cache and its readahead, then drops behind: a file opened with
// vfs.SequentialReadsOption (compactions, a preload's scans past their
// first blocks) and a range Pebble has asked to be read ahead (Prefetch).
// A file system that refuses O_DIRECT (tmpfs) keeps buffered reads.
type dropBehindFS struct {
	vfs.FS
	direct bool
	// reads counts the reads served with O_DIRECT (Metrics.DirectReads).
	reads *atomic.Int64
}

func (fs dropBehindFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil || !strings.HasSuffix(name, ".sst") || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	df := &dropBehindFile{File: f, fd: int(f.Fd()), direct: -1, reads: fs.reads}
	if fs.direct {
		df.direct = openDirect(name)
		if df.direct >= 0 && sequential(opts) {
			df.win = &window{}
		}
	}
	return df, nil
}

// sequential reports whether a file is opened for sequential reads.
func sequential(opts []vfs.OpenOption) bool {
	for _, o := range opts {
		if o == vfs.SequentialReadsOption {
			return true
		}
	}
	return false
}

// Unwrap is the file system underneath (vfs.Root).
func (fs dropBehindFS) Unwrap() vfs.FS { return fs.FS }

// pageSize is the kernel's page size (os.Getpagesize), a power of two.
var pageSize = int64(os.Getpagesize())

type dropBehindFile struct {
	vfs.File
	fd int
	// direct is a second descriptor of the file opened with O_DIRECT
	// (-1: none, or direct reads failed and were given up).
	direct int
	// ahead is the range [0] to [1] Pebble last asked to read ahead
	// (Prefetch): reads in it are served by the page cache.
	ahead atomic.Pointer[[2]int64]
	// directOff is set when a direct read failed for a reason other
	// than the device (the file system's alignment rules): the file
	// reads buffered from then on.
	directOff atomic.Bool
	// reads counts the reads served with O_DIRECT.
	reads *atomic.Int64
	// win, for a file opened for sequential reads with O_DIRECT at hand,
	// is the window of the file read ahead into process memory.
	win *window
}

// errDirectRefused: the file system refused a direct read.
var errDirectRefused = errors.New("store: direct read refused")

// maxDirectRead is the largest read served with O_DIRECT: a lookup reads
// one 4 KiB data block (two pages with its trailer) or an index block;
// anything larger is a scan's, which readahead serves better.
const maxDirectRead = 256 << 10

func (f *dropBehindFile) ReadAt(p []byte, off int64) (int, error) {
	if f.win != nil {
		if n, err, ok := f.readWindow(p, off); ok {
			return n, err
		}
	}
	if f.direct >= 0 && len(p) <= maxDirectRead && !f.directOff.Load() && !f.readAhead(off, len(p)) {
		n, err := readDirect(f.direct, p, off)
		if err != errDirectRefused {
			f.reads.Add(1)
			return n, err
		}
		f.directOff.Store(true)
	}
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

// readAhead reports whether [off, off+n) lies in the range last read
// ahead.
func (f *dropBehindFile) readAhead(off int64, n int) bool {
	r := f.ahead.Load()
	return r != nil && off >= r[0] && off+int64(n) <= r[1]
}

// Prefetch reads ahead through the page cache, and with direct reads
// marks the range so that its reads come from there.
func (f *dropBehindFile) Prefetch(off, n int64) error {
	if f.direct >= 0 {
		f.ahead.Store(&[2]int64{off, off + n})
	}
	return f.File.Prefetch(off, n)
}

func (f *dropBehindFile) Close() error {
	if f.win != nil {
		f.win.close()
	}
	if f.direct >= 0 {
		closeDirect(f.direct)
		f.direct = -1
	}
	return f.File.Close()
}
