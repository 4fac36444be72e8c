package server

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
)

// frameDense is a dense worker double that keeps the last frame's
// tensors, context columns expanded, by name.
type frameDense struct {
	prismv1.UnimplementedDenseTierServer
	mu   sync.Mutex
	last map[string][]float32
}

func (d *frameDense) Score(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	n, ts, err := arrowframe.Decode(req.GetTensors())
	if err != nil {
		return nil, err
	}
	got := map[string][]float32{}
	for _, t := range ts {
		data := t.Data
		if t.Context {
			data = make([]float32, n*t.Width)
			t.Expand(data, n)
		}
		got[t.Name] = append([]float32(nil), data...)
	}
	d.mu.Lock()
	d.last = got
	d.mu.Unlock()
	return &prismv1.ScoreResponse{Scores: make([]float32, n)}, nil
}

func (d *frameDense) frame() map[string][]float32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// rowValue is the test tables' value at row r, column k: distinct per
// row, negative in the odd columns (so that max of nothing, or a max
// started from 0, shows).
func rowValue(r int64, k int) float32 {
	v := float32(r+1) + float32(k)/10
	if k%2 == 1 {
		v = -v
	}
	return v
}

// serveValuesPlan serves p, its tables filled with rowValue, from an
// in-memory store; the returned double receives the frames.
func serveValuesPlan(t *testing.T, p *plan.Plan, o Options) (*Server, string, *frameDense) {
	t.Helper()
	return serveValuesShard(t, p, o, nil)
}

