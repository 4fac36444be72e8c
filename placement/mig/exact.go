package mig

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// ExactSteps is the search steps (nodes of the split search) Exact takes
// at most: 2-6 s on one core of a busy 2-core sandbox. The most that any
// of 50 random cases of 4 services took was 11.5 million (2 services:
// 2,192; 3: 50,510); 10 services of 0.1-0.8 GPUs searched over 30 s
// before this limit.
const ExactSteps = 20_000_000

// ErrStepLimit is what Exact returns, wrapped, when it stopped at its step
// limit before it proved that no plan has fewer GPUs than Greedy's.
var ErrStepLimit = errors.New("exact: step limit reached")

// Exact finds a plan with the fewest GPUs by iterative deepening over
// multisets of maximal layouts; for each multiset it searches slice-to-
// service assignments by profile-class counts with pruning. It is
// exponential: meant for small cases (a few services, a few GPUs) and to
// check Greedy. maxGPUs bounds the search, and so does ExactSteps: past
// it, Exact returns Greedy's plan, unproven, with an error wrapping
// ErrStepLimit (nil and the error when Greedy's plan exceeds maxGPUs).
func Exact(m Model, svcs []Service, maxGPUs int) (*Plan, error) {
	return ExactWithin(m, svcs, maxGPUs, ExactSteps)
}

// ExactWithin is Exact with a step limit of its own.
func ExactWithin(m Model, svcs []Service, maxGPUs, steps int) (*Plan, error) {
	svcs, err := validate(m, svcs)
	if err != nil {
		return nil, err
	}
	class := classes(m, svcs)
	layouts := usefulLayouts(m, svcs, class)
	// Instances are counted by class: the split of instances among
	// services then never tells apart profiles that every service values
	// alike (1g.10gb and 1g.20gb, unless memory does).
	counts := make([][]int, len(layouts))
	for i, l := range layouts {
		counts[i] = make([]int, len(m.Profiles))
		for _, in := range l {
			counts[i][class[in.Profile]]++
		}
	}
	left := steps
	// Greedy's plan bounds the search: only fewer GPUs are worth proving.
	if g, err := Greedy(m, svcs); err == nil && len(g.GPUs)-1 < maxGPUs {
		maxGPUs = len(g.GPUs) - 1
		ub := g
		plan, err := exactUpTo(m, svcs, class, layouts, counts, maxGPUs, &left)
		if errors.Is(err, ErrStepLimit) {
			return ub, fmt.Errorf("%w after %d steps: Greedy's %d GPUs not proven fewest", ErrStepLimit, steps, len(ub.GPUs))
		}
		if err != nil {
			return ub, nil
		}
		return plan, nil
	}
	plan, err := exactUpTo(m, svcs, class, layouts, counts, maxGPUs, &left)
	if errors.Is(err, ErrStepLimit) {
		return nil, fmt.Errorf("%w after %d steps, no plan of at most %d GPUs found", ErrStepLimit, steps, maxGPUs)
	}
	return plan, err
}

// classes maps each profile to the lowest profile that every service
// values alike (the same throughput), its class.
func classes(m Model, svcs []Service) []int {
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
	return class
}

// usefulLayouts drops maximal layouts that another layout dominates: same
// or more instances of every class of profiles that all services value
// alike.
func usefulLayouts(m Model, svcs []Service, class []int) []Layout {
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

func exactUpTo(m Model, svcs []Service, class []int, layouts []Layout, counts [][]int, maxGPUs int, steps *int) (*Plan, error) {
	need := false
	for _, s := range svcs {
		need = need || s.Demand > 1e-9
	}
	if !need {
		return &Plan{}, nil
	}
	// Multisets of layouts often add up to the same counts: each count
	// vector that no split covers is searched once.
	failed := map[string]bool{}
	var key []byte
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
				key = key[:0]
				for _, c := range tot {
					key = binary.AppendUvarint(key, uint64(c))
				}
				if failed[string(key)] {
					return false
				}
				if asg := coverable(m, svcs, tot, steps); asg != nil {
					found = slices.Clone(pick)
					return true
				}
				failed[string(key)] = true
				return false
			}
			for li := from; li < len(layouts) && *steps >= 0; li++ {
				pick[pos] = li
				if rec(pos+1, li) {
					return true
				}
			}
			return false
		}
		ok := rec(0, 0)
		if *steps < 0 {
			return nil, ErrStepLimit
		}
		if ok {
			plan := &Plan{}
			for _, li := range found {
				plan.GPUs = append(plan.GPUs, GPU{Layout: slices.Clone(layouts[li])})
			}
			if !assignExact(m, svcs, class, plan) {
				return nil, fmt.Errorf("exact: internal error assigning a coverable multiset")
			}
			return plan, nil
		}
	}
	return nil, fmt.Errorf("exact: no plan with at most %d GPUs", maxGPUs)
}

