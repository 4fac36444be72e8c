package placement

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// PolicyOptions is what a policy constructor may need.
type PolicyOptions struct {
	// Workload is the target workload for fragmentation-aware policies.
	Workload TargetWorkload
}

// PolicyFactory builds a fresh policy; policies hold per-run caches, so
// each run gets its own.
type PolicyFactory func(PolicyOptions) (*Policy, error)

// Registry maps policy names to factories.
type Registry struct {
	factories map[string]PolicyFactory
}

// NewRegistry returns a registry with the paper's six policies and ours.
func NewRegistry() *Registry {
	r := &Registry{factories: map[string]PolicyFactory{}}
	simple := func(name string, s ScorePlugin, sel GPUSelect) {
		r.MustRegister(name, func(PolicyOptions) (*Policy, error) {
			return &Policy{Name: name, Filters: []FilterPlugin{FitFilter{}}, Score: s, GPUSel: sel}, nil
		})
	}
	simple("Random", RandomScore{}, SelectRandom)
	simple("DotProd", DotProdScore{}, SelectBest)
	simple("GpuClustering", GpuClusteringScore{}, SelectBest)
	simple("GpuPacking", GpuPackingScore{}, SelectBest)
	simple("BestFit", BestFitScore{}, SelectBest)
	r.MustRegister("FGD", func(o PolicyOptions) (*Policy, error) {
		if len(o.Workload) == 0 {
			return nil, fmt.Errorf("policy FGD: empty target workload")
		}
		return &Policy{Name: "FGD", Filters: []FilterPlugin{FitFilter{}}, Score: &FGDScore{Workload: o.Workload}}, nil
	})
	registerOwn(r)
	return r
}

// Register adds a factory; names are unique.
func (r *Registry) Register(name string, f PolicyFactory) error {
	if _, dup := r.factories[name]; dup {
		return fmt.Errorf("policy %q registered twice", name)
	}
	r.factories[name] = f
	return nil
}

// MustRegister is Register for init-time wiring.
func (r *Registry) MustRegister(name string, f PolicyFactory) {
	if err := r.Register(name, f); err != nil {
		panic(err)
	}
}

// New builds the named policy (names match case-insensitively).
func (r *Registry) New(name string, o PolicyOptions) (*Policy, error) {
	for n, f := range r.factories {
		if strings.EqualFold(n, name) {
			return f(o)
		}
	}
	return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(r.Names(), ", "))
}

// Names lists the registered policies, the paper's six first.
func (r *Registry) Names() []string {
	var out []string
	for n := range r.factories {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		pi, pj := slices.Index(PaperPolicies, out[i]), slices.Index(PaperPolicies, out[j])
		if pi < 0 {
			pi = len(PaperPolicies)
		}
		if pj < 0 {
			pj = len(PaperPolicies)
		}
		if pi != pj {
			return pi < pj
		}
		return out[i] < out[j]
	})
	return out
}

// PaperPolicies are the policies of the FGD paper's Fig. 9, in its order.
var PaperPolicies = []string{"Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD"}
