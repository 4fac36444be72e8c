package serve

import "testing"

func TestLightGCPercent(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400}, {1 << 20, 400}, {64 << 20, 400}, {100 << 20, 250}, {128 << 20, 200}, {200 << 20, 125}, {256 << 20, 100}, {4 << 30, 100},
	} {
		if got := lightGCPercent(c.live); got != c.want {
			t.Errorf("lightGCPercent(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}
