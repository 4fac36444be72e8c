package server

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// shardedFuzzPlan is pooledPlan (table t, of 21 rows here: a fixed bag
// of 3 with weights and a jagged bag, pooled sum, mean and max) with an
// unpooled lookup of t's bag (arows), a small table u looked up by b
// (bsum) and a dense feature x passed through the cut, sharded over two
// shards: t row-wise over both (every lookup of it answered in part, by
// each combine), u table-wise on one.
func shardedFuzzPlan(tb testing.TB) *plan.Plan {
	tb.Helper()
	p := pooledPlan()
	cpu := []plan.Side{plan.CPU}
	p.Inputs = append(p.Inputs,
		plan.TensorInfo{Name: "b", DType: "int64", Shape: []int64{1}, Sides: cpu},
		plan.TensorInfo{Name: "x", DType: "float32", Shape: []int64{2}, Sides: cpu})
	p.Tables[0].Lookups = append(p.Tables[0].Lookups, plan.Lookup{Input: "a", Bag: 3, Pooling: plan.PoolNone, Output: "arows"})
	// Ids past a table: t's look up a zero row (which only shard 0's part
	// counts), u's wrap.
	p.Tables[0].Rows, p.Tables[0].UnknownIDs = 21, plan.UnknownZero
	p.Tables = append(p.Tables, plan.Table{Name: "u", Rows: 6, Dim: 2, UnknownIDs: plan.UnknownHash, Lookups: []plan.Lookup{{Input: "b", Bag: 1, Pooling: plan.PoolSum, Output: "bsum"}}})
	p.Cut = append(p.Cut,
		plan.CutTensor{TensorInfo: plan.TensorInfo{Name: "arows", DType: "float32", Shape: []int64{3, 2}}, BytesPerSample: 24, From: "lookup"},
		plan.CutTensor{TensorInfo: plan.TensorInfo{Name: "bsum", DType: "float32", Shape: []int64{2}}, BytesPerSample: 8, From: "lookup"},
		plan.CutTensor{TensorInfo: plan.TensorInfo{Name: "x", DType: "float32", Shape: []int64{2}}, BytesPerSample: 8, From: "input"})
	// t is 168 bytes, u 48: t cannot stay whole on a shard of 130.
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2, ShardBytes: 130})
	if err != nil {
		tb.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		tb.Fatal(err)
	}
	if pl := p.Sharding.Placement("t"); pl.Placement != plan.RowWise || len(pl.Shards) != 2 {
		tb.Fatalf("table t placed %+v: want row-wise over both shards", pl)
	}
	if pl := p.Sharding.Placement("u"); pl.Placement != plan.TableWise {
		tb.Fatalf("table u placed %+v: want table-wise", pl)
	}
	return p
}

// shardFuzzWorker is one embedding worker of the sharded fixture and the
// dense double it sends its frames to.
type shardFuzzWorker struct {
	srv   *Server
	addr  string
	dense *frameDense
}

// shardFuzzTier is the model served whole, and each of its two shards
// on a worker of its own.
type shardFuzzTier struct {
	whole  shardFuzzWorker
	shards [2]shardFuzzWorker
}

// shardFuzz serves shardedFuzzPlan by two tiers: one sending plain
// frames, one dictionary-encoded ones (Options.DictionaryFrames).
type shardFuzz struct {
	p           *plan.Plan
	plain, dict shardFuzzTier
	partial     map[string]plan.PartialOutput // every output answered in part
}

func newShardFuzz(tb testing.TB) *shardFuzz {
	tb.Helper()
	fx := &shardFuzz{p: shardedFuzzPlan(tb), partial: map[string]plan.PartialOutput{}}
	for _, tier := range []*shardFuzzTier{&fx.plain, &fx.dict} {
		o := Options{MaxSamples: 64, Threads: 1, DictionaryFrames: tier == &fx.dict}
		tier.whole.srv, tier.whole.addr, tier.whole.dense = serveValuesShard(tb, fx.p, o, nil)
		for k := range tier.shards {
			w := &tier.shards[k]
			w.srv, w.addr, w.dense = serveValuesShard(tb, fx.p, o, &k)
		}
	}
	for k := range fx.plain.shards {
		for _, po := range fx.p.Sharding.Shard[k].Partial {
			fx.partial[po.Output] = po
		}
	}
	return fx
}

