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
// runs it in ONNX Runtime and compares with the float64 reference, on
// synthetic samples and on edge samples (edgeBatch).
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
			// The first and last row of every table, and bags mixing them.
			b := edgeBatch(c)
			if err := b.Check(); err != nil {
				t.Fatal(err)
			}
			got := scoreORT(t, dir, b)
			want, err := m.Reference(b)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); !(d <= 1e-5) {
					t.Errorf("edge sample %d: ONNX Runtime %v, reference %v", i, got[i], want[i])
				}
			}
		})
	}
}

// edgeBatch is three samples at the edges of every table: all ids 0 and
// dense values 0; all ids rows-1 and large dense values; ids alternating
// 0 and rows-1 within bags and across tables, negative dense values.
func edgeBatch(c models.Config) *models.Batch {
	sig := c.Signature()
	b := &models.Batch{N: 3, Sig: &sig, Columns: make([]models.Column, len(sig.Inputs))}
	dense := [3]func(i int) float32{
		func(int) float32 { return 0 },
		func(i int) float32 { return 15 + float32(i) },
		func(i int) float32 { return -float32(i) / 4 },
	}
	id := func(s, k, j int) int64 {
		last := c.TableRows[k] - 1
		switch s {
		case 0:
			return 0
		case 1:
			return last
		}
		if (k+j)%2 == 0 {
			return last
		}
		return 0
	}
	for s := range 3 {
		for i := range c.NumDense {
			b.Columns[0].F32 = append(b.Columns[0].F32, dense[s](i))
		}
		for k := range c.NumTables() {
			col := 1 + k
			if c.Packed {
				col = 1
			}
			for j := range c.Bag(k) {
				b.Columns[col].I64 = append(b.Columns[col].I64, id(s, k, j))
			}
		}
	}
	return b
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
