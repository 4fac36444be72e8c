package placement

import (
	"testing"
)

// TestFGDIncrementalMatchesRecompute checks the O(shapes) pricing of a
// candidate placement against recomputing the node's fragmentation after
// really placing the task, over random states.
func TestFGDIncrementalMatchesRecompute(t *testing.T) {
	w := TargetWorkload{
		{CPUMilli: 4000, GPUMilli: 500, GPUs: 1, Freq: 0.3},
		{CPUMilli: 8000, GPUMilli: 1000, GPUs: 1, Freq: 0.3},
		{CPUMilli: 16000, GPUMilli: 1000, GPUs: 2, Freq: 0.1},
		{CPUMilli: 2000, Freq: 0.2},
		{CPUMilli: 1000, GPUMilli: 250, GPUs: 1, Freq: 0.1},
	}
	rng := NewRand(7)
	for iter := 0; iter < 2000; iter++ {
		node := Node{Name: "n", CPUMilli: 64000, MemMiB: 0, GPUs: 1 + rng.IntN(8), Model: "G"}
		s := NewNodeState(&node, 0)
		s.CPULeft = int64(rng.IntN(64)) * 1000
		for i := 0; i < node.GPUs; i++ {
			s.GPULeft[i] = int64(rng.IntN(11)) * 100
		}
		var task Task
		switch rng.IntN(3) {
		case 0:
			task = Task{Name: "s", CPUMilli: int64(rng.IntN(8)) * 1000, GPUs: 1, GPUMilli: int64(1+rng.IntN(9)) * 100}
		case 1:
			task = Task{Name: "w", CPUMilli: int64(rng.IntN(8)) * 1000, GPUs: 1 + rng.IntN(2), GPUMilli: 1000}
		default:
			task = Task{Name: "c", CPUMilli: int64(rng.IntN(8)) * 1000}
		}
		if !s.Fits(&task) {
			continue
		}
		f := &FGDScore{Workload: w, Exact: true}
		old := NodeFrag(s, w)
		score := f.Score(nil, &task, s)
		gpus := f.ChooseGPUs(nil, &task, s)
		if task.GPUs == 0 {
			gpus = nil
		}
		c := *s
		if err := c.Assign(&task, gpus); err != nil {
			t.Fatal(err)
		}
		want := f.toScore(old - NodeFrag(&c, w))
		if diff := score - want; diff > 1e-9 || diff < -1e-9 {
			t.Fatalf("iter %d: task %+v on %v cpu %d: incremental score %v, recomputed %v", iter, task, s.GPUs(), s.CPULeft, score, want)
		}
	}
}
