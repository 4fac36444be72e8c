package store

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// directFile writes n bytes of a pattern to a file on disk and opens it
// with O_DIRECT; the test is skipped where the file system refuses it.
func directFile(t *testing.T, n int) (name string, data []byte, fd int) {
	t.Helper()
	data = make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	name = filepath.Join(t.TempDir(), "000001.sst")
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fd = openDirect(name)
	if fd < 0 {
		t.Skipf("%s: the file system refuses O_DIRECT", filepath.Dir(name))
	}
	t.Cleanup(func() { closeDirect(fd) })
	return name, data, fd
}

// TestReadDirect: reads at every alignment that matters, up to and past
// the end of the file, return what os.File.ReadAt returns.
func TestReadDirect(t *testing.T) {
	const size = 3*directAlign + 1000 // the last page is partial
	name, data, fd := directFile(t, size)
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		name string
		off  int64
		n    int
	}{
		{"aligned page", 0, directAlign},
		{"a block and trailer across two pages", 100, directAlign + 5},
		{"inside one page", 4100, 50},
		{"ends on a page", directAlign - 10, 10},
		{"three pages", 1, 2*directAlign + 2},
		{"to the end", 2 * directAlign, directAlign + 1000},
		{"past the end", 3*directAlign + 900, 200},
		{"starts at the end", size, 10},
		{"starts past the end", size + directAlign, 10},
		{"empty", 10, 0},
		{"the largest direct read", 7, maxDirectRead},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := make([]byte, c.n)
			wn, werr := f.ReadAt(want, c.off)
			got := make([]byte, c.n)
			gn, gerr := readDirect(fd, got, c.off)
			if gn != wn || !errors.Is(gerr, werr) && gerr != werr {
				t.Fatalf("readDirect = %d, %v; os.File.ReadAt = %d, %v", gn, gerr, wn, werr)
			}
			if !bytes.Equal(got[:gn], want[:wn]) {
				t.Fatalf("bytes differ")
			}
			if wn > 0 && !bytes.Equal(got[:gn], data[c.off:c.off+int64(gn)]) {
				t.Fatalf("bytes differ from the file's")
			}
		})
	}
}

// TestDirectFileModes: a table file opened for random reads reads past
// the page cache; one opened for sequential reads (compactions, scans),
// a range read ahead (Prefetch) and a read larger than maxDirectRead go
// buffered; every read returns the file's bytes.
func TestDirectFileModes(t *testing.T) {
	name, data, _ := directFile(t, maxDirectRead+4*directAlign)
	var reads atomic.Int64
	fs := dropBehindFS{FS: vfs.Default, direct: true, reads: &reads}
	// read reads n bytes at off through f, checks them against the
	// file's, and checks that direct reads now number direct.
	read := func(what string, f vfs.File, off int64, n int, direct int64) {
		t.Helper()
		p := make([]byte, n)
		if _, err := f.ReadAt(p, off); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if !bytes.Equal(p, data[off:off+int64(n)]) {
			t.Fatalf("%s: bytes differ", what)
		}
		if got := reads.Load(); got != direct {
			t.Fatalf("%s: %d direct reads in all, want %d", what, got, direct)
		}
	}
	f, err := fs.Open(name, vfs.RandomReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	read("a random read", f, 123, 4101, 1)
	read("a read larger than maxDirectRead", f, 0, maxDirectRead+1, 1)
	// Pebble ignores Prefetch's error (its Linux file returns errno 0 as
	// one), and so does this test.
	_ = f.Prefetch(8192, 65536)
	read("a read in the range read ahead", f, 8192+100, 4101, 1)
	read("a read past the range read ahead", f, 65536+8192+10, 4101, 2)
	g, err := fs.Open(name, vfs.SequentialReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// A file opened for sequential reads reads a window ahead: one read
	// for many blocks, doubling while the reads go on in order.
	read("a sequential file's first read", g, 5000, 4101, 3)
	read("the next block, in its window", g, 9101, 4101, 3)
	read("a read past the window (64 KiB)", g, 70000, 4101, 4)
	read("after it, in the doubled window", g, 70000+100000, 4101, 4)
	read("a jump back", g, 0, 100, 5)
	read("a read past the end of the file", g, int64(len(data))-10, 10, 6)
	// Every byte, in pieces of a block and a bit, from a fresh file: what
	// the windows give is the file, across their edges and its end.
	h, err := fs.Open(name, vfs.SequentialReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	before := reads.Load()
	for off := 0; off < len(data); off += 4101 {
		p := make([]byte, min(4101, len(data)-off))
		if n, err := h.ReadAt(p, int64(off)); n != len(p) || (err != nil && err != io.EOF) {
			t.Fatalf("sequential read at %d: %d bytes, %v", off, n, err)
		}
		if !bytes.Equal(p, data[off:off+len(p)]) {
			t.Fatalf("sequential read at %d: bytes differ", off)
		}
	}
	if n := reads.Load() - before; n > 4 {
		t.Fatalf("%d KiB read sequentially in %d reads, want at most 4 (windows of 64, 128, 256, 512 KiB)", len(data)>>10, n)
	}
	p := make([]byte, 100)
	if n, err := h.ReadAt(p, int64(len(data))+5); n != 0 || err != io.EOF {
		t.Fatalf("a read past the end: %d bytes, %v; want 0, EOF", n, err)
	}
}

// TestWindowScan: a file read in order through its window, past the size
// at which the next window is read in the background, and read at random
// from several goroutines at once, gives the file's bytes.
func TestWindowScan(t *testing.T) {
	name, data, _ := directFile(t, 3<<20+12345)
	var reads atomic.Int64
	fs := dropBehindFS{FS: vfs.Default, direct: true, reads: &reads}
	f, err := fs.Open(name, vfs.SequentialReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; off < len(data); off += 4101 {
		p := make([]byte, min(4101, len(data)-off))
		if n, err := f.ReadAt(p, int64(off)); n != len(p) || (err != nil && err != io.EOF) {
			t.Fatalf("read at %d: %d bytes, %v", off, n, err)
		}
		if !bytes.Equal(p, data[off:off+len(p)]) {
			t.Fatalf("read at %d: bytes differ", off)
		}
	}
	// 64 + 128 + 256 KiB, then 512 KiB windows: 9 reads for 3 MiB and a bit.
	if n := reads.Load(); n > 10 {
		t.Fatalf("%d reads for %d KiB in order", n, len(data)>>10)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 300 {
				off := r.IntN(len(data))
				n := min(1+r.IntN(8192), len(data)-off)
				if r.IntN(4) == 0 {
					n = min(4096, len(data)-off) // runs of blocks in order too
				}
				p := make([]byte, n)
				if m, err := f.ReadAt(p, int64(off)); m != n || (err != nil && err != io.EOF) {
					t.Errorf("read at %d: %d of %d bytes, %v", off, m, n, err)
					return
				}
				if !bytes.Equal(p, data[off:off+n]) {
					t.Errorf("read of %d at %d: bytes differ", n, off)
					return
				}
			}
		}()
	}
	wg.Wait()
}
