package server

import (
	"fmt"

	"github.com/prism-serve/prism/api/prismv1"
)

// Jagged inputs (plan.json inputs' offsets, version 4) are
// torch.nn.EmbeddingBag's with offsets: the ids of every sample's bag
// concatenated (Input.ids), optionally one weight per id (a float input
// jagged over the same offsets, Input.values), and the offsets input,
// each sample's start in them (Input.ids: n offsets, or n+1 with the
// last the number of ids, as include_last_offset takes them). They come
// in the candidates; the router cuts them per micro-batch
// (router/jagged.go) with the offsets rebased to 0. Decoded, the
// offsets input holds n+1 offsets ending at the number of ids, the form
// store.TableLookup.Offsets takes; an empty bag pools to zeros.

// jaggedRole says whether the model input name is jagged (and over
// which offsets) or holds offsets.
func (m *model) jaggedRole(name string) (offsets string, isOffsets bool) {
	for _, in := range m.plan.Inputs {
		switch {
		case in.Name == name && in.Offsets != "":
			offsets = in.Offsets
		case in.Offsets == name:
			isOffsets = true
		}
	}
	return offsets, isOffsets
}

// decodeJagged decodes a jagged input or an offsets input of one side;
// ok false for any other input. The offsets are checked against the
// values once every input is decoded (checkJagged).
func (m *model) decodeJagged(vals map[string]*value, side string, in *prismv1.Input, ctx bool) (ok bool, err error) {
	name := in.GetName()
	offsets, isOffsets := m.jaggedRole(name)
	if offsets == "" && !isOffsets {
		return false, nil
	}
	if ctx {
		return true, badInput("model %q: context: input %q is jagged (an EmbeddingBag's ids, weights or offsets): send it in the candidates, one bag per candidate", m.name, name)
	}
	spec := m.inputs[name]
	if len(in.GetWeights()) > 0 {
		return true, badInput("model %q: %s: input %q: per-id weights of a jagged bag are a model input of their own (the lookup's weights input), not Input.weights", m.name, side, name)
	}
	if spec.ids {
		if len(in.GetValues()) > 0 {
			return true, badInput("model %q: %s: input %q takes %s ids, got %d float values", m.name, side, name, spec.dtype(), len(in.GetValues()))
		}
		if spec.int32 && offsets != "" {
			for j, id := range in.GetIds() {
				if id != int64(int32(id)) {
					return true, badInput("model %q: %s: input %q: id %d (value %d) does not fit the model's int32", m.name, side, name, j, id)
				}
			}
		}
		vals[name] = &value{i64: in.GetIds()}
	} else {
		if len(in.GetIds()) > 0 {
			return true, badInput("model %q: %s: input %q takes float values (one weight per id), got ids", m.name, side, name)
		}
		vals[name] = &value{f32: in.GetValues()}
	}
	v := vals[name]
	v.width = max(len(v.i64), len(v.f32))
	v.shape = []int64{int64(v.width)}
	return true, nil
}

// checkJagged checks every offsets input against the n candidates and
// the jagged inputs over it: n offsets (or n+1, the last the number of
// values), the first 0, never decreasing, none past the values, and
// every input jagged over them of the same length; it leaves the
// offsets in the n+1 form.
func (m *model) checkJagged(vals map[string]*value, n int) error {
	done := map[string]bool{}
	for _, in := range m.plan.Inputs {
		name := in.Offsets
		if name == "" || done[name] {
			continue
		}
		done[name] = true
		ov := vals[name]
		if ov == nil {
			continue // missing: decode names it
		}
		total, first := -1, ""
		for _, j := range m.plan.Inputs {
			v := vals[j.Name]
			if j.Offsets != name || v == nil {
				continue
			}
			t := max(len(v.i64), len(v.f32))
			if total >= 0 && t != total {
				return badInput("model %q: candidates: inputs %q (%d values) and %q (%d values) are jagged over the same offsets %q: one value per id in each", m.name, first, total, j.Name, t, name)
			}
			if first == "" {
				total, first = t, j.Name
			}
		}
		off := ov.i64
		if len(off) == n+1 {
			if off[n] != int64(total) {
				return badInput("model %q: candidates: offsets %q: %d offsets for %d candidates end at %d, but input %q has %d values (with one offset more, the last is the number of values)", m.name, name, n+1, n, off[n], first, total)
			}
			off = off[:n]
		}
		if len(off) != n {
			return badInput("model %q: candidates: offsets %q: %d offsets for %d candidates: want one per candidate, the start of its bag in %q (or one more, the number of values)", m.name, name, len(ov.i64), n, first)
		}
		if err := offsetsValid(off, total); err != nil {
			return badInput("model %q: candidates: offsets %q of input %q: %v", m.name, name, first, err)
		}
		vals[name] = &value{width: 1, shape: []int64{int64(n) + 1}, i64: append(append(make([]int64, 0, n+1), off...), int64(total))}
	}
	return nil
}

// offsetsValid: the first offset 0, none less than the one before, none
// past the total values.
func offsetsValid(off []int64, total int) error {
	if len(off) > 0 && off[0] != 0 {
		return fmt.Errorf("the first offset is %d, want 0 (the first candidate's bag starts the values)", off[0])
	}
	for i := 1; i < len(off); i++ {
		if off[i] < off[i-1] {
			return fmt.Errorf("offset %d is %d, less than offset %d (%d): offsets never decrease", i, off[i], i-1, off[i-1])
		}
	}
	if len(off) > 0 && off[len(off)-1] > int64(total) {
		return fmt.Errorf("offset %d is %d, past the %d values", len(off)-1, off[len(off)-1], total)
	}
	return nil
}

// jaggedRefs is what WorkerInfo announces: per model with jagged
// inputs, those inputs and their offsets, so the router cuts them per
// micro-batch by the offsets.
func (s *Server) jaggedRefs() map[string]*prismv1.JaggedInputs {
	var out map[string]*prismv1.JaggedInputs
	for name, m := range s.models {
		for _, j := range m.plan.Jagged() {
			if out == nil {
				out = map[string]*prismv1.JaggedInputs{}
			}
			if out[name] == nil {
				out[name] = &prismv1.JaggedInputs{}
			}
			out[name].Inputs = append(out[name].Inputs, j.Name)
			out[name].Offsets = append(out[name].Offsets, j.Offsets)
		}
	}
	return out
}
