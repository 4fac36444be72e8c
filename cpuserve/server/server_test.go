package server_test

import (
	"context"
	"fmt"
	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/plan"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
)

var testModels = []string{"dlrm-tiny", "dcnv2-tiny", "deepfm-tiny"}

const maxSamples = 512

// fixture is one embedding tier serving every test model from one store,
// and a dense tier double, both in process over bufconn: the embedding
// tier dials the dense_addr a request names through the fixture's
// in-memory network (Options.DialOptions).
type fixture struct {
	srv    *server.Server
	client prismv1.EmbeddingTierClient
	// dictClient reaches a second server on the same store with
	// Options.DictionaryFrames (dedup_test.go).
	dictClient prismv1.EmbeddingTierClient
	dense      *denseDouble
	addr       string // the dense double's (a bufconn target)
	mono       map[string]*ort.Session
	sigs       map[string]models.Signature
	// corpus holds the exporter-corpus models served besides the zoo's
	// (testExporterModels), for their float64 references.
	corpus map[string]*exporters.Model
}

// testExporterModels are exporter-corpus models the fixture serves too:
// int32 ids, a fixed exported batch rewritten to a symbolic one, a
// fixed batch kept (plan.json fixed_batch), and nn.EmbeddingBag on 2-D
// ids as the dynamo exporter writes it.
var testExporterModels = []string{"torchrec-int32-ids", "ts-fixed-batch-view", "ts-fixed-batch-row-bias",
	"dynamo-embedding-bag-2d-weighted", "dynamo-embedding-bag-2d-max",
	"ts-hash-mul-add-mod", "ts-floor-div-bucket", "ts-bitmask-shift"} // the last three run pre.onnx (preonnx_test.go)

var (
	fixOnce sync.Once
	fix     *fixture
	fixErr  error
	cleanup []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(cleanup) - 1; i >= 0; i-- {
		cleanup[i]()
	}
	os.Exit(code)
}

func setup(t testing.TB) *fixture {
	t.Helper()
	fixOnce.Do(func() { fix, fixErr = newFixture() })
	if fixErr != nil {
		t.Fatal(fixErr)
	}
	return fix
}

func newFixture() (*fixture, error) {
	if err := ort.Init(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cpuserve-server-test")
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	f := &fixture{mono: map[string]*ort.Session{}, sigs: map[string]models.Signature{}, corpus: map[string]*exporters.Model{}}
	dd := &denseDouble{models: map[string]*denseModel{}}
	var plans []string
	for _, name := range testExporterModels {
		m := exporters.ByName(name, 11)
		path := filepath.Join(dir, name+".onnx")
		if err := m.Write(path); err != nil {
			return nil, err
		}
		part := filepath.Join(dir, name+"-part")
		res, err := partitioner.Partition(path, part, partitioner.Options{})
		if err != nil {
			return nil, err
		}
		plans = append(plans, part)
		f.corpus[name], f.sigs[name] = m, m.Sig
		ds, err := ort.NewSession(filepath.Join(part, res.Plan.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			return nil, err
		}
		dd.models[res.Plan.Model.Name] = &denseModel{sess: ds, plan: res.Plan}
	}
	for i, name := range testModels {
		p, err := models.Lookup(name)
		if err != nil {
			return nil, err
		}
		cfg, err := p.Resolve(models.ScaleOptions{})
		if err != nil {
			return nil, err
		}
		m, err := models.New(cfg, uint64(11+i))
		if err != nil {
			return nil, err
		}
		mdir := filepath.Join(dir, name)
		if _, err := m.Write(mdir, models.WriteOptions{}); err != nil {
			return nil, err
		}
		part := filepath.Join(dir, name+"-part")
		res, err := partitioner.Partition(filepath.Join(mdir, models.ModelFile), part, partitioner.Options{})
		if err != nil {
			return nil, err
		}
		plans = append(plans, part)
		if f.mono[name], err = ort.NewSession(filepath.Join(mdir, models.ModelFile), ort.SessionOptions{IntraOpThreads: 1}); err != nil {
			return nil, err
		}
		f.sigs[name] = cfg.Signature()
		ds, err := ort.NewSession(filepath.Join(part, res.Plan.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			return nil, err
		}
		dd.models[res.Plan.Model.Name] = &denseModel{sess: ds, plan: res.Plan}
	}
	st, err := store.Open(filepath.Join(dir, "db"), &store.Options{NoSync: true})
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { st.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cleanup = append(cleanup, func() { cancel(); wg.Wait() })

	bn := &grpctest.Net{}
	if f.srv, err = server.New(ctx, st, server.Options{Plans: plans, MaxSamples: maxSamples, Threads: 1, DialOptions: []grpc.DialOption{bn.DialOption()}}); err != nil {
		return nil, err
	}
	cleanup = append(cleanup, f.srv.Close)
	start := func(name string, register func(*grpc.Server)) (string, error) {
		lis, err := bn.Listen(name)
		if err != nil {
			return "", err
		}
		s, err := serve.New(name, serve.Options{Listener: lis, MetricsAddr: "off"})
		if err != nil {
			return "", err
		}
		register(s.GRPC)
		wg.Add(1)
		go func() { defer wg.Done(); s.Serve(ctx) }()
		return s.Addr(), nil
	}
	if f.addr, err = start("dense-double", func(g *grpc.Server) { prismv1.RegisterDenseTierServer(g, dd) }); err != nil {
		return nil, err
	}
	f.dense = dd
	// The router's list of dense workers: the double, and an address
	// nothing listens at (a dense worker gone since).
	f.srv.SetDenseAddrs([]string{f.addr, grpctest.Target("nowhere")})
	cpuAddr, err := start("cpu", func(g *grpc.Server) { prismv1.RegisterEmbeddingTierServer(g, f.srv) })
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(cpuAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), bn.DialOption())
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { conn.Close() })
	f.client = prismv1.NewEmbeddingTierClient(conn)

	dictSrv, err := server.New(ctx, st, server.Options{Plans: plans, MaxSamples: maxSamples, Threads: 1, DialOptions: []grpc.DialOption{bn.DialOption()}, DictionaryFrames: true})
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, dictSrv.Close)
	dictSrv.SetDenseAddrs([]string{f.addr})
	dictAddr, err := start("cpu-dict", func(g *grpc.Server) { prismv1.RegisterEmbeddingTierServer(g, dictSrv) })
	if err != nil {
		return nil, err
	}
	dconn, err := grpc.NewClient(dictAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), bn.DialOption())
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { dconn.Close() })
	f.dictClient = prismv1.NewEmbeddingTierClient(dconn)
	return f, nil
}

