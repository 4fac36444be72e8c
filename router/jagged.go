package router

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// A model with jagged inputs (an EmbeddingBag's ids and per-id weights
// with their offsets; plan.json inputs' offsets) takes, in the
// candidates, every candidate's values concatenated and one offset per
// candidate, the start of its bag (or one more, the number of values).
// Its embedding workers announce those inputs (WorkerInfo.jagged); the
// router cuts them per micro-batch by the offsets: micro-batch [lo, hi)
// gets values [offsets[lo], offsets[hi]) and offsets[lo:hi] rebased to
// start at 0. The sharded fan-out sends every shard that same cut.

// maxJagged bounds the jagged inputs of a model the registry believes.
const maxJagged = 1 << 10

// Jagged is the model's jagged inputs, each with its offsets input, as
// its embedding workers announce them (nil for none).
func (r *Registry) Jagged(model string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}]
	if set == nil {
		return nil
	}
	for _, e := range set.ws {
		j := e.info.GetJagged()[model]
		if j == nil || len(j.GetInputs()) != len(j.GetOffsets()) || len(j.GetInputs()) > maxJagged {
			continue
		}
		out := make(map[string]string, len(j.GetInputs()))
		for i, in := range j.GetInputs() {
			out[in] = j.GetOffsets()[i]
		}
		return out
	}
	return nil
}

// jaggedCut is one request's jagged inputs and their offsets, checked.
type jaggedCut struct {
	of map[string]string // jagged input -> its offsets input
	// offsets holds each offsets input's n+1 offsets (the last the
	// number of values).
	offsets map[string][]int64
}

// isJagged says whether the candidate input name is a jagged input or
// offsets of the model whose jagged inputs are jagged.
func isJagged(jagged map[string]string, name string) bool {
	if _, ok := jagged[name]; ok {
		return true
	}
	for _, o := range jagged {
		if o == name {
			return true
		}
	}
	return false
}

// newJaggedCut checks the jagged inputs of req's candidates against its
// n candidates (nil for a model without any): each offsets input n
// offsets (or n+1, the last the number of values), the first 0, never
// decreasing, none past the values, and every input jagged over it of
// one length.
func newJaggedCut(jagged map[string]string, req *prismv1.RecommendRequest, n int) (*jaggedCut, error) {
	if len(jagged) == 0 {
		return nil, nil
	}
	c := &jaggedCut{of: jagged, offsets: map[string][]int64{}}
	byName := map[string]*prismv1.Input{}
	for _, in := range req.GetCandidates().GetInputs() {
		byName[in.GetName()] = in
	}
	totals := map[string]int{}
	first := map[string]string{}
	// Every jagged input (a name sent twice included) is cut by the same
	// offsets: its ids, values and weights must each hold the total, or a
	// micro-batch's cut runs past the short one.
	for _, in := range req.GetCandidates().GetInputs() {
		name := in.GetName()
		off, ok := jagged[name]
		if !ok {
			continue // not jagged; a missing one the embedding worker names
		}
		count := -1
		for _, l := range []int{len(in.GetIds()), len(in.GetValues()), len(in.GetWeights())} {
			if l == 0 {
				continue
			}
			if count >= 0 && l != count {
				return nil, status.Errorf(codes.InvalidArgument, "candidate input %q is jagged: %d ids, %d values, %d weights: want one of each per id", name, len(in.GetIds()), len(in.GetValues()), len(in.GetWeights()))
			}
			count = l
		}
		count = max(count, 0)
		if t, ok := totals[off]; ok && t != count {
			return nil, status.Errorf(codes.InvalidArgument, "candidate inputs %q (%d values) and %q (%d values) are jagged over the same offsets %q: one value per id in each", first[off], t, name, count, off)
		}
		if f, ok := first[off]; !ok || name < f { // name the same input whatever the order
			totals[off], first[off] = count, name
		}
	}
	for off, total := range totals {
		in := byName[off]
		if in == nil {
			return nil, status.Errorf(codes.InvalidArgument, "candidate input %q is jagged: send its offsets %q in the candidates, one per candidate (the start of its bag)", first[off], off)
		}
		v := in.GetIds()
		if len(in.GetValues()) > 0 || len(in.GetWeights()) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "candidate input %q holds offsets: send them as ids", off)
		}
		if len(v) == n+1 {
			if v[n] != int64(total) {
				return nil, status.Errorf(codes.InvalidArgument, "candidate input %q: %d offsets for %d candidates end at %d, but %q has %d values (with one offset more, the last is the number of values)", off, n+1, n, v[n], first[off], total)
			}
			v = v[:n]
		}
		if len(v) != n {
			return nil, status.Errorf(codes.InvalidArgument, "candidate input %q: %d offsets for %d candidates: want one per candidate, the start of its bag in %q (or one more, the number of values)", off, len(in.GetIds()), n, first[off])
		}
		if err := checkOffsets(v, total); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "candidate input %q (offsets of %q): %v", off, first[off], err)
		}
		c.offsets[off] = append(append(make([]int64, 0, n+1), v...), int64(total))
	}
	return c, nil
}

// checkOffsets: the first offset 0, none less than the one before, none
// past the total values.
func checkOffsets(off []int64, total int) error {
	if len(off) > 0 && off[0] != 0 {
		return fmt.Errorf("the first offset is %d, want 0", off[0])
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

// sliceFeatures is the package's sliceFeatures with the jagged inputs
// cut by their offsets (c nil: no jagged inputs).
func (c *jaggedCut) sliceFeatures(f *prismv1.Features, n, lo, hi int) (*prismv1.Features, error) {
	if c == nil || lo == 0 && hi == n {
		return sliceFeatures(f, n, lo, hi)
	}
	var plain, jag []*prismv1.Input
	var at []int
	for i, in := range f.GetInputs() {
		if isJagged(c.of, in.GetName()) {
			jag, at = append(jag, in), append(at, i)
		} else {
			plain = append(plain, in)
		}
	}
	sub, err := sliceFeatures(&prismv1.Features{Inputs: plain}, n, lo, hi)
	if err != nil {
		return nil, err
	}
	out := &prismv1.Features{Inputs: make([]*prismv1.Input, len(f.GetInputs()))}
	k := 0
	for i := range out.Inputs {
		if k < len(at) && at[k] == i {
			out.Inputs[i] = c.slice(jag[k], lo, hi)
			k++
			continue
		}
		out.Inputs[i] = sub.GetInputs()[i-k]
	}
	return out, nil
}

// slice cuts one jagged or offsets input for candidates [lo, hi).
func (c *jaggedCut) slice(in *prismv1.Input, lo, hi int) *prismv1.Input {
	s := &prismv1.Input{Name: in.GetName()}
	if off, ok := c.offsets[in.GetName()]; ok {
		s.Ids = make([]int64, hi-lo)
		for i := range s.Ids {
			s.Ids[i] = off[lo+i] - off[lo]
		}
		return s
	}
	off := c.offsets[c.of[in.GetName()]]
	if off == nil {
		return in // offsets without their values: the embedding worker names what is missing
	}
	a, b := off[lo], off[hi]
	if v := in.GetIds(); len(v) > 0 {
		s.Ids = v[a:b]
	}
	if v := in.GetValues(); len(v) > 0 {
		s.Values = v[a:b]
	}
	if v := in.GetWeights(); len(v) > 0 {
		s.Weights = v[a:b]
	}
	return s
}
