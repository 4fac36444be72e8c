package placement

import (
	"math"
	"testing"
)

func node8(cpuLeft int64, gpus ...int64) *NodeState {
	n := &Node{Name: "n", CPUMilli: 96000, GPUs: len(gpus), Model: "G2"}
	s := NewNodeState(n, 0)
	s.CPULeft = cpuLeft
	copy(s.GPULeft[:], gpus)
	return s
}

// The expected values are computed by hand from each policy's formula.
func TestScoreFunctions(t *testing.T) {
	share := &Task{Name: "share", CPUMilli: 4000, GPUs: 1, GPUMilli: 500}
	whole := &Task{Name: "whole", CPUMilli: 8000, GPUs: 1, GPUMilli: 1000}
	two := &Task{Name: "two", CPUMilli: 16000, GPUs: 2, GPUMilli: 1000}
	cpu := &Task{Name: "cpu", CPUMilli: 32000}
	empty := node8(96000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	half := node8(64000, 600, 1000, 0, 1000)
	cases := []struct {
		name   string
		plugin ScorePlugin
		task   *Task
		node   *NodeState
		want   float64
	}{
		// DotProd: 100*(1 - (96/128*4/128 + 8/8*0.5/8)/2) = 100*(1-(0.0234375+0.0625)/2) = 95.703 -> 95
		{"dotprod share empty", DotProdScore{}, share, empty, 95},
		// (64/128*16/128 + 2.6/8*2/8)/2 = (0.0625+0.08125)/2 = 0.071875 -> 92.8 -> 92
		{"dotprod two half", DotProdScore{}, two, half, 92},
		// cpu task: (96/128*32/128)/2 = 0.09375 -> 90.6 -> 90
		{"dotprod cpu empty", DotProdScore{}, cpu, empty, 90},
		// BestFit raw: (1 - ((96-4)/128*0.5 + (8-0.5)/8*0.5))*100 = (1-(0.359375+0.46875))*100 = 17.19 -> 17
		{"bestfit share empty", BestFitScore{}, share, empty, 17},
		// (1 - ((64-8)/128*.5 + (2.6-1)/8*.5))*100 = (1-(0.21875+0.1))*100 = 68.1 -> 68
		{"bestfit whole half", BestFitScore{}, whole, half, 68},
		// GpuPacking: idle node -> max(33-8, 8) = 25
		{"packing whole empty", GpuPackingScore{}, whole, empty, 25},
		// share on the 600 GPU: 100 - (600*100/1000)/10 = 94
		{"packing share half", GpuPackingScore{}, share, half, 94},
		// whole on a used node takes one free GPU: max(50-1, 33) = 49
		{"packing whole half", GpuPackingScore{}, whole, half, 49},
		{"packing cpu", GpuPackingScore{}, cpu, half, 0},
		// GpuClustering: empty node band 1: 25*(8000-8000)/8000 + 25 = 25
		{"clustering whole empty", GpuClusteringScore{}, whole, empty, 25},
		{"clustering cpu", GpuClusteringScore{}, cpu, empty, 0},
	}
	for _, c := range cases {
		if got := c.plugin.Score(&CycleState{Rand: NewRand(1)}, c.task, c.node); got != c.want {
			t.Errorf("%s: score %v, want %v", c.name, got, c.want)
		}
	}
}

func TestGpuClusteringBands(t *testing.T) {
	whole := &Task{Name: "w", CPUMilli: 1000, GPUs: 1, GPUMilli: 1000}
	share := &Task{Name: "s", CPUMilli: 1000, GPUs: 1, GPUMilli: 300}
	s := node8(96000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	if err := s.Assign(whole, []int{0}); err != nil {
		t.Fatal(err)
	}
	// Only 1-gpu tasks there: band 3; fill 25*(8000-7000)/8000 = 3 -> 78.
	if got := (GpuClusteringScore{}).Score(nil, whole, s); got != 78 {
		t.Errorf("same shape only: %v, want 78", got)
	}
	// A share task sees a node of another shape: band 0 -> 3.
	if got := (GpuClusteringScore{}).Score(nil, share, s); got != 3 {
		t.Errorf("other shape: %v, want 3", got)
	}
	if err := s.Assign(share, []int{1}); err != nil {
		t.Fatal(err)
	}
	// Mixed node holding the shape: band 2; fill 25*(8000-6700)/8000 = 4 -> 54.
	if got := (GpuClusteringScore{}).Score(nil, whole, s); got != 54 {
		t.Errorf("mixed: %v, want 54", got)
	}
}

func TestBestFitNormalize(t *testing.T) {
	s := []float64{17, 68, 42, 68}
	(BestFitScore{}).Normalize(s)
	want := []float64{0, 100, 49, 100} // (42-17)*100/51 = 49
	for i := range s {
		if s[i] != want[i] {
			t.Fatalf("normalized %v, want %v", s, want)
		}
	}
	same := []float64{5, 5}
	(BestFitScore{}).Normalize(same)
	if same[0] != 0 || same[1] != 0 {
		t.Fatalf("equal scores normalized to %v, want zeros", same)
	}
}

func TestNodeFragByHand(t *testing.T) {
	w := TargetWorkload{
		{CPUMilli: 4000, GPUMilli: 500, GPUs: 1, Freq: 0.5},
		{CPUMilli: 8000, GPUMilli: 1000, GPUs: 1, Freq: 0.3},
		{CPUMilli: 2000, Freq: 0.2},
	}
	// GPUs free 600, 1000, 0, 300; 10 cores left.
	s := node8(10000, 600, 1000, 0, 300)
	// share shape fits (600 and 1000 have room): fragments = 0 + 300 = 300 -> 0.5*300
	// whole shape fits (1000): fragments = 600+300 = 900 -> 0.3*900
	// cpu shape: all 1900 free -> 0.2*1900
	want := 0.5*300 + 0.3*900 + 0.2*1900
	if got := NodeFrag(s, w); math.Abs(got-want) > 1e-9 {
		t.Fatalf("NodeFrag = %v, want %v", got, want)
	}
	// With 5 cores the whole shape lacks CPU: all 1900 count for it.
	s.CPULeft = 5000
	want = 0.5*300 + 0.3*1900 + 0.2*1900
	if got := NodeFrag(s, w); math.Abs(got-want) > 1e-9 {
		t.Fatalf("NodeFrag lacking cpu = %v, want %v", got, want)
	}
	// FGD score of a 500-milli task: on the 600 GPU frag drops by
	// 0.5*0 + 0.3*(0) ... computed: new free 100,1000,0,300, cpu 1000:
	// share shape lacks CPU -> 1400*0.5; whole lacks CPU -> 1400*0.3; cpu shape 1400*0.2.
	f := &FGDScore{Workload: w}
	task := &Task{Name: "t", CPUMilli: 4000, GPUs: 1, GPUMilli: 500}
	old := NodeFrag(s, w)
	newFrag := 1400.0
	wantScore := math.Trunc(100 / (1 + math.Exp(-(old-newFrag)/1000)))
	if got := f.Score(nil, task, s); got != wantScore {
		t.Fatalf("FGD score %v, want %v (old %v new %v)", got, wantScore, old, newFrag)
	}
}

func TestTargetWorkload(t *testing.T) {
	var tasks []Task
	add := func(n int, k Task) {
		for i := 0; i < n; i++ {
			tasks = append(tasks, k)
		}
	}
	add(5, Task{CPUMilli: 1000, GPUs: 1, GPUMilli: 500})
	add(3, Task{CPUMilli: 2000, GPUs: 1, GPUMilli: 1000})
	add(1, Task{CPUMilli: 3000})
	add(1, Task{CPUMilli: 4000})
	w := NewTargetWorkload(tasks, 0.6)
	if len(w) != 2 || w[0].GPUMilli != 500 || math.Abs(w[0].Freq-5.0/8) > 1e-12 || math.Abs(w[1].Freq-3.0/8) > 1e-12 {
		t.Fatalf("target workload %+v", w)
	}
	// A tie in count goes to the larger CPU first.
	w = NewTargetWorkload(tasks, 0.95)
	if len(w) != 4 || w[2].CPUMilli != 4000 {
		t.Fatalf("tie order %+v", w)
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	for _, n := range PaperPolicies {
		if _, err := r.New(n, PolicyOptions{Workload: TargetWorkload{{GPUMilli: 1000, GPUs: 1, Freq: 1}}}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := r.New("nope", PolicyOptions{}); err == nil {
		t.Error("unknown policy accepted")
	}
	if err := r.Register("FGD", nil); err == nil {
		t.Error("duplicate registration accepted")
	}
}

func TestUnschedulableIsNotError(t *testing.T) {
	nodes := []Node{{Name: "a", CPUMilli: 4000, GPUs: 1, Model: "T4"}}
	c := NewCluster(nodes)
	p, _ := NewRegistry().New("BestFit", PolicyOptions{})
	_, _, st := NewScheduler(p).Schedule(&CycleState{Rand: NewRand(1)}, c, &Task{Name: "big", CPUMilli: 8000})
	if st.Code != Unschedulable {
		t.Fatalf("status %v, want Unschedulable", st.Code)
	}
	_, _, st = NewScheduler(p).Schedule(&CycleState{Rand: NewRand(1)}, c, &Task{Name: "v100", GPUs: 1, GPUMilli: 1000, Models: []string{"V100"}})
	if st.Code != Unschedulable {
		t.Fatalf("model mismatch: status %v, want Unschedulable", st.Code)
	}
}

// The scores the table above leaves out, by hand.
func TestMoreScoresByHand(t *testing.T) {
	// Random: the PreScore pick gets 100, every other node 0.
	a, b := node8(96000, 1000), node8(96000, 1000)
	b.Index = 1
	cs := &CycleState{Rand: NewRand(1)}
	task := &Task{Name: "w", CPUMilli: 1000, GPUs: 1, GPUMilli: 1000}
	(RandomScore{}).PreScore(cs, task, []*NodeState{a, b})
	sa, sb := (RandomScore{}).Score(cs, task, a), (RandomScore{}).Score(cs, task, b)
	if sa+sb != 100 || sa*sb != 0 {
		t.Errorf("random scores %v, %v: want one 100 and one 0", sa, sb)
	}

	// GpuPacking on an idle 2-GPU node: max(33-2, 2) = 31. A share task
	// on GPUs 300, 600, 1000 walks them from the least free: 300 is too
	// small, 600 takes it with no free GPU used: max(100 - 60/10, 50) = 94.
	if got := (GpuPackingScore{}).Score(nil, task, node8(96000, 1000, 1000)); got != 31 {
		t.Errorf("packing idle 2-gpu node: %v, want 31", got)
	}
	share := &Task{Name: "s", CPUMilli: 1000, GPUs: 1, GPUMilli: 500}
	if got := (GpuPackingScore{}).Score(nil, share, node8(96000, 300, 600, 1000)); got != 94 {
		t.Errorf("packing share: %v, want 94", got)
	}

	// FGD, whole-GPU task. Shapes 500-milli share and 1 GPU, each 4 cores
	// and half the weight. GPUs 1000, 1000, 600, 10 cores: the share shape
	// fits everywhere (0), the 1-GPU shape sees 600 as a fragment (0.5*600):
	// 300. A 1-GPU task with 8 cores leaves 2 cores, so neither shape fits
	// and all 1600 free milli are fragments: decrease -1300,
	// 100*sigmoid(-1.3) = 21.42 -> 21.
	w := TargetWorkload{
		{CPUMilli: 4000, GPUMilli: 500, GPUs: 1, Freq: 0.5},
		{CPUMilli: 4000, GPUMilli: 1000, GPUs: 1, Freq: 0.5},
	}
	n := node8(10000, 1000, 1000, 600)
	if got := NodeFrag(n, w); got != 300 {
		t.Fatalf("NodeFrag %v, want 300", got)
	}
	big := &Task{Name: "b", CPUMilli: 8000, GPUs: 1, GPUMilli: 1000}
	if got := (&FGDScore{Workload: w}).Score(nil, big, n); got != 21 {
		t.Errorf("FGD whole-GPU task: %v, want 21", got)
	}
	if got, want := (&FGDScore{Workload: w, Exact: true}).Score(nil, big, n), 100/(1+math.Exp(1.3)); math.Abs(got-want) > 1e-12 {
		t.Errorf("FGDExact: %v, want %v", got, want)
	}
}
