package ort

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestCUDAMatchesCPU runs a float32 matrix product on the CUDA execution
// provider and on the CPU and wants the same numbers to 1e-5: TF32 (which
// ONNX Runtime's CUDA provider enables by default on Ampere and later)
// would be off by about 1e-3 here. Skipped unless ORT_LIB is a CUDA
// build on a machine with a GPU.
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
	got, err := gpu.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(got[0]) != n*k {
		t.Fatalf("%d outputs, want %d", len(got[0]), n*k)
	}
	var worst float64
	for i := range want[0] {
		worst = max(worst, math.Abs(float64(got[0][i]-want[0][i])))
	}
	t.Logf("max abs difference CUDA vs CPU over %d sums of %d products: %g", n*k, k, worst)
	if worst > 1e-5 {
		t.Fatalf("CUDA differs from the CPU by %g (TF32?)", worst)
	}
}