// denseDouble stands in for gpuserve: dense.onnx in ONNX Runtime on the
// CPU, shapes from the plan's cut.
type denseDouble struct {
	prismv1.UnimplementedDenseTierServer
	models map[string]*denseModel
	mu     sync.Mutex
	fail   error // returned by Score while set
	// last is the last frame scored: its bytes and its context columns.
	last struct {
		bytes   int
		context []string
		content string // ScoreRequest.content
	}
}

type denseModel struct {
	sess *ort.Session
	plan *plan.Plan
}

func (d *denseDouble) setFail(err error) {
	d.mu.Lock()
	d.fail = err
	d.mu.Unlock()
}

func (d *denseDouble) Score(ctx context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	start := time.Now()
	d.mu.Lock()
	fail := d.fail
	d.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	m := d.models[req.GetModel()]
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "model %q", req.GetModel())
	}
	n, ts, err := arrowframe.Decode(req.GetTensors())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if n != int(req.GetNumSamples()) || len(ts) != len(m.plan.Cut) {
		return nil, status.Errorf(codes.InvalidArgument, "%d rows, %d tensors; want %d, %d", n, len(ts), req.GetNumSamples(), len(m.plan.Cut))
	}
	var ins []ort.Input
	var ctxCols []string
	for i, c := range m.plan.Cut {
		if ts[i].Name != c.Name {
			return nil, status.Errorf(codes.InvalidArgument, "tensor %d is %q, want %q", i, ts[i].Name, c.Name)
		}
		data := ts[i].Data
		if ts[i].Context {
			data = make([]float32, n*ts[i].Width)
			ts[i].Expand(data, n)
			ctxCols = append(ctxCols, c.Name)
		}
		ins = append(ins, ort.Input{Name: c.Name, Shape: append([]int64{int64(n)}, c.Shape...), Float32: data})
	}
	d.mu.Lock()
	d.last.bytes, d.last.context, d.last.content = len(req.GetTensors()), ctxCols, req.GetContent()
	d.mu.Unlock()
	out, err := m.sess.Run(ins)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &prismv1.ScoreResponse{Scores: out[0], DenseUs: time.Since(start).Microseconds()}, nil
}

