package placement

import (
	"fmt"
	"math"
)

// registerOwn adds policies of our own beyond the paper's.
func registerOwn(r *Registry) {
	r.MustRegister("FGDExact", func(o PolicyOptions) (*Policy, error) {
		return &Policy{Name: "FGDExact", Filters: []FilterPlugin{FitFilter{}}, Score: &FGDScore{Workload: o.Workload, Exact: true}}, nil
	})
	own := func(name string, sec PackSecondary) {
		r.MustRegister(name, func(o PolicyOptions) (*Policy, error) {
			if len(o.Workload) == 0 {
				return nil, fmt.Errorf("policy %s: empty target workload", name)
			}
			return &Policy{Name: name, Filters: []FilterPlugin{FitFilter{}}, Score: &FGDPackScore{Workload: o.Workload, Secondary: sec}}, nil
		})
	}
	// FGDPack is the chosen variant (best on seeds 1-10); the others stay
	// registered so the comparison in BENCHMARKS.md can be rerun.
	own("FGDPack", PackBestFit)
	for _, sec := range []PackSecondary{PackGPUFit, PackUsed, PackFullFree, PackExact} {
		own("FGDPack-"+string(sec), sec)
	}
}

// PackSecondary names the tie breaker FGDPackScore applies between
// placements with the same (truncated) FGD score.
type PackSecondary string

const (
	// PackGPUFit: the node left with the least free GPU capacity.
	PackGPUFit PackSecondary = "gpufit"
	// PackUsed: a node already hosting tasks, then the least free GPU.
	PackUsed PackSecondary = "used"
	// PackBestFit: BestFit's weighted CPU and GPU left, untruncated.
	PackBestFit PackSecondary = "bestfit"
	// PackFullFree: the fewest fully free GPUs left, then the least free GPU.
	PackFullFree PackSecondary = "fullfree"
	// PackExact: the untruncated fragmentation decrease.
	PackExact PackSecondary = "exact"
)

// FGDPackScore is FGD with the packing it gets from ties made explicit.
// The primary key is FGD's own truncated score, so it prefers exactly the
// placements FGD prefers; between equal scores it ranks by Secondary
// instead of leaving the choice to node order. The score is primary +
// secondary/2 with secondary in [0,1), so the order is lexicographic. For a
// fractional task the GPU is chosen the same way: best primary, then the
// least free GPU that fits.
type FGDPackScore struct {
	Workload  TargetWorkload
	Secondary PackSecondary
	fgd       FGDScore
}

var (
	_ ScorePlugin = (*FGDPackScore)(nil)
	_ GPUChooser  = (*FGDPackScore)(nil)
)

func (*FGDPackScore) Name() string { return "FGDPack" }

func (p *FGDPackScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	s, _ := p.best(t, n)
	return s
}

func (p *FGDPackScore) ChooseGPUs(_ *CycleState, t *Task, n *NodeState) []int {
	if !t.IsShare() {
		return n.FirstFreeGPUs(t.GPUs)
	}
	if _, g := p.best(t, n); g >= 0 {
		return []int{g}
	}
	return nil
}

func (p *FGDPackScore) best(t *Task, n *NodeState) (float64, int) {
	p.fgd.Workload = p.Workload
	st := p.fgd.statsOf(n)
	if !t.IsShare() {
		var nf float64
		if t.GPUs == 0 {
			nf = st.after(p.Workload, 0, 0, 0, t.CPUMilli, 0)
		} else {
			nf = st.after(p.Workload, int32(t.GPUs), MilliGPU, 0, t.CPUMilli, t.TotalGPUMilli())
		}
		full := 0
		if t.GPUs > 0 {
			full = t.GPUs
		}
		return p.combine(st.frag-nf, t, n, t.TotalGPUMilli(), full), -1
	}
	best, bestGPU := -1.0, -1
	for i, g := range n.GPUs() {
		if g < t.GPUMilli {
			continue
		}
		nf := st.after(p.Workload, 1, g, g-t.GPUMilli, t.CPUMilli, t.GPUMilli)
		full := 0
		if g == MilliGPU {
			full = 1
		}
		s := p.combine(st.frag-nf, t, n, t.GPUMilli, full)
		// Between equal node scores, the tighter GPU.
		s += 1e-6 * float64(MilliGPU-(g-t.GPUMilli)) / MilliGPU
		if bestGPU < 0 || s > best {
			best, bestGPU = s, i
		}
	}
	return best, bestGPU
}

// combine is the lexicographic score of a placement that lowers the node's
// fragmentation by delta, takes gpu milli-GPU and turns full fully free
// GPUs into used ones.
func (p *FGDPackScore) combine(delta float64, t *Task, n *NodeState, gpu int64, full int) float64 {
	sig := maxScore / (1 + math.Exp(-delta/1000))
	primary := math.Trunc(sig)
	left := float64(n.GPULeftTotal()-gpu) / float64(MaxGPUsPerNode*MilliGPU+1)
	var sec float64
	switch p.Secondary {
	case PackGPUFit:
		sec = 1 - left
	case PackUsed:
		if n.Tasks > 0 {
			sec = 0.5
		}
		sec += 0.5 * (1 - left)
	case PackBestFit:
		s := float64(n.CPULeft-t.CPUMilli)/maxSpecCPU*0.5 + float64(n.GPULeftTotal()-gpu)/maxSpecGPU*0.5
		sec = 1 - min(max(s, 0), 1)*0.999
	case PackFullFree:
		ff := n.FullyFreeGPUs() - full
		sec = 1 - (float64(ff)+left)/float64(MaxGPUsPerNode+1)
	case PackExact:
		sec = sig - primary
	}
	return primary + sec/2
}
