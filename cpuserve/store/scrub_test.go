package store

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestScrub: a damaged block no lookup has read (the hot tier off, the
// store just opened) is found by Scrub and reported as a read's damage
// is: logged naming the file and its tables, counted, Damaged, and
// OnDamage (the self-mend's cue); an intact store scrubs clean and
// records the pass.
func TestScrub(t *testing.T) {
	a := &testTable{name: "a", rows: 3000, dim: 16, seed: 1}
	b := &testTable{name: "b", rows: 500, dim: 16, seed: 2}
	pl := writePlan(t, "m", []*testTable{a, b})
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, &Options{FS: vfs.Default, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), pl, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Scrub(context.Background(), 0)
	if err != nil || len(rep.Damaged) > 0 || rep.Files == 0 || rep.Bytes == 0 {
		t.Fatalf("scrub of an intact store: %+v, %v", rep, err)
	}
	if m := s.Metrics(); m.LastScrub.IsZero() || m.ScrubbedBytes != rep.Bytes || m.Corruptions != 0 {
		t.Fatalf("metrics after a clean scrub: last %v, bytes %d (scrubbed %d), corruptions %d", m.LastScrub, m.ScrubbedBytes, rep.Bytes, m.Corruptions)
	}
	file, size := sstOf(t, s, "m", "a")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	flipByte(t, filepath.Join(dir, file), size)

	log := &recLogger{}
	var heard []string
	var mu sync.Mutex
	s, err = Open(dir, &Options{FS: vfs.Default, HotBytes: -1, Logger: log, OnDamage: func(p string) { mu.Lock(); heard = append(heard, p); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Damaged() != "" {
		t.Fatalf("damage found before the scrub (%s): the test reads nothing of it", s.Damaged())
	}
	rep, err = s.Scrub(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Damaged) != 1 || !strings.HasSuffix(rep.Damaged[0], file) {
		t.Fatalf("scrub found %v, want %s", rep.Damaged, file)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasSuffix(s.Damaged(), file) || !slices.EqualFunc(heard, []string{file}, strings.HasSuffix) || s.Metrics().Corruptions == 0 {
		t.Fatalf("Damaged %q, OnDamage heard %v, corruptions %d: want %s reported", s.Damaged(), heard, s.Metrics().Corruptions, file)
	}
	if n := log.count(file, "is damaged", "m/a"); n != 1 {
		t.Fatalf("%d log lines name %s damaged with its table: %q", n, file, log.lines)
	}
	// A second pass reports it again but logs it once.
	if rep, err = s.Scrub(context.Background(), 0); err != nil || len(rep.Damaged) != 1 {
		t.Fatalf("second scrub: %+v, %v", rep, err)
	}
	if n := log.count(file, "is damaged"); n != 1 {
		t.Fatalf("%d log lines after a second scrub, want 1", n)
	}
}

// TestScrubPacedStops: a paced scrub (1 byte a second) ends as soon as
// its context does.
func TestScrubPacedStops(t *testing.T) {
	pl := writePlan(t, "m", []*testTable{{name: "a", rows: 300, dim: 8, seed: 1}})
	s, err := Open(filepath.Join(t.TempDir(), "db"), &Options{FS: vfs.Default, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Ingest(context.Background(), pl, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.Scrub(ctx, 1); done <- err }()
	time.Sleep(50 * time.Millisecond) // into the first file's paced reads
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("a cancelled scrub: %v", err)
	}
}
