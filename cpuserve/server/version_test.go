package server

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
)

// writeTablesPlan writes a plan folder of model with tables a (rows x 4)
// and b (rows x 4) drawn from seed, and returns it read back.
func writeTablesPlan(t *testing.T, model string, seed uint64) (string, *plan.Plan) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	p := &plan.Plan{Version: plan.Version, Model: plan.ModelInfo{Name: model}, DenseModel: "dense.onnx",
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}}}
	for _, name := range []string{"a", "b"} {
		data := make([]float32, 10*4)
		for i := range data {
			data[i] = float32(r.NormFloat64())
		}
		file := tablefile.FileName(name)
		meta, err := tablefile.Write(filepath.Join(dir, file), name, 4, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Inputs = append(p.Inputs, plan.TensorInfo{Name: "ids_" + name, DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}})
		p.Tables = append(p.Tables, plan.Table{Name: name, File: file, Rows: meta.Rows, Dim: meta.Dim, DType: "float32", SHA256: meta.SHA256,
			Lookups: []plan.Lookup{{Input: "ids_" + name, Bag: 1, Pooling: plan.PoolSum, Output: "emb_" + name}}})
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, p
}

// TestServedPlanMatchesActiveContent: a worker started on a plan whose
// tables the store's active version does not hold (a retrained model of
// the same shapes, or a store switched to another version by prism store
// versions) must not serve: it would score the store's rows with this
// plan's cpu.onnx and dense side. Checked by shape only, it served them.
func TestServedPlanMatchesActiveContent(t *testing.T) {
	ctx := context.Background()
	d1, p1 := writeTablesPlan(t, "m", 1)
	d2, p2 := writeTablesPlan(t, "m", 2)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), &store.Options{NoSync: true, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ingested, err := ensureIngested(ctx, st, d1, p1, nil); err != nil || !ingested {
		t.Fatalf("first start: ingested %v, %v", ingested, err)
	}
	if _, err := ensureIngested(ctx, st, d1, p1, nil); err != nil {
		t.Fatalf("the plan the store holds: %v", err)
	}
	_, err = ensureIngested(ctx, st, d2, p2, nil)
	if err == nil || !strings.Contains(err.Error(), "of other content than the plan's") || !strings.Contains(err.Error(), "version 1, from "+d1) {
		t.Fatalf("a plan of other content than the active version's: %v", err)
	}
	// Its version ingested but not active: refused until it is.
	if _, err := st.Ingest(ctx, d2, store.IngestOptions{NoActivate: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureIngested(ctx, st, d2, p2, nil); err == nil {
		t.Fatal("served plan 2 while version 1 is active")
	}
	if err := st.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureIngested(ctx, st, d2, p2, nil); err != nil {
		t.Fatalf("plan 2 after activating its version: %v", err)
	}
	if _, err := ensureIngested(ctx, st, d1, p1, nil); err == nil {
		t.Fatal("served plan 1 after a switch to version 2")
	}
}
