package ort

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestCUDAMatchesCPU runs a float32 matrix product on the CUDA execution
// provider and on the CPU and wants the same numbers to float32's
// rounding: sums of 256 products of numbers in [-1, 1] differ by at most
// 1.5e-5 between the two (measured on an H200: summation order), while
// TF32, which ONNX Runtime's CUDA provider enables by default on Ampere
// and later, rounds each factor to 11 bits and was off by 6.5e-3 there.
// Skipped unless ORT_LIB is a CUDA build on a machine with a GPU.
func TestCUDAMatchesCPU(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	const k, n = 256, 512
	r := rand.New(rand.NewPCG(1, 2))
	w := make([]float32, k*k)
	x := make([]float32, n*k)
	for i := range w {
		w[i] = r.Float32()*2 - 1
	}
	for i := range x {
		x[i] = r.Float32()*2 - 1
	}
	path := filepath.Join(t.TempDir(), "matmul.onnx")
	if err := os.WriteFile(path, matMulModel(k, w), 0o644); err != nil {
		t.Fatal(err)
	}
	gpu, err := NewSession(path, SessionOptions{CUDA: true})
	if err != nil {
		t.Skipf("no CUDA execution provider here: %v", err)
	}
	defer gpu.Close()
	tf32, err := NewSession(path, SessionOptions{CUDA: true, TF32: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tf32.Close()
	cpu, err := NewSession(path, SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	in := []Input{{Name: "x", Shape: []int64{n, k}, Float32: x}}
	want, err := cpu.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	worst := func(s *Session) float64 {
		got, err := s.Run(in)
		if err != nil {
			t.Fatal(err)
		}
		if len(got[0]) != n*k {
			t.Fatalf("%d outputs, want %d", len(got[0]), n*k)
		}
		var w float64
		for i := range want[0] {
			w = max(w, math.Abs(float64(got[0][i]-want[0][i])))
		}
		return w
	}
	const bound = 1e-4
	off, on := worst(gpu), worst(tf32)
	t.Logf("max abs difference from the CPU over %d sums of %d products: %g (float32), %g (TF32)", n*k, k, off, on)
	if off > bound {
		t.Fatalf("CUDA differs from the CPU by %g, over %g: TF32 not off?", off, bound)
	}
	// Before Ampere TF32 does not exist and the two agree.
	if on <= bound {
		t.Logf("TF32 made no difference: a GPU before Ampere?")
	}
}
