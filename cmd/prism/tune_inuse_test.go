package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
)

// TestTuneRefusesStoreInUse: with its --db held by another process (a
// prism up serving it), tune stops before its first trial, not after
// every trial's prism up failed alike on the lock.
func TestTuneRefusesStoreInUse(t *testing.T) {
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	s, err := store.Open(db, nil) // this process holds it; prism tune is another
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := run(t, nil, "tune", "--model", part, "--db", db, "--max-trials", "2", "--out", filepath.Join(dir, "tune"), "--prior", "")
	if err == nil || !strings.Contains(out, "--db "+db+" is in use") || strings.Contains(out, "trial 1") {
		t.Fatalf("tune on a store in use: %v\n%s", err, out)
	}
}
