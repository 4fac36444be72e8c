package server

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// value is a tensor in flight between the stages of one request. A
// context value holds one sample's worth (ctx true) until a stage needs
// every sample (see full); lookups of context ids run once and are tiled.
type value struct {
	width int // per sample
	shape []int64
	f32   []float32
	i64   []int64
	w     []float32 // Input.weights, one per id
	ctx   bool
}

// full returns v for n samples, repeating a context value.
func (v *value) full(n int) *value {
	if !v.ctx {
		return v
	}
	return &value{width: v.width, shape: v.shape, f32: tile(v.f32, n), i64: tile(v.i64, n), w: tile(v.w, n)}
}

// tile repeats one sample's values n times (nil stays nil).
func tile[T any](one []T, n int) []T {
	if one == nil {
		return nil
	}
	out := make([]T, len(one)*n)
	for i := range n {
		copy(out[i*len(one):], one)
	}
	return out
}

func badInput(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// decode checks a request's features against the model's inputs and
// returns every model input by name. The values alias the request.
func (m *model) decode(req *prismv1.LookupRequest, n int) (map[string]*value, error) {
	if fb := m.plan.FixedBatch; fb > 0 && int64(n) != fb {
		return nil, badInput("model %q: %d candidates: the model was exported with a fixed batch of %d that node %s keeps (plan.json fixed_batch), so it serves batches of exactly %d candidates",
			m.name, n, fb, m.fixedBlocker(), fb)
	}
	vals := make(map[string]*value, len(m.inputs)+len(m.lookups))
	if err := m.decodeSide(vals, "candidates", req.GetCandidates(), n, false); err != nil {
		return nil, err
	}
	if err := m.decodeSide(vals, "context", req.GetContext(), n, true); err != nil {
		return nil, err
	}
	var missing []string
	for _, name := range m.order {
		if vals[name] == nil && (m.needs == nil || m.needs[name]) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, badInput("model %q: missing input(s) %s: every model input must come in the candidates or the context", m.name, strings.Join(missing, ", "))
	}
	if err := m.checkJagged(vals, n); err != nil { // jagged.go
		return nil, err
	}
	return vals, nil
}

func (m *model) decodeSide(vals map[string]*value, side string, f *prismv1.Features, n int, ctx bool) error {
	samples := n
	if ctx {
		samples = 1
	}
	seen := map[string]bool{}
	for _, in := range f.GetInputs() {
		name := in.GetName()
		spec := m.inputs[name]
		if spec == nil {
			return badInput("model %q: %s: unknown input %q (the model's inputs: %s)", m.name, side, name, strings.Join(m.order, ", "))
		}
		if seen[name] {
			return badInput("model %q: %s: input %q given twice", m.name, side, name)
		}
		seen[name] = true
		if ok, err := m.decodeJagged(vals, side, in, ctx); ok || err != nil { // jagged.go
			if err != nil {
				return err
			}
			continue
		}
		if ctx && vals[name] != nil {
			continue // the candidates' values win over the context's
		}
		var count int
		if spec.ids {
			if len(in.GetValues()) > 0 {
				return badInput("model %q: %s: input %q takes %s ids, got %d float values", m.name, side, name, spec.dtype(), len(in.GetValues()))
			}
			count = len(in.GetIds())
			if spec.int32 {
				for j, id := range in.GetIds() {
					if id != int64(int32(id)) {
						return badInput("model %q: %s: input %q: id %d (value %d) does not fit the model's int32", m.name, side, name, j, id)
					}
				}
			}
		} else {
			if len(in.GetIds()) > 0 || len(in.GetWeights()) > 0 {
				return badInput("model %q: %s: input %q takes float values, got ids or weights", m.name, side, name)
			}
			count = len(in.GetValues())
		}
		width := spec.width
		switch {
		case width >= 0 && count != samples*width:
			what := "per sample"
			if ctx {
				what = "(the context is one sample, shared by every candidate)"
			} else {
				what = fmt.Sprintf("for %d samples", samples)
			}
			return badInput("model %q: %s: input %q has %d values, want %d x %d %s", m.name, side, name, count, width, samples, what)
		case width < 0 && (count == 0 || count%samples != 0):
			return badInput("model %q: %s: input %q has %d values, not a multiple of %d samples", m.name, side, name, count, samples)
		case width < 0:
			width = count / samples
		}
		if w := in.GetWeights(); len(w) > 0 {
			if !spec.weighted {
				return badInput("model %q: %s: input %q: the model takes no per-id weights for it", m.name, side, name)
			}
			if len(w) != count {
				return badInput("model %q: %s: input %q: %d weights for %d ids", m.name, side, name, len(w), count)
			}
		}
		vals[name] = &value{width: width, shape: batchShape(n, spec.shape, width), f32: in.GetValues(), i64: in.GetIds(), w: in.GetWeights(), ctx: ctx}
		if spec.ids {
			vals[name].f32 = nil
		} else {
			vals[name].i64 = nil
		}
	}
	return nil
}

// batchShape is [n, shape...] with an unknown dim filled from width.
func batchShape(n int, shape []int64, width int) []int64 {
	out := append([]int64{int64(n)}, shape...)
	known, unknown := int64(1), -1
	for i, d := range shape {
		if d < 0 {
			unknown = i + 1
		} else {
			known *= d
		}
	}
	if unknown > 0 {
		out[unknown] = int64(width) / max(known, 1)
	}
	return out
}

// fixedBlocker names the node that keeps a fixed-batch plan at its
// batch, for messages.
func (m *model) fixedBlocker() string {
	if b := m.plan.Batch; b != nil && len(b.Blockers) > 0 {
		return fmt.Sprintf("%q (%s)", b.Blockers[0].Node, b.Blockers[0].Op)
	}
	return "(unnamed)"
}
