package server_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prism-serve/prism/models"
)

// TestContextFixedBatchCPU: a model exported with a fixed batch whose
// cpu.onnx adds a folded [B, 1] constant to a dense input (each row its
// own bias) scores as the monolith when that input comes in the context:
// its output differs per row though it reads context values alone.
func TestContextFixedBatchCPU(t *testing.T) {
	f := setup(t)
	const name = "ts-fixed-batch-row-bias"
	p := f.dense.models[name].plan
	if p.FixedBatch <= 0 || p.CPUModel == "" {
		t.Fatalf("plan: fixed_batch %d, cpu model %q: want a fixed batch and a cpu.onnx", p.FixedBatch, p.CPUModel)
	}
	m := f.corpus[name]
	n := int(p.FixedBatch)
	for _, ctxIn := range [][]string{nil, {"dense"}, {"ids", "dense"}} {
		src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 7, Uniform: true})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := src.Next(n)
		shareContext(b, ctxIn...)
		want, err := m.Reference(b)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := f.client.Lookup(ctx, f.request(name, b, ctxIn...))
		cancel()
		if err != nil {
			t.Fatalf("context %v: %v", ctxIn, err)
		}
		for s, v := range resp.Scores {
			if d := math.Abs(float64(v) - want[s]); d > 1e-5 {
				t.Errorf("context %v: score %d differs from the reference by %g", ctxIn, s, d)
			}
		}
	}
}
