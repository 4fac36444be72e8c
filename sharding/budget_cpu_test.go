package sharding

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// With ShardBytes 0 (the default budget) Plan must never fail: the
// user set no budget, so none can be unmet. Small tables (few rows per
// shard) used to get a budget below what any placement needs.
func TestDefaultBudgetAlwaysFits(t *testing.T) {
	one := func(name string) Table { return Table{Name: name, Rows: 1, Dim: 1, Lookups: 1} }
	if _, err := Plan([]Table{one("a"), one("b"), one("c")}, Options{Shards: 2}); err != nil {
		t.Errorf("3 one-row tables on 2 shards, default budget: %v", err)
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for it := range 2000 {
		n := 1 + rng.IntN(8)
		ts := randTables(rng, 1+rng.IntN(12), 20)
		o := Options{Shards: n}
		r, err := Plan(ts, o)
		if err != nil {
			t.Fatalf("case %d: %d shards, default budget, tables %+v: %v", it, n, ts, err)
		}
		o.ShardBytes = r.ShardBytes
		checkResult(t, ts, o, r)
	}
}

// A budget large enough for anything is not "too small" because
// budget*shards overflowed int64.
func TestHugeBudgetFits(t *testing.T) {
	ts := []Table{{Name: "a", Rows: 1000, Dim: 16, Lookups: 1}}
	if _, err := Plan(ts, Options{Shards: 16, ShardBytes: 1 << 60}); err != nil {
		t.Fatalf("16 shards of 1 EiB: %v", err)
	}
	_, err := Plan(ts, Options{Shards: 2, ShardBytes: 100})
	if !errors.Is(err, ErrNoFit) || !strings.Contains(err.Error(), "the tables hold 64000 bytes, 2 shards of 100 bytes only 200") {
		t.Fatalf("tight budget: %v", err)
	}
}

// The embedding worker of shard 0 runs cpu.onnx and refuses to serve
// when it reads a lookup output shard 0 does not answer whole; prism
// shard must not write such a sharding (deepfm-tiny's cpu.onnx reads
// every table's lookups).
func TestRunRefusesShardingCPUReads(t *testing.T) {
	dir := t.TempDir()
	part := partitionedPreset(t, dir, "deepfm-tiny")
	before, err := os.ReadFile(filepath.Join(part, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := plan.Read(part); p.CPUModel == "" {
		t.Fatal("deepfm-tiny's plan has no cpu.onnx; the test needs one")
	}
	_, err = Run(part, RunOptions{Options: Options{Shards: 2}, Zipf: 1.05}, os.Stderr)
	if err == nil || !strings.Contains(err.Error(), "cpu.onnx reads lookup output") {
		t.Fatalf("sharding a model whose cpu.onnx reads lookups of tables off shard 0: %v, want it refused", err)
	}
	after, _ := os.ReadFile(filepath.Join(part, "plan.json"))
	if string(after) != string(before) {
		t.Fatal("plan.json was rewritten though the sharding was refused")
	}
	// One shard holds every table: cpu.onnx's lookups are all shard 0's.
	if _, err := Run(part, RunOptions{Options: Options{Shards: 1}, Zipf: 1.05}, os.Stderr); err != nil {
		t.Fatalf("one shard: %v", err)
	}
	// Partitioned with every reader of a lookup on the dense side
	// (prism partition --lookups-dense), it shards.
	dense := filepath.Join(dir, "part-lookups-dense")
	if _, err := partitioner.Partition(filepath.Join(dir, "model", models.ModelFile), dense, partitioner.Options{LookupsDense: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(dense, RunOptions{Options: Options{Shards: 2}, Zipf: 1.05}, os.Stderr); err != nil {
		t.Fatalf("partitioned with LookupsDense, 2 shards: %v", err)
	}
}