// request turns a batch into a Lookup request; the inputs named in ctx go
// in the context, taken from sample 0.
func (f *fixture) request(model string, b *models.Batch, ctx ...string) *prismv1.LookupRequest {
	req := &prismv1.LookupRequest{Model: model, NumSamples: int32(b.N), DenseAddr: f.addr, Candidates: &prismv1.Features{}, Context: &prismv1.Features{}}
	for i, in := range b.Sig.Inputs {
		col := b.Columns[i]
		if contains(ctx, in.Name) {
			x := &prismv1.Input{Name: in.Name}
			if col.F32 != nil {
				x.Values = col.F32[:in.Width]
			} else {
				x.Ids = col.I64[:in.Width]
			}
			req.Context.Inputs = append(req.Context.Inputs, x)
			continue
		}
		req.Candidates.Inputs = append(req.Candidates.Inputs, &prismv1.Input{Name: in.Name, Values: col.F32, Ids: col.I64})
	}
	return req
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// shareContext makes every sample carry sample 0's values of the named inputs.
func shareContext(b *models.Batch, names ...string) {
	for i, in := range b.Sig.Inputs {
		if !contains(names, in.Name) {
			continue
		}
		w := in.Width
		for s := 1; s < b.N; s++ {
			if b.Columns[i].F32 != nil {
				copy(b.Columns[i].F32[s*w:(s+1)*w], b.Columns[i].F32[:w])
			} else {
				copy(b.Columns[i].I64[s*w:(s+1)*w], b.Columns[i].I64[:w])
			}
		}
	}
}

func (f *fixture) batch(t *testing.T, model string, n int, seed uint64) *models.Batch {
	t.Helper()
	src, err := models.NewSynthetic(f.sigs[model], models.SyntheticOptions{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Next(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fixture) checkScores(t *testing.T, model string, b *models.Batch, req *prismv1.LookupRequest) *prismv1.LookupResponse {
	t.Helper()
	return f.checkScoresVia(t, f.client, model, b, req)
}

func (f *fixture) checkScoresVia(t *testing.T, client prismv1.EmbeddingTierClient, model string, b *models.Batch, req *prismv1.LookupRequest) *prismv1.LookupResponse {
	t.Helper()
	want, err := f.mono[model].Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.Lookup(ctx, req)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if len(resp.Scores) != len(want[0]) {
		t.Fatalf("%d scores, want %d", len(resp.Scores), len(want[0]))
	}
	worst := 0.0
	for i, w := range want[0] {
		worst = max(worst, math.Abs(float64(resp.Scores[i]-w)))
	}
	if worst > 1e-5 {
		t.Fatalf("max abs error %.3g against the monolithic model", worst)
	}
	return resp
}

// TestScoresMatchMonolith: every model family through the embedding tier
// and the dense double reproduces model.onnx within 1e-5.
func TestScoresMatchMonolith(t *testing.T) {
	f := setup(t)
	for i, name := range testModels {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 7, 300} {
				b := f.batch(t, name, n, uint64(100+i*10+n))
				resp := f.checkScores(t, name, b, f.request(name, b))
				tm := resp.Times
				if n == 300 {
					t.Logf("n=%d decode %dus lookup %dus cpu %dus encode %dus transfer %dus dense %dus", n, tm.DecodeUs, tm.LookupUs, tm.CpuModelUs, tm.EncodeUs, tm.TransferUs, tm.DenseUs)
				}
				if tm == nil || tm.DenseUs <= 0 {
					t.Errorf("stage times %v: want the dense time filled", tm)
				}
			}
		})
	}
}

// TestContext: inputs sent once in the context are shared by every
// candidate, dense features and ids alike, for every family.
func TestContext(t *testing.T) {
	f := setup(t)
	for i, name := range testModels {
		t.Run(name, func(t *testing.T) {
			ctxInputs := []string{models.DenseInput, models.SparseInput(0), models.SparseInput(3), models.SparseInput(20)}
			b := f.batch(t, name, 64, uint64(500+i))
			shareContext(b, ctxInputs...)
			f.checkScores(t, name, b, f.request(name, b, ctxInputs...))
			plain, ctxCols := f.dense.lastFrame()
			t.Logf("cpu model %q; context columns %v", f.dense.models[name].plan.CPUModel, ctxCols)
			if len(ctxCols) == 0 {
				t.Errorf("no context column in the frame: the context's lookups crossed once per sample")
			}
			// The same samples, every input per candidate: the frame
			// carries every row of those columns.
			f.checkScores(t, name, b, f.request(name, b))
			if full, cols := f.dense.lastFrame(); len(cols) != 0 || full <= plain {
				t.Errorf("every input per candidate: frame of %d bytes with context columns %v; with the context %d bytes", full, cols, plain)
			}
			// Everything in the context: n identical samples.
			var all []string
			for _, in := range b.Sig.Inputs {
				all = append(all, in.Name)
			}
			b = f.batch(t, name, 5, uint64(600+i))
			shareContext(b, all...)
			f.checkScores(t, name, b, f.request(name, b, all...))
			// cpu.onnx's outputs too, read from context values alone.
			p := f.dense.models[name].plan
			if _, cols := f.dense.lastFrame(); len(cols) != len(p.Cut) {
				t.Errorf("everything in the context: context columns %v, want all %d cut tensors (cpu model %q)", cols, len(p.Cut), p.CPUModel)
			}
		})
	}
}

// lastFrame is the bytes and the context columns of the last frame the
// double scored.
func (d *denseDouble) lastFrame() (int, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last.bytes, d.last.context
}

// TestContextFrame: for dlrm-tiny, the cut tensors made from the context
// alone (the dense features, the context ids' pooled embeddings) cross as
// context columns, and the frame is smaller by their other rows.
func TestContextFrame(t *testing.T) {
	f := setup(t)
	const name, n = "dlrm-tiny", 64
	p := f.dense.models[name].plan
	ctxInputs := []string{models.DenseInput, models.SparseInput(0), models.SparseInput(2)}
	want := map[string]bool{}
	for _, tb := range p.Tables {
		for _, l := range tb.Lookups {
			if contains(ctxInputs, l.Input) {
				want[l.Output] = true
			}
		}
	}
	saved := 0
	for _, c := range p.Cut {
		if c.Name == models.DenseInput {
			want[c.Name] = true
		}
		if want[c.Name] {
			w := 1
			for _, d := range c.Shape {
				w *= int(d)
			}
			saved += 4 * (n - 1) * w
		}
	}
	if len(want) < 3 {
		t.Fatalf("dlrm-tiny's cut %v: want the dense features and two lookups among it", p.Cut)
	}
	b := f.batch(t, name, n, 77)
	shareContext(b, ctxInputs...)
	f.checkScores(t, name, b, f.request(name, b, ctxInputs...))
	ctxBytes, cols := f.dense.lastFrame()
	if len(cols) != len(want) {
		t.Errorf("context columns %v, want %v", cols, want)
	}
	for _, c := range cols {
		if !want[c] {
			t.Errorf("column %q sent as context", c)
		}
	}
	f.checkScores(t, name, b, f.request(name, b))
	fullBytes, _ := f.dense.lastFrame()
	if d := fullBytes - ctxBytes; d < saved-384*len(want) || d > saved {
		t.Errorf("frame %d bytes with the context, %d without: saves %d, want about %d", ctxBytes, fullBytes, d, saved)
	}
}

// TestBadInput: each bad request gets its status and a message naming
// the problem; the server keeps serving after all of them.
func TestBadInput(t *testing.T) {
	f := setup(t)
	const model = "dcnv2-tiny"
	b := f.batch(t, model, 16, 9)
	shareContext(b, models.SparseInput(1))
	good := func() *prismv1.LookupRequest { return f.request(model, b, models.SparseInput(1)) }
	find := func(req *prismv1.LookupRequest, name string) *prismv1.Input {
		for _, in := range append(req.Candidates.Inputs, req.Context.Inputs...) {
			if in.Name == name {
				return in
			}
		}
		t.Fatalf("no input %q", name)
		return nil
	}
	cat := models.SparseInput(2)
	cases := []struct {
		name string
		edit func(*prismv1.LookupRequest)
		code codes.Code
		msg  string
	}{
		{"unknown model", func(r *prismv1.LookupRequest) { r.Model = "nope" }, codes.NotFound, `"nope"`},
		{"unknown version", func(r *prismv1.LookupRequest) { r.Version = 99 }, codes.NotFound, "version 99"},
		{"zero samples", func(r *prismv1.LookupRequest) { r.NumSamples = 0 }, codes.InvalidArgument, "num_samples 0"},
		{"negative samples", func(r *prismv1.LookupRequest) { r.NumSamples = -3 }, codes.InvalidArgument, "num_samples -3"},
		{"over the limit", func(r *prismv1.LookupRequest) { r.NumSamples = maxSamples + 1 }, codes.InvalidArgument, "limit"},
		{"missing input", func(r *prismv1.LookupRequest) {
			r.Candidates.Inputs = r.Candidates.Inputs[:len(r.Candidates.Inputs)-1]
		}, codes.InvalidArgument, "missing input"},
		{"empty request", func(r *prismv1.LookupRequest) { r.Candidates, r.Context = nil, nil }, codes.InvalidArgument, "missing input"},
		{"unknown input", func(r *prismv1.LookupRequest) {
			r.Candidates.Inputs = append(r.Candidates.Inputs, &prismv1.Input{Name: "cat_99", Ids: []int64{1}})
		}, codes.InvalidArgument, `unknown input "cat_99"`},
		{"input twice", func(r *prismv1.LookupRequest) {
			r.Candidates.Inputs = append(r.Candidates.Inputs, r.Candidates.Inputs[0])
		}, codes.InvalidArgument, "twice"},
		{"short dense", func(r *prismv1.LookupRequest) {
			in := find(r, models.DenseInput)
			in.Values = in.Values[:len(in.Values)-1]
		}, codes.InvalidArgument, `"dense" has 207 values, want 13 x 16`},
		{"long ids", func(r *prismv1.LookupRequest) {
			in := find(r, cat)
			in.Ids = append(in.Ids, 1)
		}, codes.InvalidArgument, cat},
		{"short context", func(r *prismv1.LookupRequest) {
			in := find(r, models.SparseInput(1))
			in.Ids = in.Ids[:len(in.Ids)-1]
		}, codes.InvalidArgument, "context"},
		{"values for ids", func(r *prismv1.LookupRequest) {
			in := find(r, cat)
			in.Values, in.Ids = make([]float32, len(in.Ids)), nil
		}, codes.InvalidArgument, "int64 ids"},
		{"ids for values", func(r *prismv1.LookupRequest) {
			in := find(r, models.DenseInput)
			in.Ids, in.Values = make([]int64, len(in.Values)), nil
		}, codes.InvalidArgument, "float values"},
		{"unexpected weights", func(r *prismv1.LookupRequest) {
			in := find(r, cat)
			in.Weights = make([]float32, len(in.Ids))
		}, codes.InvalidArgument, "weights"},
		{"id out of range", func(r *prismv1.LookupRequest) {
			in := find(r, cat)
			in.Ids[5] = 1 << 40
		}, codes.InvalidArgument, "out of range"},
		{"negative id", func(r *prismv1.LookupRequest) {
			in := find(r, cat)
			in.Ids[0] = -1
		}, codes.InvalidArgument, "negative"},
		{"no dense address", func(r *prismv1.LookupRequest) { r.DenseAddr = "" }, codes.InvalidArgument, "dense_addr"},
		{"dense unreachable", func(r *prismv1.LookupRequest) { r.DenseAddr = grpctest.Target("nowhere") }, codes.Unavailable, ""},
		// Embeddings go only to dense workers the router registered.
		{"dense not registered", func(r *prismv1.LookupRequest) { r.DenseAddr = grpctest.Target("elsewhere") }, codes.PermissionDenied, "not a dense worker registered with the router"},
		{"dense host of the attacker", func(r *prismv1.LookupRequest) { r.DenseAddr = "203.0.113.9:443" }, codes.PermissionDenied, "not a dense worker registered"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := proto.Clone(good()).(*prismv1.LookupRequest)
			c.edit(req)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := f.client.Lookup(ctx, req)
			expectStatus(t, err, c.code, c.msg)
			f.checkScores(t, model, b, good())
		})
	}

	t.Run("deadline passed", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		_, err := f.srv.Lookup(ctx, good())
		expectStatus(t, err, codes.DeadlineExceeded, "deadline")
		ctx, cancel = context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		_, err = f.client.Lookup(ctx, good())
		expectStatus(t, err, codes.DeadlineExceeded, "")
		f.checkScores(t, model, b, good())
	})
	t.Run("dense status passes through", func(t *testing.T) {
		f.dense.setFail(status.Error(codes.ResourceExhausted, "dense queue full"))
		_, err := f.client.Lookup(context.Background(), good())
		f.dense.setFail(nil)
		expectStatus(t, err, codes.ResourceExhausted, "dense queue full")
		f.checkScores(t, model, b, good())
	})
}

func expectStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("got %v %q, want %v with %q", st.Code(), st.Message(), code, msg)
	}
}

// TestMetrics: the stage histograms, the samples in flight and the
// store's hot-tier metrics are exported.
func TestMetrics(t *testing.T) {
	f := setup(t)
	b := f.batch(t, "dlrm-tiny", 32, 3)
	f.checkScores(t, "dlrm-tiny", b, f.request("dlrm-tiny", b))
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.srv.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"prism_embedding_stage_seconds", "prism_embedding_outstanding_samples", "prism_embedding_batch_samples", "prism_store_hot_hit_ratio", "prism_store_lookups_total", "prism_embedding_frame_bytes_total", "prism_embedding_frame_samples_total"} {
		if !got[name] {
			t.Errorf("metric %s not exported", name)
		}
	}
	w := f.srv.WorkerInfo("cpu/test", "127.0.0.1:1")
	if w.Role != prismv1.Role_ROLE_EMBEDDING || fmt.Sprint(w.Models) != fmt.Sprint([]string{"dcnv2-tiny", "deepfm-tiny", "dlrm-tiny", "dynamo-embedding-bag-2d-max", "dynamo-embedding-bag-2d-weighted", "torchrec-int32-ids", "ts-bitmask-shift",
		"ts-fixed-batch-row-bias", "ts-fixed-batch-view", "ts-floor-div-bucket", "ts-hash-mul-add-mod"}) || w.Outstanding != 0 {
		t.Errorf("worker info %v", w)
	}
}

