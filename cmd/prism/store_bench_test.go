package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreBenchZipf: --zipf sets the exponent of every scenario. The
// gather, redis and preload scenarios drew Zipf 1.05 whatever it said
// (and printed "zipf 1.05" after --zipf 0.5); they take one exponent,
// ltm and misses one run per exponent.
func TestStoreBenchZipf(t *testing.T) {
	work := filepath.Join(t.TempDir(), "sb")
	common := []string{"store", "bench", "--model", "dlrm-tiny", "--work", work, "--batch", "8", "--batches", "4", "--warmup", "2",
		"--hot-bytes", "8MiB", "--cache-bytes", "8MiB"}
	out, err := run(t, nil, append(common, "--scenario", "gather", "--zipf", "0.5")...)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Contains(out, "zipf 1.05") || strings.Count(out, "zipf 0.50") != 2 {
		t.Errorf("gather --zipf 0.5:\n%s", out)
	}
	out, err = run(t, nil, append(common, "--scenario", "gather", "--zipf", "0.5,1.2")...)
	if err == nil || !strings.Contains(out, `--zipf "0.5,1.2": the gather scenario takes one exponent`) {
		t.Errorf("gather --zipf 0.5,1.2: %v\n%s", err, out)
	}
	out, err = run(t, nil, append(common, "--scenario", "ltm", "--zipf", "0.5,1.2")...)
	if err != nil || !strings.Contains(out, "zipf 0.50") || !strings.Contains(out, "zipf 1.20") {
		t.Errorf("ltm --zipf 0.5,1.2: %v\n%s", err, out)
	}
}
