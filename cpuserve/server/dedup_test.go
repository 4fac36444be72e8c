package server

import (
	"slices"
	"testing"
)

// TestDistinct: first-seen order, every id's index, over table sizes
// that wrap the stamps' pass and reuse one table.
func TestDistinct(t *testing.T) {
	tb := new(idTable)
	for _, c := range []struct {
		ids  []int64
		want []int64
	}{
		{[]int64{5}, []int64{5}},
		{[]int64{3, 3, 3}, []int64{3}},
		{[]int64{7, -1, 7, 0, -1, 1 << 62, 0}, []int64{7, -1, 0, 1 << 62}},
		{[]int64{}, []int64{}},
	} {
		index := make([]int32, len(c.ids))
		uniq := tb.distinct(c.ids, make([]int64, 0, len(c.ids)), index)
		if !slices.Equal(uniq, c.want) {
			t.Errorf("distinct(%v) = %v, want %v", c.ids, uniq, c.want)
		}
		for s, id := range c.ids {
			if uniq[index[s]] != id {
				t.Errorf("distinct(%v): index[%d] = %d names %d", c.ids, s, index[s], uniq[index[s]])
			}
		}
	}
	// Many passes, many sizes: compared with a map.
	tb.pass = ^uint32(0) - 3 // wraps within the loop
	for pass := range 40 {
		n := 1 + pass*37
		ids := make([]int64, n)
		for s := range ids {
			ids[s] = int64((s * 7919) % (n/3 + 1))
		}
		index := make([]int32, len(ids))
		uniq := tb.distinct(ids, make([]int64, 0, len(ids)), index)
		seen := map[int64]bool{}
		for s, id := range ids {
			seen[id] = true
			if uniq[index[s]] != id {
				t.Fatalf("pass %d: index[%d] wrong", pass, s)
			}
		}
		if len(uniq) != len(seen) {
			t.Fatalf("pass %d: %d distinct, want %d", pass, len(uniq), len(seen))
		}
	}
}