// BenchmarkLookup: one micro-batch of 270 candidates (MLPerf DLRMv2's
// average) through the embedding tier and the dense double, with the
// stage breakdown the server reports. The fixture is in process over
// bufconn, so transfer is gRPC framing and an in-memory pipe, without
// the kernel's loopback copy (make bench-serve measures that).
func BenchmarkLookup(b *testing.B) {
	for _, name := range testModels {
		b.Run(name, func(b *testing.B) {
			f := setup(b)
			src, _ := models.NewSynthetic(f.sigs[name], models.SyntheticOptions{Seed: 1})
			batch, _ := src.Next(270)
			req := f.request(name, batch)
			var sum [6]int64
			b.ResetTimer()
			for b.Loop() {
				resp, err := f.client.Lookup(context.Background(), req)
				if err != nil {
					b.Fatal(err)
				}
				tm := resp.Times
				for i, v := range []int64{tm.DecodeUs, tm.LookupUs, tm.CpuModelUs, tm.EncodeUs, tm.TransferUs, tm.DenseUs} {
					sum[i] += v
				}
			}
			for i, stage := range []string{"decode", "lookup", "cpu", "encode", "transfer", "dense"} {
				b.ReportMetric(float64(sum[i])/float64(b.N), stage+"-us/op")
			}
			b.ReportMetric(float64(270*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}

// TestSequencedUpdates: the router's numbered updates map to statuses a
// router acts on, and bad input takes its number (no rows are written
// here: the fixture's store is shared with the score checks).
func TestSequencedUpdates(t *testing.T) {
	f := setup(t)
	model := testModels[0]
	ctx := context.Background()
	// The fixture's store outlives one run (-count): number after it.
	base := f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]
	steps := []struct {
		seq   int64
		table string
		rows  []byte
		want  codes.Code
		after int64
	}{
		{1, "emb_l.0.weight", []byte{1, 2, 3}, codes.InvalidArgument, 1}, // ragged rows: refused, number taken
		{3, "nope", make([]byte, 64), codes.FailedPrecondition, 1},       // too early
		{2, "nope", make([]byte, 64), codes.InvalidArgument, 2},          // unknown table: refused, number taken
		{1, "emb_l.0.weight", []byte{1, 2, 3}, codes.InvalidArgument, 2}, // a replay of a refused one
		{3, "nope", make([]byte, 64), codes.InvalidArgument, 3},
	}
	for i, st := range steps {
		_, err := f.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: base + st.seq, Update: &prismv1.UpdateRequest{Model: model, Table: st.table, Ids: []int64{0}, Rows: st.rows}})
		if status.Code(err) != st.want {
			t.Fatalf("step %d: %v, want %v", i, err, st.want)
		}
		if got := f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; got != base+st.after {
			t.Fatalf("step %d: worker announces update %d, want %d", i, got, base+st.after)
		}
	}
	// A number of another sequence (a shard's, this worker holding the
	// whole model) is refused and not taken; the model's own is taken.
	for _, tc := range []struct {
		sequence string
		want     codes.Code
		after    int64
	}{{model + "#shard1@00aa", codes.FailedPrecondition, 3}, {model + "#shard0", codes.FailedPrecondition, 3}} {
		_, err := f.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: base + 4, Sequence: tc.sequence, Update: &prismv1.UpdateRequest{Model: model, Table: "emb_l.0.weight", Ids: []int64{0}, Rows: make([]byte, 64)}})
		if status.Code(err) != tc.want {
			t.Fatalf("sequence %q: %v, want %v", tc.sequence, err, tc.want)
		}
		if got := f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; got != base+tc.after {
			t.Fatalf("sequence %q: worker announces update %d, want %d", tc.sequence, got, base+tc.after)
		}
	}
	// The number alone (number_only) is for a shard not holding the
	// table: this unsharded worker holds every table, so it refuses it
	// without taking the number; unsequenced, it is bad input.
	for _, seq := range []int64{base + 4, 0} {
		want := codes.FailedPrecondition
		if seq == 0 {
			want = codes.InvalidArgument
		}
		_, err := f.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: seq, NumberOnly: true, Update: &prismv1.UpdateRequest{Model: model, Table: "emb_l.0.weight", Ids: []int64{0}}})
		if status.Code(err) != want {
			t.Fatalf("number only, seq %d: %v, want %v", seq, err, want)
		}
		if got := f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; got != base+3 {
			t.Fatalf("number only, seq %d: worker announces update %d, want %d (not taken)", seq, got, base+3)
		}
	}
	// A catch-up's run of numbers (number_from .. seq): refused by a
	// worker holding the whole model, and bad input when it runs
	// backwards; no number taken either way.
	for _, tc := range []struct {
		from, seq int64
		want      codes.Code
	}{{base + 4, base + 6, codes.FailedPrecondition}, {base + 6, base + 4, codes.InvalidArgument}, {-1, base + 4, codes.InvalidArgument}} {
		_, err := f.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: tc.seq, NumberOnly: true, NumberFrom: tc.from, SkippedTables: []string{"emb_l.0.weight"}, Update: &prismv1.UpdateRequest{Model: model}})
		if status.Code(err) != tc.want {
			t.Fatalf("numbers %d .. %d: %v, want %v", tc.from, tc.seq, err, tc.want)
		}
		if got := f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; got != base+3 {
			t.Fatalf("numbers %d .. %d: worker announces update %d, want %d (not taken)", tc.from, tc.seq, got, base+3)
		}
	}
}