// serveValuesShard is serveValuesPlan with, when shard is set, the store
// holding only that shard of p's sharding (p.Sharding set).
func serveValuesShard(t testing.TB, p *plan.Plan, o Options, shard *int) (*Server, string, *frameDense) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range p.Tables {
		tb := &p.Tables[i]
		data := make([]float32, tb.Rows*int64(tb.Dim))
		for r := range tb.Rows {
			for k := range tb.Dim {
				data[r*int64(tb.Dim)+int64(k)] = rowValue(r, k)
			}
		}
		file := tablefile.FileName(tb.Name)
		meta, err := tablefile.Write(filepath.Join(dir, file), tb.Name, tb.Dim, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		tb.File, tb.SHA256, tb.DType = file, meta.SHA256, "float32"
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open("db", &store.Options{FS: vfs.NewMem(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if shard != nil {
		if _, err := st.Ingest(context.Background(), dir, store.IngestOptions{Shard: shard}); err != nil {
			t.Fatal(err)
		}
	}
	d := &frameDense{}
	bn := &grpctest.Net{}
	lis := bn.MustListen(t, "dense")
	g := grpc.NewServer()
	prismv1.RegisterDenseTierServer(g, d)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	o.Plans, o.AnyDenseAddr, o.Logger = []string{dir}, true, slog.New(slog.DiscardHandler)
	o.DialOptions = append(o.DialOptions, bn.DialOption())
	s, err := New(context.Background(), st, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, lis.Addr().String(), d
}

// poolDirect pools the bag ids (weights w, nil for none) of a dim-wide
// rowValue table the plain way: sum, mean (by the bag's size) or max of
// w·row; an empty bag is zeros.
func poolDirect(pooling plan.Pooling, ids []int64, w []float32, dim int) []float32 {
	out := make([]float32, dim)
	if len(ids) == 0 {
		return out
	}
	for k := range dim {
		var acc float32
		if pooling == plan.PoolMax {
			acc = float32(math.Inf(-1))
		}
		for j, id := range ids {
			x := rowValue(id, k)
			if w != nil {
				x *= w[j]
			}
			if pooling == plan.PoolMax {
				acc = max(acc, x)
			} else {
				acc += x
			}
		}
		if pooling == plan.PoolMean {
			acc /= float32(len(ids))
		}
		out[k] = acc
	}
	return out
}

func closeTo(a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d values, want %d", len(a), len(b))
	}
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > 1e-4*max(1, math.Abs(float64(b[i]))) {
			return fmt.Errorf("value %d: %v, want %v", i, a[i], b[i])
		}
	}
	return nil
}

// pooledPlan: table t (20 x 2) looked up by a fixed bag of 3 (input a,
// weights aw) and by a jagged bag (input j over offsets jo, weights jw),
// each pooled sum (weighted), mean and max (weighted).
func pooledPlan() *plan.Plan {
	cut := func(name string) plan.CutTensor {
		return plan.CutTensor{TensorInfo: plan.TensorInfo{Name: name, DType: "float32", Shape: []int64{2}}, BytesPerSample: 8, From: "lookup"}
	}
	cpu := []plan.Side{plan.CPU}
	return &plan.Plan{
		Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Inputs: []plan.TensorInfo{
			{Name: "a", DType: "int64", Shape: []int64{3}, Sides: cpu},
			{Name: "aw", DType: "float32", Shape: []int64{3}, Sides: cpu},
			{Name: "j", DType: "int64", Shape: []int64{}, Sides: cpu, Offsets: "jo"},
			{Name: "jo", DType: "int64", Shape: []int64{}, Sides: cpu},
			{Name: "jw", DType: "float32", Shape: []int64{}, Sides: cpu, Offsets: "jo"},
		},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut:     []plan.CutTensor{cut("asum"), cut("amean"), cut("amax"), cut("jsum"), cut("jmean"), cut("jmax")},
		Tables: []plan.Table{{Name: "t", Rows: 20, Dim: 2, Lookups: []plan.Lookup{
			{Input: "a", Bag: 3, Pooling: plan.PoolSum, Weights: "aw", Output: "asum"},
			{Input: "a", Bag: 3, Pooling: plan.PoolMean, Output: "amean"},
			{Input: "a", Bag: 3, Pooling: plan.PoolMax, Weights: "aw", Output: "amax"},
			{Input: "j", Offsets: "jo", Bag: 1, Pooling: plan.PoolSum, Weights: "jw", Output: "jsum"},
			{Input: "j", Offsets: "jo", Bag: 1, Pooling: plan.PoolMean, Output: "jmean"},
			{Input: "j", Offsets: "jo", Bag: 1, Pooling: plan.PoolMax, Weights: "jw", Output: "jmax"},
		}}},
	}
}

// TestPooledValues: every pooled cut column the worker sends equals the
// plain computation over the table's rows, for fixed and jagged bags
// (empty ones included), weighted or not, with the fixed bag's ids or
// weights in the context or the candidates.
func TestPooledValues(t *testing.T) {
	s, addr, d := serveValuesPlan(t, pooledPlan(), Options{})
	const n = 3
	a := []int64{0, 5, 19, 7, 7, 2, 11, 3, 0}
	aw := []float32{1, -2, 0.5, 3, 1, -1, 0.25, 2, -0.5}
	j := []int64{4, 9, 1, 18, 6}
	jo := []int64{0, 2, 2} // sample 1's bag is empty
	jw := []float32{2, -1, 0.5, 1, -3}
	jbags := [][2]int{{0, 2}, {2, 2}, {2, 5}}
	in := func(name string, ids []int64, vals []float32) *prismv1.Input {
		return &prismv1.Input{Name: name, Ids: ids, Values: vals}
	}
	for _, tc := range []struct {
		name string
		ctxA bool // a from the context (sample 0's bag for all)
		ctxW bool // aw from the context
	}{
		{"candidates", false, false},
		{"ids in the context", true, false},
		{"weights in the context", false, true},
		{"both in the context", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := &prismv1.Features{Inputs: []*prismv1.Input{in("j", j, nil), in("jo", jo, nil), in("jw", nil, jw)}}
			ctx := &prismv1.Features{}
			ga, gw := a, aw
			if tc.ctxA {
				ctx.Inputs = append(ctx.Inputs, in("a", a[:3], nil))
				ga = append(append(append([]int64(nil), a[:3]...), a[:3]...), a[:3]...)
			} else {
				cands.Inputs = append(cands.Inputs, in("a", a, nil))
			}
			if tc.ctxW {
				ctx.Inputs = append(ctx.Inputs, in("aw", nil, aw[:3]))
				gw = append(append(append([]float32(nil), aw[:3]...), aw[:3]...), aw[:3]...)
			} else {
				cands.Inputs = append(cands.Inputs, in("aw", nil, aw))
			}
			req := &prismv1.LookupRequest{Model: "m", NumSamples: n, DenseAddr: addr, Candidates: cands, Context: ctx}
			if _, err := s.Lookup(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			got := d.frame()
			for s := range n {
				bag, w := ga[3*s:3*s+3], gw[3*s:3*s+3]
				jb, jwb := j[jbags[s][0]:jbags[s][1]], jw[jbags[s][0]:jbags[s][1]]
				for _, c := range []struct {
					col  string
					want []float32
				}{
					{"asum", poolDirect(plan.PoolSum, bag, w, 2)},
					{"amean", poolDirect(plan.PoolMean, bag, nil, 2)},
					{"amax", poolDirect(plan.PoolMax, bag, w, 2)},
					{"jsum", poolDirect(plan.PoolSum, jb, jwb, 2)},
					{"jmean", poolDirect(plan.PoolMean, jb, nil, 2)},
					{"jmax", poolDirect(plan.PoolMax, jb, jwb, 2)},
				} {
					if err := closeTo(got[c.col][2*s:2*s+2], c.want); err != nil {
						t.Errorf("sample %d, %s: %v", s, c.col, err)
					}
				}
			}
		})
	}
}
