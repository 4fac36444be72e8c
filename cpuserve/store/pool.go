package store

// pool reduces the gathered rows g (one per id, in id order) into r.Out.
// direct means g is r.Out (one row per output row); only the weights are
// left to apply. The arithmetic order is fixed (bag order, from zero) so
// a plain loop over the same rows gives the same floats.
func pool(r *TableLookup, g []float32, dim, samples int, direct bool) {
	if direct {
		if r.Weights != nil {
			for i, w := range r.Weights {
				row := g[i*dim : (i+1)*dim]
				for k := range row {
					row[k] *= w
				}
			}
		}
		return
	}
	bag := max(r.Bag, 1)
	for s := range samples {
		lo, hi := s*bag, (s+1)*bag
		if r.Offsets != nil {
			lo, hi = int(r.Offsets[s]), int(r.Offsets[s+1])
		}
		out := r.Out[s*dim : (s+1)*dim]
		clear(out)
		if hi == lo {
			continue
		}
		switch r.Pooling {
		case PoolMax:
			copy(out, g[lo*dim:(lo+1)*dim])
			if r.Weights != nil {
				w := r.Weights[lo]
				for k := range out {
					out[k] *= w
				}
			}
			for j := lo + 1; j < hi; j++ {
				row := g[j*dim : (j+1)*dim]
				w := float32(1)
				if r.Weights != nil {
					w = r.Weights[j]
				}
				for k, x := range row[:len(out)] {
					out[k] = max(out[k], w*x)
				}
			}
		default:
			for j := lo; j < hi; j++ {
				row := g[j*dim : (j+1)*dim]
				if r.Weights == nil {
					for k, x := range row[:len(out)] {
						out[k] += x
					}
					continue
				}
				w := r.Weights[j]
				for k, x := range row[:len(out)] {
					out[k] += w * x
				}
			}
			if r.Pooling == PoolMean {
				inv := float32(hi - lo)
				for k := range out {
					out[k] /= inv
				}
			}
		}
	}
}

// poolPartial pools a partial lookup (TableLookup.Partial): over the ids
// held only (ids[i] != notHeld; the others' rows of g are zeros), mean
// as an undivided sum, and the per-sample counts into r.Counts.
func poolPartial(r *TableLookup, g []float32, ids []int64, dim, samples int, direct bool) {
	if direct {
		pool(r, g, dim, samples, true) // zeros stay zeros
		if r.Counts != nil {
			for s := range samples {
				r.Counts[s] = 0
				if ids[s] != notHeld {
					r.Counts[s] = 1
				}
			}
		}
		return
	}
	bag := max(r.Bag, 1)
	for s := range samples {
		lo, hi := s*bag, (s+1)*bag
		if r.Offsets != nil {
			lo, hi = int(r.Offsets[s]), int(r.Offsets[s+1])
		}
		out := r.Out[s*dim : (s+1)*dim]
		clear(out)
		count := 0
		for j := lo; j < hi; j++ {
			if ids[j] == notHeld {
				continue
			}
			row := g[j*dim : (j+1)*dim]
			w := float32(1)
			if r.Weights != nil {
				w = r.Weights[j]
			}
			switch {
			case r.Pooling != PoolMax:
				for k, x := range row[:len(out)] {
					out[k] += w * x
				}
			case count == 0:
				for k, x := range row[:len(out)] {
					out[k] = w * x
				}
			default:
				for k, x := range row[:len(out)] {
					out[k] = max(out[k], w*x)
				}
			}
			count++
		}
		if r.Counts != nil {
			r.Counts[s] = float32(count)
		}
	}
}