// TestFreshUpdateHeldAlready: an update the router sends for the first
// time (fresh) under a number the store holds already is another
// sequencer's update under that number (a router that lost the
// election): AlreadyExists, nothing written, where acknowledging it as
// a replay would let the router count rows no store holds. The same
// number replayed (not fresh) is acknowledged again, and the next one
// sent fresh applies. The fuzz fixture's own store takes the rows.
func TestFreshUpdateHeldAlready(t *testing.T) {
	fx := fuzzSetup(t)
	model, tab := fx.plan.Model.Name, fx.plan.Tables[0]
	ctx := context.Background()
	base := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]
	apply := func(seq int64, fresh bool, v float32) error {
		row := make([]float32, tab.Dim)
		for i := range row {
			row[i] = v
		}
		_, err := fx.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: seq, Fresh: fresh, Update: &prismv1.UpdateRequest{Model: model, Table: tab.Name, Ids: []int64{3}, Rows: leview.Bytes(row)}})
		return err
	}
	holds := func(want float32, what string) {
		t.Helper()
		l := store.TableLookup{Table: tab.Name, IDs: []int64{3}, Pooling: store.PoolNone, Out: make([]float32, tab.Dim)}
		if err := fx.st.Lookup(model, []store.TableLookup{l}); err != nil {
			t.Fatal(err)
		}
		if got := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; l.Out[0] != want || got != base+1 {
			t.Fatalf("%s: row 3 holds %v at update %d, want %v at %d", what, l.Out[0], got, want, base+1)
		}
	}
	if err := apply(base+1, true, 0.25); err != nil {
		t.Fatalf("update %d sent fresh: %v", base+1, err)
	}
	holds(0.25, "applied")
	if err := apply(base+1, true, 0.75); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("another update %d sent fresh: %v, want AlreadyExists", base+1, err)
	}
	holds(0.25, "another update of a held number")
	if err := apply(base+1, false, 0.25); err != nil {
		t.Fatalf("update %d replayed: %v, want it acknowledged again", base+1, err)
	}
	holds(0.25, "replayed")
}

