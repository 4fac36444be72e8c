package router

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestUpdateLogLostMarker deletes the marker of the update log's
// current MANIFEST (Pebble's CURRENT), as a damaged directory or an
// operator's clean-up would. The log is refused, naming what is missing
// and the mend, its files left in place; before, Pebble opened the
// folder as no database, started an empty log over it and deleted its
// files: the router came up with only what a recycled write-ahead log
// still held (here update 3 of 3, its floor moved to 2), updates it
// had acknowledged gone, nothing said.
func TestUpdateLogLostMarker(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, err := openUpdateLog(dir, vfs.Default)
	if err != nil {
		t.Fatal(err)
	}
	// Three updates, each flushed to a table file as a log past its
	// 4 MiB memtable is.
	for seq := int64(1); seq <= 3; seq++ {
		entry := &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}}
		if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &logChange{Next: seq, Committed: seq, Entry: entry}}}); err != nil {
			t.Fatal(err)
		}
		if err := l.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
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
	l, err = openUpdateLog(dir, vfs.Default)
	if err == nil {
		got, _ := l.load()
		l.Close()
		t.Fatalf("an update log without its MANIFEST marker opened, holding %+v", got)
	}
	if !strings.Contains(err.Error(), "marker.manifest") || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("%v: want the marker named and the mend", err)
	}
	if after, _ := filepath.Glob(filepath.Join(dir, "*")); !slices.Equal(before, after) {
		t.Fatalf("the log's files were %v, now %v", before, after)
	}
	// Put back, the log holds every update.
	if err := os.WriteFile(markers[0], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err = openUpdateLog(dir, vfs.Default); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, err := l.load()
	if err != nil || len(got) != 1 || got[0].next != 3 || len(got[0].log) != 3 {
		t.Fatalf("read back %+v, %v; want model m at 3 with its 3 entries", got, err)
	}
}

// TestUpdateLogDamagedTable damages a block of the update log's table
// file, as bit rot would: the router refuses to start on it, naming
// the file and what to do (before, the restore's read of the block took
// Pebble's default, the logger's Fatalf, and the router exited at every
// start with Pebble's message).
func TestUpdateLogDamagedTable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, err := openUpdateLog(dir, vfs.Default)
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		entry := &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}}
		if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &logChange{Next: seq, Committed: seq, Entry: entry}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ssts, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(ssts) != 1 {
		t.Fatalf("table files %v, want one", ssts)
	}
	b, err := os.ReadFile(ssts[0])
	if err != nil {
		t.Fatal(err)
	}
	b[10] ^= 0x5a // in the first data block
	if err := os.WriteFile(ssts[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = openUpdateLog(dir, vfs.Default)
	if err == nil {
		got, lerr := l.load()
		l.Close()
		t.Fatalf("an update log with a damaged table file opened; load: %+v, %v", got, lerr)
	}
	if !strings.Contains(err.Error(), filepath.Base(ssts[0])) || !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("%v: want the file named and the mend", err)
	}
}