// combine assembles the shards' frames as the dense worker does
// (gpuserve/assemble.go): a whole column from the one shard sending it,
// an output answered in part combined from every part by its rule.
func (fx *shardFuzz) combine(n int, frames []map[string][]float32) (map[string][]float32, error) {
	out := map[string][]float32{}
	for _, c := range fx.p.Cut {
		w := 1
		for _, d := range c.Shape {
			w *= int(d)
		}
		var whole [][]float32
		for _, fr := range frames {
			if v, ok := fr[c.Name]; ok {
				whole = append(whole, v)
			}
		}
		po, part := fx.partial[c.Name]
		switch {
		case len(whole) == 1 && !part:
			out[c.Name] = whole[0]
			continue
		case len(whole) > 0:
			return nil, fmt.Errorf("cut tensor %q sent whole by %d shards (in part: %v)", c.Name, len(whole), part)
		case !part:
			return nil, fmt.Errorf("cut tensor %q sent by no shard", c.Name)
		}
		var parts, counts [][]float32
		for _, fr := range frames {
			v, ok := fr[arrowframe.PartialName(c.Name)]
			if !ok {
				continue
			}
			if len(v) != n*w {
				return nil, fmt.Errorf("part of %q: %d values for %d samples of %d", c.Name, len(v), n, w)
			}
			parts = append(parts, v)
			if po.Combine != plan.CombineSum {
				cnt, ok := fr[arrowframe.CountName(c.Name)]
				if !ok || len(cnt) != n {
					return nil, fmt.Errorf("part of %q (%s) without its %d counts: %d", c.Name, po.Combine, n, len(cnt))
				}
				counts = append(counts, cnt)
			}
		}
		if len(parts) != 2 {
			return nil, fmt.Errorf("cut tensor %q: %d parts, want 2", c.Name, len(parts))
		}
		got := make([]float32, n*w)
		for s := range n {
			var count float32
			for i := range parts {
				if counts != nil {
					count += counts[i][s]
				}
			}
			for k := range w {
				var acc float32
				any := false
				for i, v := range parts {
					x := v[s*w+k]
					switch po.Combine {
					case plan.CombineMaxCount:
						if counts[i][s] == 0 {
							continue
						}
						if !any || x > acc {
							acc = x
						}
						any = true
					default:
						acc += x
					}
				}
				if po.Combine == plan.CombineSumCount {
					if count == 0 {
						acc = 0
					} else {
						acc /= count
					}
				}
				got[s*w+k] = acc
			}
		}
		out[c.Name] = got
	}
	return out, nil
}

// tame says whether every float of req is finite and small, so that
// pooling the same terms in another order (by shard) stays within
// float32 rounding of the whole table's answer.
func tame(req *prismv1.LookupRequest) bool {
	for _, f := range []*prismv1.Features{req.GetCandidates(), req.GetContext()} {
		for _, in := range f.GetInputs() {
			for _, v := range append(slices.Clip(in.GetValues()), in.GetWeights()...) {
				if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 1e3 {
					return false
				}
			}
		}
	}
	return true
}

// sameFrame compares two frames column by column, within tol of each
// value (absolute, plus relative to the wanted value; NaN matches NaN).
func sameFrame(got, want map[string][]float32, tol float64) error {
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			return fmt.Errorf("column %q missing", name)
		}
		if len(g) != len(w) {
			return fmt.Errorf("column %q: %d values, want %d", name, len(g), len(w))
		}
		for i := range w {
			if g[i] == w[i] || math.IsNaN(float64(g[i])) && math.IsNaN(float64(w[i])) {
				continue
			}
			if d := math.Abs(float64(g[i] - w[i])); !(d <= tol*(1+math.Abs(float64(w[i])))) {
				return fmt.Errorf("column %q value %d: %v, want %v", name, i, g[i], w[i])
			}
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d columns, want %d", len(got), len(want))
	}
	return nil
}

// tileContext is req with its context moved into the candidates, each
// context input repeated for every sample: what the request means. A
// context input the candidates also send is dropped (theirs win).
func tileContext(req *prismv1.LookupRequest) *prismv1.LookupRequest {
	out := proto.Clone(req).(*prismv1.LookupRequest)
	out.Context = nil
	if out.Candidates == nil {
		out.Candidates = &prismv1.Features{}
	}
	n := int(req.GetNumSamples())
	for _, in := range req.GetContext().GetInputs() {
		if slices.ContainsFunc(req.GetCandidates().GetInputs(), func(c *prismv1.Input) bool { return c.GetName() == in.GetName() }) {
			continue
		}
		out.Candidates.Inputs = append(out.Candidates.Inputs, &prismv1.Input{Name: in.GetName(), Ids: tile(in.GetIds(), n), Values: tile(in.GetValues(), n), Weights: tile(in.GetWeights(), n)})
	}
	return out
}

