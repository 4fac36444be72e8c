package server

import (
	"context"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"slices"
	"sync"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/prelookup"
)

// model is one served model: its plan, resolved once at startup into
// what a request needs (input widths, lookups, the cut), and its CPU
// subgraph when the plan has one.
type model struct {
	name string
	dir  string
	plan *plan.Plan
	// content identifies the model served (plan.Plan.Content; "" when the
	// plan records no table content): announced, checked against a
	// pinned Lookup, sent with the cut tensors.
	content string
	inputs  map[string]*inputSpec
	order   []string // input names in plan order, for messages
	// lookups in plan order: each table's uses, one TableLookup each.
	lookups []lookupSpec
	// pre runs the plan's pre.onnx (preonnx.go), nil without one.
	pre *preModel
	// needs, on a shard other than 0 of a sharded model (shard.go), are
	// the inputs it reads: a request need not carry the others.
	needs   map[string]bool
	cpu     *ort.Session
	cpuIns  []string
	cpuOuts []string
	// cpuDeps: per cpu.onnx output, the inputs it is computed from
	// (context.go: an output of context values alone is one).
	cpuDeps map[string][]string
	cut     []cutSpec
	// cols is the frame layout of the cut (nil when a cut shape is not
	// fully known): lookups write straight into a frame of this layout.
	cols []arrowframe.Column
	// dedup marks the columns that may go dictionary-encoded
	// (dedup.go; nil: none, or Options.DictionaryFrames off).
	dedup []int
	// dedupPool recycles the dedup (dedup.go) of a micro-batch.
	dedupPool sync.Pool
	// sampleBytes is the cut's float32 bytes per sample (a dimension the
	// plan leaves unknown counts as 1): what admission charges.
	sampleBytes int64
}

// rowFactors are the plan's RowFactors of table (nil: none, or no such
// table).
func (m *model) rowFactors(table string) map[int64]float32 {
	if m.plan == nil {
		return nil
	}
	for i := range m.plan.Tables {
		if m.plan.Tables[i].Name == table {
			return m.plan.Tables[i].RowFactors
		}
	}
	return nil
}

// inputSpec is one model input as the requests carry it.
type inputSpec struct {
	name  string
	ids   bool    // ids (Input.ids, int64 on the wire) rather than float values (Input.values)
	int32 bool    // the model declares the ids int32: each must fit one
	shape []int64 // per sample, plan's
	width int     // values per sample (0 for a dimension of 0); -1 when the plan leaves a dim unknown
	// weighted: some lookup reads this input's per-id weights from
	// Input.weights (a plan lookup with Weights naming no model input).
	weighted bool
}

type lookupSpec struct {
	table string
	dim   int
	rows  int64 // the table's, as the plan gives it
	l     plan.Lookup
	// pre runs the lookup's pre-lookup ops (nil when Input holds the ids).
	pre *prelookup.Program
	// split: pre starts with a column pick of an integer input that
	// other lookups pick columns of too, so the input is split into its
	// columns once per micro-batch (prelookup.Columns) and pre runs on
	// its column.
	split bool
}

type cutSpec struct {
	name  string
	shape []int64 // per sample
}

// ensureIngested ingests the plan in dir into st unless st already
// serves the model, and checks that the stored tables are the plan's.
func ensureIngested(ctx context.Context, st *store.Store, dir string, p *plan.Plan, progress func(model string, done, total int64)) (ingested bool, err error) {
	name := p.ServedName(dir)
	if !slices.Contains(st.Models(), name) {
		io := store.IngestOptions{Model: name}
		if progress != nil {
			io.Progress = func(done, total int64) { progress(name, done, total) }
		}
		if _, err := st.Ingest(ctx, dir, io); err != nil {
			return false, fmt.Errorf("ingest model %q from %s: %w", name, dir, err)
		}
		ingested = true
	}
	if err := st.MatchPlan(name, p); err != nil {
		// Another version of the model (the plan retrained, or the store
		// switched by prism store versions): its rows would be scored by
		// this plan's cpu.onnx and dense side.
		return ingested, fmt.Errorf("%w (the store serves %s; the plan is in %s): ingest the plan (prism ingest), activate the version ingested from it (prism store versions) or serve the plan the store holds",
			err, activeFrom(st, name), dir)
	}
	return ingested, nil
}

// activeFrom says which version of model the store serves and the plan
// it was ingested from, for a message: "version N, from PLAN".
func activeFrom(st *store.Store, model string) string {
	vs, _ := st.Versions(model)
	for _, v := range vs {
		if v.Active {
			return fmt.Sprintf("version %d, from %s", v.N, v.Plan)
		}
	}
	return "no active version"
}

