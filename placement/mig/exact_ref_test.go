package mig

import (
	"fmt"
	"math"
	"slices"
)

// The exact solver as it was before it split instances by class and
// remembered the counts no split covers: the reference for the new one's
// GPU counts and its benchmark.

// exactRef finds a plan with the fewest GPUs by iterative deepening over
// multisets of maximal layouts; for each multiset it searches slice-to-
// service assignments by profile counts with pruning. It is exponential:
// meant for small cases (a few services, a few GPUs) and to check Greedy.
// maxGPUs bounds the search.
func exactRef(m Model, svcs []Service, maxGPUs int) (*Plan, error) {
	svcs, err := validate(m, svcs)
	if err != nil {
		return nil, err
	}
	layouts := usefulLayoutsRef(m, svcs)
	counts := make([][]int, len(layouts))
	for i, l := range layouts {
		counts[i] = make([]int, len(m.Profiles))
		for _, in := range l {
			counts[i][in.Profile]++
		}
	}
	// Greedy's plan bounds the search: only fewer GPUs are worth proving.
	if g, err := Greedy(m, svcs); err == nil && len(g.GPUs)-1 < maxGPUs {
		maxGPUs = len(g.GPUs) - 1
		ub := g
		plan, err := exactUpToRef(m, svcs, layouts, counts, maxGPUs)
		if err != nil {
			return ub, nil
		}
		return plan, nil
	}
	return exactUpToRef(m, svcs, layouts, counts, maxGPUs)
}

// usefulLayouts drops maximal layouts that another layout dominates: same
// or more instances of every class of profiles that all services value
// alike.
func usefulLayoutsRef(m Model, svcs []Service) []Layout {
	class := make([]int, len(m.Profiles))
	for p := range m.Profiles {
		class[p] = p
		for q := 0; q < p; q++ {
			same := true
			for _, s := range svcs {
				same = same && s.Throughput[p] == s.Throughput[q]
			}
			if same {
				class[p] = class[q]
				break
			}
		}
	}
	all := m.MaximalLayouts()
	vec := make([][]int, len(all))
	for i, l := range all {
		vec[i] = make([]int, len(m.Profiles))
		for _, in := range l {
			vec[i][class[in.Profile]]++
		}
	}
	var out []Layout
	for i := range all {
		dominated := false
		for j := range all {
			if i == j {
				continue
			}
			le, lt := true, false
			for c := range vec[i] {
				le = le && vec[i][c] <= vec[j][c]
				lt = lt || vec[i][c] < vec[j][c]
			}
			if le && (lt || j < i) {
				dominated = true
				break
			}
		}
		if !dominated {
			out = append(out, all[i])
		}
	}
	return out
}

func exactUpToRef(m Model, svcs []Service, layouts []Layout, counts [][]int, maxGPUs int) (*Plan, error) {
	need := false
	for _, s := range svcs {
		need = need || s.Demand > 1e-9
	}
	if !need {
		return &Plan{}, nil
	}
	for k := 1; k <= maxGPUs; k++ {
		pick := make([]int, k)
		var found []int
		var rec func(pos, from int) bool
		rec = func(pos, from int) bool {
			if pos == k {
				tot := make([]int, len(m.Profiles))
				for _, li := range pick {
					for p, c := range counts[li] {
						tot[p] += c
					}
				}
				if asg := coverableRef(m, svcs, tot); asg != nil {
					found = slices.Clone(pick)
					return true
				}
				return false
			}
			for li := from; li < len(layouts); li++ {
				pick[pos] = li
				if rec(pos+1, li) {
					return true
				}
			}
			return false
		}
		if rec(0, 0) {
			plan := &Plan{}
			for _, li := range found {
				plan.GPUs = append(plan.GPUs, GPU{Layout: slices.Clone(layouts[li])})
			}
			if !assignExactRef(m, svcs, plan) {
				return nil, fmt.Errorf("exact: internal error assigning a coverable multiset")
			}
			return plan, nil
		}
	}
	return nil, fmt.Errorf("exact: no plan with at most %d GPUs", maxGPUs)
}