// shardFuzzSeeds are Lookups of the sharded fixture's model: valid ones
// (every input in the candidates; the fixed bag, its weights, b and x in
// the context; empty jagged bags; both shards' rows in one bag) and the
// interesting invalid ones (fan-out fields that match no shard, an id
// past a row-wise table, a jagged input in the context, a weight count
// off by one).
func shardFuzzSeeds(addr string) []*prismv1.LookupRequest {
	in := func(name string, ids []int64, vals []float32) *prismv1.Input {
		return &prismv1.Input{Name: name, Ids: ids, Values: vals}
	}
	cands := func() *prismv1.Features {
		return &prismv1.Features{Inputs: []*prismv1.Input{
			in("a", []int64{0, 5, 19, 7, 7, 2, 11, 3, 0}, nil), in("aw", nil, []float32{1, -2, 0.5, 3, 1, -1, 0.25, 2, -0.5}),
			in("j", []int64{4, 9, 1, 18, 6}, nil), in("jo", []int64{0, 2, 2}, nil), in("jw", nil, []float32{2, -1, 0.5, 1, -3}),
			in("b", []int64{0, 5, 3}, nil), in("x", nil, []float32{1, 2, 3, 4, 5, 6}),
		}}
	}
	req := func(mod func(r *prismv1.LookupRequest)) *prismv1.LookupRequest {
		r := &prismv1.LookupRequest{Model: "m", NumSamples: 3, DenseAddr: addr, Candidates: cands()}
		mod(r)
		return r
	}
	// drop takes the named inputs out of the candidates.
	drop := func(r *prismv1.LookupRequest, names ...string) {
		r.Candidates.Inputs = slices.DeleteFunc(r.Candidates.Inputs, func(x *prismv1.Input) bool { return slices.Contains(names, x.Name) })
	}
	return []*prismv1.LookupRequest{
		req(func(*prismv1.LookupRequest) {}),
		req(func(r *prismv1.LookupRequest) { r.FanoutKey, r.Shard, r.Shards = "req-1/0", 0, 2 }),
		req(func(r *prismv1.LookupRequest) { r.FanoutKey, r.Shard, r.Shards = "req-1/0", 1, 2 }),
		req(func(r *prismv1.LookupRequest) {
			drop(r, "a", "aw", "b", "x")
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("a", []int64{1, 2, 3}, nil), in("aw", nil, []float32{1, 0.5, -1}), in("b", []int64{4}, nil), in("x", nil, []float32{7, 8})}}
		}),
		req(func(r *prismv1.LookupRequest) {
			drop(r, "aw")
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("aw", nil, []float32{1, 0.5, -1})}}
		}),
		req(func(r *prismv1.LookupRequest) {
			drop(r, "a")
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("a", []int64{0, 1, 1}, nil)}}
			r.FanoutKey, r.Shard, r.Shards = "req-2/0", 1, 2
		}),
		// A context input the candidates also send (theirs win).
		req(func(r *prismv1.LookupRequest) {
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("b", []int64{1}, nil)}}
		}),
		req(func(r *prismv1.LookupRequest) { r.Candidates.Inputs[3].Ids = []int64{0, 0, 0} }),
		// Ids past the tables (t's a zero row, u's wrapped), and a max
		// over a bag of them alone.
		req(func(r *prismv1.LookupRequest) { r.Candidates.Inputs[0].Ids[4] = 21 }),
		req(func(r *prismv1.LookupRequest) {
			r.Candidates.Inputs[0].Ids = []int64{40, 41, 1 << 40, 3, 5, 99, 22, 23, 24}
			r.Candidates.Inputs[5].Ids = []int64{6, 13, 1 << 50}
		}),
		req(func(r *prismv1.LookupRequest) { r.Candidates.Inputs[0].Ids[4] = -1 }),
		req(func(r *prismv1.LookupRequest) { r.Candidates.Inputs[1].Values = r.Candidates.Inputs[1].Values[:8] }),
		req(func(r *prismv1.LookupRequest) { r.FanoutKey, r.Shard, r.Shards = "", 1, 2 }),
		req(func(r *prismv1.LookupRequest) { r.FanoutKey, r.Shard, r.Shards = "k", 2, 2 }),
		req(func(r *prismv1.LookupRequest) { r.FanoutKey, r.Shard, r.Shards = "k", -1, -2 }),
		req(func(r *prismv1.LookupRequest) {
			drop(r, "j", "jo", "jw")
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("j", []int64{1}, nil), in("jo", []int64{0}, nil), in("jw", nil, []float32{1})}}
		}),
		req(func(r *prismv1.LookupRequest) {
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{in("a", []int64{1}, nil)}}
			drop(r, "a")
		}),
	}
}

