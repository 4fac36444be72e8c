package router

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// nonFiniteScore is the InvalidArgument status of a request scored NaN or
// infinite for a candidate one of whose float features (Input.values or
// weights, its own or the context's) is not a finite number; nil when
// every score is finite, or a non-finite one comes of finite features
// (the model's own answer, passed on as the whole model gives it).
//
// The tiers score what they are sent, as the whole model does, so a NaN
// feature came back as a NaN score under OK: a client could not tell its
// own bad feature from a broken model. Features are not refused before
// scoring: a model may read NaN as "missing" (IsNaN, Where) and score it
// finitely, and then the request is served as the whole model serves it.
func nonFiniteScore(req *prismv1.RecommendRequest, jc *jaggedCut, scores []float32, n int) error {
	for k, s := range scores {
		if !notFinite(s) {
			continue
		}
		if err := badFeature(req, jc, n, k, s); err != nil {
			return err
		}
	}
	return nil
}

// nonFiniteTaskScore is nonFiniteScore for the scores of a model of
// tasks tasks, candidate-major (RecommendResponse.task_scores): a
// non-finite score of any task is judged by its candidate's features.
func nonFiniteTaskScore(req *prismv1.RecommendRequest, jc *jaggedCut, taskScores []float32, n, tasks int) error {
	for i, s := range taskScores {
		if !notFinite(s) {
			continue
		}
		if err := badFeature(req, jc, n, i/tasks, s); err != nil {
			return err
		}
	}
	return nil
}

func notFinite(v float32) bool {
	d := v - v // NaN for NaN and ±Inf, 0 for every finite v
	return d != d
}

// badFeature names the first float feature of candidate k (n in all)
// that is not a finite number, as an InvalidArgument status; nil for
// none.
func badFeature(req *prismv1.RecommendRequest, jc *jaggedCut, n, k int, score float32) error {
	inCands := map[string]bool{}
	for _, in := range req.GetCandidates().GetInputs() {
		inCands[in.GetName()] = true
		for _, f := range floatFields(in) {
			field, v := f.name, f.v
			lo, hi := candidateRange(jc, in.GetName(), len(v), n, k)
			for i := lo; i < hi; i++ {
				if notFinite(v[i]) {
					return status.Errorf(codes.InvalidArgument, "candidate %d scored %v: candidate input %q: %s[%d] is %v: a feature must be a finite number", k, score, in.GetName(), field, i, v[i])
				}
			}
		}
	}
	for _, in := range req.GetContext().GetInputs() {
		if inCands[in.GetName()] {
			continue // the candidates' values win over the context's
		}
		for _, f := range floatFields(in) {
			field, v := f.name, f.v
			for i, x := range v {
				if notFinite(x) {
					return status.Errorf(codes.InvalidArgument, "candidate %d scored %v: context input %q: %s[%d] is %v: a feature must be a finite number", k, score, in.GetName(), field, i, x)
				}
			}
		}
	}
	return nil
}

type floatField struct {
	name string
	v    []float32
}

// floatFields are an input's float fields, in a fixed order for messages.
func floatFields(in *prismv1.Input) [2]floatField {
	return [2]floatField{{"values", in.GetValues()}, {"weights", in.GetWeights()}}
}

// candidateRange is where candidate k's values lie in a candidate
// input's l values: its bag for a jagged input (by its offsets), else
// its l/n.
func candidateRange(jc *jaggedCut, name string, l, n, k int) (int, int) {
	if l == 0 {
		return 0, 0
	}
	if jc != nil {
		if off := jc.offsets[jc.of[name]]; off != nil && len(off) == n+1 {
			lo, hi := int(off[k]), int(off[k+1])
			if 0 <= lo && lo <= hi && hi <= l {
				return lo, hi
			}
			return 0, 0
		}
	}
	w := l / n
	return k * w, (k + 1) * w
}
