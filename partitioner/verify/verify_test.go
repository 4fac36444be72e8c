package verify_test

import (
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

func requireORT(t *testing.T) {
	t.Helper()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
}

// TestZooPartitionsReproduceMonolith: for every preset (tables scaled to
// keep the test fast), chaining cpu.onnx, the lookups and dense.onnx
// reproduces the whole model within 1e-5 on fresh random inputs.
func TestZooPartitionsReproduceMonolith(t *testing.T) {
	requireORT(t)
	for _, name := range models.Presets() {
		t.Run(name, func(t *testing.T) {
			p, _ := models.Lookup(name)
			c, err := p.Resolve(models.ScaleOptions{MaxRows: 20000})
			if err != nil {
				t.Fatal(err)
			}
			m, err := models.New(c, 21)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if _, err := m.Write(filepath.Join(dir, "model"), models.WriteOptions{External: true}); err != nil {
				t.Fatal(err)
			}
			model := filepath.Join(dir, "model", models.ModelFile)
			out := filepath.Join(dir, "part")
			res, err := partitioner.Partition(model, out, partitioner.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(res.Plan.Tables); got < c.NumTables() {
				t.Errorf("%d tables found, the model has %d", got, c.NumTables())
			}
			rep, err := verify.Verify(model, out, 200, 77)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cut %d B/sample, %d tables, max abs error %.2g", res.Plan.Cost.CutBytes, len(res.Plan.Tables), rep.MaxAbsErr)
		})
	}
}
