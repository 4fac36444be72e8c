package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// runFileLimited runs prism with its file size limit (ulimit -f, in
// 512-byte blocks under sh) at blocks: a write past it fails with EFBIG,
// as one onto a full disk fails with ENOSPC, at a point the test knows.
func runFileLimited(t *testing.T, blocks int, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -f %d && exec "$0" "$@"`, blocks), prismBin}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// snapshot is every file of dir (not recursing) with its bytes.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if e.IsDir() {
			files[e.Name()+"/"] = nil
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

// TestFailedWriteKeepsPreviousOutput: a batch command whose write fails
// part-way (the disk full) exits non-zero naming the file and leaves
// the output that was there as it was, with nothing of its own beside
// it; a dependent command still takes the output. prism shard truncated
// the partition's plan.json (and every later command refused the
// folder: "unexpected end of JSON input"); prism models build over an
// earlier build deleted its model.onnx.data first, leaving a
// model.onnx without its data and a model.json of the old build.
func TestFailedWriteKeepsPreviousOutput(t *testing.T) {
	cases := []struct {
		name string
		// setup makes the output the command fails to replace, and
		// returns the folder holding it and the command's arguments.
		setup  func(t *testing.T, dir string) (string, []string)
		blocks int    // the file size limit, 512-byte blocks
		want   string // in the error
		// then is a dependent command that must still work on the folder.
		then func(out string) []string
	}{
		{
			name: "shard rewriting plan.json",
			setup: func(t *testing.T, dir string) (string, []string) {
				_, part, _ := partitioned(t, dir, "dlrm-tiny")
				// The sharded plan.json is larger than the 8 KiB limit,
				// the unsharded one there already too.
				return part, []string{"shard", part, "--shards", "2", "--zipf", "1.05"}
			},
			blocks: 16,
			want:   "plan.json",
			then: func(part string) []string {
				return []string{"ingest", part, "--db", filepath.Join(filepath.Dir(part), "db")}
			},
		},
		{
			name: "models build over an earlier build",
			setup: func(t *testing.T, dir string) (string, []string) {
				m := filepath.Join(dir, "m")
				if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", m, "--external-data"); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				// About 7 MiB of weights, over the 2 MiB limit.
				return m, []string{"models", "build", "dlrm-tiny", "-o", m, "--external-data", "--rows-scale", "8", "--seed", "2"}
			},
			blocks: 4096,
			want:   "model.onnx.data",
			then: func(m string) []string {
				return []string{"score", filepath.Join(m, "model.onnx"), "--samples", "64"}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, args := tc.setup(t, t.TempDir())
			before := snapshot(t, out)
			msg, err := runFileLimited(t, tc.blocks, args...)
			if err == nil {
				t.Fatalf("%v succeeded past the file size limit:\n%s", args, msg)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("the error does not name %s:\n%s", tc.want, msg)
			}
			after := snapshot(t, out)
			for name, b := range before {
				if a, ok := after[name]; !ok {
					t.Errorf("%s is gone", name)
				} else if !bytes.Equal(a, b) {
					t.Errorf("%s changed: %d bytes, was %d", name, len(a), len(b))
				}
			}
			for name := range after {
				if _, ok := before[name]; !ok {
					t.Errorf("%s left behind", name)
				}
			}
			if msg, err := run(t, nil, tc.then(out)...); err != nil {
				t.Errorf("%v after the failed write: %v\n%s", tc.then(out), err, msg)
			}
		})
	}
}

// TestScoresOutFailsFirst: --scores-out names a file the scores go to
// whole or not at all; a path that cannot be written fails before any
// scoring (it failed after scoring the whole input, an hour of a Criteo
// file), and a write that fails part-way leaves the file as it was.
func TestScoresOutFailsFirst(t *testing.T) {
	dir := t.TempDir()
	m := filepath.Join(dir, "m")
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", m); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	model := filepath.Join(m, "model.onnx")
	old := filepath.Join(dir, "old.txt")
	if err := os.WriteFile(old, []byte("0.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		path   string
		blocks int // the file size limit, 512-byte blocks; 0: none
		want   string
	}{
		{"missing folder", filepath.Join(dir, "nope", "s.txt"), 0, "nope/s.txt"},
		{"a folder", m, 0, "is a folder"},
		{"disk full part-way", old, 1, "old.txt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"score", model, "--samples", "4096", "--scores-out", tc.path}
			var msg string
			var err error
			if tc.blocks > 0 {
				msg, err = runFileLimited(t, tc.blocks, args...)
			} else {
				start := time.Now()
				msg, err = run(t, nil, args...)
				t.Logf("failed in %s", time.Since(start))
				if strings.Contains(msg, "sample 0:") {
					t.Errorf("scored before finding the scores file unwritable:\n%s", msg)
				}
			}
			if err == nil || !strings.Contains(msg, tc.want) {
				t.Errorf("want an error naming %q, got %v:\n%s", tc.want, err, msg)
			}
			if b, _ := os.ReadFile(old); string(b) != "0.5\n" {
				t.Errorf("old.txt is now %q", b)
			}
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if !slices.Equal(names, []string{"m", "old.txt"}) {
				t.Errorf("the folder holds %v, want [m old.txt]", names)
			}
		})
	}
}
