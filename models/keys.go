package models

import (
	"fmt"
	"slices"

	"github.com/prism-serve/prism/plan"
)

// keySet is an input's valid keys (InputSpec.Keys), indexed: key i of
// the set, in order, is keys[r].Lo + i - starts[r] for the range r
// holding it.
type keySet struct {
	keys   []plan.KeyRange
	starts []int64 // starts[r]: the keys before range r
	n      int64
}

func newKeySet(name string, ks []plan.KeyRange) (*keySet, error) {
	s := &keySet{keys: ks, starts: make([]int64, len(ks))}
	for i, r := range ks {
		if r.Hi <= r.Lo || (i > 0 && r.Lo < ks[i-1].Hi) {
			return nil, fmt.Errorf("input %s: keys %v are not sorted, disjoint, non-empty ranges", name, ks)
		}
		s.starts[i] = s.n
		s.n += r.Hi - r.Lo
		if s.n <= 0 {
			return nil, fmt.Errorf("input %s: the count of keys overflows", name)
		}
	}
	if s.n == 0 {
		return nil, fmt.Errorf("input %s: no valid keys", name)
	}
	return s, nil
}

// at is key i of the set, i in [0, n).
func (s *keySet) at(i int64) int64 {
	r, ok := slices.BinarySearch(s.starts, i)
	if !ok {
		r--
	}
	return s.keys[r].Lo + i - s.starts[r]
}