// loadModel resolves a plan folder and opens its CPU subgraph.
func loadModel(dir string, p *plan.Plan, so ort.SessionOptions) (*model, error) {
	m := &model{name: p.ServedName(dir), dir: dir, plan: p, inputs: map[string]*inputSpec{}}
	for _, in := range p.Inputs {
		spec := &inputSpec{name: in.Name, shape: in.Shape, width: 1}
		switch in.DType {
		case "int64":
			spec.ids = true
		case "int32":
			spec.ids, spec.int32 = true, true
		case "float32", "float":
		default:
			return nil, fmt.Errorf("model %q: input %q: dtype %q not served (float32, int64 and int32 are)", m.name, in.Name, in.DType)
		}
		for _, d := range in.Shape {
			if d < 0 {
				spec.width = -1
				break
			}
			spec.width *= int(d)
		}
		m.inputs[in.Name] = spec
		m.order = append(m.order, in.Name)
	}
	infos := map[string]plan.TensorInfo{}
	for _, in := range p.Inputs {
		infos[in.Name] = in
	}
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			in := m.inputs[l.Input]
			var pre *prelookup.Program
			if len(l.Pre) > 0 && in != nil {
				var err error
				if pre, err = prelookup.Compile(infos[l.Input], l.Pre); err != nil {
					return nil, fmt.Errorf("model %q: table %q: %w", m.name, t.Name, err)
				}
			} else if l.PreOutput == "" && (in == nil || !in.ids) {
				return nil, fmt.Errorf("model %q: table %q looks up %q, which is not an int64 or int32 model input", m.name, t.Name, l.Input)
			}
			if l.Weights != "" {
				if w := m.inputs[l.Weights]; w == nil {
					// Weights not a model input of their own: they ride on
					// the id input's Input.weights.
					in.weighted = true
				} else if w.ids {
					return nil, fmt.Errorf("model %q: lookup of %q: weights %q are not float32", m.name, l.Input, l.Weights)
				}
			}
			m.lookups = append(m.lookups, lookupSpec{table: t.Name, dim: t.Dim, rows: t.Rows, l: l, pre: pre})
		}
	}
	picks := map[string]int{} // lookups picking a column of each input
	for _, ls := range m.lookups {
		if _, ok := ls.pre.FirstColumnOK(); ok && ls.l.PreOutput == "" {
			picks[ls.l.Input]++
		}
	}
	for i, ls := range m.lookups {
		if _, ok := ls.pre.FirstColumnOK(); ok && ls.l.PreOutput == "" && picks[ls.l.Input] > 1 {
			m.lookups[i].split = true
		}
	}
	for _, c := range p.Cut {
		m.cut = append(m.cut, cutSpec{name: c.Name, shape: c.Shape})
		w := 1
		for _, d := range c.Shape {
			w *= int(max(d, 0))
		}
		m.cols = append(m.cols, arrowframe.Column{Name: c.Name, Width: w})
	}
	m.sampleBytes = cutSampleBytes(m.cut)
	for _, c := range m.cols {
		if c.Width <= 0 {
			m.cols = nil
			break
		}
	}
	pre, err := loadPre(dir, p, m.inputs, so)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", m.name, err)
	}
	m.pre = pre
	if p.CPUModel != "" {
		path, err := plan.Resolve(dir, p.CPUModel)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", m.name, err)
		}
		s, err := newSession(path, so)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", m.name, err)
		}
		m.cpu, m.cpuIns, m.cpuOuts = s, s.InputNames(), s.OutputNames()
		if m.cpuDeps, err = cpuDependencies(path); err != nil {
			s.Close()
			return nil, fmt.Errorf("model %q: %w", m.name, err)
		}
		if p.FixedBatch > 0 {
			// A graph tied to its exported batch may read constants of
			// that batch (a folded [B, 1] tensor, one row per sample):
			// an output of context values alone then differs by row, so
			// none is taken as a context value (context.go).
			m.cpuDeps = nil
		}
	}
	return m, nil
}

func (m *model) close() {
	m.pre.close()
	if m.cpu != nil {
		m.cpu.Close()
	}
}

// cutShape is the per-sample shape of a cut tensor.
func (m *model) cutShape(name string) []int64 {
	for _, c := range m.cut {
		if c.name == name {
			return c.shape
		}
	}
	return nil
}

// dtype is the element type the model declares for an id input.
func (s *inputSpec) dtype() string {
	if s.int32 {
		return "int32"
	}
	return "int64"
}

// cutSampleBytes is the float32 bytes per sample of the cut tensors cut
// (a dimension the plan leaves open counts as 1).
func cutSampleBytes(cut []cutSpec) int64 {
	var n int64
	for _, c := range cut {
		w := 1
		for _, d := range c.shape {
			w *= int(max(d, 0))
		}
		n += 4 * int64(max(w, 1))
	}
	return n
}
