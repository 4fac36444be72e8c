package ort

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

const (
	arenaChildEnv  = "PRISM_ARENA_CHILD"  // "shared" or "own"
	arenaModelEnv  = "PRISM_ARENA_MODEL"  // the model the child loads
	arenaNEnv      = "PRISM_ARENA_N"      // sessions
	arenaBatchEnv  = "PRISM_ARENA_BATCH"  // samples of each session's run
	arenaResultEnv = "PRISM_ARENA_RESULT" // where the child writes arenaResult
)

// arenaResult is what an arena child measured: its resident memory
// after loading and after one run of each session, and the first
// session's outputs.
type arenaResult struct {
	LoadedMB, RunMB int64
	Out             []float32
}

// TestArenaChild is the child of TestSharedArena and
// BenchmarkSharedArena: N sessions of the model, each run once on a
// batch of the same inputs, in a process whose sessions share the
// environment's arena or keep their own (ShareArena is process-wide).
func TestArenaChild(t *testing.T) {
	mode := os.Getenv(arenaChildEnv)
	if mode == "" {
		t.Skip("only run as TestSharedArena's child process")
	}
	if mode == "shared" {
		if err := ShareArena(); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := strconv.Atoi(os.Getenv(arenaNEnv))
	batch, _ := strconv.Atoi(os.Getenv(arenaBatchEnv))
	var ss []*Session
	for range n {
		s, err := NewSession(os.Getenv(arenaModelEnv), SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	res := arenaResult{LoadedMB: residentMB(t)}
	r := rand.New(rand.NewPCG(1, 2))
	for i, s := range ss {
		var in []Input
		for _, info := range s.inputs {
			d := info.Dimensions[len(info.Dimensions)-1]
			x := make([]float32, batch*int(d))
			for j := range x {
				x[j] = r.Float32()
			}
			in = append(in, Input{Name: info.Name, Shape: []int64{int64(batch), d}, Float32: x})
		}
		out, err := s.Run(in)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			res.Out = out[0]
		}
	}
	res.RunMB = residentMB(t)
	b, _ := json.Marshal(res)
	if err := os.WriteFile(os.Getenv(arenaResultEnv), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// residentMB is this process's resident memory.
func residentMB(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb >> 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// runArenaChild runs TestArenaChild in mode ("shared" or "own").
func runArenaChild(t testing.TB, mode, model string, n, batch int) arenaResult {
	t.Helper()
	out := t.TempDir() + "/result.json"
	cmd := exec.Command(os.Args[0], "-test.run=^TestArenaChild$", "-test.v=false", "-test.bench=^$")
	cmd.Env = append(os.Environ(), arenaChildEnv+"="+mode, arenaModelEnv+"="+model, arenaNEnv+"="+strconv.Itoa(n), arenaBatchEnv+"="+strconv.Itoa(batch), arenaResultEnv+"="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("arena child (%s): %v\n%s", mode, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res arenaResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestSharedArena: sessions sharing the environment's arena
// (ShareArena) score as sessions with their own do.
func TestSharedArena(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	if err := Init(); err != nil {
		t.Skip(err)
	}
	const width = 64
	w := make([]float32, width*width)
	for i := range w {
		w[i] = float32(i%7) - 3
	}
	model := writeModel(t, "mm.onnx", matMulModel(width, w))
	own := runArenaChild(t, "own", model, 3, 256)
	shared := runArenaChild(t, "shared", model, 3, 256)
	if len(own.Out) != 256*width || len(shared.Out) != len(own.Out) {
		t.Fatalf("outputs of %d and %d values, want %d", len(own.Out), len(shared.Out), 256*width)
	}
	for i := range own.Out {
		if own.Out[i] != shared.Out[i] {
			t.Fatalf("output %d: %v with a shared arena, %v without", i, shared.Out[i], own.Out[i])
		}
	}
}

// BenchmarkSharedArena reports the resident memory of N sessions after
// one run each, with an arena each and with the environment's shared
// (PRISM_ARENA_MODEL: a dense.onnx, e.g. make demo's
// out/demo/dlrm-kaggle-part/dense.onnx; else a 1024-wide MatMul),
// PRISM_ARENA_N sessions (20), PRISM_ARENA_BATCH samples (4096).
func BenchmarkSharedArena(b *testing.B) {
	if err := Init(); err != nil {
		b.Skip(err)
	}
	model := os.Getenv(arenaModelEnv)
	if model == "" {
		const width = 1024
		model = writeModel(b, "mm.onnx", matMulModel(width, make([]float32, width*width)))
	}
	n, batch := 20, 4096
	if v, err := strconv.Atoi(os.Getenv(arenaNEnv)); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv(arenaBatchEnv)); err == nil {
		batch = v
	}
	for range b.N {
		own := runArenaChild(b, "own", model, n, batch)
		shared := runArenaChild(b, "shared", model, n, batch)
		b.ReportMetric(float64(own.RunMB), "own-MB")
		b.ReportMetric(float64(shared.RunMB), "shared-MB")
		b.ReportMetric(float64(shared.RunMB)/float64(own.RunMB), "shared/own")
	}
}