// coverable decides whether instance counts per profile can be split among
// services to meet every demand; it returns the split [profile][service].
func coverable(m Model, svcs []Service, tot []int, steps *int) [][]int {
	split := make([][]int, len(tot))
	for p := range split {
		split[p] = make([]int, len(svcs))
	}
	rem := make([]float64, len(svcs))
	for i, s := range svcs {
		rem[i] = s.Demand
	}
	// Largest profiles first: they have few instances to split, and the
	// many small ones come last, where a count check stands in for trying
	// every split.
	var order []int
	for p := len(tot) - 1; p >= 0; p-- {
		if tot[p] > 0 {
			order = append(order, p)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return m.Profiles[b].Compute - m.Profiles[a].Compute })
	var rec func(i int) bool
	rec = func(i int) bool {
		if *steps <= 0 {
			*steps = -1 // out of steps: every caller unwinds
			return false
		}
		*steps--
		if i == len(order) {
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
			for _, q := range order[i:] {
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
		for _, q := range order[i:] {
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
		p := order[i]
		// Prune: the last profile must have, for every service, the fewest
		// instances that cover what it still lacks; any split that meets
		// every demand gives each at least that many.
		if i == len(order)-1 {
			need := 0
			for s := range svcs {
				c, ok := fewest(rem[s], svcs[s].Throughput[p])
				need += c
				if !ok || need > tot[p] {
					return false
				}
			}
		}
		return distribute(svcs, p, tot[p], 0, split, rem, steps, func() bool { return rec(i + 1) })
	}
	if rec(0) {
		return split
	}
	return nil
}

// fewest is the least count c of instances of throughput t that leaves
// rem - c·t unmet demand at most 1e-9, computed as distribute and
// coverable subtract; false when none does.
func fewest(rem, t float64) (int, bool) {
	if rem <= 1e-9 {
		return 0, true
	}
	if t <= 0 {
		return 0, false
	}
	x := math.Ceil((rem - 1e-9) / t)
	if x > 1<<52 {
		return 1 << 52, true // more than any count of instances
	}
	c := max(0, int(x))
	for c > 0 && rem-float64(c-1)*t <= 1e-9 {
		c--
	}
	for rem-float64(c)*t > 1e-9 {
		c++
	}
	return c, true
}

// distribute tries every way of giving n instances of profile p to
// services s.. and calls next for each.
func distribute(svcs []Service, p, n, s int, split [][]int, rem []float64, steps *int, next func() bool) bool {
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
	for c := useful; c >= 0 && *steps >= 0; c-- {
		split[p][s] = c
		rem[s] -= float64(c) * svcs[s].Throughput[p]
		if distribute(svcs, p, n-c, s+1, split, rem, steps, next) {
			return true
		}
		rem[s] += float64(c) * svcs[s].Throughput[p]
		split[p][s] = 0
	}
	return false
}

// assignExact labels a plan's instances from a coverable split of their
// counts by class.
func assignExact(m Model, svcs []Service, class []int, plan *Plan) bool {
	tot := make([]int, len(m.Profiles))
	for _, g := range plan.GPUs {
		for _, in := range g.Layout {
			tot[class[in.Profile]]++
		}
	}
	steps := math.MaxInt // known coverable: no limit
	split := coverable(m, svcs, tot, &steps)
	if split == nil {
		return false
	}
	for gi := range plan.GPUs {
		g := &plan.GPUs[gi]
		g.Assign = make([]int, len(g.Layout))
		for j, in := range g.Layout {
			g.Assign[j] = -1
			for s := range svcs {
				if c := class[in.Profile]; split[c][s] > 0 {
					split[c][s]--
					g.Assign[j] = s
					break
				}
			}
		}
	}
	return true
}
