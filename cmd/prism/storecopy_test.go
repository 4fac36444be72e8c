package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
)

// stageCheckpoint stages a checkpoint of the store in src into dst's
// staged copy, complete, as prism store copy leaves it for a store in use.
func stageCheckpoint(t *testing.T, src, dst string) {
	t.Helper()
	s, err := store.Open(src, &store.Options{HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	staged := filepath.Join(dst, store.StagedDirName)
	if err := os.MkdirAll(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Files {
		r, err := c.Open(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if err := os.WriteFile(filepath.Join(staged, f.Name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(staged, store.StagedCompleteName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// --seed over a folder holding a complete staged copy (a copy staged
// for a worker that then lost its Pod, a seed step killed before its
// swap) swaps it in and copies nothing; over a store, nothing at all.
func TestSeedSwapsStagedCopy(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	s, err := store.Open(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	stageCheckpoint(t, src, dst)
	var out bytes.Buffer
	j := &copyJob{db: dst, seed: true, out: &out, errOut: &out}
	if done, err := j.seeded(); err != nil || !done || !strings.Contains(out.String(), "swapped in the copy staged before") {
		t.Fatalf("seeded over a staged copy: %v, %v\n%s", done, err, &out)
	}
	out.Reset()
	if done, err := j.seeded(); err != nil || !done || !strings.Contains(out.String(), "holds a store already") {
		t.Fatalf("seeded over a store: %v, %v\n%s", done, err, &out)
	}
	out.Reset()
	j.db = filepath.Join(dir, "empty")
	if done, err := j.seeded(); err != nil || done {
		t.Fatalf("seeded over nothing: %v, %v\n%s", done, err, &out)
	}
}
