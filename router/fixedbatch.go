package router

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// A model exported with a fixed batch B that the partitioner could not
// rewrite to a symbolic one (plan.json fixed_batch) runs its parts at B
// only. Its embedding workers announce B (WorkerInfo.fixed_batch), and
// the router cuts every request of the model into micro-batches of
// exactly B candidates: the last one is padded with copies of its last
// candidate, and the padding's scores are dropped. A client sends any
// number of candidates, as for any other model.

// maxFixedBatch bounds the fixed batch the registry believes.
const maxFixedBatch = 1 << 16

// FixedBatch is the batch model's embedding workers announce it fixed
// at, 0 when it takes any (or no worker announces one in range).
func (r *Registry) FixedBatch(model string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}]
	if set == nil {
		return 0
	}
	for _, e := range set.ws {
		if b := e.info.GetFixedBatch()[model]; b > 0 && b <= maxFixedBatch {
			return int(b)
		}
	}
	return 0
}

// fixedBatches are the micro-batches [lo, hi) of n candidates at fixed
// batch b: consecutive runs of b, the last shorter (then padded).
func fixedBatches(n, b int) [][2]int {
	var out [][2]int
	for lo := 0; lo < n; lo += b {
		out = append(out, [2]int{lo, min(lo+b, n)})
	}
	return out
}

// padFeatures returns f (m candidates) with its last candidate repeated
// until it holds b: every candidate input's values, ids and weights.
func padFeatures(f *prismv1.Features, m, b int) (*prismv1.Features, error) {
	if m == b {
		return f, nil
	}
	if m <= 0 || m > b {
		return nil, status.Errorf(codes.Internal, "padding %d candidates to a batch of %d", m, b)
	}
	out := &prismv1.Features{Inputs: make([]*prismv1.Input, len(f.GetInputs()))}
	for i, in := range f.GetInputs() {
		out.Inputs[i] = &prismv1.Input{
			Name:    in.GetName(),
			Values:  padLast(in.GetValues(), m, b),
			Ids:     padLast(in.GetIds(), m, b),
			Weights: padLast(in.GetWeights(), m, b),
		}
	}
	return out, nil
}

// padLast extends v (m samples of len(v)/m values) to b samples by
// repeating its last sample; nil stays nil.
func padLast[T any](v []T, m, b int) []T {
	if len(v) == 0 {
		return v
	}
	w := len(v) / m
	out := make([]T, 0, b*w)
	out = append(out, v...)
	last := v[len(v)-w:]
	for range b - m {
		out = append(out, last...)
	}
	return out
}
