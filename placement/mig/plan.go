package mig

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// Service is a model to serve with its throughput demand.
type Service struct {
	Name   string
	Demand float64 // requests/s
	// Throughput per profile index of the model, requests/s per instance.
	Throughput []float64
	// MemGB is the memory one instance of the service needs, in GB: the
	// dense model's weights, the activations of its largest batch and the
	// runtime's own. The planners use only profiles whose MemGB is at
	// least this; 0 means not given (every profile fits).
	MemGB float64
}

// Fits reports whether an instance of profile p holds the service.
func (s Service) Fits(p Profile) bool { return s.MemGB <= p.MemGB }

// DefaultThroughput is the table when none is measured: a full GPU (7g)
// serves full; a g-slice instance serves 0.136*g of it, MLPerf v1.1's
// measured 1g.10gb share of a full A100 (0.133-0.139, ResNet-50 and BERT);
// memory size does not change throughput.
func DefaultThroughput(m Model, full float64) []float64 {
	t := make([]float64, len(m.Profiles))
	for i, p := range m.Profiles {
		if p.Compute == m.ComputeSlices {
			t[i] = full
		} else {
			t[i] = full * 0.136 * float64(p.Compute)
		}
	}
	return t
}

// GPU is one GPU of a plan: its layout and the service each instance
// serves (-1 idle).
type GPU struct {
	Layout Layout
	Assign []int
}

// Plan is a solution.
type Plan struct {
	GPUs []GPU
}

// Validate checks legality and that demands are met.
func (p *Plan) Validate(m Model, svcs []Service) error {
	got := make([]float64, len(svcs))
	for i, g := range p.GPUs {
		if err := m.Legal(g.Layout); err != nil {
			return fmt.Errorf("gpu %d: %w", i, err)
		}
		if len(g.Assign) != len(g.Layout) {
			return fmt.Errorf("gpu %d: %d assignments for %d instances", i, len(g.Assign), len(g.Layout))
		}
		for j, s := range g.Assign {
			if s < 0 {
				continue
			}
			if p := m.Profiles[g.Layout[j].Profile]; !svcs[s].Fits(p) {
				return fmt.Errorf("gpu %d: service %q needs %g GB, %s has %g", i, svcs[s].Name, svcs[s].MemGB, p.Name, p.MemGB)
			}
			got[s] += svcs[s].Throughput[g.Layout[j].Profile]
		}
	}
	for s := range svcs {
		if got[s]+1e-9 < svcs[s].Demand {
			return fmt.Errorf("service %q gets %.3f of %.3f", svcs[s].Name, got[s], svcs[s].Demand)
		}
	}
	return nil
}

// maxGreedyGPUs bounds the GPUs Greedy lays out (one per step).
const maxGreedyGPUs = 1_000_000

// WholeGPUs is the baseline: every service on whole GPUs of its own.
func WholeGPUs(m Model, svcs []Service) int {
	full := slices.IndexFunc(m.Profiles, func(p Profile) bool { return p.Compute == m.ComputeSlices })
	n := 0
	for _, s := range svcs {
		n += int(math.Ceil(s.Demand/s.Throughput[full] - 1e-9))
	}
	return n
}

// validate checks the services against the model and returns them as the
// planners see them: a profile too small for a service serves it nothing.
func validate(m Model, svcs []Service) ([]Service, error) {
	out := make([]Service, len(svcs))
	for i, s := range svcs {
		if len(s.Throughput) != len(m.Profiles) {
			return nil, fmt.Errorf("service %q: %d throughputs for %d profiles", s.Name, len(s.Throughput), len(m.Profiles))
		}
		if s.Demand < 0 || math.IsNaN(s.Demand) {
			return nil, fmt.Errorf("service %q: bad demand %v", s.Name, s.Demand)
		}
		if !(s.MemGB >= 0) || math.IsInf(s.MemGB, 0) {
			return nil, fmt.Errorf("service %q: bad memory %v GB", s.Name, s.MemGB)
		}
		best, largest := 0.0, -1
		for p, t := range s.Throughput {
			if t < 0 {
				return nil, fmt.Errorf("service %q: negative throughput", s.Name)
			}
			if t > 0 && (largest < 0 || m.Profiles[p].MemGB > m.Profiles[largest].MemGB) {
				largest = p
			}
			if s.Fits(m.Profiles[p]) {
				best = max(best, t)
			}
		}
		if s.Demand > 0 && best == 0 {
			if largest >= 0 {
				return nil, fmt.Errorf("service %q needs %g GB per instance; the largest %s slice that serves it, %s, has %g GB", s.Name, s.MemGB, m.Name, m.Profiles[largest].Name, m.Profiles[largest].MemGB)
			}
			return nil, fmt.Errorf("service %q: demand %v but no profile serves it", s.Name, s.Demand)
		}
		out[i] = s
		if slices.ContainsFunc(m.Profiles, func(p Profile) bool { return !s.Fits(p) }) {
			out[i].Throughput = slices.Clone(s.Throughput)
			for p := range m.Profiles {
				if !s.Fits(m.Profiles[p]) {
					out[i].Throughput[p] = 0
				}
			}
		}
	}
	return out, nil
}