// coverable decides whether instance counts per profile can be split among
// services to meet every demand; it returns the split [profile][service].
func coverableRef(m Model, svcs []Service, tot []int) [][]int {
	split := make([][]int, len(tot))
	for p := range split {
		split[p] = make([]int, len(svcs))
	}
	rem := make([]float64, len(svcs))
	for i, s := range svcs {
		rem[i] = s.Demand
	}
	// Upper bound of what the profiles from p on can still add per service.
	var rec func(p int) bool
	rec = func(p int) bool {
		if p == len(tot) {
			for _, r := range rem {
				if r > 1e-9 {
					return false
				}
			}
			return true
		}
		// Prune: every service must be coverable by the remaining profiles alone.
		for s := range svcs {
			if rem[s] <= 1e-9 {
				continue
			}
			cap := 0.0
			for q := p; q < len(tot); q++ {
				cap += float64(tot[q]) * svcs[s].Throughput[q]
			}
			if cap+1e-9 < rem[s] {
				return false
			}
		}
		// Prune: all services together. An instance serves one service, so
		// it covers at most the largest share min(1, t/rem) of any one
		// service's unmet demand, and every unmet service needs a whole
		// share. Without this, services alike (each coverable alone) make
		// distribute try every split before a count that is short overall
		// fails.
		active, shares := 0, 0.0
		for s := range svcs {
			if rem[s] > 1e-9 {
				active++
			}
		}
		for q := p; q < len(tot); q++ {
			best := 0.0
			for s := range svcs {
				if rem[s] > 1e-9 {
					best = max(best, min(1, svcs[s].Throughput[q]/rem[s]))
				}
			}
			shares += float64(tot[q]) * best
		}
		if shares < float64(active)-1e-9 {
			return false
		}
		return distributeRef(svcs, p, tot[p], 0, split, rem, func() bool { return rec(p + 1) })
	}
	if rec(0) {
		return split
	}
	return nil
}

// distribute tries every way of giving n instances of profile p to
// services s.. and calls next for each.
func distributeRef(svcs []Service, p, n, s int, split [][]int, rem []float64, next func() bool) bool {
	if s == len(svcs)-1 || n == 0 {
		if n > 0 {
			split[p][s] = n
			rem[s] -= float64(n) * svcs[s].Throughput[p]
		}
		ok := next()
		if n > 0 && !ok { // on success the split stays for the caller
			rem[s] += float64(n) * svcs[s].Throughput[p]
			split[p][s] = 0
		}
		return ok
	}
	// Giving a service more than it needs never helps; cap the useful count.
	useful := n
	if t := svcs[s].Throughput[p]; t > 0 {
		useful = min(n, int(math.Ceil(max(rem[s], 0)/t-1e-9)))
	} else {
		useful = 0
	}
	for c := useful; c >= 0; c-- {
		split[p][s] = c
		rem[s] -= float64(c) * svcs[s].Throughput[p]
		if distributeRef(svcs, p, n-c, s+1, split, rem, next) {
			return true
		}
		rem[s] += float64(c) * svcs[s].Throughput[p]
		split[p][s] = 0
	}
	return false
}

// assignExact labels a plan's instances from a coverable split.
func assignExactRef(m Model, svcs []Service, plan *Plan) bool {
	tot := make([]int, len(m.Profiles))
	for _, g := range plan.GPUs {
		for _, in := range g.Layout {
			tot[in.Profile]++
		}
	}
	split := coverableRef(m, svcs, tot)
	if split == nil {
		return false
	}
	for gi := range plan.GPUs {
		g := &plan.GPUs[gi]
		g.Assign = make([]int, len(g.Layout))
		for j, in := range g.Layout {
			g.Assign[j] = -1
			for s := range svcs {
				if split[in.Profile][s] > 0 {
					split[in.Profile][s]--
					g.Assign[j] = s
					break
				}
			}
		}
	}
	return true
}
