package mig

import (
	"encoding/binary"
	"slices"
)

// improve drops GPUs, last first, while the plan stays valid after
// reassigning every instance greedily (local search by removal): a trial
// without GPU i reassigns all instances, largest compute first and in plan
// order among equals, each to the service with the most relative unmet
// demand that it serves, and succeeds when no demand is left.
//
// A trial's outcome depends only on the sequence of profiles it visits,
// and of a profile only on its throughputs: profiles of one compute size
// that every service values alike (the two 1g profiles, unless memory
// tells them apart) are one class. A trial is keyed by that class
// sequence, run-length encoded, and its outcome kept: the plans Greedy
// builds repeat a few layouts, so a removal pass over G GPUs runs a
// handful of distinct trials instead of G, each in O(instances · log
// services) with a heap per class instead of O(instances · services). A
// GPU next to one whose trial just failed, with the same classes in the
// same order, would give the same sequence and is skipped unkeyed. The
// result is identical to reassigning every trial in full.
func improve(m Model, svcs []Service, plan *Plan) {
	if len(plan.GPUs) < 2 {
		return
	}
	r := newReassigner(m, svcs)
	memo := map[string]bool{}
	var key []byte
	tot := r.count(plan.GPUs)
	changed, prevFailed := false, false
	for i := len(plan.GPUs) - 1; i >= 0 && len(plan.GPUs) > 1; i-- {
		if prevFailed && r.sameClasses(plan.GPUs[i].Layout, plan.GPUs[i+1].Layout) {
			continue // the same sequence as the trial of GPU i+1, which failed
		}
		key = r.key(key[:0], plan.GPUs, i, tot)
		ok, seen := memo[string(key)]
		if !seen {
			ok = r.run(key)
			memo[string(key)] = ok
		}
		prevFailed = !ok
		if ok {
			for _, in := range plan.GPUs[i].Layout {
				tot[r.class[in.Profile]]--
			}
			plan.GPUs = slices.Delete(plan.GPUs, i, i+1)
			changed = true
		}
	}
	if changed {
		r.assign(plan)
	}
}

// reassigner runs the removal pass's reassignment.
type reassigner struct {
	m      Model
	svcs   []Service
	class  []int // profile -> class: the lowest profile of its compute that every service values alike
	levels []int // distinct compute sizes, largest first
	multi  []bool
	// levelClass is the class of a level's first profile.
	levelClass []int
	// per trial
	rem   []float64
	ver   []int32
	heaps [][]cand // per class, built on first use in a trial
	built []int    // the classes whose heaps this trial built
}

// cand is a service in a class's heap: its relative unmet demand when
// pushed and the version of its demand then (stale once it changed).
type cand struct {
	r   float64
	s   int32
	ver int32
}

// before orders candidates as the reassignment picks them: most relative
// unmet demand first, the lower service index among equals.
func before(a, b cand) bool { return a.r > b.r || (a.r == b.r && a.s < b.s) }

func newReassigner(m Model, svcs []Service) *reassigner {
	r := &reassigner{m: m, svcs: svcs, class: make([]int, len(m.Profiles))}
	for p, pp := range m.Profiles {
		r.class[p] = p
		for q := 0; q < p; q++ {
			if m.Profiles[q].Compute != pp.Compute {
				continue
			}
			same := true
			for _, s := range svcs {
				same = same && s.Throughput[p] == s.Throughput[q]
			}
			if same {
				r.class[p] = r.class[q]
				break
			}
		}
		if !slices.Contains(r.levels, pp.Compute) {
			r.levels = append(r.levels, pp.Compute)
		}
	}
	slices.SortFunc(r.levels, func(a, b int) int { return b - a })
	r.multi = make([]bool, len(r.levels))
	r.levelClass = make([]int, len(r.levels))
	for li, c := range r.levels {
		first := -1
		for p, pp := range m.Profiles {
			if pp.Compute != c {
				continue
			}
			if first < 0 {
				first = r.class[p]
			} else if r.class[p] != first {
				r.multi[li] = true
			}
		}
		r.levelClass[li] = first
	}
	r.rem = make([]float64, len(svcs))
	r.ver = make([]int32, len(svcs))
	r.heaps = make([][]cand, len(m.Profiles))
	return r
}

func (r *reassigner) sameClasses(a, b Layout) bool {
	return slices.EqualFunc(a, b, func(x, y Instance) bool { return r.class[x.Profile] == r.class[y.Profile] })
}

