package tablefile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/tablefile"
)

// goodTable is the bytes of a small valid table file (rows x dim).
func goodTable(tb testing.TB, rows, dim int) []byte {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "t.arrow")
	if _, err := tablefile.Write(path, "t", dim, table(rows, dim), nil); err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzOpen opens arbitrary bytes as a table file and reads every row as
// the store's ingest and partitioner/verify do (Batch, Verify, ReadAll).
// A file that opens must hold what its metadata says (rows x dim values,
// batch by batch, every batch readable again); any other file is an error, never a panic or a read
// outside the mapping.
func FuzzOpen(f *testing.F) {
	good := goodTable(f, 5, 4)
	f.Add(good)
	f.Add(goodTable(f, 0, 3))
	f.Add(good[:len(good)-10])
	f.Add(good[:len(good)/2])
	f.Add([]byte("ARROW1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "t.arrow")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		tab, err := tablefile.Open(path)
		if err != nil {
			return
		}
		defer tab.Close()
		if tab.Dim <= 0 || tab.Rows < 0 {
			t.Fatalf("opened a table of %d x %d", tab.Rows, tab.Dim)
		}
		var rows int64
		for i := range tab.NumBatches() {
			first, vals, err := tab.Batch(i)
			if err != nil {
				// Open read every batch: one it read, it reads again.
				t.Fatalf("batch %d of a table that opened: %v", i, err)
			}
			if first != rows || len(vals)%tab.Dim != 0 {
				t.Fatalf("batch %d: first row %d (want %d), %d values of width %d", i, first, rows, len(vals), tab.Dim)
			}
			for _, v := range vals { // touch every value: no read outside the mapping
				_ = v
			}
			rows += int64(len(vals) / tab.Dim)
		}
		if rows != tab.Rows {
			t.Fatalf("batches hold %d rows, metadata says %d", rows, tab.Rows)
		}
		if _, _, err := tab.Batch(tab.NumBatches()); err == nil {
			t.Fatal("batch past the end: no error")
		}
		if _, _, err := tab.Batch(-1); err == nil {
			t.Fatal("batch -1: no error")
		}
		tab.Verify()
		if all, err := tab.ReadAll(); err != nil || int64(len(all)) != tab.Rows*int64(tab.Dim) {
			t.Fatalf("ReadAll: %d values (%v), metadata says %d x %d", len(all), err, tab.Rows, tab.Dim)
		}
	})
}