// FuzzLookupSharded sends Lookups built from arbitrary bytes to the
// workers of a model sharded over two shards (a row-wise table answered
// in part by each, a table-wise one, a dense feature) and of the whole
// model: every request gets n scores or a documented status, never a
// panic. Where the whole model's worker takes a request, each shard
// takes its part of it (fan-out fields set as the router sets them), the
// parts combine to the whole worker's frame, and the request with its
// context moved into every candidate frames the same (the context-once
// path changes nothing but the bytes).
func FuzzLookupSharded(f *testing.F) {
	fx := newShardFuzz(f)
	for _, r := range shardFuzzSeeds(fx.plain.whole.addr) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	workers := []*shardFuzzWorker{&fx.plain.whole, &fx.plain.shards[0], &fx.plain.shards[1], &fx.dict.whole, &fx.dict.shards[0], &fx.dict.shards[1]}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.LookupRequest
		if proto.Unmarshal(b, &req) != nil {
			t.Skip()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// As it came, to every worker.
		for i, w := range workers {
			r := proto.Clone(&req).(*prismv1.LookupRequest)
			if r.DenseAddr != "" {
				r.DenseAddr = w.addr
			}
			resp, err := w.srv.Lookup(ctx, r)
			if c := status.Code(err); !documentedCode(c) {
				t.Fatalf("worker %d: status %v: %v", i, c, err)
			}
			if err == nil && len(resp.GetScores()) != int(r.GetNumSamples()) {
				t.Fatalf("worker %d: %d scores for %d samples", i, len(resp.GetScores()), r.GetNumSamples())
			}
		}
		// As the router sends it: whole, and in parts.
		base := proto.Clone(&req).(*prismv1.LookupRequest)
		base.FanoutKey, base.Shard, base.Shards, base.DenseAddr = "", 0, 0, fx.plain.whole.addr
		if _, err := fx.plain.whole.srv.Lookup(ctx, base); err != nil {
			return
		}
		n := int(base.GetNumSamples())
		want := fx.plain.whole.dense.frame()
		for _, tier := range []*shardFuzzTier{&fx.plain, &fx.dict} {
			what := "plain"
			if tier == &fx.dict {
				what = "dictionary"
				wr := proto.Clone(base).(*prismv1.LookupRequest)
				wr.DenseAddr = tier.whole.addr
				if _, err := tier.whole.srv.Lookup(ctx, wr); err != nil {
					t.Fatalf("the whole model's worker took the request, with dictionary frames it refused it: %v", err)
				}
				if err := sameFrame(tier.whole.dense.frame(), want, 1e-6); err != nil {
					t.Fatalf("dictionary frames differ from plain ones: %v", err)
				}
			}
			frames := make([]map[string][]float32, len(tier.shards))
			for k := range tier.shards {
				sk := proto.Clone(base).(*prismv1.LookupRequest)
				sk.FanoutKey, sk.Shard, sk.Shards, sk.DenseAddr = "fuzz/0", int32(k), int32(len(tier.shards)), tier.shards[k].addr
				if _, err := tier.shards[k].srv.Lookup(ctx, sk); err != nil {
					t.Fatalf("the whole model's worker took the request, shard %d (%s frames) refused its part: %v", k, what, err)
				}
				frames[k] = tier.shards[k].dense.frame()
			}
			if !tame(base) {
				continue
			}
			got, err := fx.combine(n, frames)
			if err != nil {
				t.Fatalf("%s frames: %v", what, err)
			}
			if err := sameFrame(got, want, 1e-4); err != nil {
				t.Fatalf("the shards' parts (%s frames) combined differ from the whole model's frame: %v", what, err)
			}
		}
		if len(base.GetContext().GetInputs()) == 0 {
			return
		}
		tiled := tileContext(base)
		if _, err := fx.plain.whole.srv.Lookup(ctx, tiled); err != nil {
			t.Fatalf("the request took its context, the same features in every candidate were refused: %v", err)
		}
		if err := sameFrame(fx.plain.whole.dense.frame(), want, 1e-6); err != nil {
			t.Fatalf("the context sent once frames otherwise than in every candidate: %v", err)
		}
	})
}

// documentedCode is the set of codes a worker answers bad input and load
// with (README: Errors); Internal or Unknown means a bug.
func documentedCode(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted,
		codes.DeadlineExceeded, codes.Canceled, codes.Unavailable, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}
