package placement

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// Shape is a task shape of the target workload with its probability.
type Shape struct {
	CPUMilli int64
	GPUMilli int64 // per GPU; 0 for CPU tasks
	GPUs     int
	Models   string // "|"-joined model constraint, "" for any
	Freq     float64
	models   []string
}

// Accepts reports whether a node of the model can serve the shape.
func (s *Shape) Accepts(model string) bool {
	return s.Models == "" || slices.Contains(s.models, model)
}

// TargetWorkload is the distribution of task shapes FGD expects to arrive.
type TargetWorkload []Shape

// NewTargetWorkload takes the most popular shapes of tasks, adding one
// shape at a time in decreasing count until they cover at least coverage
// (0.6 in the paper) of the tasks, and renormalizes their frequencies. CPU
// tasks are included, as the reference simulator's runs do. Ties in count
// are broken as the reference does (larger CPU, then GPU share, then count
// first) so the result does not depend on input order.
func NewTargetWorkload(tasks []Task, coverage float64) TargetWorkload {
	type key struct {
		cpu, milli int64
		gpus       int
		models     string
	}
	counts := map[key]int{}
	for i := range tasks {
		t := &tasks[i]
		counts[key{t.CPUMilli, t.GPUMilli, t.GPUs, strings.Join(t.Models, "|")}]++
	}
	var shapes TargetWorkload
	for k, c := range counts {
		shapes = append(shapes, Shape{CPUMilli: k.cpu, GPUMilli: k.milli, GPUs: k.gpus, Models: k.models, Freq: float64(c)})
	}
	slices.SortFunc(shapes, func(a, b Shape) int {
		return cmp.Or(
			cmp.Compare(b.Freq, a.Freq),
			cmp.Compare(b.CPUMilli, a.CPUMilli),
			cmp.Compare(b.GPUMilli, a.GPUMilli),
			cmp.Compare(b.GPUs, a.GPUs),
			cmp.Compare(b.Models, a.Models))
	})
	total := float64(len(tasks))
	var cum float64
	n := 0
	for n < len(shapes) && cum < coverage*total {
		cum += shapes[n].Freq
		n++
	}
	shapes = shapes[:n]
	for i := range shapes {
		shapes[i].Freq /= cum
		if shapes[i].Models != "" {
			shapes[i].models = strings.Split(shapes[i].Models, "|")
		}
	}
	return shapes
}

// NodeFrag is FGD's fragmentation measure of one node in milli-GPU: the
// expected free GPU capacity that a task drawn from w cannot use there. For
// a shape the node can host, the free shares of GPUs too small for it are
// fragments; for a shape it cannot host (CPU, GPU model, too few GPUs with
// room) every free share is, and so it is for CPU-only shapes.
func NodeFrag(n *NodeState, w TargetWorkload) float64 {
	var st fragStats
	st.compute(n, w)
	return st.frag
}

// fragStats caches, per shape, the GPUs of a node with room for it and the
// free shares of those without, so that FGD can price a candidate
// placement in O(shapes) instead of O(shapes x GPUs).
type fragStats struct {
	version uint64
	valid   bool
	fit     []int32
	small   []int64
	acc     []bool
	total   int64
	cpu     int64
	frag    float64
}

func (st *fragStats) compute(n *NodeState, w TargetWorkload) {
	st.fit = st.fit[:0]
	st.small = st.small[:0]
	st.acc = st.acc[:0]
	st.total = n.GPULeftTotal()
	st.cpu = n.CPULeft
	for i := range w {
		s := &w[i]
		var fit int32
		var small int64
		for _, g := range n.GPUs() {
			if g >= s.GPUMilli {
				fit++
			} else {
				small += g
			}
		}
		st.fit = append(st.fit, fit)
		st.small = append(st.small, small)
		st.acc = append(st.acc, s.Accepts(n.Node.Model))
	}
	st.frag = st.after(w, 0, 0, 0, 0, 0)
	st.version = n.version
	st.valid = true
}

// after prices the node once k GPUs go from a free to b free each, the
// CPU drops by cpu and the total free GPU by used.
func (st *fragStats) after(w TargetWorkload, k int32, a, b, cpu, used int64) float64 {
	total := st.total - used
	cpuLeft := st.cpu - cpu
	var f float64
	for i := range w {
		s := &w[i]
		if s.GPUMilli == 0 || !st.acc[i] {
			f += s.Freq * float64(total)
			continue
		}
		fit, small := st.fit[i], st.small[i]
		if k > 0 {
			if a >= s.GPUMilli {
				fit -= k
			} else {
				small -= int64(k) * a
			}
			if b >= s.GPUMilli {
				fit += k
			} else {
				small += int64(k) * b
			}
		}
		if int(fit) >= s.GPUs && cpuLeft >= s.CPUMilli {
			f += s.Freq * float64(small)
		} else {
			f += s.Freq * float64(total)
		}
	}
	return f
}

// FGDScore is Fragmentation Gradient Descent: place the task where the
// node's fragmentation grows least, trying each GPU for a fractional task.
// The score is the reference's 100*sigmoid(decrease/1000), truncated.
type FGDScore struct {
	Workload TargetWorkload
	// Exact keeps the untruncated sigmoid, so ties are rare; the paper's
	// configuration truncates.
	Exact bool
	stats []fragStats
}

var (
	_ ScorePlugin = (*FGDScore)(nil)
	_ GPUChooser  = (*FGDScore)(nil)
)

func (*FGDScore) Name() string { return "FGD" }

func (f *FGDScore) statsOf(n *NodeState) *fragStats {
	if n.Index >= len(f.stats) {
		f.stats = append(f.stats, make([]fragStats, n.Index+1-len(f.stats))...)
	}
	st := &f.stats[n.Index]
	if !st.valid || st.version != n.version {
		st.compute(n, f.Workload)
	}
	return st
}

func (f *FGDScore) toScore(delta float64) float64 {
	s := maxScore / (1 + math.Exp(-delta/1000))
	if f.Exact {
		return s
	}
	return math.Trunc(s)
}

func (f *FGDScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	s, _ := f.best(t, n)
	return s
}

// best returns the best score on n and, for a fractional task, the GPU
// that gets it (the first such in device order).
func (f *FGDScore) best(t *Task, n *NodeState) (float64, int) {
	st := f.statsOf(n)
	if !t.IsShare() {
		var nf float64
		if t.GPUs == 0 {
			nf = st.after(f.Workload, 0, 0, 0, t.CPUMilli, 0)
		} else {
			nf = st.after(f.Workload, int32(t.GPUs), MilliGPU, 0, t.CPUMilli, t.TotalGPUMilli())
		}
		return f.toScore(st.frag - nf), -1
	}
	best, bestGPU := -1.0, -1
	var seen [MaxGPUsPerNode]int64
	nseen := 0
outer:
	for i, g := range n.GPUs() {
		if g < t.GPUMilli {
			continue
		}
		for _, v := range seen[:nseen] {
			if v == g { // same free share, same score; the first GPU keeps it
				continue outer
			}
		}
		seen[nseen] = g
		nseen++
		nf := st.after(f.Workload, 1, g, g-t.GPUMilli, t.CPUMilli, t.GPUMilli)
		if s := f.toScore(st.frag - nf); bestGPU < 0 || s > best {
			best, bestGPU = s, i
		}
	}
	return best, bestGPU
}

func (f *FGDScore) ChooseGPUs(_ *CycleState, t *Task, n *NodeState) []int {
	if !t.IsShare() {
		return n.FirstFreeGPUs(t.GPUs)
	}
	if _, g := f.best(t, n); g >= 0 {
		return []int{g}
	}
	return nil
}
