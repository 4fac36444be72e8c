package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestScoreCriteoProgress: scoring a Criteo file shows a progress bar of
// its bytes on stderr (a whole train.txt takes hours), and only there.
func TestScoreCriteoProgress(t *testing.T) {
	dir := t.TempDir()
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", dir, "--seed", "2"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "%d", i%2)
		for k := range 13 {
			fmt.Fprintf(&b, "\t%d", (i+k)%7)
		}
		for k := range 26 {
			fmt.Fprintf(&b, "\t%08x", (i*31+k*17)%977)
		}
		b.WriteString("\n")
	}
	criteo := filepath.Join(dir, "day.tsv")
	if err := os.WriteFile(criteo, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prismBin, "score", filepath.Join(dir, "model.onnx"), "--criteo", criteo, "--batch", "64")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "scored 300 samples") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "scoring day.tsv") || !strings.Contains(stderr.String(), "100%") {
		t.Errorf("no progress bar on stderr:\n%s", stderr.String())
	}
	if strings.Contains(stdout.String(), "scoring day.tsv") {
		t.Errorf("progress on stdout:\n%s", stdout.String())
	}
}
