package mig

import (
	"slices"
	"sort"
)

// The removal pass as it was before its trials were keyed and memoized,
// kept as the reference the new one must match exactly: every trial
// reassigns all instances of the plan by scanning every service.

func greedyRef(m Model, svcs []Service) (*Plan, error) {
	svcs, err := validate(m, svcs)
	if err != nil {
		return nil, err
	}
	plan, err := greedyBuild(m, svcs)
	if err != nil {
		return nil, err
	}
	improveRef(m, svcs, plan)
	return plan, nil
}

func improveRef(m Model, svcs []Service, plan *Plan) {
	for i := len(plan.GPUs) - 1; i >= 0 && len(plan.GPUs) > 1; i-- {
		trial := &Plan{GPUs: slices.Concat(plan.GPUs[:i:i], plan.GPUs[i+1:])}
		if reassignRef(m, svcs, trial) {
			*plan = *trial
		}
	}
}

func reassignRef(m Model, svcs []Service, plan *Plan) bool {
	type slot struct{ g, j int }
	var slots []slot
	for g := range plan.GPUs {
		plan.GPUs[g].Assign = make([]int, len(plan.GPUs[g].Layout))
		for j := range plan.GPUs[g].Layout {
			plan.GPUs[g].Assign[j] = -1
			slots = append(slots, slot{g, j})
		}
	}
	sort.SliceStable(slots, func(a, b int) bool {
		pa := m.Profiles[plan.GPUs[slots[a].g].Layout[slots[a].j].Profile].Compute
		pb := m.Profiles[plan.GPUs[slots[b].g].Layout[slots[b].j].Profile].Compute
		return pa > pb
	})
	rem := make([]float64, len(svcs))
	for i, s := range svcs {
		rem[i] = s.Demand
	}
	for _, sl := range slots {
		p := plan.GPUs[sl.g].Layout[sl.j].Profile
		bestS, bestR := -1, 0.0
		for s := range svcs {
			if rem[s] > 1e-9 && svcs[s].Throughput[p] > 0 && rem[s]/svcs[s].Demand > bestR {
				bestS, bestR = s, rem[s]/svcs[s].Demand
			}
		}
		if bestS >= 0 {
			plan.GPUs[sl.g].Assign[sl.j] = bestS
			rem[bestS] -= svcs[bestS].Throughput[p]
		}
	}
	for _, r := range rem {
		if r > 1e-9 {
			return false
		}
	}
	return true
}