// Greedy builds a plan one GPU at a time: for every maximal layout it
// assigns each instance, largest first, to the service whose unmet demand
// it covers most, and keeps the layout that covers the most unmet demand
// (as a share of each service's demand). A final pass drops any GPU whose
// removal the others' idle or surplus instances can absorb. A service
// gets only slices with at least its MemGB; one that no slice holds is an
// error naming its need and the largest slice.
func Greedy(m Model, svcs []Service) (*Plan, error) {
	svcs, err := validate(m, svcs)
	if err != nil {
		return nil, err
	}
	plan, err := greedyBuild(m, svcs)
	if err != nil {
		return nil, err
	}
	improve(m, svcs, plan)
	return plan, nil
}

// greedyBuild is Greedy before its removal pass, on validated services.
func greedyBuild(m Model, svcs []Service) (*Plan, error) {
	layouts := m.MaximalLayouts()
	for _, l := range layouts { // biggest instances first
		sort.SliceStable(l, func(i, j int) bool { return m.Profiles[l[i].Profile].Compute > m.Profiles[l[j].Profile].Compute })
	}
	rem := make([]float64, len(svcs))
	for i, s := range svcs {
		rem[i] = s.Demand
		// One service alone needs at least its demand over the most a
		// GPU serves of it: past the bound it is said at once (a demand
		// of 1e18 left the greedy's gain at 0 against float64 rounding:
		// "demand left that no layout serves"; 1e9 took 4 s to refuse).
		perGPU := 0.0
		for _, l := range layouts {
			t := 0.0
			for _, inst := range l {
				t += s.Throughput[inst.Profile]
			}
			perGPU = max(perGPU, t)
		}
		if perGPU > 0 && !(s.Demand/perGPU <= maxGreedyGPUs) {
			return nil, fmt.Errorf("the demands need more than %d GPUs: check their unit (full-GPU equivalents, or requests/s with a full GPU's throughput)", maxGreedyGPUs)
		}
	}
	plan := &Plan{}
	for iter := 0; ; iter++ {
		left := 0.0
		for _, r := range rem {
			left += max(r, 0)
		}
		if left <= 1e-9 {
			break
		}
		if iter >= maxGreedyGPUs {
			return nil, fmt.Errorf("the demands need more than %d GPUs: check their unit (full-GPU equivalents, or requests/s with a full GPU's throughput)", maxGreedyGPUs)
		}
		var best GPU
		bestGain := -1.0
		for _, l := range layouts {
			assign, gain := fillLayout(m, svcs, l, rem)
			if gain > bestGain+1e-12 {
				best, bestGain = GPU{Layout: l, Assign: assign}, gain
			}
		}
		if bestGain <= 0 {
			return nil, fmt.Errorf("greedy: demand left that no layout serves")
		}
		for j, s := range best.Assign {
			if s >= 0 {
				rem[s] -= svcs[s].Throughput[best.Layout[j].Profile]
			}
		}
		plan.GPUs = append(plan.GPUs, best)
	}
	return plan, nil
}

// fillLayout assigns a layout's instances to services by largest relative
// unmet demand covered; it returns the assignment and the covered share.
func fillLayout(m Model, svcs []Service, l Layout, rem []float64) ([]int, float64) {
	r := slices.Clone(rem)
	assign := make([]int, len(l))
	gain := 0.0
	for j, in := range l {
		assign[j] = -1
		bestS, bestG := -1, 0.0
		for s := range svcs {
			if r[s] <= 1e-9 || svcs[s].Demand == 0 {
				continue
			}
			g := min(r[s], svcs[s].Throughput[in.Profile]) / svcs[s].Demand
			if g > bestG+1e-12 {
				bestS, bestG = s, g
			}
		}
		if bestS >= 0 {
			assign[j] = bestS
			r[bestS] -= svcs[bestS].Throughput[in.Profile]
			gain += bestG
		}
	}
	return assign, gain
}
