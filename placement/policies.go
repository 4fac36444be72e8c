package placement

import "math"

// Normalization constants of the reference simulator: the largest node
// spec it assumes (128 cores, 8 GPUs).
const (
	maxSpecCPU = 128000
	maxSpecGPU = 8000
	maxScore   = 100
)

// RandomScore gives 100 to one feasible node drawn at random and 0 to the
// rest.
type RandomScore struct{}

var (
	_ ScorePlugin    = RandomScore{}
	_ PreScorePlugin = RandomScore{}
)

func (RandomScore) Name() string { return "Random" }

func (RandomScore) PreScore(cs *CycleState, _ *Task, feasible []*NodeState) {
	cs.Pick = feasible[cs.Rand.IntN(len(feasible))].Index
}

func (RandomScore) Score(cs *CycleState, _ *Task, n *NodeState) float64 {
	if n.Index == cs.Pick {
		return maxScore
	}
	return 0
}

// DotProdScore is Tetris's alignment score as the reference simulator
// configures it for the paper (merged GPU dimension, normalized by the
// largest node): 100*(1 - <free,req>/2), truncated. A smaller dot product
// scores higher.
type DotProdScore struct{}

var _ ScorePlugin = DotProdScore{}

func (DotProdScore) Name() string { return "DotProd" }

func (DotProdScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	return dotProdScore(n.CPULeft, n.GPULeftTotal(), t.CPUMilli, t.TotalGPUMilli())
}

func dotProdScore(cpuLeft, gpuLeft, cpu, gpu int64) float64 {
	if cpuLeft < cpu {
		return 0
	}
	dot := float64(cpuLeft)/maxSpecCPU*float64(cpu)/maxSpecCPU + float64(gpuLeft)/maxSpecGPU*float64(gpu)/maxSpecGPU
	return math.Trunc(maxScore * (1 - dot/2))
}

// GpuClusteringScore packs tasks of the same GPU shape together: nodes
// hosting only that shape score (75,100], nodes hosting it among others
// (50,75], empty nodes (25,50], nodes of other shapes [0,25]; within a band
// fuller nodes score higher. CPU tasks score 0 everywhere.
type GpuClusteringScore struct{}

var _ ScorePlugin = GpuClusteringScore{}

func (GpuClusteringScore) Name() string { return "GpuClustering" }

func (GpuClusteringScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	tag := AffinityTag(t)
	if tag == "" {
		return 0
	}
	fill := (maxScore / 4) * (maxSpecGPU - n.GPULeftTotal()) / maxSpecGPU
	var band int64
	switch {
	case n.Affinity[tag] > 0 && len(n.Affinity) == 1:
		band = 3
	case n.Affinity[tag] > 0:
		band = 2
	case len(n.Affinity) == 0:
		band = 1
	}
	return float64(fill + band*maxScore/4)
}

// GpuPackingScore prefers, in order: sharing an occupied GPU (the fuller
// the better), using free GPUs of a node already in use, and last an idle
// node (the fewer GPUs the better). CPU tasks score 0 everywhere.
type GpuPackingScore struct{}

var _ ScorePlugin = GpuPackingScore{}

func (GpuPackingScore) Name() string { return "GpuPacking" }

func (GpuPackingScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	if t.GPUs == 0 {
		return 0
	}
	free := n.FullyFreeGPUs()
	if free == n.Node.GPUs {
		return float64(max(int64(maxScore/3-free), int64(free)))
	}
	// Walk the devices from the least free up, as the reference does.
	var idx [MaxGPUsPerNode]int
	gl := n.GPUs()
	for i := range gl {
		idx[i] = i
	}
	order := idx[:len(gl)]
	insertionSortBy(order, gl)
	req, freeUsed := t.GPUs, 0
	var ratio int64
	for _, i := range order {
		if req == 0 {
			break
		}
		if gl[i] >= t.GPUMilli {
			req--
			if gl[i] == MilliGPU {
				freeUsed++
			}
			ratio += gl[i] * 100 / MilliGPU
		}
	}
	if req != 0 {
		return 0
	}
	if freeUsed > 0 {
		return float64(max(int64(maxScore/2-freeUsed), maxScore/3))
	}
	return float64(max(maxScore-ratio/10, maxScore/2))
}

// insertionSortBy stably sorts device indexes by ascending free share.
func insertionSortBy(order []int, left []int64) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && left[order[j]] < left[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}

// BestFitScore prefers the node left with the least weighted free CPU and
// GPU after placement; scores are min-max normalized over the feasible
// nodes and truncated, as the reference's NormalizeScore does.
type BestFitScore struct{}

var (
	_ ScorePlugin     = BestFitScore{}
	_ NormalizePlugin = BestFitScore{}
)

func (BestFitScore) Name() string { return "BestFit" }

func (BestFitScore) Score(_ *CycleState, t *Task, n *NodeState) float64 {
	return bestFitRaw(n.CPULeft, n.GPULeftTotal(), t.CPUMilli, t.TotalGPUMilli())
}

func bestFitRaw(cpuLeft, gpuLeft, cpu, gpu int64) float64 {
	s := float64(cpuLeft-cpu)/maxSpecCPU*0.5 + float64(gpuLeft-gpu)/maxSpecGPU*0.5
	return math.Trunc((1 - s) * maxScore)
}

func (BestFitScore) Normalize(scores []float64) {
	normalizeMinMax(scores)
}

// normalizeMinMax maps integer scores onto [0,100] with integer
// arithmetic; all equal scores become 0.
func normalizeMinMax(scores []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range scores {
		lo, hi = min(lo, s), max(hi, s)
	}
	r := int64(hi - lo)
	for i, s := range scores {
		if r == 0 {
			scores[i] = 0
			continue
		}
		scores[i] = float64((int64(s) - int64(lo)) * maxScore / r)
	}
}
