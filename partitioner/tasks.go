package partitioner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prism-serve/prism/plan"
)

// chooseTasks picks the outputs the dense tier answers with and puts
// them first in p.Outputs (plan.Plan.TaskOutputs). With names, exactly
// those outputs, in that order, each of them a float32 score (one value
// per sample, or [k]). Without, every such output, in the model's order
// (the one named "score" first): a multi-task model exported with one
// output per task (a PyTorch module returning a tuple of heads,
// HugeCTR's MMoE) is served with every task's scores, and a model of one
// score as before. Outputs that are not scores (an embedding, an int64
// rank) stay after them; dense.onnx still computes every output, the
// dense tier fetches only the tasks. Without names, scores past
// plan.MaxTasks values a sample are left out, and so are an output [k]
// after the first task (an embedding of 16 values a sample is not 16
// tasks: a multi-task model's heads are one value a sample each, or
// stacked in its first score) and an output whose per-sample shape the
// partitioner could not work out (unknown says which: its plan shape,
// [], would read as one value a sample); when the first output is of
// unknown shape, it alone is served, as before (the dense tier checks
// its values a sample at run time).
func chooseTasks(p *plan.Plan, names []string, unknown map[string]bool) error {
	var tasks []int
	if len(names) > 0 {
		seen := map[string]bool{}
		for _, name := range names {
			i := slices.IndexFunc(p.Outputs, func(o plan.TensorInfo) bool { return o.Name == name })
			if i < 0 {
				return fmt.Errorf("--tasks %q: the model has no output of that name (outputs: %s)", name, quotedNames(p.Outputs))
			}
			if seen[name] {
				return fmt.Errorf("--tasks %q: named twice", name)
			}
			seen[name] = true
			if o := p.Outputs[i]; o.DType != "float32" {
				return fmt.Errorf("--tasks %q: the output is %s; a task's scores are float32", name, o.DType)
			}
			if unknown[name] {
				return fmt.Errorf("--tasks %q: the output's per-sample shape is unknown (the model does not declare it and the partitioner could not infer it): it cannot be told to be a score per task", name)
			}
			if _, err := plan.ScoreWidth(p.Outputs[i]); err != nil {
				return fmt.Errorf("--tasks: output %w", err)
			}
			tasks = append(tasks, i)
		}
	} else {
		if unknown[p.Outputs[0].Name] {
			return nil
		}
		total := 0
		for i, o := range p.Outputs {
			if o.DType != "float32" || unknown[o.Name] {
				continue
			}
			w, err := plan.ScoreWidth(o)
			if err != nil || total+w > plan.MaxTasks || (w > 1 && len(tasks) > 0) {
				continue
			}
			total += w
			tasks = append(tasks, i)
		}
		if len(tasks) == 0 {
			// No output is a score: the plan is written as the model
			// has it, and the dense tier refuses it at load, naming
			// the first output and its shape.
			return nil
		}
	}
	outs := make([]plan.TensorInfo, 0, len(p.Outputs))
	for _, i := range tasks {
		outs = append(outs, p.Outputs[i])
	}
	for i, o := range p.Outputs {
		if !slices.Contains(tasks, i) {
			outs = append(outs, o)
		}
	}
	p.Outputs = outs
	p.TaskOutputs = 0
	if len(tasks) > 1 {
		p.TaskOutputs = len(tasks)
	}
	if _, err := p.Tasks(); err != nil {
		return fmt.Errorf("--tasks: %w", err)
	}
	p.Version = plan.WriteVersion(p)
	return nil
}

func quotedNames(outs []plan.TensorInfo) string {
	var names []string
	for _, o := range outs {
		names = append(names, fmt.Sprintf("%q", o.Name))
	}
	return strings.Join(names, ", ")
}
