package plan

import (
	"fmt"
	"strconv"
)

// MaxTasks bounds the values per sample of a multi-task model's score
// (its first output, or its TaskOutputs): a head of a few tasks (CTR,
// CVR, ...) is served; an output as wide as an embedding is not a score,
// and each of its values would cross the wire back to the client for
// every candidate.
const MaxTasks = 64

// MaxTaskName bounds the length of a task's name (TaskNames) that a
// dense worker answers with (ScoreResponse.task_names) and the router
// passes on: an output's name, which ONNX does not bound.
const MaxTaskName = 256

// Tasks is the number of values per sample the dense tier answers with:
// 1 for a first output of one value per sample ([], [1], [1, 1]), k for a
// multi-task model's 1-D [k] (1 < k <= MaxTasks, HugeCTR's label_dim, an
// MMoE's heads stacked), and the sum of the widths of the first
// TaskOutputs outputs for a model with one output per task. Any other
// shape (unknown sizes, 2-D or more of more than one value, more than
// MaxTasks in all) is an error that names it.
func (p *Plan) Tasks() (int, error) {
	widths, err := p.TaskWidths()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, w := range widths {
		n += w
	}
	return n, nil
}

// TaskWidths is the values per sample of each output the dense tier
// answers with (Tasks): one entry, or TaskOutputs.
func (p *Plan) TaskWidths() ([]int, error) {
	if len(p.Outputs) == 0 {
		return nil, fmt.Errorf("plan has no outputs: the first is the score the dense tier answers with")
	}
	outs := p.Outputs[:max(p.TaskOutputs, 1)]
	widths := make([]int, len(outs))
	total := 0
	for i, o := range outs {
		where := "first output"
		if len(outs) > 1 {
			where = fmt.Sprintf("task output %d", i)
			if o.DType != "float32" {
				return nil, fmt.Errorf("%s %q is %s; a task's scores are float32", where, o.Name, o.DType)
			}
		}
		w, err := ScoreWidth(o)
		if err != nil {
			return nil, fmt.Errorf("%s %w", where, err)
		}
		if total += w; total > MaxTasks {
			return nil, fmt.Errorf("task outputs %d to %d have %d values per sample: more than %d tasks is not a score per task", 0, i, total, MaxTasks)
		}
		widths[i] = w
	}
	return widths, nil
}

// ScoreWidth is the values per sample of an output served as scores: 1
// for one value per sample, k for a 1-D [k] (k <= MaxTasks); any other
// shape is an error that names the output and the shape.
func ScoreWidth(o TensorInfo) (int, error) {
	w := int64(1)
	for _, d := range o.Shape {
		if d <= 0 {
			return 0, fmt.Errorf("%q has per-sample shape %v: every dimension must be known", o.Name, o.Shape)
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
	case len(o.Shape) != 1:
		return 0, fmt.Errorf("%q has per-sample shape %v; want one score per sample, or [k] for a model of k tasks", o.Name, o.Shape)
	case w > MaxTasks:
		return 0, fmt.Errorf("%q has per-sample shape %v: more than %d tasks is not a score per task", o.Name, o.Shape, MaxTasks)
	}
	return int(w), nil
}

// TaskNames names the Tasks values of a sample, in order: an output's
// name for an output of one value per sample, name[j] for value j of
// one of k.
func (p *Plan) TaskNames() ([]string, error) {
	widths, err := p.TaskWidths()
	if err != nil {
		return nil, err
	}
	var names []string
	for i, w := range widths {
		name := p.Outputs[i].Name
		if w == 1 {
			names = append(names, name)
			continue
		}
		for j := range w {
			names = append(names, name+"["+strconv.Itoa(j)+"]")
		}
	}
	return names, nil
}

// WriteVersion is the plan.json version to write p at: the oldest that
// holds its fields (Version 5 only for TaskOutputs), so builds reading
// up to version 4 still serve every plan needing none of version 5.
func WriteVersion(p *Plan) int {
	if p.TaskOutputs > 1 {
		return Version
	}
	return 4
}
