package plan

import "fmt"

// Jagged inputs (version 4) are torch.nn.EmbeddingBag's with offsets: a
// 1-D ids input holding every sample's bag concatenated ("indices"),
// optionally a 1-D float input of one weight per id
// ("per_sample_weights"), and an offsets input, one int64 per sample,
// the start of the sample's bag in the ids (offsets[0] = 0, never
// decreasing, at most the number of ids; sample i's bag runs to
// offsets[i+1], the last one's to the end). A lookup with LastOffset
// takes one offset more, the number of ids (include_last_offset=True).
// An empty bag pools to the zero vector, as torch's does.
//
// On the wire (Recommend), a jagged input's values and its offsets come
// in the candidates, as the model takes them: the ids of all N
// candidates, and N offsets (N+1, the last the number of ids, are taken
// too).

// JaggedInput is a jagged model input with the offsets input it reads.
type JaggedInput struct {
	// Name is the jagged input (ids or weights).
	Name string
	// Offsets is the model input holding each sample's start in it.
	Offsets string
}

// Jagged lists the plan's jagged inputs in input order (nil for a plan
// with none).
func (p *Plan) Jagged() []JaggedInput {
	var out []JaggedInput
	for _, in := range p.Inputs {
		if in.Offsets != "" {
			out = append(out, JaggedInput{Name: in.Name, Offsets: in.Offsets})
		}
	}
	return out
}

// IsOffsets says whether the model input name holds a jagged input's
// offsets.
func (p *Plan) IsOffsets(name string) bool {
	for _, in := range p.Inputs {
		if in.Offsets == name {
			return true
		}
	}
	return false
}

// validateJagged checks the jagged inputs and lookups: a version 4
// field, each jagged input 1-D and read by the CPU side only, its
// offsets an integer input of one value per sample that is not jagged
// itself, and every jagged lookup pooled, on a jagged ids input, its
// weights (if any) jagged over the same offsets.
func (p *Plan) validateJagged() error {
	info := map[string]TensorInfo{}
	for _, in := range p.Inputs {
		info[in.Name] = in
	}
	used := false
	for i, in := range p.Inputs {
		if in.Offsets == "" {
			continue
		}
		used = true
		where := fmt.Sprintf("inputs[%d] %q", i, in.Name)
		off, ok := info[in.Offsets]
		switch {
		case !ok:
			return fmt.Errorf("%s: offsets %q is not a model input", where, in.Offsets)
		case off.Offsets != "":
			return fmt.Errorf("%s: offsets %q is itself jagged", where, in.Offsets)
		case off.DType != "int64" && off.DType != "int32":
			return fmt.Errorf("%s: offsets %q of dtype %q, want int64 or int32", where, in.Offsets, off.DType)
		case len(off.Shape) != 0:
			return fmt.Errorf("%s: offsets %q of per-sample shape %v, want one value per sample ([])", where, in.Offsets, off.Shape)
		case len(in.Shape) != 0:
			return fmt.Errorf("%s: a jagged input has per-sample shape [] (its values are 1-D), got %v", where, in.Shape)
		}
		for _, s := range append(append([]Side(nil), in.Sides...), off.Sides...) {
			if s == GPU {
				return fmt.Errorf("%s: the dense side reads a jagged input or its offsets %q; only lookups read them", where, in.Offsets)
			}
		}
	}
	last := map[string]bool{}
	for _, t := range p.Tables {
		for j, l := range t.Lookups {
			if l.Offsets == "" && !l.LastOffset {
				if info[l.Input].Offsets != "" {
					return fmt.Errorf("tables %q lookups[%d]: input %q is jagged but the lookup names no offsets", t.Name, j, l.Input)
				}
				continue
			}
			used = true
			lw := fmt.Sprintf("tables %q lookups[%d]", t.Name, j)
			switch {
			case l.Offsets == "":
				return fmt.Errorf("%s: last_offset without offsets", lw)
			case info[l.Input].Offsets != l.Offsets:
				return fmt.Errorf("%s: offsets %q, but input %q is not jagged over them (its offsets: %q)", lw, l.Offsets, l.Input, info[l.Input].Offsets)
			case info[l.Input].DType != "int64" && info[l.Input].DType != "int32":
				return fmt.Errorf("%s: jagged input %q of dtype %q, want int64 or int32 ids", lw, l.Input, info[l.Input].DType)
			case l.Weights != "" && info[l.Weights].Offsets != l.Offsets:
				return fmt.Errorf("%s: weights %q are not jagged over the offsets %q of the ids", lw, l.Weights, l.Offsets)
			case l.Bag != 1 || l.Rank1:
				return fmt.Errorf("%s: a jagged lookup has bag 1 and no rank1 (its bags are as long as its offsets say)", lw)
			case l.Pooling == PoolNone:
				return fmt.Errorf("%s: a jagged lookup pools its bags (sum, mean or max)", lw)
			case len(l.Pre) > 0 || l.PreOutput != "":
				return fmt.Errorf("%s: a jagged lookup runs no pre-lookup ops", lw)
			}
			if prev, ok := last[l.Offsets]; ok && prev != l.LastOffset {
				return fmt.Errorf("%s: offsets %q read with and without last_offset", lw, l.Offsets)
			}
			last[l.Offsets] = l.LastOffset
		}
	}
	if used && p.Version < 4 {
		return fmt.Errorf("jagged inputs in a version %d plan (they came in version 4)", p.Version)
	}
	return nil
}

// LastOffset says whether the lookups reading the offsets input name
// take the number of ids as one more offset (include_last_offset).
func (p *Plan) LastOffset(name string) bool {
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			if l.Offsets == name {
				return l.LastOffset
			}
		}
	}
	return false
}