// count returns the instances of each class in gpus.
func (r *reassigner) count(gpus []GPU) []int {
	tot := make([]int, len(r.m.Profiles))
	for _, g := range gpus {
		for _, in := range g.Layout {
			tot[r.class[in.Profile]]++
		}
	}
	return tot
}

// key appends the class sequence a trial without GPU skip visits, as
// (class, count) runs, to buf; tot counts each class's instances in gpus.
func (r *reassigner) key(buf []byte, gpus []GPU, skip int, tot []int) []byte {
	runClass, runLen := -1, 0
	flush := func() {
		if runLen > 0 {
			buf = binary.AppendUvarint(buf, uint64(runClass))
			buf = binary.AppendUvarint(buf, uint64(runLen))
		}
	}
	add := func(c, n int) {
		if c != runClass {
			flush()
			runClass, runLen = c, 0
		}
		runLen += n
	}
	for li, level := range r.levels {
		if !r.multi[li] {
			// One class: only the count matters.
			c := r.levelClass[li]
			n := tot[c]
			for _, in := range gpus[skip].Layout {
				if r.class[in.Profile] == c {
					n--
				}
			}
			if n > 0 {
				add(c, n)
			}
			continue
		}
		for g := range gpus {
			if g == skip {
				continue
			}
			for _, in := range gpus[g].Layout {
				if r.m.Profiles[in.Profile].Compute == level {
					add(r.class[in.Profile], 1)
				}
			}
		}
	}
	flush()
	return buf
}

// reset starts a trial: all demand unmet, no heap built.
func (r *reassigner) reset() {
	for s := range r.svcs {
		r.rem[s] = r.svcs[s].Demand
		r.ver[s] = 0
	}
	for c := range r.heaps {
		r.heaps[c] = r.heaps[c][:0]
	}
	r.built = r.built[:0]
}

// pick gives one instance of class c to the service with the most
// relative unmet demand that c serves; it returns that service or -1.
func (r *reassigner) pick(c int) int {
	if !slices.Contains(r.built, c) {
		r.built = append(r.built, c)
		h := r.heaps[c][:0]
		for s, sv := range r.svcs {
			if r.rem[s] > 1e-9 && sv.Throughput[c] > 0 {
				h = append(h, cand{r.rem[s] / sv.Demand, int32(s), r.ver[s]})
			}
		}
		for i := len(h)/2 - 1; i >= 0; i-- {
			down(h, i)
		}
		r.heaps[c] = h
	}
	h := r.heaps[c]
	for len(h) > 0 {
		top := h[0]
		s := int(top.s)
		if top.ver == r.ver[s] {
			r.rem[s] -= r.svcs[s].Throughput[c]
			r.ver[s]++
			return s
		}
		// Stale: its demand went down since; refresh or drop it.
		if r.rem[s] > 1e-9 {
			h[0] = cand{r.rem[s] / r.svcs[s].Demand, top.s, r.ver[s]}
		} else {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		down(h, 0)
	}
	r.heaps[c] = h
	return -1
}

// down restores the heap order below i.
func down(h []cand, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		j := l
		if l+1 < len(h) && before(h[l+1], h[l]) {
			j = l + 1
		}
		if !before(h[j], h[i]) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

// met reports whether the trial left no demand unmet.
func (r *reassigner) met() bool {
	for _, x := range r.rem {
		if x > 1e-9 {
			return false
		}
	}
	return true
}

// run reassigns the class sequence a key encodes; it reports whether all
// demand is met.
func (r *reassigner) run(key []byte) bool {
	r.reset()
	for len(key) > 0 {
		c, n1 := binary.Uvarint(key)
		n, n2 := binary.Uvarint(key[n1:])
		key = key[n1+n2:]
		for range n {
			r.pick(int(c))
		}
	}
	return r.met()
}

// assign labels every instance of the plan as the reassignment does.
func (r *reassigner) assign(plan *Plan) {
	r.reset()
	for g := range plan.GPUs {
		plan.GPUs[g].Assign = make([]int, len(plan.GPUs[g].Layout))
	}
	for _, level := range r.levels {
		for g := range plan.GPUs {
			for j, in := range plan.GPUs[g].Layout {
				if r.m.Profiles[in.Profile].Compute == level {
					plan.GPUs[g].Assign[j] = r.pick(r.class[in.Profile])
				}
			}
		}
	}
}
