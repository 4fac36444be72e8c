package placement

import (
	"cmp"
	"fmt"
	"slices"
)

// AllocBound is an upper bound, in percent of GPU capacity, on the GPU
// allocation any policy can reach in the run Simulate makes with opts once
// pct percent of capacity has arrived. It relaxes the cluster to one pool
// of GPUs (no CPU, memory, node boundaries or model constraints, all of
// which only lower what a policy reaches) and keeps the one constraint that
// costs FGD most: a GPU holding a fractional task of more than 1000-eps
// milli can take nothing else of eps or more.
//
// The argument is a dual feasible function (Fekete and Schepers): with
// u(x) = 1000 for x > 1000-eps, 0 for x < eps and x otherwise, the u of the
// tasks sharing one GPU never sum past 1000, so any set of tasks that fits
// has sum u <= capacity. The bound is the fractional knapsack of the
// arrived tasks under that budget (placed volume x, weight u(x)), minimized
// over eps in {1000-s+1 : s a fractional size above 500} and the plain
// volume bound.
func AllocBound(nodes []Node, tasks []Task, opts SimOptions, pct int) (float64, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return 0, err
	}
	_, order, list := runSetup(nodes, tasks, &opts)
	var capacity int64
	for i := range order {
		capacity += int64(order[i].GPUs) * MilliGPU
	}
	if capacity == 0 {
		return 0, fmt.Errorf("alloc bound: cluster has no GPUs")
	}
	// The tasks Simulate has seen when it records pct: up to and including
	// the one that takes arrived load to pct.
	var arrived int64
	n := len(list)
	for i, t := range list {
		arrived += t.TotalGPUMilli()
		if arrived*100/capacity >= int64(pct) {
			n = i + 1
			break
		}
	}
	prefix := list[:n]
	best := 100 * float64(min(arrived, capacity)) / float64(capacity)
	seen := map[int64]bool{}
	for _, t := range prefix {
		if t.IsShare() && t.GPUMilli > MilliGPU/2 && !seen[t.GPUMilli] {
			seen[t.GPUMilli] = true
			best = min(best, 100*dffKnapsack(prefix, capacity, MilliGPU-t.GPUMilli+1)/float64(capacity))
		}
	}
	return best, nil
}

// dffKnapsack is the most GPU volume the tasks can place with sum u <=
// capacity for the dual feasible function of threshold eps, filled
// fractionally in decreasing volume per u.
func dffKnapsack(tasks []*Task, capacity, eps int64) float64 {
	type item struct{ vol, u int64 }
	var items []item
	for _, t := range tasks {
		if t.GPUs == 0 {
			continue
		}
		x := t.GPUMilli
		var u int64
		switch {
		case x > MilliGPU-eps:
			u = MilliGPU
		case x < eps:
			u = 0
		default:
			u = x
		}
		items = append(items, item{t.TotalGPUMilli(), int64(t.GPUs) * u})
	}
	// vol/u descending, u = 0 first; compare by cross-multiplication.
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(b.vol*a.u, a.vol*b.u) })
	left := capacity
	var placed float64
	for _, it := range items {
		if it.u <= left {
			placed += float64(it.vol)
			left -= it.u
			continue
		}
		placed += float64(it.vol) * float64(left) / float64(it.u)
		break
	}
	return placed
}
