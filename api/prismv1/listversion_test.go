package prismv1

import "testing"

// TestSameList: two versions name one list only when both are set with
// a non-zero process and equal fields.
func TestSameList(t *testing.T) {
	v := func(process, gen uint64) *ListVersion { return &ListVersion{Process: process, Gen: gen} }
	for _, c := range []struct {
		name string
		a, b *ListVersion
		want bool
	}{
		{"equal", v(7, 3), v(7, 3), true},
		{"another change", v(7, 3), v(7, 4), false},
		{"another process, same change count", v(7, 3), v(8, 3), false},
		{"none held", nil, v(7, 3), false},
		{"none sent", v(7, 3), nil, false},
		{"neither", nil, nil, false},
		{"process 0", v(0, 3), v(0, 3), false},
	} {
		if got := SameList(c.a, c.b); got != c.want {
			t.Errorf("%s: SameList(%v, %v) = %v, want %v", c.name, c.a, c.b, got, c.want)
		}
	}
}