// TestExporterModels: an exporter-corpus model whose ids the model
// declares int32 is served from int64 ids on the wire (each must fit an
// int32); a model exported with a fixed batch and rewritten to a
// symbolic one serves any number of candidates; one whose fixed batch
// could not be rewritten serves exactly that many and refuses others
// naming the node that keeps it. Scores equal the corpus's float64
// references within 1e-5.
func TestExporterModels(t *testing.T) {
	f := setup(t)
	check := func(t *testing.T, name string, n int, seed uint64) {
		t.Helper()
		m := f.corpus[name]
		src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := src.Next(n)
		want, err := m.Reference(b)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := f.client.Lookup(ctx, f.request(name, b))
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if len(resp.Scores) != n {
			t.Fatalf("%d scores for %d candidates", len(resp.Scores), n)
		}
		for i, v := range resp.Scores {
			if d := math.Abs(float64(v) - want[i]); d > 1e-5 {
				t.Fatalf("n=%d: score %d differs from the reference by %g", n, i, d)
			}
		}
	}
	t.Run("int32", func(t *testing.T) {
		for _, n := range []int{1, 7, 300} {
			check(t, "torchrec-int32-ids", n, uint64(n))
		}
		b := f.batch(t, "torchrec-int32-ids", 2, 1)
		b.Columns[1].I64[1] = 1 << 33 // wraps to 0 as an int32: refused
		_, err := f.client.Lookup(context.Background(), f.request("torchrec-int32-ids", b))
		expectStatus(t, err, codes.InvalidArgument, "does not fit the model's int32")
	})
	t.Run("fixed-batch-rewritten", func(t *testing.T) {
		for _, n := range []int{1, 5, 8, 300} {
			check(t, "ts-fixed-batch-view", n, uint64(n))
		}
	})
	// nn.EmbeddingBag on 2-D ids [batch, 5] (the dynamo exporter's
	// loop over a Range of offsets): a lookup of bag 5, pooled by the
	// store, weighted or max.
	t.Run("dynamo-2d-embedding-bag", func(t *testing.T) {
		for _, name := range []string{"dynamo-embedding-bag-2d-weighted", "dynamo-embedding-bag-2d-max"} {
			for _, n := range []int{1, 7, 300} {
				check(t, name, n, uint64(n))
			}
		}
	})
	t.Run("fixed-batch-kept", func(t *testing.T) {
		check(t, "ts-fixed-batch-row-bias", 4, 3)
		for _, n := range []int{1, 5} {
			b := f.batch(t, "ts-fixed-batch-row-bias", n, 1)
			_, err := f.client.Lookup(context.Background(), f.request("ts-fixed-batch-row-bias", b))
			expectStatus(t, err, codes.InvalidArgument, `serves batches of exactly 4 candidates`)
			expectStatus(t, err, codes.InvalidArgument, `node "/Add_`)
		}
	})
}

