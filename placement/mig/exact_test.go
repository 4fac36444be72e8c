package mig

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The exact solver with instances split by class, the count check on the
// last profile and the memo of uncoverable counts proves the same fewest
// GPUs as before, on the cases the reference solves in reasonable time.
func TestExactMatchesReference(t *testing.T) {
	type tc struct {
		name string
		m    Model
		svcs []Service
	}
	var cases []tc
	for seed := 0; seed < 10; seed++ {
		m, svcs := smallCase(seed)
		cases = append(cases, tc{fmt.Sprintf("small/%d", seed), m, svcs})
	}
	for seed := uint64(1); seed <= 12; seed++ {
		m := Models[seed%uint64(len(Models))]
		svcs := RandomServices(m, seed, 2+int(seed%2), 2)
		cases = append(cases, tc{fmt.Sprintf("random/%d", seed), m, svcs})
		cases = append(cases, tc{fmt.Sprintf("memory/%d", seed), m, withMemory(m, svcs, seed)})
	}
	for _, c := range cases {
		want, werr := exactRef(c.m, c.svcs, 6)
		got, gerr := Exact(c.m, c.svcs, 6)
		if (werr == nil) != (gerr == nil) {
			t.Errorf("%s: error %v, reference %v", c.name, gerr, werr)
			continue
		}
		if werr != nil {
			continue
		}
		if len(got.GPUs) != len(want.GPUs) {
			t.Errorf("%s: %d GPUs, reference %d", c.name, len(got.GPUs), len(want.GPUs))
		}
		if err := got.Validate(c.m, c.svcs); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// Past its step limit the exact solver returns the heuristic's plan with
// an error saying it is unproven; below the heuristic's count, no plan.
// Steps, not time: the outcome is the same on any machine.
func TestExactStepLimit(t *testing.T) {
	m := A100_80GB
	svcs := RandomServices(m, 1, 10, 0.8) // 10 services: greedy needs 6 GPUs
	g, err := Greedy(m, svcs)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		maxGPUs, steps int
		gpus           int // 0: no plan
		err            string
	}{
		{maxGPUs: 6, steps: 100_000, gpus: len(g.GPUs), err: fmt.Sprintf("exact: step limit reached after 100000 steps: Greedy's %d GPUs not proven fewest", len(g.GPUs))},
		{maxGPUs: 4, steps: 100_000, err: "exact: step limit reached after 100000 steps, no plan of at most 4 GPUs found"},
		{maxGPUs: 6, steps: 0, gpus: len(g.GPUs), err: fmt.Sprintf("exact: step limit reached after 0 steps: Greedy's %d GPUs not proven fewest", len(g.GPUs))},
	} {
		p, err := ExactWithin(m, svcs, c.maxGPUs, c.steps)
		if !errors.Is(err, ErrStepLimit) || err.Error() != c.err {
			t.Errorf("max %d, %d steps: error %v, want %q", c.maxGPUs, c.steps, err, c.err)
		}
		switch {
		case c.gpus == 0 && p != nil:
			t.Errorf("max %d, %d steps: a plan of %d GPUs, want none", c.maxGPUs, c.steps, len(p.GPUs))
		case c.gpus > 0 && (p == nil || len(p.GPUs) != c.gpus || p.Validate(m, svcs) != nil):
			t.Errorf("max %d, %d steps: plan %v, want Greedy's %d GPUs", c.maxGPUs, c.steps, p, c.gpus)
		}
	}
	// Cases the limit leaves alone: 4 services, 2 to 6 GPUs.
	for seed := uint64(1); seed <= 6; seed++ {
		svcs := RandomServices(m, seed, 4, 2)
		if _, err := Exact(m, svcs, 6); err != nil && !strings.Contains(err.Error(), "no plan with at most") {
			t.Errorf("4 services seed %d: %v", seed, err)
		}
	}
}

// BenchmarkExact times the exact solver against the reference on 3 and 4
// services (A100-80GB, demands 0.1-2 GPUs), in the same run.
func BenchmarkExact(b *testing.B) {
	m := A100_80GB
	for _, c := range []struct {
		name string
		seed uint64
		n    int
	}{{"3svcs", 3, 3}, {"4svcs", 1, 4}} {
		svcs := RandomServices(m, c.seed, c.n, 2)
		for _, impl := range []struct {
			name string
			run  func(Model, []Service, int) (*Plan, error)
		}{{"new", Exact}, {"old", exactRef}} {
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				for b.Loop() {
					if _, err := impl.run(m, svcs, 6); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
