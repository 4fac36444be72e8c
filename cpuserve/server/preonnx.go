package server

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// preModel is a plan's pre-lookup subgraph (plan.json pre_model,
// pre.onnx): the integer work between the model inputs and the ids of
// the lookups the native pre-lookup ops do not cover (hashing by
// multiply and shift, bit masks, floor division ...). It runs through
// ONNX Runtime on the CPU, once per micro-batch, before the store
// lookups; its outputs are the ids of the lookups naming them in
// pre_output, read exactly as a native program's ids are.
type preModel struct {
	s    *ort.Session
	ins  []string
	outs []string
	// bag is the ids per sample each output holds (the lookups' Bag).
	bag map[string]int
}

// loadPre opens the plan's pre.onnx and checks it against the lookups
// that read it: its inputs are model inputs, and every pre_output is
// one of its outputs. It returns nil when the plan has none.
func loadPre(dir string, p *plan.Plan, inputs map[string]*inputSpec, so ort.SessionOptions) (*preModel, error) {
	if p.PreModel == "" {
		return nil, nil
	}
	path, err := plan.Resolve(dir, p.PreModel)
	if err != nil {
		return nil, err
	}
	s, err := newSession(path, so)
	if err != nil {
		return nil, err
	}
	pm := &preModel{s: s, ins: s.InputNames(), outs: s.OutputNames(), bag: map[string]int{}}
	fail := func(format string, args ...any) (*preModel, error) {
		s.Close()
		return nil, fmt.Errorf("pre-lookup subgraph %s: "+format, append([]any{p.PreModel}, args...)...)
	}
	for _, in := range pm.ins {
		if inputs[in] == nil {
			return fail("its input %q is not a model input", in)
		}
	}
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			if l.PreOutput == "" {
				continue
			}
			found := false
			for _, o := range pm.outs {
				found = found || o == l.PreOutput
			}
			if !found {
				return fail("table %q: the lookup's pre_output %q is not one of its outputs %v", t.Name, l.PreOutput, pm.outs)
			}
			if b, ok := pm.bag[l.PreOutput]; ok && b != l.Bag {
				return fail("output %q is read by lookups of bag %d and %d", l.PreOutput, b, l.Bag)
			}
			pm.bag[l.PreOutput] = l.Bag
		}
	}
	return pm, nil
}

func (pm *preModel) close() {
	if pm != nil {
		pm.s.Close()
	}
}

// runPre runs the model's pre.onnx, if it has one, on the micro-batch's
// inputs in vals and adds its outputs (int64 ids) to vals under their
// names. When every input it reads is a context value it runs once, on
// the context's one sample, and its outputs are context values too (a
// lookup of them runs once); otherwise it runs on all n samples, the
// context inputs repeated.
func (m *model) runPre(vals map[string]*value, n int) error {
	pm := m.pre
	if pm == nil {
		return nil
	}
	ctx := true
	for _, name := range pm.ins {
		v := vals[name]
		if v == nil {
			return badInput("model %q: pre-lookup subgraph: no value for input %q", m.name, name)
		}
		ctx = ctx && v.ctx
	}
	samples := n
	if ctx {
		samples = 1
	}
	ins := make([]ort.Input, 0, len(pm.ins))
	for _, name := range pm.ins {
		v := vals[name]
		shape := v.shape
		if ctx {
			shape = append([]int64{1}, v.shape[1:]...)
		} else {
			v = v.full(n)
		}
		ins = append(ins, ort.Input{Name: name, Shape: shape, Float32: v.f32, Int64: v.i64})
	}
	outs, err := pm.s.RunInt64(ins)
	if err != nil {
		return badInput("model %q: pre-lookup subgraph %s: %v", m.name, m.plan.PreModel, err)
	}
	for i, name := range pm.outs {
		want := samples * pm.bag[name]
		if _, read := pm.bag[name]; read && len(outs[i]) != want {
			return status.Errorf(codes.Internal, "model %q: pre-lookup subgraph %s: output %q has %d ids for %d samples of bag %d", m.name, m.plan.PreModel, name, len(outs[i]), samples, pm.bag[name])
		}
		vals[name] = &value{width: len(outs[i]) / samples, shape: []int64{int64(n), int64(len(outs[i]) / samples)}, i64: outs[i], ctx: ctx}
	}
	return nil
}

// preIDs is the ids of lookup l when pre.onnx makes them (runPre put
// them in vals), with the per-id weights riding on its input, if any.
func preIDs(vals map[string]*value, l plan.Lookup, n int) *value {
	ids := *vals[l.PreOutput]
	in := vals[l.Input]
	ids.w = in.w
	if ids.w != nil && in.ctx != ids.ctx {
		ids.w = in.full(n).w // pre.onnx ran on every sample
	}
	return &ids
}
