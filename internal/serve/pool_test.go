package serve

import "testing"

func TestPoolTiers(t *testing.T) {
	for _, tc := range []struct{ size, cap int }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {463_000, 512 << 10}, {4 << 20, 4 << 20}, {4<<20 + 1, 4<<20 + 1},
	} {
		b := Pool.Get(tc.size)
		if len(*b) != tc.size || cap(*b) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.size, len(*b), cap(*b), tc.size, tc.cap)
		}
		Pool.Put(b)
	}
	// A recycled buffer comes back at the asked length; foreign
	// capacities are dropped, not pooled.
	b := Pool.Get(1000)
	(*b)[0] = 7
	Pool.Put(b)
	c := Pool.Get(600)
	if len(*c) != 600 || cap(*c) != 1024 {
		t.Errorf("recycled: len %d cap %d", len(*c), cap(*c))
	}
	odd := make([]byte, 10, 700)
	Pool.Put(&odd)
	if d := Pool.Get(700); cap(*d) != 1024 {
		t.Errorf("foreign buffer pooled: cap %d", cap(*d))
	}
}
