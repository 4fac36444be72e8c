package store

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestStressWindow: several sequential and random files, read at once
// from several goroutines, opened and closed over and over: every read
// gives the file's bytes (no pooled buffer shared while in use).
func TestStressWindow(t *testing.T) {
	_, _, _ = directFile(t, 4096)
	dir := t.TempDir()
	var files []string
	var datas [][]byte
	for i := range 3 {
		n := 2<<20 + i*777
		data := make([]byte, n)
		r := rand.New(rand.NewPCG(uint64(i), 2))
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		name := filepath.Join(dir, string(rune('a'+i))+".sst")
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
		datas = append(datas, data)
	}
	var reads atomic.Int64
	fs := dropBehindFS{FS: vfs.Default, direct: true, reads: &reads}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for round := range 6 {
				fi := (g + round) % 3
				data := datas[fi]
				opt := vfs.SequentialReadsOption
				if g%3 == 2 {
					opt = vfs.RandomReadsOption
				}
				f, err := fs.Open(files[fi], opt)
				if err != nil {
					t.Error(err)
					return
				}
				var inner sync.WaitGroup
				for k := range 2 {
					inner.Add(1)
					go func() {
						defer inner.Done()
						rr := rand.New(rand.NewPCG(uint64(g*100+round*10+k), 4))
						off := rr.IntN(len(data) / 2)
						for range 400 {
							n := 1 + rr.IntN(8192)
							if rr.IntN(8) == 0 {
								off = rr.IntN(len(data))
							}
							n = min(n, len(data)-off)
							if n <= 0 {
								off = 0
								continue
							}
							p := make([]byte, n)
							m, err := f.ReadAt(p, int64(off))
							if m != n || (err != nil && err != io.EOF) {
								t.Errorf("read at %d: %d of %d, %v", off, m, n, err)
								return
							}
							if !bytes.Equal(p, data[off:off+n]) {
								t.Errorf("file %d read of %d at %d: bytes differ", fi, n, off)
								return
							}
							off += n
						}
					}()
				}
				inner.Wait()
				f.Close()
				_ = r
			}
		}()
	}
	wg.Wait()
	t.Logf("%d direct reads", reads.Load())
}
