package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// TestManyModelsShareCores: an embedding worker serving several models
// with ONNX Runtime work (cpu.onnx, pre.onnx) at --threads 0 opens
// intra-op pools that together hold no more threads than its cores (or
// one per session): each session's pool was ONNX Runtime's default,
// one thread per core of the machine, so a worker of 40 such models on
// a 64-core host started 40 x 64 threads, whatever GOMAXPROCS prism up
// gave it.
func TestManyModelsShareCores(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := models.Lookup("deepfm-tiny") // cpu.onnx
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Write(filepath.Join(dir, "deepfm"), models.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	deepfm := filepath.Join(dir, "deepfm-part")
	if _, err := partitioner.Partition(filepath.Join(dir, "deepfm", models.ModelFile), deepfm, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
	hashed := filepath.Join(dir, "hashed-part") // pre.onnx
	if err := exporters.ByName("ts-hash-mul-add-mod", 11).Write(filepath.Join(dir, "hashed.onnx")); err != nil {
		t.Fatal(err)
	}
	if _, err := partitioner.Partition(filepath.Join(dir, "hashed.onnx"), hashed, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
	plans := []string{deepfm, hashed}
	// Copies of deepfm under other names: a platform's models.
	for _, name := range []string{"ranker-a", "ranker-b", "ranker-c"} {
		cp := filepath.Join(dir, name)
		if err := os.CopyFS(cp, os.DirFS(deepfm)); err != nil {
			t.Fatal(err)
		}
		pl, err := plan.Read(cp)
		if err != nil {
			t.Fatal(err)
		}
		pl.Model.Name = name
		if err := plan.Write(cp, pl); err != nil {
			t.Fatal(err)
		}
		plans = append(plans, cp)
	}

	var mu sync.Mutex
	var pools []int
	orig := newSession
	newSession = func(path string, so ort.SessionOptions) (*ort.Session, error) {
		mu.Lock()
		pools = append(pools, so.IntraOpThreads)
		mu.Unlock()
		return orig(path, so)
	}
	defer func() { newSession = orig }()

	st, err := store.Open(filepath.Join(dir, "db"), &store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := New(context.Background(), st, Options{Plans: plans, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	if len(pools) < len(plans) {
		t.Fatalf("%d ONNX Runtime sessions for %d models with cpu.onnx or pre.onnx", len(pools), len(plans))
	}
	cores := runtime.GOMAXPROCS(0)
	total := 0
	for _, n := range pools {
		if n <= 0 {
			n = runtime.NumCPU() // ONNX Runtime's default: a thread per core
		}
		total += n
	}
	if limit := max(cores, len(pools)); total > limit {
		t.Errorf("%d sessions' intra-op pools %v hold %d threads on %d cores (GOMAXPROCS), want at most %d", len(pools), pools, total, cores, limit)
	}
}
