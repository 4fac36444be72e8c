package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// residentSST is the bytes of dir's table files in the page cache
// (mincore over a read-only mapping of each).
func residentSST(t *testing.T, dir string) int64 {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	var total int64
	page := int64(os.Getpagesize())
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		if st.Size() == 0 {
			f.Close()
			continue
		}
		b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		vec := make([]byte, (st.Size()+page-1)/page)
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatal(errno)
		}
		unix.Munmap(b)
		for _, v := range vec {
			if v&1 != 0 {
				total += page
			}
		}
	}
	return total
}

// dropAll evicts dir's table files from the page cache.
func dropAll(t *testing.T, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		unix.Fdatasync(int(f.Fd()))
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}

// TestDropBehind reads every row of a table through the miss path (no hot
// tier) from a store on disk whose table pages were dropped first, in
// three modes: buffered (the control: the pages stay in the page cache,
// so the test can fail), drop-behind (buffered reads, pages dropped
// after each) and direct (O_DIRECT). In each the rows come back right;
// with drop-behind and direct reads the pages do not stay, and only
// direct reads count as such.
func TestDropBehind(t *testing.T) {
	tabs := []*testTable{{name: "t", rows: 20000, dim: 16, seed: 5}}
	plan := writePlan(t, "m", tabs)
	for _, mode := range []struct {
		name         string
		drop, direct bool
	}{{"buffered", false, false}, {"drop-behind", true, false}, {"direct", true, true}} {
		dir := filepath.Join(t.TempDir(), "db")
		s, err := Open(dir, &Options{FS: vfs.Default, HotBytes: -1, CacheBytes: 1 << 20, Preload: PreloadOff, DropBehind: mode.drop, DirectReads: mode.direct})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Ingest(context.Background(), plan, IngestOptions{}); err != nil {
			t.Fatal(err)
		}
		dropAll(t, dir)
		if r := residentSST(t, dir); r > 64<<10 {
			s.Close()
			t.Skipf("this file system keeps %d bytes of the dropped table files resident (tmpfs?): nothing to measure", r)
		}
		ids := make([]int64, tabs[0].rows)
		for i := range ids {
			ids[i] = int64(i)
		}
		for start := 0; start < len(ids); start += 2000 {
			l := TableLookup{Table: "t", IDs: ids[start : start+2000], Bag: 1, Pooling: PoolNone, Out: make([]float32, 2000*16)}
			if err := s.Lookup("m", []TableLookup{l}); err != nil {
				t.Fatal(err)
			}
			for i := range 2000 {
				row := tabs[0].data[(start+i)*16 : (start+i+1)*16]
				for k, v := range row {
					if l.Out[i*16+k] != v {
						t.Fatalf("%s: row %d col %d = %v, want %v", mode.name, start+i, k, l.Out[i*16+k], v)
					}
				}
			}
		}
		r := residentSST(t, dir)
		direct := s.Metrics().DirectReads
		s.Close()
		t.Logf("%s: %d KiB of table files resident after reading %d rows, %d direct reads", mode.name, r>>10, len(ids), direct)
		switch {
		case mode.drop && r > 256<<10:
			t.Errorf("%s: %d KiB of table files stayed in the page cache", mode.name, r>>10)
		case !mode.drop && r < 1<<20:
			t.Errorf("without drop-behind only %d KiB stayed resident: the control reads nothing into the page cache", r>>10)
		case mode.direct && direct == 0:
			t.Errorf("direct: no read went past the page cache")
		case !mode.direct && direct != 0:
			t.Errorf("%s: %d direct reads without DirectReads", mode.name, direct)
		}
	}
}

// TestDropBehindPreload: a preload under DropBehind (and DirectReads, as
// an embedding worker under a memory budget opens its store) scans with Pebble's
// readahead on and leaves it off for the lookups after it; the rows it
// loads are right and their pages leave the page cache.
func TestDropBehindPreload(t *testing.T) {
	tabs := []*testTable{{name: "t", rows: 20000, dim: 16, seed: 6}}
	plan := writePlan(t, "m", tabs)
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, &Options{FS: vfs.Default, HotBytesAutoMax: 64 << 20, CacheBytes: 1 << 20, Preload: PreloadAuto, DropBehind: true, DirectReads: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc := s.popts.Local.ReadaheadConfig
	if rc.Speculative() != objstorageprovider.NoReadahead {
		t.Fatalf("after Open: speculative readahead %v, want off", rc.Speculative())
	}
	if _, err := s.Ingest(context.Background(), plan, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if pr := s.Preloaded(); pr.Rows != tabs[0].rows {
		t.Fatalf("preloaded %d rows, want %d", pr.Rows, tabs[0].rows)
	}
	if rc.Speculative() != objstorageprovider.NoReadahead {
		t.Fatalf("after the preload: speculative readahead %v, want off again", rc.Speculative())
	}
	if r := residentSST(t, dir); r > 256<<10 {
		t.Errorf("%d KiB of table files resident after the preload", r>>10)
	}
	l := TableLookup{Table: "t", IDs: []int64{0, 19999, 777}, Bag: 1, Pooling: PoolNone, Out: make([]float32, 3*16)}
	if err := s.Lookup("m", []TableLookup{l}); err != nil {
		t.Fatal(err)
	}
	for i, id := range l.IDs {
		for k := range 16 {
			if got, want := l.Out[i*16+k], tabs[0].data[int(id)*16+k]; got != want {
				t.Fatalf("row %d col %d = %v, want %v", id, k, got, want)
			}
		}
	}
}
