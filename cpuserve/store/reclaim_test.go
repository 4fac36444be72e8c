package store

import (
	"context"
	"errors"
	iofs "io/fs"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// sstBytes sums the sizes of the table files in the store folder "db" of
// fs: the disk an operator sees the store take beside its logs.
func sstBytes(t *testing.T, fs vfs.FS) int64 {
	t.Helper()
	names, err := fs.List("db")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, name := range names {
		if !strings.HasSuffix(name, ".sst") {
			continue
		}
		fi, err := fs.Stat(fs.PathJoin("db", name))
		if errors.Is(err, iofs.ErrNotExist) {
			continue // deleted since the listing: Pebble drops the files moments after the compaction
		}
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// TestDropVersionReclaimsDisk: once DropVersion returns (prism store
// versions --drop, which closes the store right after), the dropped
// version's table files are gone from the folder. Before, its rows were
// deleted by range tombstones left in the memtable: the files stayed
// until the store was next opened and its write-ahead log replayed and
// flushed, so the command that was run to free disk freed none (a 131
// MiB version: du 366 MB before and after the drop, 147 MB only after
// the next open).
func TestDropVersionReclaimsDisk(t *testing.T) {
	ctx := context.Background()
	mk := func(seed uint64) []*testTable {
		return []*testTable{{name: "a", rows: 20000, dim: 16, seed: seed}, {name: "b", rows: 20000, dim: 16, seed: seed + 1}}
	}
	const version = 2 * 20000 * 16 * 4 // bytes of one version's rows
	for _, tc := range []struct {
		name  string
		close bool // measured after Close, as the command leaves it
	}{{"open", false}, {"closed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s, err := Open("db", &Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, seed := range []uint64{1, 11} {
				if _, err := s.Ingest(ctx, writePlan(t, "m", mk(seed)), IngestOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			before := sstBytes(t, fs)
			if before < 2*version {
				t.Fatalf("two versions take %d bytes of table files, want at least %d", before, 2*version)
			}
			if err := s.DropVersion(ctx, "m", 1); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// Pebble deletes the files it compacted away moments after
			// the compaction (at once on Close).
			after := sstBytes(t, fs)
			for deadline := time.Now().Add(5 * time.Second); before-after < version*9/10 && time.Now().Before(deadline); after = sstBytes(t, fs) {
				time.Sleep(10 * time.Millisecond)
			}
			if freed := before - after; freed < version*9/10 {
				t.Errorf("dropping a version of %d bytes freed %d bytes of table files (%d -> %d)", version, freed, before, after)
			}
		})
	}
}
