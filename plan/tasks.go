package plan

import "fmt"

// MaxTasks bounds the values per sample of a multi-task model's score
// (its first output): a head of a few tasks (CTR, CVR, ...) is served; a
// first output as wide as an embedding is not a score, and each of its
// values would cross the wire back to the client for every candidate.
const MaxTasks = 64

// Tasks is the number of values per sample of the plan's score (its
// first output, the one the dense tier answers with): 1 for a per-sample
// shape of one value ([], [1], [1, 1]), k for a multi-task model's 1-D
// [k] (1 < k <= MaxTasks, HugeCTR's label_dim, an MMoE's heads stacked).
// Any other shape (unknown sizes, 2-D or more of more than one value, k
// above MaxTasks) is an error that names it.
func (p *Plan) Tasks() (int, error) {
	if len(p.Outputs) == 0 {
		return 0, fmt.Errorf("plan has no outputs: the first is the score the dense tier answers with")
	}
	score := p.Outputs[0]
	w := int64(1)
	for _, d := range score.Shape {
		if d <= 0 {
			return 0, fmt.Errorf("first output %q has per-sample shape %v: every dimension must be known", score.Name, score.Shape)
		}
		if d > MaxTasks || w*d > MaxTasks {
			w = MaxTasks + 1 // more than a score per task (and no overflow)
			break
		}
		w *= d
	}
	switch {
	case w == 1:
		return 1, nil
	case len(score.Shape) != 1:
		return 0, fmt.Errorf("first output %q has per-sample shape %v; want one score per sample, or [k] for a model of k tasks", score.Name, score.Shape)
	case w > MaxTasks:
		return 0, fmt.Errorf("first output %q has per-sample shape %v: more than %d tasks is not a score per task", score.Name, score.Shape, MaxTasks)
	}
	return int(w), nil
}
