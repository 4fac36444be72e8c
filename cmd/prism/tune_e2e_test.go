package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/tune"
)

// tuneGrid is a two-configuration grid of dlrm-tiny for prism tune with
// short trials: its plan, ingested store, --out and --prior, and the
// command's arguments.
func tuneGrid(t *testing.T) (part, db, out, prior string, args []string) {
	t.Helper()
	dir := t.TempDir()
	_, part, _ = partitioned(t, dir, "dlrm-tiny")
	db = filepath.Join(dir, "db")
	if text, err := run(t, nil, "ingest", part, "--db", db); err != nil {
		t.Fatalf("ingest: %v\n%s", err, text)
	}
	out, prior = filepath.Join(dir, "tune-out"), filepath.Join(dir, "prior.jsonl")
	args = []string{"tune", "--model", part, "--db", db, "--insecure", "--out", out, "--prior", prior, "--grid",
		"--micro-batch", "8,16", "--max-batch", "256", "--max-delay", "2ms", "--threads", "1", "--dense-workers", "1",
		"--admit-share", "1", "--steps", "2", "--step", "1s", "--candidates", "16", "--pool", "32", "--start-rate", "20", "--slo", "1s", "--timeout", "1s"}
	return part, db, out, prior, args
}

// TestTuneEndToEnd: prism tune runs real trials (prism up, then the load
// generator's find-max) over a two-configuration grid of dlrm-tiny,
// writes tune.json with both trials measured and a best, appends them to
// the prior, and prism up --config starts from what it wrote.
func TestTuneEndToEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: real prism up trials")
	}
	part, db, out, prior, args := tuneGrid(t)
	text, err := run(t, nil, args...)
	if err != nil {
		t.Fatalf("tune: %v\n%s", err, text)
	}
	var rep tune.Report
	if b, err := os.ReadFile(filepath.Join(out, tune.File)); err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("tune.json: %v\n%s", err, text)
	}
	if len(rep.Trials) != 2 || rep.Best == nil {
		t.Fatalf("tune.json: %d trials, best %v\n%s", len(rep.Trials), rep.Best, text)
	}
	tried := map[string]bool{}
	for _, tr := range rep.Trials {
		if tr.Result.SamplesPerS <= 0 || tr.Result.Steps == 0 {
			t.Fatalf("trial %d (%v) measured nothing: %+v\n%s", tr.N, tr.Config, tr.Result, text)
		}
		tried[tr.Config["micro-batch"]] = true
	}
	if !tried["8"] || !tried["16"] {
		t.Fatalf("the grid's two micro-batches were not both tried: %v", tried)
	}
	recs, err := tune.ReadPrior(prior)
	if err != nil || len(recs) != 2 {
		t.Fatalf("prior: %d records, %v", len(recs), err)
	}
	// prism up takes what tune wrote.
	up := startProc(t, readyline.Up, "up", "--model", part, "--db", db, "--addr", "127.0.0.1:0", "--insecure", "--config", filepath.Join(out, "tune.json"))
	if up.addr == "" {
		t.Fatal("prism up --config printed no address")
	}
	if mb := rep.Best.Config["micro-batch"]; mb != "8" && mb != "16" {
		t.Fatalf("the best configuration's micro-batch %q is not one of the grid's", mb)
	}
}
