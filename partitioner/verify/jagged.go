package verify

import (
	"fmt"
	"math"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// JaggedLookup pools a jagged lookup (plan.json offsets) for n samples,
// the plain way: sample s's bag is ids[offsets[s]:offsets[s+1]] (the
// last one's to the end), each row scaled by its weight when weights
// are given, pooled by sum, mean or max; an empty bag is the zero
// vector, as torch.nn.EmbeddingBag makes it.
func JaggedLookup(table []float32, t plan.Table, l plan.Lookup, n int, ids, offsets []int64, weights []float32) (tensor, error) {
	want := n
	if l.LastOffset {
		want++
	}
	if err := models.CheckOffsets(offsets, want, len(ids), l.LastOffset); err != nil {
		return tensor{}, fmt.Errorf("lookup %s: offsets %s: %w", l.Input, l.Offsets, err)
	}
	if weights != nil && len(weights) != len(ids) {
		return tensor{}, fmt.Errorf("lookup %s: %d weights for %d ids", l.Input, len(weights), len(ids))
	}
	d := t.Dim
	out := make([]float32, n*d)
	for s := range n {
		lo, hi := offsets[s], int64(len(ids))
		if s+1 < len(offsets) {
			hi = offsets[s+1]
		}
		acc := out[s*d : (s+1)*d]
		if hi == lo {
			continue
		}
		if l.Pooling == plan.PoolMax {
			for i := range acc {
				acc[i] = float32(math.Inf(-1))
			}
		}
		for j := lo; j < hi; j++ {
			id := ids[j]
			if id < 0 || id >= t.Rows {
				return tensor{}, fmt.Errorf("lookup %s: id %d outside table %q of %d rows", l.Input, id, t.Name, t.Rows)
			}
			w := float32(1)
			if weights != nil {
				w = weights[j]
			}
			for i, v := range table[id*int64(d) : (id+1)*int64(d)] {
				if l.Pooling == plan.PoolMax {
					acc[i] = max(acc[i], v)
				} else {
					acc[i] += w * v
				}
			}
		}
		if l.Pooling == plan.PoolMean {
			for i := range acc {
				acc[i] /= float32(hi - lo)
			}
		}
	}
	return tensor{shape: []int64{int64(n), int64(d)}, f32: out}, nil
}
