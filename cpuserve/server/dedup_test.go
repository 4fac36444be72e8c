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

// TestDirectDistinct: direct indexing finds the same distinct ids in the
// same order as hashing, across passes that wrap its 16-bit stamps, and
// declines (leaving uniq as given) a column with an id outside the table.
func TestDirectDistinct(t *testing.T) {
	const rows = 300
	d := newDirectIndex(rows)
	h := new(idTable)
	d.pass = 1<<16 - 5 // wraps within the loop
	for pass := range 40 {
		n := 1 + pass*23
		ids := make([]int64, n)
		for s := range ids {
			ids[s] = int64((s*7919 + pass) % (rows / (1 + pass%4)))
		}
		di, hi := make([]int32, n), make([]int32, n)
		prefix := []int64{-9, -9} // uniq may hold other columns' ids
		du, ok := d.distinct(ids, append(make([]int64, 0, n+2), prefix...), di)
		if !ok {
			t.Fatalf("pass %d: declined ids within the table", pass)
		}
		hu := h.distinct(ids, make([]int64, 0, n), hi)
		if !slices.Equal(du, hu) || !slices.Equal(di, hi) {
			t.Fatalf("pass %d: direct %v %v, hashed %v %v", pass, du, di, hu, hi)
		}
	}
	for _, bad := range []int64{-1, rows, 1 << 40} {
		ids := []int64{1, 2, bad, 1}
		uniq := make([]int64, 1, 8)
		got, ok := d.distinct(ids, uniq, make([]int32, len(ids)))
		if ok || len(got) != 1 {
			t.Errorf("id %d outside %d rows: ok %v, uniq %v; want declined, uniq as given", bad, rows, ok, got)
		}
	}
	// After a declined pass the next one starts clean.
	index := make([]int32, 3)
	if u, ok := d.distinct([]int64{2, 1, 2}, nil, index); !ok || !slices.Equal(u, []int64{2, 1}) || !slices.Equal(index, []int32{0, 1, 0}) {
		t.Errorf("after a declined pass: %v %v %v", u, index, ok)
	}
}
