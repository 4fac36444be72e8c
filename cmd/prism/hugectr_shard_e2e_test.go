package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/prism-serve/prism/models/exporters"
)

// TestUpShardedHugeCTR: NVIDIA HugeCTR models (hugectr2onnx: hash keys
// mapped to rows by key_to_indice_hash_all_tables in pre.onnx, pooled
// per slot) sharded row-wise over two and three embedding workers
// serve prism score's scores on the whole model within 1e-5: every
// shard runs the key map (pre.onnx) on the keys and keeps the rows it
// holds. Partitioned without --lookups-dense, the slots' reassembly
// (Unsqueeze, Concat) lands in cpu.onnx, which shard 0 runs on its
// own rows only, and prism shard refuses any sharding that splits a
// table off shard 0. The multi-task ones serve both their tasks so.
func TestUpShardedHugeCTR(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		shards int
		budget string // --shard-bytes: below the big table's bytes
		// rowWise is the least number of row-wise tables.
		rowWise int
	}{
		{"hugectr-dlrm", 2, "400", 1},
		{"hugectr-dlrm", 3, "300", 1},
		{"hugectr-wdl", 2, "500", 1},
		{"hugectr-wdl", 3, "300", 1},
		{"hugectr-dcn", 2, "400", 1},
		{"hugectr-deepfm", 2, "500", 1},
		{"hugectr-deepfm-v32", 3, "300", 1},
		// Two tasks: the dense worker assembles the shards' parts and
		// answers every part with both tasks' scores.
		{"hugectr-dlrm-multitask", 2, "400", 1},
		// The newest converter's layout (a key map per layer), and a
		// task per output (the shared-bottom sample's two labels).
		{"hugectr-wdl-2503", 2, "500", 1},
		{"hugectr-shared-bottom", 2, "400", 1},
	} {
		t.Run(tc.name+"/"+strconv.Itoa(tc.shards), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			model := filepath.Join(dir, tc.name, "model.onnx")
			if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := exporters.ByName(tc.name, 11).Write(model); err != nil {
				t.Fatal(err)
			}
			part := filepath.Join(dir, tc.name+"-part")
			if out, err := run(t, nil, "partition", model, "-o", part, "--lookups-dense", "--verify", "296"); err != nil {
				t.Fatalf("partition: %v\n%s", err, out)
			}
			upSharded(t, dir, model, part, []string{"--shards", strconv.Itoa(tc.shards), "--shard-bytes", tc.budget, "--zipf", "1.05"}, tc.shards, 1, tc.rowWise)
		})
	}
}
