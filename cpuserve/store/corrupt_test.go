package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/pebblecheck"
)

// recLogger is an Options.Logger that keeps its Errorf lines.
type recLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *recLogger) Infof(string, ...any) {}
func (l *recLogger) Errorf(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(f, a...))
}
func (l *recLogger) Fatalf(f string, a ...any) { l.Errorf("fatal: "+f, a...) }

func (l *recLogger) count(sub ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		all := true
		for _, s := range sub {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// TestCorruptTableFile damages the table file (SST) holding one table's
// rows, as bit rot or a torn write would, and opens the store again: it
// opens (before, Pebble's corruption report ended the process at the
// open's first read of the damaged block, so the worker never served
// again), serves every intact row exactly, refuses the damaged ones with
// ErrCorrupt naming the file (never a wrong row, not from the hot tier
// either, not on a second ask), logs the file once and counts the reads.
func TestCorruptTableFile(t *testing.T) {
	a := &testTable{name: "a", rows: 3000, dim: 16, seed: 1}
	b := &testTable{name: "b", rows: 500, dim: 16, seed: 2}
	pl := writePlan(t, "m", []*testTable{a, b})
	for _, tc := range []struct {
		name     string
		hotBytes int64
		damage   func(t *testing.T, path string, size int64)
		// maxBad is the most rows of a the damage may cost; 0: the
		// store is refused at open, the error naming the file and
		// what to do.
		maxBad int64
	}{
		{"flip/hot", 0, flipByte, 200},
		{"flip/nohot", -1, flipByte, 200},
		{"flip/smallhot", 16 << 10, flipByte, 200},
		{"truncate", 0, truncateHalf, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			s, err := Open(dir, &Options{FS: vfs.Default, HotBytes: tc.hotBytes})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(context.Background(), pl, IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			file, size := sstOf(t, s, "m", "a")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, filepath.Join(dir, file), size)

			log := &recLogger{}
			var heard []string
			var heardMu sync.Mutex
			onDamage := func(path string) { heardMu.Lock(); heard = append(heard, path); heardMu.Unlock() }
			s, err = Open(dir, &Options{FS: vfs.Default, HotBytes: tc.hotBytes, Logger: log, OnDamage: onDamage})
			if tc.maxBad == 0 {
				if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "prism store copy") {
					t.Fatalf("open of a store with a damaged %s: %v, want a refusal naming the file and the mend", file, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open of a store with a damaged %s: %v", file, err)
			}
			defer s.Close()
			var bad []int64
			for round := range 2 {
				var badNow []int64
				for _, tt := range []*testTable{a, b} {
					for id := range tt.rows {
						req := TableLookup{Table: tt.name, IDs: []int64{id}, Bag: 1, Pooling: PoolSum, Out: make([]float32, tt.dim)}
						err := s.Lookup("m", []TableLookup{req})
						if err != nil {
							if tt == b || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) {
								t.Fatalf("round %d: table %s row %d: %v (want ErrCorrupt naming %s, and only for table a)", round, tt.name, id, err, file)
							}
							badNow = append(badNow, id)
							continue
						}
						if want := refPool(tt, req); !slices.Equal(req.Out, want) {
							t.Fatalf("round %d: table %s row %d: served %v, stored %v", round, tt.name, id, req.Out, want)
						}
					}
				}
				if round == 1 && !slices.Equal(bad, badNow) {
					t.Fatalf("refused rows %v, then %v", bad, badNow)
				}
				bad = badNow
			}
			if len(bad) == 0 || int64(len(bad)) > tc.maxBad {
				t.Fatalf("%d rows of %d refused, want 1 to %d", len(bad), a.rows, tc.maxBad)
			}
			if m := s.Metrics(); m.Corruptions < int64(len(bad)) {
				t.Errorf("%d corrupt reads counted, want at least the %d rows refused", m.Corruptions, len(bad))
			}
			heardMu.Lock()
			defer heardMu.Unlock()
			if len(heard) != 1 || !strings.HasSuffix(heard[0], file) || !strings.HasSuffix(s.Damaged(), file) {
				t.Errorf("OnDamage heard %q, Damaged() = %q; want %s once", heard, s.Damaged(), file)
			}
			if n := log.count(file, "is damaged", "holding rows of", "m/a"); n != 1 {
				t.Errorf("%d log lines name %s as damaged, want 1: %q", n, file, log.lines)
			}
			if n := log.count("fatal"); n != 0 {
				t.Errorf("Fatalf called: %q", log.lines)
			}
		})
	}
}

// sstOf returns the name and size of the one table file holding the
// rows of model's table.
func sstOf(t *testing.T, s *Store, model, table string) (string, int64) {
	t.Helper()
	tv := s.view.Load().models[model].tables[table]
	levels, err := s.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	var size int64
	for _, l := range levels {
		for _, f := range l {
			if len(f.Smallest.UserKey) >= 4 && len(f.Largest.UserKey) >= 4 &&
				keyTable(f.Smallest.UserKey) == tv.id && keyTable(f.Largest.UserKey) == tv.id {
				found = append(found, fmt.Sprintf("%06d.sst", f.FileNum))
				size = int64(f.Size)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("table %s (physical %d) is in table files %v, want one", table, tv.id, found)
	}
	return found[0], size
}

func keyTable(k []byte) uint32 {
	return uint32(k[0])<<24 | uint32(k[1])<<16 | uint32(k[2])<<8 | uint32(k[3])
}

// flipByte inverts the byte in the middle of the file: a data block's.
func flipByte(t *testing.T, path string, size int64) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], size/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], size/2); err != nil {
		t.Fatal(err)
	}
}

