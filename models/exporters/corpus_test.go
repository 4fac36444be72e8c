package exporters_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
)

// TestCorpusMatchesReference: every corpus model, run whole in ONNX
// Runtime, equals its float64 reference within 1e-5 on valid inputs
// (ids spread over each value's whole range, uniform and Zipf).
func TestCorpusMatchesReference(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	for _, m := range append(append(append(exporters.Corpus(3), exporters.FixedBatch(3)...), exporters.HugeCTR(3)...), append(exporters.Quantized(3), exporters.Paddle(3)...)...) {
		t.Run(m.Name, func(t *testing.T) {
			tol := 1e-5
			if m.Tol > 0 {
				tol = m.Tol
			}
			path := filepath.Join(t.TempDir(), "model.onnx")
			if err := m.Write(path); err != nil {
				t.Fatal(err)
			}
			s, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, uniform := range []bool{true, false} {
				src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 9, Uniform: uniform})
				if err != nil {
					t.Fatal(err)
				}
				n, chunk := 300, 300
				if m.Batch > 0 {
					// A fixed exported batch: the model takes batches of
					// exactly that size.
					chunk = int(m.Batch)
					n -= n % chunk
				}
				b, _ := src.Next(n)
				want, err := m.Reference(b)
				if err != nil {
					t.Fatal(err)
				}
				var got []float32
				for i := 0; i < n; i += chunk {
					out, err := s.Run(modelrun.Inputs(b.Slice(i, i+chunk)))
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, out[0]...)
				}
				var worst float64
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i])-want[i]))
				}
				if worst > tol || len(got) != len(want) {
					t.Fatalf("ONNX Runtime differs from the float64 reference by %g (%d scores, want %d)", worst, len(got), len(want))
				}
			}
		})
	}
}

// TestEmbeddingBagLoopRuns: the TorchScript Loop form of EmbeddingBag
// and its broken twin are valid models ONNX Runtime runs (one score per
// bag), so the error the partitioner gives the twin is about the
// pattern, not a bad fixture.
func TestEmbeddingBagLoopRuns(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	for _, bag := range []bool{true, false} {
		m := exporters.EmbeddingBagLoop(1, bag)
		path := filepath.Join(t.TempDir(), "model.onnx")
		if err := m.Write(path); err != nil {
			t.Fatal(err)
		}
		s, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		// Bags [3 1] and [4 1 5]; the twin gathers one row per bag.
		out, err := s.Run([]ort.Input{{Name: "indices", Shape: []int64{5}, Int64: []int64{3, 1, 4, 1, 5}}, {Name: "offsets", Shape: []int64{2}, Int64: []int64{0, 2}}})
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(out[0]) != 2 || math.IsNaN(float64(out[0][0])) {
			t.Fatalf("bag=%v: scores %v, want 2", bag, out[0])
		}
	}
}

// TestFixedBatchRefusesOtherSizes: a fixed-batch fixture really is
// fixed: ONNX Runtime refuses a batch of another size for it.
func TestFixedBatchRefusesOtherSizes(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	for _, m := range exporters.FixedBatch(3) {
		path := filepath.Join(t.TempDir(), "model.onnx")
		if err := m.Write(path); err != nil {
			t.Fatal(err)
		}
		s, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := src.Next(int(m.Batch) + 1)
		_, err = s.Run(modelrun.Inputs(b))
		s.Close()
		if err == nil {
			t.Fatalf("%s: ran a batch of %d, exported at %d", m.Name, m.Batch+1, m.Batch)
		}
	}
}
