package mig

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// bruteCounts lists, per distinct multiset, the profile counts of every
// layout NVIDIA's placement rules allow, from the rules alone: any set of
// (profile, start) pairs with starts from the profile's placements whose
// memory slices [start, start+size) do not overlap and whose compute
// slices add up to at most 7. Independent of Legal and MaximalLayouts.
func bruteCounts(m Model) [][]int {
	type inst struct{ p, start int }
	var all []inst
	for p, pr := range m.Profiles {
		for _, st := range pr.Starts {
			all = append(all, inst{p, st})
		}
	}
	seen := map[string]bool{}
	var out [][]int
	for mask := 1; mask < 1<<len(all); mask++ {
		used, compute, ok := 0, 0, true
		cnt := make([]int, len(m.Profiles))
		for i, in := range all {
			if mask&(1<<i) == 0 {
				continue
			}
			pr := m.Profiles[in.p]
			span := (1<<pr.Size - 1) << in.start
			if in.start+pr.Size > m.MemSlices || used&span != 0 {
				ok = false
				break
			}
			used |= span
			compute += pr.Compute
			cnt[in.p]++
		}
		if ok && compute <= m.ComputeSlices && !seen[fmt.Sprint(cnt)] {
			seen[fmt.Sprint(cnt)] = true
			out = append(out, cnt)
		}
	}
	return out
}

// bruteCovers tries every split of the instance counts tot among the
// services (an instance unassigned idles).
func bruteCovers(svcs []Service, tot []int) bool {
	rem := make([]float64, len(svcs))
	for i, s := range svcs {
		rem[i] = s.Demand
	}
	var profile func(p int) bool
	profile = func(p int) bool {
		if p == len(tot) {
			for _, r := range rem {
				if r > 1e-9 {
					return false
				}
			}
			return true
		}
		var give func(s, n int) bool
		give = func(s, n int) bool {
			if s == len(svcs) {
				return profile(p + 1)
			}
			for c := 0; c <= n; c++ {
				rem[s] -= float64(c) * svcs[s].Throughput[p]
				ok := give(s+1, n-c)
				rem[s] += float64(c) * svcs[s].Throughput[p]
				if ok {
					return true
				}
			}
			return false
		}
		return give(0, tot[p])
	}
	return profile(0)
}

// bruteFewest is the fewest GPUs, at most maxK, whose layouts cover the
// (validated) services, or -1.
func bruteFewest(m Model, svcs []Service, maxK int) int {
	layouts := bruteCounts(m)
	for k := 0; k <= maxK; k++ {
		pick := make([]int, k)
		var rec func(pos, from int) bool
		rec = func(pos, from int) bool {
			if pos == k {
				tot := make([]int, len(m.Profiles))
				for _, li := range pick {
					for p, c := range layouts[li] {
						tot[p] += c
					}
				}
				return bruteCovers(svcs, tot)
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
			return k
		}
	}
	return -1
}

// TestExactAgainstBruteForce: on every model, with throughputs that tell
// profiles apart and memory needs that rule some out, the exact solver's
// count is the fewest GPUs an exhaustive search over every layout the
// placement rules allow finds (up to 2 GPUs), Greedy never does better,
// and both plans are legal and meet every demand.
func TestExactAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for i := range 30 {
		m := Models[i%len(Models)]
		var svcs []Service
		for s := range 2 + i%2 {
			th := DefaultThroughput(m, 1)
			if rng.IntN(2) == 0 {
				for p := range th {
					th[p] = float64(1+rng.IntN(6)) / 7
				}
			}
			sv := Service{Name: fmt.Sprint("s", s), Demand: float64(1+rng.IntN(8)) / 10, Throughput: th}
			if rng.IntN(3) == 0 {
				sv.MemGB = float64(rng.IntN(int(m.Profiles[len(m.Profiles)-1].MemGB)))
			}
			svcs = append(svcs, sv)
		}
		v, err := validate(m, svcs)
		if err != nil {
			t.Fatal(err)
		}
		want := bruteFewest(m, v, 2)
		if want < 0 {
			continue
		}
		ex, err := Exact(m, svcs, 2)
		if err != nil || len(ex.GPUs) != want {
			t.Errorf("case %d %s %+v: exact %v (%v), exhaustive %d GPUs", i, m.Name, svcs, ex, err, want)
			continue
		}
		gr, err := Greedy(m, svcs)
		if err != nil || len(gr.GPUs) < want {
			t.Errorf("case %d: greedy %v (%v) against exhaustive %d GPUs", i, gr, err, want)
			continue
		}
		for name, p := range map[string]*Plan{"exact": ex, "greedy": gr} {
			if err := p.Validate(m, svcs); err != nil {
				t.Errorf("case %d %s: %v", i, name, err)
			}
		}
	}
	for _, m := range Models {
		if got, want := len(bruteCounts(m)), 77; got != want {
			t.Errorf("%s: %d non-empty layouts (as multisets), want %d", m.Name, got, want)
		}
	}
}
