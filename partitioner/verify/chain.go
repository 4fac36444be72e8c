// Package verify runs a partitioned model the way the serving tiers will
// (cpu.onnx, the table lookups and pooling in Go from the Arrow files,
// then dense.onnx) and checks it against the monolithic model. It lives
// apart from package partitioner so that the partitioner itself needs no
// ONNX Runtime.
package verify

import (
	"fmt"
	"math"

	"github.com/prism-serve/prism/internal/prelookup"
	"github.com/prism-serve/prism/plan"
	planpkg "github.com/prism-serve/prism/plan"

	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/models"
)

// Chain is an opened partition folder.
type Chain struct {
	Plan   *plan.Plan
	cpu    *ort.Session
	pre    *ort.Session // pre.onnx, run as the embedding tier runs it (pre.go)
	dense  *ort.Session
	tables map[string][]float32
	inputs map[string]planpkg.TensorInfo
}

// Open loads a partition folder: both subgraphs in ONNX Runtime and every
// table in memory (this is a checker, not the embedding store).
func Open(dir string, so ort.SessionOptions) (*Chain, error) {
	plan, err := plan.Read(dir)
	if err != nil {
		return nil, err
	}
	c := &Chain{Plan: plan, tables: map[string][]float32{}, inputs: map[string]planpkg.TensorInfo{}}
	for _, in := range plan.Inputs {
		c.inputs[in.Name] = in
	}
	if plan.CPUModel != "" {
		path, err := planFile(dir, plan.CPUModel)
		if err != nil {
			return nil, err
		}
		if c.cpu, err = ort.NewSession(path, so); err != nil {
			return nil, err
		}
	}
	if plan.PreModel != "" {
		path, err := planFile(dir, plan.PreModel)
		if err == nil {
			c.pre, err = ort.NewSession(path, so)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	path, err := planFile(dir, plan.DenseModel)
	if err != nil {
		c.Close()
		return nil, err
	}
	if c.dense, err = ort.NewSession(path, so); err != nil {
		c.Close()
		return nil, err
	}
	for _, t := range plan.Tables {
		path, err := planFile(dir, t.File)
		if err != nil {
			c.Close()
			return nil, err
		}
		tab, err := tablefile.Open(path)
		if err != nil {
			c.Close()
			return nil, err
		}
		if tab.Rows != t.Rows || tab.Dim != t.Dim || tab.SHA256 != t.SHA256 {
			tab.Close()
			c.Close()
			return nil, fmt.Errorf("table %q: file says %d x %d (%s), plan says %d x %d (%s)", t.Name, tab.Rows, tab.Dim, tab.SHA256, t.Rows, t.Dim, t.SHA256)
		}
		data, err := tab.ReadAll()
		tab.Close()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.tables[t.Name] = data
	}
	return c, nil
}

// Close frees the sessions.
func (c *Chain) Close() {
	if c.cpu != nil {
		c.cpu.Close()
	}
	if c.dense != nil {
		c.dense.Close()
	}
	if c.pre != nil {
		c.pre.Close()
	}
}

// tensor is a named value in flight between the stages.
type tensor struct {
	shape []int64
	f32   []float32
	i64   []int64
}

// Run scores a batch through the chain and returns the dense model's
// outputs in plan order.
func (c *Chain) Run(b *models.Batch) ([][]float32, error) {
	vals := map[string]tensor{}
	for i, in := range b.Sig.Inputs {
		vals[in.Name] = tensor{shape: b.Shape(i), f32: b.Columns[i].F32, i64: b.Columns[i].I64}
	}
	if err := c.runPre(vals, b.N); err != nil {
		return nil, err
	}
	for _, t := range c.Plan.Tables {
		for _, l := range t.Lookups {
			ids := vals[l.Input].i64
			if l.Offsets != "" {
				out, err := JaggedLookup(c.tables[t.Name], t, l, b.N, ids, vals[l.Offsets].i64, vals[l.Weights].f32)
				if err != nil {
					return nil, err
				}
				vals[l.Output] = out
				continue
			}
			if l.PreOutput != "" {
				ids = vals[l.PreOutput].i64
			}
			if len(l.Pre) > 0 {
				prog, err := prelookup.Compile(c.inputs[l.Input], l.Pre)
				if err != nil {
					return nil, err
				}
				in := vals[l.Input]
				if ids, err = prog.Run(b.N, in.f32, in.i64); err != nil {
					return nil, fmt.Errorf("lookup of table %q: pre-lookup ops on %q: %w", t.Name, l.Input, err)
				}
			}
			out, err := Lookup(c.tables[t.Name], t, l, b.N, ids, vals[l.Weights].f32)
			if err != nil {
				return nil, err
			}
			vals[l.Output] = out
		}
	}
	run := func(s *ort.Session, outs []plan.CutTensor) error {
		var ins []ort.Input
		for _, name := range s.InputNames() {
			v, ok := vals[name]
			if !ok {
				return fmt.Errorf("no value for input %q of the CPU subgraph", name)
			}
			ins = append(ins, ort.Input{Name: name, Shape: v.shape, Float32: v.f32, Int64: v.i64})
		}
		res, err := s.Run(ins)
		if err != nil {
			return err
		}
		for i, name := range s.OutputNames() {
			shape := []int64{int64(b.N)}
			for _, ct := range outs {
				if ct.Name == name {
					shape = append(shape, ct.Shape...)
				}
			}
			vals[name] = tensor{shape: shape, f32: res[i]}
		}
		return nil
	}
	if c.cpu != nil {
		if err := run(c.cpu, c.Plan.Cut); err != nil {
			return nil, err
		}
	}
	var ins []ort.Input
	for _, ct := range c.Plan.Cut {
		v, ok := vals[ct.Name]
		if !ok {
			return nil, fmt.Errorf("cut tensor %q was not produced", ct.Name)
		}
		ins = append(ins, ort.Input{Name: ct.Name, Shape: v.shape, Float32: v.f32, Int64: v.i64})
	}
	return c.dense.Run(ins)
}

// Lookup gathers and pools one lookup for n samples, the plain way: the
// reference the embedding store is tested against.
func Lookup(table []float32, t plan.Table, l plan.Lookup, n int, ids []int64, weights []float32) (tensor, error) {
	d := t.Dim
	if len(ids) != n*l.Bag {
		return tensor{}, fmt.Errorf("lookup %s: %d ids for %d samples of bag %d", l.Input, len(ids), n, l.Bag)
	}
	row := func(id int64) ([]float32, error) {
		if id < 0 || id >= t.Rows {
			return nil, fmt.Errorf("lookup %s: id %d outside table %q of %d rows", l.Input, id, t.Name, t.Rows)
		}
		return table[id*int64(d) : (id+1)*int64(d)], nil
	}
	if l.Pooling == plan.PoolNone {
		out := make([]float32, 0, len(ids)*d)
		for _, id := range ids {
			r, err := row(id)
			if err != nil {
				return tensor{}, err
			}
			out = append(out, r...)
		}
		shape := []int64{int64(n), int64(l.Bag), int64(d)}
		if l.Rank1 {
			shape = []int64{int64(n), int64(d)}
		}
		return tensor{shape: shape, f32: out}, nil
	}
	out := make([]float32, n*d)
	for s := range n {
		acc := out[s*d : (s+1)*d]
		if l.Pooling == plan.PoolMax {
			for i := range acc {
				acc[i] = float32(math.Inf(-1))
			}
		}
		for j := range l.Bag {
			r, err := row(ids[s*l.Bag+j])
			if err != nil {
				return tensor{}, err
			}
			w := float32(1)
			if weights != nil {
				w = weights[s*l.Bag+j]
			}
			for i, v := range r {
				if l.Pooling == plan.PoolMax {
					acc[i] = max(acc[i], v)
				} else {
					acc[i] += w * v
				}
			}
		}
		if l.Pooling == plan.PoolMean {
			for i := range acc {
				acc[i] /= float32(l.Bag)
			}
		}
	}
	return tensor{shape: []int64{int64(n), int64(d)}, f32: out}, nil
}

// planFile resolves a file the plan names inside its folder (plan.Resolve:
// no symlink out of it); in Open a local variable hides package plan.
func planFile(dir, rel string) (string, error) { return plan.Resolve(dir, rel) }
