package mig

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// equivalenceCases are seeded random demands of many shapes: few services
// with large demands, many with small ones, on every model; some with
// memory needs that tell the two 1g profiles apart (a service that only
// 1g.20gb and larger hold), some with measured-looking throughputs.
func equivalenceCases() []struct {
	name string
	m    Model
	svcs []Service
} {
	var out []struct {
		name string
		m    Model
		svcs []Service
	}
	add := func(name string, m Model, svcs []Service) {
		out = append(out, struct {
			name string
			m    Model
			svcs []Service
		}{name, m, svcs})
	}
	shapes := []struct {
		n   int
		max float64
	}{{1, 3}, {2, 2}, {3, 2}, {5, 1}, {8, 0.5}, {12, 3}, {30, 2}, {60, 1}}
	for seed := uint64(1); seed <= 40; seed++ {
		m := Models[seed%uint64(len(Models))]
		sh := shapes[seed%uint64(len(shapes))]
		svcs := RandomServices(m, seed, sh.n, sh.max)
		add(fmt.Sprintf("random/%d", seed), m, svcs)

		add(fmt.Sprintf("memory/%d", seed), m, withMemory(m, svcs, seed))

		// Throughputs off the default table, 1g.10gb and 1g.20gb apart.
		rng := rand.New(rand.NewPCG(seed, 8))
		odd := make([]Service, len(svcs))
		for i, s := range svcs {
			s.Throughput = append([]float64(nil), s.Throughput...)
			for p := range s.Throughput {
				s.Throughput[p] *= 0.8 + 0.4*rng.Float64()
			}
			odd[i] = s
		}
		add(fmt.Sprintf("throughput/%d", seed), m, odd)
	}
	// Cases whose removal pass drops a GPU (found by searching seeds: the
	// pass rarely finds one).
	for _, c := range []struct {
		seed   uint64
		m      Model
		n      int
		max    float64
		memory bool
	}{
		{2431, A100_80GB, 3, 2, false},
		{2559, H200_141GB, 5, 2, false},
		{102, H100_80GB, 4, 1, true},
		{1263, H100_94GB, 5, 2, true},
		{1291, A100_80GB, 3, 2, true},
		{1842, H100_80GB, 4, 1, true},
	} {
		svcs := RandomServices(c.m, c.seed, c.n, c.max)
		if c.memory {
			svcs = withMemory(c.m, svcs, c.seed)
		}
		add(fmt.Sprintf("removes/%d", c.seed), c.m, svcs)
	}
	add("large", A100_80GB, RandomServices(A100_80GB, 3, 60, 3))
	add("large-memory", A100_80GB, withMemory(A100_80GB, RandomServices(A100_80GB, 3, 60, 3), 3))
	return out
}

// withMemory gives each service a memory need, drawn by seed: none,
// between the two 1g sizes (only 1g.20gb and larger hold it on an
// A100-80GB), or between the 2g and 3g sizes.
func withMemory(m Model, svcs []Service, seed uint64) []Service {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]Service, len(svcs))
	for i, s := range svcs {
		s.MemGB = []float64{0, (m.Profiles[0].MemGB + m.Profiles[1].MemGB) / 2, (m.Profiles[2].MemGB + m.Profiles[3].MemGB) / 2}[rng.IntN(3)]
		out[i] = s
	}
	return out
}

// The keyed, memoized removal pass returns exactly the plan (layouts,
// order and every assignment) that reassigning each trial in full did.
func TestGreedyRemovalMatchesReference(t *testing.T) {
	removed, cases := 0, 0
	for _, tc := range equivalenceCases() {
		svcs, err := validate(tc.m, tc.svcs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		built, err := greedyBuild(tc.m, svcs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want, err := greedyRef(tc.m, tc.svcs)
		if err != nil {
			t.Fatalf("%s: reference: %v", tc.name, err)
		}
		got, err := Greedy(tc.m, tc.svcs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: plans differ:\n got %v\nwant %v", tc.name, got, want)
		}
		if err := got.Validate(tc.m, tc.svcs); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		removed += len(built.GPUs) - len(want.GPUs)
		if len(built.GPUs) > len(want.GPUs) {
			cases++
		}
	}
	if removed == 0 {
		t.Fatal("no case removed a GPU: the comparison never saw a successful trial")
	}
	t.Logf("the removal pass dropped %d GPUs in %d cases", removed, cases)
}

// greedyCases are the benchmarks' demands on A100-80GB: 200 services of
// 0.1-16 GPUs (1,684 GPUs planned), the same with memory needs that keep
// a third of the services off 1g.10gb and a third off slices under 3g,
// and 100 services of 0.1-3 GPUs (171 GPUs).
var greedyCases = []struct {
	name   string
	n      int
	max    float64
	memory bool
}{{"1684gpus", 200, 16, false}, {"1684gpus-memory", 200, 16, true}, {"171gpus", 100, 3, false}}

func greedyCase(m Model, i int) []Service {
	c := greedyCases[i]
	svcs := RandomServices(m, 7, c.n, c.max)
	if c.memory {
		svcs = withMemory(m, svcs, 7)
	}
	return svcs
}

// BenchmarkGreedy times the whole heuristic, the new removal pass
// against the reference one, on the same plans in the same run.
func BenchmarkGreedy(b *testing.B) {
	m := A100_80GB
	for i, c := range greedyCases {
		svcs := greedyCase(m, i)
		for _, impl := range []struct {
			name string
			run  func(Model, []Service) (*Plan, error)
		}{{"new", Greedy}, {"old", greedyRef}} {
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				for b.Loop() {
					if _, err := impl.run(m, svcs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRemovalPass times the removal pass alone on the plan Greedy
// builds before it.
func BenchmarkRemovalPass(b *testing.B) {
	m := A100_80GB
	for i, c := range greedyCases {
		svcs, err := validate(m, greedyCase(m, i))
		if err != nil {
			b.Fatal(err)
		}
		built, err := greedyBuild(m, svcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, impl := range []struct {
			name string
			run  func(Model, []Service, *Plan)
		}{{"new", improve}, {"old", improveRef}} {
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				for b.Loop() {
					p := &Plan{GPUs: slices.Clone(built.GPUs)}
					impl.run(m, svcs, p)
				}
			})
		}
	}
}
