package gpuserve

import (
	"math/bits"
	"sync"
)

// expansions pools the buffers dictionary-encoded columns expand into
// (arrowframe.DecodeWith): a frame of 270 samples of dlrm-kaggle expands
// 449 KB, and a fresh allocation per frame cost more in page faults and
// collection than the expansion's copy (BENCHMARKS.md). Buffers are
// pooled by power-of-two size class.
var expansions expansionPool

type expansionPool struct {
	classes [40]sync.Pool // class c holds buffers of 1<<c floats
}

// get returns a buffer of at least n floats (contents undefined).
func (p *expansionPool) get(n int) []float32 {
	c := bits.Len(uint(max(n, 1) - 1))
	if c >= len(p.classes) {
		return make([]float32, n)
	}
	if b, ok := p.classes[c].Get().(*[]float32); ok {
		return (*b)[:n]
	}
	return make([]float32, n, 1<<c)
}

// put returns b (from get) to its class.
func (p *expansionPool) put(b []float32) {
	c := bits.Len(uint(cap(b))) - 1
	if c < 0 || c >= len(p.classes) || cap(b) != 1<<c {
		return // not one of get's buffers
	}
	b = b[:cap(b)]
	p.classes[c].Put(&b)
}
