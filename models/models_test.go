package models_test

import (
	"fmt"
	"github.com/prism-serve/prism/internal/modelrun"
	"math"
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
)

// scoreORT runs the model in dir through ONNX Runtime.
func scoreORT(t *testing.T, dir string, b *models.Batch) []float32 {
	t.Helper()
	s, err := ort.NewSession(filepath.Join(dir, models.ModelFile), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func requireORT(t *testing.T) {
	t.Helper()
	if err := ort.Init(); err != nil {
		t.Fatalf("%v", err)
	}
}

// TestPresetsMatchReference builds every preset (big ones scaled down),
// runs it in ONNX Runtime and compares with the float64 reference.
func TestPresetsMatchReference(t *testing.T) {
	requireORT(t)
	for _, name := range models.Presets() {
		t.Run(name, func(t *testing.T) {
			p, err := models.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			// Tables are scaled so the test stays fast; the dense layers,
			// bags and graph structure are the preset's own.
			c, err := p.Resolve(models.ScaleOptions{MaxRows: 20000})
			if err != nil {
				t.Fatal(err)
			}
			m, err := models.New(c, 7)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if _, err := m.Write(dir, models.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			sig := c.Signature()
			for _, n := range []int{1, 64} {
				src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(n) + 100})
				if err != nil {
					t.Fatal(err)
				}
				b, _ := src.Next(n)
				got := scoreORT(t, dir, b)
				want, err := m.Reference(b)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != n {
					t.Fatalf("batch %d: %d scores", n, len(got))
				}
				var worst float64
				for i := range got {
					worst = max(worst, math.Abs(float64(got[i])-want[i]))
				}
				if worst > 1e-5 {
					t.Fatalf("batch %d: max abs error %g > 1e-5", n, worst)
				}
				t.Logf("batch %d: max abs error %.2g, first score %.6f", n, worst, got[0])
			}
		})
	}
}

func ExamplePresets() {
	for _, n := range models.Presets() {
		fmt.Println(n)
	}
	// Output:
	// dcnv2-mlperf
	// dcnv2-tiny
	// deepfm-tiny
	// dlrm-kaggle
	// dlrm-kaggle-packed
	// dlrm-terabyte
	// dlrm-tiny
	// dlrm-tiny-packed
}
