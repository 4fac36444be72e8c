package up

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
)

// writeSeededPlan writes an unsharded plan folder of model m, one table
// "a" of 8 x 2 drawn from seed, and returns it read back.
func writeSeededPlan(t *testing.T, seed uint64) (string, *plan.Plan) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	data := make([]float32, 8*2)
	for i := range data {
		data[i] = float32(r.NormFloat64())
	}
	file := tablefile.FileName("a")
	meta, err := tablefile.Write(filepath.Join(dir, file), "a", 2, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Inputs:  []plan.TensorInfo{{Name: "ids", DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}}},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Tables: []plan.Table{{Name: "a", File: file, Rows: meta.Rows, Dim: meta.Dim, DType: "float32", SHA256: meta.SHA256,
			Lookups: []plan.Lookup{{Input: "ids", Bag: 1, Pooling: plan.PoolSum, Output: "emb_a"}}}}}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	if p, err = plan.Read(dir); err != nil {
		t.Fatal(err)
	}
	return dir, p
}

// TestIngestChanged: prism up ingests an unsharded plan into a worker's
// store whose active version of the model holds other tables (the model
// rebuilt with the same shapes, or the store switched to another
// version): its worker refuses that store, and before it checked shapes
// only and served the old rows under the new plan. A store of the plan's
// tables, or without the model, is left alone.
func TestIngestChanged(t *testing.T) {
	d1, p1 := writeSeededPlan(t, 1)
	d2, p2 := writeSeededPlan(t, 2)
	parent := t.TempDir()
	db := filepath.Join(parent, "db")
	st, err := store.Open(db, &store.Options{HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ingest(context.Background(), d1, store.IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	args := filepath.Join(parent, "args")
	exe := filepath.Join(parent, "fake-prism")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho \"$@\" >> "+args+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := Config{Exe: exe, DB: db, EmbeddingWorkers: 2, Stderr: io.Discard}
	for _, tc := range []struct {
		name string
		dir  string
		p    *plan.Plan
		keep int
		want string
	}{
		{"the plan the store holds", d1, p1, 0, ""},
		{"a rebuilt plan", d2, p2, 0, "ingest " + d2 + " --db " + db + "\n"},
		// prism up --keep-versions 2: a retrained model's ingest keeps
		// its newest 2 versions, not every one up ever ingested.
		{"a rebuilt plan, --keep-versions 2", d2, p2, 2, "ingest " + d2 + " --db " + db + " --keep-versions 2\n"},
	} {
		os.Remove(args)
		c.KeepVersions = tc.keep
		if err := ingestChanged(context.Background(), c, []string{tc.dir}, []*plan.Plan{tc.p}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, _ := os.ReadFile(args)
		// The second worker's store (db-1) does not exist: its worker
		// ingests the plan itself.
		if string(got) != tc.want {
			t.Errorf("%s: ran %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestIngestShardsKeepVersions: prism up --keep-versions N reaches the
// prism ingest --shard K children too, one per shard store lacking its
// shard (a resharded or retrained model), not the unsharded ingest alone.
func TestIngestShardsKeepVersions(t *testing.T) {
	parent := t.TempDir()
	args := filepath.Join(parent, "args")
	exe := filepath.Join(parent, "fake-prism")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho \"$@\" >> "+args+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(parent, "db")
	c := Config{Exe: exe, DB: db, EmbeddingWorkers: 2, Replicas: 1, shards: 2, KeepVersions: 3, Stderr: io.Discard}
	if err := ingestShards(context.Background(), c, []sharded{{dir: "plan", model: "m", shards: 2}}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(args)
	want := "ingest plan --db " + ShardDB(db, 0, 0) + " --shard 0 --keep-versions 3\n" +
		"ingest plan --db " + ShardDB(db, 1, 0) + " --shard 1 --keep-versions 3\n"
	if string(got) != want {
		t.Errorf("ran %q, want %q", got, want)
	}
}

// TestStoresOpenedOncePerWorker: before any child starts, up checks
// what each embedding worker's store holds of every model by opening
// the store once, not once per model: a platform's 40 models on 4
// workers opened a store 160 times (a read-only Pebble open replays its
// WAL), and up's start-up grew by about 30 ms per model on a small
// store before the router even started. What is ingested is unchanged.
func TestStoresOpenedOncePerWorker(t *testing.T) {
	parent := t.TempDir()
	args := filepath.Join(parent, "args")
	exe := filepath.Join(parent, "fake-prism")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho \"$@\" >> "+args+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var opens []string
	orig := openStore
	openStore = func(dir string, o *store.Options) (*store.Store, error) {
		opens = append(opens, dir)
		return orig(dir, o)
	}
	defer func() { openStore = orig }()

	// Unsharded: two stores holding m0, one rebuilt since; m1 and m2
	// are new to them (their workers ingest them).
	old, _ := writeSeededPlan(t, 1)
	db := filepath.Join(parent, "db")
	c := Config{Exe: exe, DB: db, EmbeddingWorkers: 2, Stderr: io.Discard}
	for i := range c.EmbeddingWorkers {
		st, err := store.Open(embeddingDB(c, i), &store.Options{HotBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Ingest(context.Background(), old, store.IngestOptions{Model: "m0"}); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	var dirs []string
	var plans []*plan.Plan
	for i := range 3 {
		d, p := writeSeededPlan(t, uint64(2+i))
		p.Model.Name = fmt.Sprintf("m%d", i)
		if err := plan.Write(d, p); err != nil {
			t.Fatal(err)
		}
		dirs, plans = append(dirs, d), append(plans, p)
	}
	if err := ingestChanged(context.Background(), c, dirs, plans); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(args)
	if want := "ingest " + dirs[0] + " --db " + db + "\ningest " + dirs[0] + " --db " + db + "-1\n"; string(got) != want {
		t.Errorf("ran %q, want %q", got, want)
	}
	if len(opens) != c.EmbeddingWorkers {
		t.Errorf("%d stores of %d models: opened %d times (%v), want once each", c.EmbeddingWorkers, len(plans), len(opens), opens)
	}

	// Sharded: two shard stores, three sharded models none holds.
	os.Remove(args)
	opens = nil
	sdb := filepath.Join(parent, "sharded")
	sc := Config{Exe: exe, DB: sdb, EmbeddingWorkers: 2, Replicas: 1, shards: 2, Stderr: io.Discard}
	for k := range 2 {
		st, err := store.Open(ShardDB(sdb, k, 0), &store.Options{HotBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	var sp []sharded
	for i, p := range plans {
		sp = append(sp, sharded{dir: dirs[i], model: p.Model.Name, shards: 2, plan: p})
	}
	if err := ingestShards(context.Background(), sc, sp); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(args)
	if n := strings.Count(string(got), "ingest "); n != 6 {
		t.Errorf("ran %q, want 3 models x 2 shards ingests", got)
	}
	if len(opens) != 2 {
		t.Errorf("2 shard stores of %d models: opened %d times (%v), want once each", len(sp), len(opens), opens)
	}
}
