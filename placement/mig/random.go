package mig

import (
	"fmt"
	"math/rand/v2"
)

// RandomServices draws n services for benchmarks and tests, deterministic
// in seed: a full-GPU throughput in [100, 300) requests/s, a demand of 0.1
// to maxDemand full GPUs in tenths, and for half of them slices between 2g
// and 4g 10% less efficient than linear, as some models scale.
func RandomServices(m Model, seed uint64, n int, maxDemand float64) []Service {
	rng := rand.New(rand.NewPCG(seed, 0x5bd1e995))
	tenths := max(1, int(maxDemand*10))
	svcs := make([]Service, 0, n)
	for s := 0; s < n; s++ {
		full := float64(100 + rng.IntN(200))
		t := DefaultThroughput(m, full)
		if rng.IntN(2) == 0 {
			for i, p := range m.Profiles {
				if p.Compute > 1 && p.Compute < 7 {
					t[i] *= 0.9
				}
			}
		}
		svcs = append(svcs, Service{Name: fmt.Sprintf("s%d", s), Demand: full * float64(1+rng.IntN(tenths)) / 10, Throughput: t})
	}
	return svcs
}
