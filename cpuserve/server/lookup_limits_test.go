package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
)

type zeroScores struct {
	prismv1.UnimplementedDenseTierServer
}

func (zeroScores) Score(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	return &prismv1.ScoreResponse{Scores: make([]float32, req.GetNumSamples())}, nil
}

// serveTestPlan serves p (every table filled with ones) from an
// in-memory store, its dense worker a stub answering zeros.
func serveTestPlan(t *testing.T, p *plan.Plan, o Options) (*Server, string) {
	t.Helper()
	return serveTestPlanWith(t, p, o, zeroScores{})
}

// serveTestPlanWith is serveTestPlan with dense as the dense worker.
func serveTestPlanWith(t *testing.T, p *plan.Plan, o Options, dense prismv1.DenseTierServer) (*Server, string) {
	t.Helper()
	return serveTestPlanOn(t, p, o, dense, &store.Options{FS: vfs.NewMem(), NoSync: true})
}

// serveTestPlanOn is serveTestPlanWith on a store opened with sto.
func serveTestPlanOn(t *testing.T, p *plan.Plan, o Options, dense prismv1.DenseTierServer, sto *store.Options) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range p.Tables {
		tb := &p.Tables[i]
		data := make([]float32, tb.Rows*int64(tb.Dim))
		for k := range data {
			data[k] = 1
		}
		file := tablefile.FileName(tb.Name)
		meta, err := tablefile.Write(filepath.Join(dir, file), tb.Name, tb.Dim, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		tb.File, tb.SHA256, tb.DType = file, meta.SHA256, "float32"
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open("db", sto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	bn := &grpctest.Net{}
	lis := bn.MustListen(t, "dense")
	g := grpc.NewServer()
	prismv1.RegisterDenseTierServer(g, dense)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	o.Plans, o.AnyDenseAddr, o.Logger = []string{dir}, true, slog.New(slog.DiscardHandler)
	o.DialOptions = append(o.DialOptions, bn.DialOption())
	s, err := New(context.Background(), st, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, lis.Addr().String()
}

// testPlan: one table of 50 x 4, its lookup of input ids (per-sample
// shape idsShape, bag 3, unpooled) the cut tensor rows [3, 4].
func testPlan(idsShape ...int64) *plan.Plan {
	return &plan.Plan{
		Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Inputs:  []plan.TensorInfo{{Name: "ids", DType: "int64", Shape: idsShape, Sides: []plan.Side{plan.CPU}}},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut:     []plan.CutTensor{{TensorInfo: plan.TensorInfo{Name: "rows", DType: "float32", Shape: []int64{3, 4}}, BytesPerSample: 48, From: "lookup"}},
		Tables: []plan.Table{{Name: "t", Rows: 50, Dim: 4,
			Lookups: []plan.Lookup{{Input: "ids", Bag: 3, Pooling: plan.PoolNone, Output: "rows"}}}},
	}
}

func idsLookup(addr string, n int, ids []int64) *prismv1.LookupRequest {
	return &prismv1.LookupRequest{Model: "m", NumSamples: int32(n), DenseAddr: addr,
		Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "ids", Ids: ids}}}}
}

// TestBagOfUnknownWidth: an ids input whose per-sample shape the
// plan leaves unknown ([-1]) feeding a lookup of bag 3: a request with 2
// ids per sample is the client's error (InvalidArgument), not the
// server's (Internal).
func TestBagOfUnknownWidth(t *testing.T) {
	s, addr := serveTestPlan(t, testPlan(-1), Options{})
	_, err := s.Lookup(context.Background(), idsLookup(addr, 3, []int64{1, 2, 3, 4, 5, 6}))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("2 ids per sample for a bag of 3: %v, want InvalidArgument", err)
	}
	if _, err := s.Lookup(context.Background(), idsLookup(addr, 2, []int64{1, 2, 3, 4, 5, 6})); err != nil {
		t.Fatalf("3 ids per sample: %v", err)
	}
}

// TestLookupOverInflightLimit: a Lookup within MaxSamples but over
// MaxInflightSamples, on an idle worker, was refused ResourceExhausted
// ("overloaded: 0 samples in flight ... retry later") every time.
func TestLookupOverInflightLimit(t *testing.T) {
	s, addr := serveTestPlan(t, testPlan(3), Options{MaxSamples: 64, MaxInflightSamples: 16})
	ids := make([]int64, 3*20)
	if _, err := s.Lookup(context.Background(), idsLookup(addr, 20, ids)); err != nil {
		t.Fatalf("20 samples alone in flight (max samples 64, in flight 16): %v", err)
	}
	if s.Outstanding() != 0 {
		t.Fatalf("%d samples left in flight", s.Outstanding())
	}
	// Behind another lookup in flight, the limit holds.
	release, err := s.admit(10, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := s.Lookup(context.Background(), idsLookup(addr, 20, ids)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("20 samples behind 10 in flight: %v, want ResourceExhausted", err)
	}
}
