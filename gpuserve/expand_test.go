package gpuserve

import "testing"

func TestExpansionPool(t *testing.T) {
	var p expansionPool
	for _, n := range []int{1, 2, 3, 270 * 16, 1 << 12, 1<<12 + 1} {
		b := p.get(n)
		if len(b) != n || cap(b) < n {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
		for i := range b {
			b[i] = float32(i)
		}
		p.put(b)
		if again := p.get(n); len(again) != n {
			t.Fatalf("get(%d) after put: len %d", n, len(again))
		}
	}
	p.put(make([]float32, 3)) // not from get: ignored
	p.put(nil)
}
