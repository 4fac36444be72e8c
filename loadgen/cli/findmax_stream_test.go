package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/loadgen"
)

// TestFindMaxRunsSendNewRequests: find-max's warm-up and each trial draw
// requests of their own. Each run rebuilt the request stream from the
// same --seed and --stream, so the first trial replayed the warm-up's
// requests (and every trial the previous ones'), finding their rows in
// the embedding tier's hot tier: the bias fbc4125 removed between runs.
// The schedule, from the same seed every trial, was one shape rescaled.
func TestFindMaxRunsSendNewRequests(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{} // payload -> request id that first carried it
	var repeats []string
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		b, _ := protojson.Marshal(req.Candidates)
		mu.Lock()
		defer mu.Unlock()
		if first, ok := seen[string(b)]; ok {
			repeats = append(repeats, first+" again as "+req.RequestId)
		} else {
			seen[string(b)] = req.RequestId
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "40",
		"--find-max-trial", "500ms", "--find-max-trials", "2", "--find-max-warmup", "500ms", "--candidates", "3", "--slo", "1s", "--quiet")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 20 || len(repeats) > 0 {
		t.Fatalf("%d distinct requests; %d sent again by a later run: %s\n%s", len(seen), len(repeats), strings.Join(repeats[:min(5, len(repeats))], ", "), out)
	}
}

// TestFindMaxNonePassedLeavesNoStaleReport: a search in which no rate
// met the SLO said "0.0 req/s is the highest rate" and left in --out
// the summary.json, timeseries.csv and plot.png of an earlier run,
// which read as this search's best trial.
func TestFindMaxNonePassedLeavesNoStaleReport(t *testing.T) {
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(*prismv1.RecommendRequest) time.Duration { return 20 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	for _, name := range loadgen.ReportFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("an earlier run's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "20",
		"--find-max-trial", "200ms", "--find-max-trials", "2", "--find-max-warmup", "0s", "--candidates", "1", "--slo", "1ms", "--out", dir, "--quiet")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "find-max: no rate met p99 under 1ms (2 trials of 200ms)") {
		t.Fatalf("output:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "findmax.json")); err != nil {
		t.Fatal(err)
	}
	for _, name := range loadgen.ReportFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of an earlier run left beside this search's findmax.json (stat: %v)", name, err)
		}
	}
}

// TestFindMaxInterruptedKeepsTrials: a search interrupted (Ctrl-C) in
// its second trial reports and writes the trials it ran, and still
// exits with the interruption. It returned at once: findmax.json was
// not written and the first trial's result was lost.
func TestFindMaxInterruptedKeepsTrials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int64
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(*prismv1.RecommendRequest) time.Duration {
		if n.Add(1) == 30 { // the first trial sends about 20
			cancel()
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	cmd := New()
	var outb bytes.Buffer
	cmd.SetOut(&outb)
	cmd.SetErr(&outb)
	cmd.SetArgs([]string{"--target", addr, "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "100", "--stream", "1",
		"--find-max-trial", "200ms", "--find-max-trials", "5", "--find-max-warmup", "0s", "--candidates", "1", "--slo", "1s", "--out", dir, "--quiet"})
	err = cmd.ExecuteContext(ctx)
	out := outb.String()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want the interruption\n%s", err, out)
	}
	buf, rerr := os.ReadFile(filepath.Join(dir, "findmax.json"))
	if rerr != nil {
		t.Fatalf("interrupted search: %v\n%s", rerr, out)
	}
	var res loadgen.FindMaxResult
	if err := json.Unmarshal(buf, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Trials) < 1 || !res.Trials[0].Pass || res.MaxRate != 100 || !strings.Contains(out, "stopped early") {
		t.Fatalf("findmax.json: max %.1f, %d trials; output:\n%s", res.MaxRate, len(res.Trials), out)
	}
}

// TestFindMaxServerDown: a search in which no request of any trial was
// answered (nothing listens at the address) exits with an error saying
// why, as a single run does, not "0.0 req/s is the highest rate" and
// status 0.
func TestFindMaxServerDown(t *testing.T) {
	out, err := runCLI(t, "--target", "127.0.0.1:1", "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "400", "--stream", "1",
		"--find-max-trial", "100ms", "--find-max-trials", "2", "--find-max-warmup", "0s", "--candidates", "1", "--timeout", "100ms", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "none of") || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("error %v\n%s", err, out)
	}
}
