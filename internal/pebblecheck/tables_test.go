package pebblecheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// writeDB writes a Pebble database of n keys in dir, flushed to table
// files, and returns its table files' names.
func writeDB(t *testing.T, dir string, n int) []string {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest})
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 64)
	for i := range n {
		for j := range val {
			val[j] = byte(i + j)
		}
		if err := db.Set(fmt.Appendf(nil, "key%08d", i), val, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no table files in %s (%v)", dir, err)
	}
	return names
}

// TestTables damages a table file as the disk it was read from would,
// and checks Tables names it, while it passes every intact one (and
// reports progress over the whole folder).
func TestTables(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
		want   string // "" : no damage found
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"flip-data", func(t *testing.T, path string) { flipAt(t, path, 0.3) }, "checksum"},
		{"flip-near-end", func(t *testing.T, path string) { flipAt(t, path, 0.9) }, "is damaged"},
		{"truncated", func(t *testing.T, path string) {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, "is damaged"},
		{"not-a-table", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("this is not a table file at all, but it is long enough to hold a footer's bytes"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "is damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ssts := writeDB(t, dir, 20000)
			tc.damage(t, ssts[0])
			var last, total int64
			damaged, err := Tables(context.Background(), vfs.Default, dir, func(c, tot int64) { last, total = c, tot })
			if err != nil {
				t.Fatal(err)
			}
			if last != total || total == 0 {
				t.Fatalf("progress ended at %d of %d bytes", last, total)
			}
			if tc.want == "" {
				if len(damaged) > 0 {
					t.Fatalf("an intact database: %v", damaged)
				}
				return
			}
			if len(damaged) != 1 || damaged[0].Path != ssts[0] || !strings.Contains(damaged[0].Error(), tc.want) {
				t.Fatalf("Tables of a database with %s damaged: %v, want it alone, the error with %q", ssts[0], damaged, tc.want)
			}
		})
	}
}

// TestTablesCancelled: a check of a large store stops when its context
// ends.
func TestTablesCancelled(t *testing.T) {
	dir := t.TempDir()
	writeDB(t, dir, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Tables(ctx, vfs.Default, dir, nil); err != context.Canceled {
		t.Fatalf("Tables with its context ended: %v", err)
	}
}

// flipAt flips one byte at fraction at of the file at path.
func flipAt(t *testing.T, path string, at float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[int(float64(len(b))*at)] ^= 0x5a
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckOptions: garbage in the latest OPTIONS file is named, as
// settings only (ErrSettingsOnly); an older one is not read, and an
// intact database passes.
func TestCheckOptions(t *testing.T) {
	dir := t.TempDir()
	writeDB(t, dir, 10)
	if err := Check(vfs.Default, dir); err != nil {
		t.Fatalf("an intact database: %v", err)
	}
	opts, _ := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
	if len(opts) != 1 {
		t.Fatalf("OPTIONS files %v, want one", opts)
	}
	if err := os.WriteFile(filepath.Join(dir, "OPTIONS-000000"), []byte("garbage [[["), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Check(vfs.Default, dir); err != nil {
		t.Fatalf("garbage in an older OPTIONS file, which Pebble does not read: %v", err)
	}
	if err := os.WriteFile(opts[0], []byte("garbage [[["), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Check(vfs.Default, dir)
	if !errors.Is(err, ErrSettingsOnly) || !strings.Contains(err.Error(), opts[0]) {
		t.Fatalf("garbage in %s: %v, want it named as settings only", opts[0], err)
	}
	if err := os.Remove(opts[0]); err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatalf("the mend, the file removed: %v", err)
	}
	db.Close()
}

// TestCheckManifest: the damage Pebble opens over and loses data with
// is refused, naming the file: a lost marker of the current MANIFEST,
// and a MANIFEST record that does not check followed by whole ones. A
// torn last record, what a crash leaves, passes (Pebble's to ignore).
func TestCheckManifest(t *testing.T) {
	// Several flushes: each adds a MANIFEST record.
	build := func(t *testing.T) string {
		dir := t.TempDir()
		db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if err := db.Set(fmt.Appendf(nil, "k%d", i), []byte("v"), pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if err := db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	manifest := func(t *testing.T, dir string) string {
		name := CurrentManifest(vfs.Default, dir)
		if name == "" {
			t.Fatal("no current MANIFEST")
		}
		return filepath.Join(dir, name)
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string // "" to pass
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"lost marker", func(t *testing.T, dir string) {
			markers, _ := filepath.Glob(filepath.Join(dir, "marker.manifest.*"))
			for _, m := range markers {
				if err := os.Remove(m); err != nil {
					t.Fatal(err)
				}
			}
		}, "no marker.manifest"},
		{"record damaged before whole ones", func(t *testing.T, dir string) {
			path := manifest(t, dir)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[manifestHeader+2] ^= 0xff // the first record's payload
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "does not check, and a whole record follows"},
		{"torn last record", func(t *testing.T, dir string) {
			path := manifest(t, dir)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, st.Size()-3); err != nil {
				t.Fatal(err)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			tc.damage(t, dir)
			err := Check(vfs.Default, dir)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Check: %v, want %q", err, tc.want)
			}
		})
	}
}