// TestContentPinned: the worker announces the content of the model it
// serves (the plan's, the same whatever its store numbers the version),
// answers with it, sends it to the dense worker with the cut tensors,
// serves a Lookup pinned to it and refuses one pinned to another
// content, NotFound, whatever version number comes along.
func TestContentPinned(t *testing.T) {
	f := setup(t)
	const name = "dlrm-tiny"
	info := f.srv.WorkerInfo("cpu-1", "addr")
	content := info.GetContent()[name]
	if len(content) != 16 {
		t.Fatalf("announced content %q of %s, want 16 hex digits", content, name)
	}
	if v := info.GetVersion()[name]; v != 1 {
		t.Fatalf("announced version %d of %s; its store numbers it 1", v, name)
	}
	b := f.batch(t, name, 5, 77)
	req := f.request(name, b)
	req.Content = content
	req.Version = 9 // stores number apart: the content decides
	resp := f.checkScores(t, name, b, req)
	if resp.GetContent() != content {
		t.Fatalf("answered content %q, want %q", resp.GetContent(), content)
	}
	f.dense.mu.Lock()
	sent := f.dense.last.content
	f.dense.mu.Unlock()
	if sent != content {
		t.Fatalf("sent the dense worker content %q, want %q", sent, content)
	}
	req.Content, req.Version = "0123456789abcdef", 1
	_, err := f.client.Lookup(context.Background(), req)
	expectStatus(t, err, codes.NotFound, "content")
}

// An update of a table the model has not names the tables it has: the
// client's name may not be the plan's (a float16 table is NAME_float).
func TestUpdateUnknownTableNamesTables(t *testing.T) {
	f := setup(t)
	model := testModels[0]
	for _, seq := range []int64{0, f.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model] + 1} {
		_, err := f.srv.Update(context.Background(), &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: model, Table: "nope", Ids: []int64{0}, Rows: make([]byte, 64)}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "its tables: emb_l.0.weight, emb_l.1.weight") {
			t.Fatalf("seq %d: update of table nope: %v, want InvalidArgument listing the model's tables", seq, err)
		}
	}
}
