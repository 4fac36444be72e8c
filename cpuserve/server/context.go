package server

import (
	"slices"

	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/onnxpb"
)

// A request's context features (LookupRequest.context) are one sample's
// worth, shared by every candidate. Their lookups and pooling run once
// (value.ctx, request.go), and a cut tensor computed from the context
// alone crosses to the dense worker once too: it goes in the frame as a
// context column (arrowframe, context.go), one row for all the samples,
// and the dense worker expands it into its batch. A cut tensor is
// context-only when it is
//
//   - a model input the request sent in the context (a dense feature);
//   - a lookup's output whose ids (after the pre-lookup ops) and weights
//     all came in the context, pooled or not;
//   - an output of cpu.onnx whose graph reads only such values (model
//     inputs sent in the context, lookups run once): cpu.onnx still runs
//     on every sample, and its first row goes (cpuDependencies).
//
// The partial columns of a row-wise shard are sent for every sample (the
// dense worker's combine reads every sample's part).

// contextCut says, per cut tensor of m (m.cut's order), whether it is
// context-only for this request's decoded values.
func (m *model) contextCut(vals map[string]*value) (ctx []bool, any bool) {
	ctx = make([]bool, len(m.cut))
	once := make(map[string]bool, len(m.lookups))
	for _, ls := range m.lookups {
		once[ls.l.Output] = lookupOnce(ls, vals)
	}
	// Predicting a column context where the lookup then runs for every
	// sample would break the frame: lookupOnce must follow Server.lookup's
	// rule exactly, or say false (the column is then sent expanded).
	isCtx := func(name string) bool {
		v := vals[name]
		return v != nil && v.ctx || once[name]
	}
	for i, c := range m.cut {
		switch {
		case isCtx(c.name): // a model input sent in the context, a lookup run once
			ctx[i] = true
		case m.cpu != nil:
			ctx[i] = m.cpuContext(c.name, isCtx)
		}
		any = any || ctx[i]
	}
	return ctx, any
}

// lookupOnce says whether a lookup runs once for the request: its ids and
// its weights (if any) came in the context. It is the rule Server.lookup
// follows.
func lookupOnce(ls lookupSpec, vals map[string]*value) bool {
	ids := vals[ls.l.Input]
	if ls.l.PreOutput != "" {
		ids = vals[ls.l.PreOutput] // pre.onnx's ids (runPre has run)
	}
	if ids == nil || !ids.ctx {
		return false
	}
	if w := ls.l.Weights; w != "" {
		if wv := vals[w]; wv != nil {
			return wv.ctx
		}
	}
	return true
}

// contextCols is the frame layout of m's cut for a request: m.cols with
// the context-only tensors marked (m.cols itself when none is).
func (m *model) contextCols(ctx []bool, any bool) []arrowframe.Column {
	if !any || m.cols == nil {
		return m.cols
	}
	cols := make([]arrowframe.Column, len(m.cols))
	for i, c := range m.cols {
		c.Context = ctx[i]
		cols[i] = c
	}
	return cols
}

// cpuDependencies reads cpu.onnx's graph and returns, per graph output,
// the graph inputs it is computed from (initializers and constants are
// nobody's). A node with a subgraph (If, Loop, Scan), which may read
// outer names unseen here, counts as reading every graph input. A node
// that reads a name no earlier node made (a graph out of order) also
// does: the answer may say "every input" where it is not, never less.
func cpuDependencies(path string) (map[string][]string, error) {
	mp, err := onnxpb.ReadModel(path, onnxpb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return nil, err
	}
	g := mp.GetGraph()
	var all []string
	deps := map[string]map[string]bool{}
	for _, in := range g.GetInput() {
		deps[in.GetName()] = map[string]bool{in.GetName(): true}
		all = append(all, in.GetName())
	}
	known := map[string]bool{"": true} // an omitted optional input
	for _, t := range g.GetInitializer() {
		known[t.GetName()] = true
	}
	for _, nd := range g.GetNode() {
		from := map[string]bool{}
		whole := false
		for _, a := range nd.GetAttribute() {
			whole = whole || a.GetG() != nil || len(a.GetGraphs()) > 0
		}
		for _, in := range nd.GetInput() {
			switch d, ok := deps[in]; {
			case ok:
				for k := range d {
					from[k] = true
				}
			case !known[in]:
				whole = true
			}
		}
		if whole {
			for _, k := range all {
				from[k] = true
			}
		}
		for _, out := range nd.GetOutput() {
			deps[out] = from
		}
	}
	out := map[string][]string{}
	for _, o := range g.GetOutput() {
		d, ok := deps[o.GetName()]
		if !ok && !known[o.GetName()] {
			d = map[string]bool{}
			for _, k := range all {
				d[k] = true
			}
		}
		names := make([]string, 0, len(d))
		for k := range d {
			names = append(names, k)
		}
		slices.Sort(names)
		out[o.GetName()] = names
	}
	return out, nil
}

// cpuContext says whether cpu.onnx's output is computed from context
// values alone, as isCtx tells them: then every sample's row of it is the
// same, and it is a context value.
func (m *model) cpuContext(output string, isCtx func(string) bool) bool {
	deps, ok := m.cpuDeps[output]
	if !ok {
		return false
	}
	for _, d := range deps {
		if !isCtx(d) {
			return false
		}
	}
	return true
}
