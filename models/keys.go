package models

import (
	"fmt"
	"slices"
)

// keySet is an input's valid keys (InputSpec.Keys), indexed: key i of
// the set, in order, is keys[r].Lo + i - starts[r] for the range r
// holding it.
type keySet struct {
	keys   []IDRange
	starts []int64 // starts[r]: the keys before range r
	n      int64
}

func newKeySet(name string, ks []IDRange) (*keySet, error) {
	s := &keySet{keys: ks, starts: make([]int64, len(ks))}
	for i, r := range ks {
		if !r.IsID() || (i > 0 && r.Lo < ks[i-1].Hi) {
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

// hasKey says whether ks (sorted, disjoint) holds k.
func hasKey(ks []IDRange, k int64) bool {
	i, _ := slices.BinarySearchFunc(ks, k, func(r IDRange, k int64) int {
		switch {
		case r.Hi <= k:
			return -1
		case r.Lo > k:
			return 1
		}
		return 0
	})
	return i < len(ks) && ks[i].Lo <= k && k < ks[i].Hi
}
