package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// TestStoreCheck: prism store check passes an intact store, and names
// each damaged table file of a store (and of a complete copy staged in
// it) with the served tables it holds rows of, ending with status 1;
// a folder holding no store is refused.
func TestStoreCheck(t *testing.T) {
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	if out, err := run(t, nil, "ingest", part, "--db", db); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := run(t, nil, "store", "check", "--db", db); err != nil || !strings.Contains(out, "every block of its table files checks") {
		t.Fatalf("check of an intact store: %v: %s", err, out)
	}
	if out, err := run(t, nil, "store", "check", "--db", filepath.Join(dir, "dlrm-tiny")); err == nil || !strings.Contains(out, "holds no store") {
		t.Fatalf("check of a folder without a store: %v: %s", err, out)
	}

	ssts, _ := filepath.Glob(filepath.Join(db, "*.sst"))
	if len(ssts) < 2 {
		t.Fatalf("the store has %d table files", len(ssts))
	}
	flip := func(path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[10] ^= 0x5a // in the first data block
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	damaged := ssts[len(ssts)/2]
	flip(damaged)
	out, err := run(t, nil, "store", "check", "--db", db)
	want := regexp.MustCompile(`DAMAGED ` + regexp.QuoteMeta(damaged) + `: .*checksum mismatch.*\(rows of physical table \d+: dlrm-tiny/`)
	if err == nil || !want.MatchString(out) || !strings.Contains(out, "1 damaged table file(s)") || strings.Count(out, "DAMAGED") != 1 {
		t.Fatalf("check of a store with %s damaged: %v:\n%s", damaged, err, out)
	}

	// A complete staged copy is checked too: its next open swaps it in.
	staged := filepath.Join(db, "copy-in")
	if err := os.MkdirAll(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ssts[0])
	if err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(staged, filepath.Base(ssts[0]))
	if err := os.WriteFile(copied, b, 0o644); err != nil {
		t.Fatal(err)
	}
	flip(copied)
	if err := os.WriteFile(filepath.Join(staged, "COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, nil, "store", "check", "--db", db)
	if err == nil || !strings.Contains(out, "DAMAGED "+copied) || !strings.Contains(out, "2 damaged table file(s)") {
		t.Fatalf("check of a store with a damaged staged copy: %v:\n%s", err, out)
	}
}

// TestServeScrubFindsDamage: a serving embedding worker's background
// scrub (--scrub-every) finds a damaged block that no lookup has read
// (the hot tier off: nothing preloaded) and reports it as a read would:
// the file and its table logged, the scrub's own line after.
func TestServeScrubFindsDamage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	if out, err := run(t, nil, "ingest", part, "--db", db); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ssts, _ := filepath.Glob(filepath.Join(db, "*.sst"))
	if len(ssts) < 2 {
		t.Fatalf("the store has %d table files", len(ssts))
	}
	damaged := ssts[len(ssts)/2]
	b, err := os.ReadFile(damaged)
	if err != nil {
		t.Fatal(err)
	}
	b[10] ^= 0x5a
	if err := os.WriteFile(damaged, b, 0o644); err != nil {
		t.Fatal(err)
	}
	w := startProc(t, readyline.Embedding, "serve", "embedding", "--insecure", "--db", db, "--plan", part,
		"--hot-bytes", "-1", "--scrub-every", "300ms", "--metrics-addr", "off")
	waitLog(t, w, "scrub: table files of the store are damaged", 30*time.Second)
	if log := w.log.String(); !strings.Contains(log, filepath.Base(damaged)+" is damaged") || !strings.Contains(log, "dlrm-tiny/") {
		t.Fatalf("the damaged file and its table are not named:\n%s", log)
	}
}
