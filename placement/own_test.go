package placement

import (
	"math"
	"testing"
)

// FGDPack's score is FGD's truncated score plus half its tie breaker; the
// numbers are worked by hand.
func TestFGDPackScoreByHand(t *testing.T) {
	w := TargetWorkload{{CPUMilli: 4000, GPUMilli: 500, GPUs: 1, Freq: 1}}
	task := &Task{Name: "s", CPUMilli: 4000, GPUs: 1, GPUMilli: 500}
	p := &FGDPackScore{Workload: w, Secondary: PackBestFit}

	// Four free GPUs: every GPU still fits the shape afterwards, so the
	// fragmentation stays 0: sigmoid(0) = 50. BestFit's left share:
	// (96-4)/128*0.5 + (4-0.5)/8*0.5 = 0.359375 + 0.21875 = 0.578125.
	// The chosen GPU keeps 500 of 1000: GPU term 1e-6*0.5.
	empty := node8(96000, 1000, 1000, 1000, 1000)
	want := 50 + (1-0.578125*0.999)/2 + 1e-6*0.5
	if got := p.Score(nil, task, empty); math.Abs(got-want) > 1e-12 {
		t.Fatalf("empty node: score %v, want %v", got, want)
	}

	// GPUs 600, 1000, 1000: on GPU 0 the 100 left is a fragment, so the
	// fragmentation grows by 100: 100*sigmoid(-0.1) = 47.50 -> 47; on GPU 1
	// it stays 0 -> 50. FGDPack takes GPU 1, the first of the tied best.
	used := node8(96000, 600, 1000, 1000)
	if g := p.ChooseGPUs(nil, task, used); len(g) != 1 || g[0] != 1 {
		t.Fatalf("chose %v, want [1]", g)
	}
	// Same primary as FGD on both nodes.
	f := &FGDScore{Workload: w}
	for _, n := range []*NodeState{empty, used} {
		if got, fgd := math.Floor(p.Score(nil, task, n)), f.Score(nil, task, n); got != fgd {
			t.Errorf("primary %v, FGD %v", got, fgd)
		}
	}

	// Between two nodes FGD ties (both 50), the fuller one wins: used has
	// 2.6 GPUs and 96 cores left, so its BestFit share is smaller.
	if p.Score(nil, task, used) <= p.Score(nil, task, empty) {
		t.Fatalf("tie went to the emptier node")
	}

	// The exact secondary ranks by the untruncated sigmoid: for a CPU task
	// taking 4 of 6 cores, the shape loses its CPU and all 2000 free milli
	// become fragments: 100*sigmoid(-2) = 11.92 -> 11 + 0.92/2.
	small := node8(6000, 1000, 1000)
	cpu := &Task{Name: "c", CPUMilli: 4000}
	px := &FGDPackScore{Workload: w, Secondary: PackExact}
	sig := 100 / (1 + math.Exp(2))
	if got, want := px.Score(nil, cpu, small), 11+(sig-11)/2; math.Abs(got-want) > 1e-12 {
		t.Fatalf("exact secondary: %v, want %v", got, want)
	}
}

// Two GPUs, tasks 810, 810, 400 milli in that order: at 100% arrived all
// three are in. Volume alone allows 100%. With eps = 191 an 810 weighs a
// whole GPU and the 400 weighs 400: place 400 (budget 1600 left), one 810
// (600 left), 0.6 of the other 810 (486): 1696 of 2000 = 84.8%. The best
// real packing is 810+810 = 81%, under the bound.
func TestAllocBoundByHand(t *testing.T) {
	nodes := []Node{{Name: "n", CPUMilli: 64000, GPUs: 2, Model: "G"}}
	tasks := []Task{
		{Name: "a", CPUMilli: 1000, GPUs: 1, GPUMilli: 810},
		{Name: "b", CPUMilli: 1000, GPUs: 1, GPUMilli: 810},
		{Name: "c", CPUMilli: 1000, GPUs: 1, GPUMilli: 400},
	}
	got, err := AllocBound(nodes, tasks, SimOptions{Inflation: -1, NoShuffle: true}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got-84.8) > 1e-9 {
		t.Fatalf("bound %v, want 84.8", got)
	}
	r, err := Simulate(nodes, tasks, "FGD", NewRegistry(), SimOptions{Inflation: -1, NoShuffle: true})
	if err != nil {
		t.Fatal(err)
	}
	if a := r.AllocAt(100); a > got+1e-9 {
		t.Fatalf("FGD allocates %v above the bound %v", a, got)
	}
}
