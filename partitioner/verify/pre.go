package verify

import (
	"fmt"

	"github.com/prism-serve/prism/internal/ort"
)

// runPre runs the plan's pre.onnx, when it has one, on the batch's
// model inputs, as the embedding tier does (ONNX Runtime on the CPU,
// before the lookups), and adds its outputs, the ids of the lookups
// naming them in pre_output, to vals.
func (c *Chain) runPre(vals map[string]tensor, n int) error {
	if c.pre == nil {
		return nil
	}
	var ins []ort.Input
	for _, name := range c.pre.InputNames() {
		v, ok := vals[name]
		if !ok {
			return fmt.Errorf("no value for input %q of the pre-lookup subgraph", name)
		}
		ins = append(ins, ort.Input{Name: name, Shape: v.shape, Float32: v.f32, Int64: v.i64})
	}
	outs, err := c.pre.RunInt64(ins)
	if err != nil {
		return fmt.Errorf("pre-lookup subgraph %s: %w", c.Plan.PreModel, err)
	}
	for i, name := range c.pre.OutputNames() {
		if n == 0 {
			continue
		}
		vals[name] = tensor{shape: []int64{int64(n), int64(len(outs[i]) / n)}, i64: outs[i]}
	}
	return nil
}