// truncateHalf cuts the file to half its size: a torn copy.
func truncateHalf(t *testing.T, path string, size int64) {
	if err := os.Truncate(path, size/2); err != nil {
		t.Fatal(err)
	}
}

// TestLostManifestMarker deletes the marker of a store's current
// MANIFEST (Pebble's CURRENT), as a damaged directory or an operator's
// clean-up would. Open refuses the folder, naming what is missing and
// the mend, and leaves every file of the store in place; before, Pebble
// opened it as no store, started an empty one over it and deleted the
// table files, and a serving worker given its plan ingested it again:
// the updates made since were lost without a word.
func TestLostManifestMarker(t *testing.T) {
	a := &testTable{name: "a", rows: 300, dim: 4, seed: 1}
	pl := writePlan(t, "m", []*testTable{a})
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, &Options{FS: vfs.Default, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), pl, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{7}, fill(4, 9), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	markers, _ := filepath.Glob(filepath.Join(dir, "marker.manifest.*"))
	if len(markers) != 1 {
		t.Fatalf("manifest markers %v, want one", markers)
	}
	if err := os.Remove(markers[0]); err != nil {
		t.Fatal(err)
	}
	before, _ := filepath.Glob(filepath.Join(dir, "*"))
	// Read-only too (storecopy's inspect of a received copy): it said
	// "no store there (prism ingest makes one)".
	for _, o := range []*Options{{FS: vfs.Default, HotBytes: -1}, {FS: vfs.Default, HotBytes: -1, MustExist: true}, {FS: vfs.Default, HotBytes: -1, MustExist: true, ReadOnly: true}} {
		s, err := Open(dir, o)
		if err == nil {
			s.Close()
			t.Fatalf("MustExist %v ReadOnly %v: a store without its MANIFEST marker opened", o.MustExist, o.ReadOnly)
		}
		if !strings.Contains(err.Error(), "marker.manifest") || !strings.Contains(err.Error(), "prism store copy") {
			t.Errorf("MustExist %v ReadOnly %v: %v, want the marker named and the mend", o.MustExist, o.ReadOnly, err)
		}
		after, _ := filepath.Glob(filepath.Join(dir, "*"))
		if !slices.Equal(before, after) {
			t.Fatalf("MustExist %v ReadOnly %v: the store's files were %v, now %v", o.MustExist, o.ReadOnly, before, after)
		}
	}
	// The mend the error names opens the store, the update kept.
	if err := os.WriteFile(markers[0], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, &Options{FS: vfs.Default, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if seq, err := s.AppliedSeq("m"); err != nil || seq != 1 {
		t.Fatalf("applied seq %d, %v after the marker was put back, want 1", seq, err)
	}
}

// TestDamagedManifest damages the store's current MANIFEST: a byte of
// an early record flipped (bit rot; records that check follow it) and
// its last record cut short (the torn tail a crash leaves). Pebble reads
// a MANIFEST up to its first bad record either way; opened after the
// flip, it forgot the table files the later records add and deleted
// them, and the store served without those tables' rows, the catalog
// from before, nothing said. The flip is now refused, naming the file,
// with every file left in place; the torn tail opens as before.
func TestDamagedManifest(t *testing.T) {
	var tables []*testTable
	for i := range 8 {
		tables = append(tables, &testTable{name: fmt.Sprintf("t%d", i), rows: 200, dim: 4, seed: uint64(i + 1)})
	}
	pl := writePlan(t, "m", tables)
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, size int64)
		refuse bool
	}{
		{"flip", func(t *testing.T, path string, size int64) { flipAt(t, path, size/3) }, true},
		{"torn-tail", func(t *testing.T, path string, size int64) {
			if err := os.Truncate(path, size-3); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			s, err := Open(dir, &Options{FS: vfs.Default, HotBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(context.Background(), pl, IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			name := pebblecheck.CurrentManifest(vfs.Default, dir)
			path := filepath.Join(dir, name)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path, st.Size())
			before, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			// Read-only (storecopy's inspect of a received copy, which
			// decides whether the copy is taken): it opened the store as
			// of the bad record, the later tables' models and updates
			// missing, nothing said.
			if ro, err := Open(dir, &Options{FS: vfs.Default, HotBytes: -1, MustExist: true, ReadOnly: true}); tc.refuse && err == nil {
				n := len(ro.Models())
				ro.Close()
				t.Fatalf("read-only, a store with a damaged %s opened (models %d)", name, n)
			} else if !tc.refuse && err != nil {
				t.Fatalf("read-only open after a torn last MANIFEST record: %v", err)
			} else if err == nil {
				ro.Close()
			}
			s, err = Open(dir, &Options{FS: vfs.Default, HotBytes: -1})
			if !tc.refuse {
				if err != nil {
					t.Fatalf("open after a torn last MANIFEST record: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				after, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
				t.Fatalf("a store with a damaged %s opened (table files %d before, %d after)", name, len(before), len(after))
			}
			if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "prism store copy") {
				t.Errorf("%v: want %s named and the mend", err, name)
			}
			if after, _ := filepath.Glob(filepath.Join(dir, "*.sst")); !slices.Equal(before, after) {
				t.Errorf("table files %v, then %v", before, after)
			}
		})
	}
}

func flipAt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}
