package server_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// fuzzFixture is an embedding tier of its own (its own store, so fuzzed
// updates never reach the shared fixture's tables) serving dlrm-tiny, and
// a dense stub answering zeros, in process over bufconn.
type fuzzFixture struct {
	srv   *server.Server
	st    *store.Store
	dense string
	plan  *plan.Plan
	// dir is the plan's folder and net the in-process network the dense
	// stub listens on (ownFixture).
	dir string
	net *grpctest.Net
}

var (
	fuzzOnce sync.Once
	fuzzFix  *fuzzFixture
	fuzzErr  error
)

func fuzzSetup(tb testing.TB) *fuzzFixture {
	tb.Helper()
	fuzzOnce.Do(func() { fuzzFix, fuzzErr = newFuzzFixture() })
	if fuzzErr != nil {
		tb.Fatal(fuzzErr)
	}
	return fuzzFix
}

type zeroDense struct {
	prismv1.UnimplementedDenseTierServer
}

func (zeroDense) Score(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	return &prismv1.ScoreResponse{Scores: make([]float32, req.GetNumSamples())}, nil
}

func newFuzzFixture() (*fuzzFixture, error) {
	if err := ort.Init(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cpuserve-fuzz")
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	p, err := models.Lookup("dlrm-tiny")
	if err != nil {
		return nil, err
	}
	m, err := models.New(p.Config, 7)
	if err != nil {
		return nil, err
	}
	if _, err := m.Write(filepath.Join(dir, "model"), models.WriteOptions{}); err != nil {
		return nil, err
	}
	part := filepath.Join(dir, "part")
	res, err := partitioner.Partition(filepath.Join(dir, "model", models.ModelFile), part, partitioner.Options{})
	if err != nil {
		return nil, err
	}
	st, err := store.Open(filepath.Join(dir, "db"), &store.Options{NoSync: true})
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { st.Close() })
	bn := &grpctest.Net{}
	lis, err := bn.Listen("zero-dense")
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer()
	prismv1.RegisterDenseTierServer(g, zeroDense{})
	go g.Serve(lis)
	cleanup = append(cleanup, g.Stop)
	srv, err := server.New(context.Background(), st, server.Options{
		Plans: []string{part}, MaxSamples: 64, Threads: 1, AnyDenseAddr: true,
		DialOptions: []grpc.DialOption{bn.DialOption()}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, srv.Close)
	return &fuzzFixture{srv: srv, st: st, dense: lis.Addr().String(), plan: res.Plan, dir: part, net: bn}, nil
}

// ownFixture is the shared fixture's tier on a store of its own, closed
// with the test: for a test that leaves in the store what its next run
// (-count) would trip on, such as the election epoch it keeps (a store
// that heard of an ordered epoch refuses legacy ones) or a diverged
// mark.
func ownFixture(t *testing.T) *fuzzFixture {
	t.Helper()
	shared := fuzzSetup(t)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), &store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := server.New(context.Background(), st, server.Options{
		Plans: []string{shared.dir}, MaxSamples: 64, Threads: 1, AnyDenseAddr: true,
		DialOptions: []grpc.DialOption{shared.net.DialOption()}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &fuzzFixture{srv: srv, st: st, dense: shared.dense, plan: shared.plan, dir: shared.dir, net: shared.net}
}

// validLookup is a Lookup of n samples, every id 1 and every value 0.5.
func (fx *fuzzFixture) validLookup(n int) *prismv1.LookupRequest {
	req := &prismv1.LookupRequest{Model: fx.plan.Model.Name, NumSamples: int32(n), DenseAddr: fx.dense, Candidates: &prismv1.Features{}}
	for _, in := range fx.plan.Inputs {
		w := 1
		for _, d := range in.Shape {
			w *= int(max(d, 1))
		}
		x := &prismv1.Input{Name: in.Name}
		if in.DType == "int64" {
			x.Ids = make([]int64, n*w)
			for i := range x.Ids {
				x.Ids[i] = 1
			}
		} else {
			x.Values = make([]float32, n*w)
			for i := range x.Values {
				x.Values[i] = 0.5
			}
		}
		req.Candidates.Inputs = append(req.Candidates.Inputs, x)
	}
	return req
}

// documented is the set of codes an internal handler answers bad input
// and load with (README: Errors); Internal or Unknown means a bug.
func documented(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted,
		codes.DeadlineExceeded, codes.Canceled, codes.Unavailable, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// FuzzLookup sends EmbeddingTier.Lookup requests built from arbitrary
// bytes (a non-empty dense_addr is pointed at the fixture's dense stub,
// so the request goes all the way). Every request gets n scores or a
// documented status, never a panic.
func FuzzLookup(f *testing.F) {
	fx := fuzzSetup(f)
	for _, n := range []int{1, 4} {
		good := fx.validLookup(n)
		bad := proto.Clone(good).(*prismv1.LookupRequest)
		bad.Candidates.Inputs[len(bad.Candidates.Inputs)-1].Ids = []int64{-1}
		huge := proto.Clone(good).(*prismv1.LookupRequest)
		huge.NumSamples = 1 << 30
		ctx := proto.Clone(good).(*prismv1.LookupRequest)
		ctx.Context = &prismv1.Features{Inputs: ctx.Candidates.Inputs[:1]}
		// Every input in the context (one row for all samples).
		allCtx := proto.Clone(good).(*prismv1.LookupRequest)
		allCtx.Context, allCtx.Candidates = allCtx.Candidates, nil
		for _, x := range allCtx.Context.Inputs {
			x.Ids, x.Values = x.Ids[:len(x.Ids)/n], x.Values[:len(x.Values)/n]
		}
		// The request's other fields: a part of a sharded fan-out (this
		// worker serves the whole model), a content, a version.
		part := proto.Clone(good).(*prismv1.LookupRequest)
		part.FanoutKey, part.Shard, part.Shards = "req-1/0", 1, 2
		whole := proto.Clone(good).(*prismv1.LookupRequest)
		whole.FanoutKey, whole.Shard, whole.Shards = "req-1/0", 0, 1
		content := proto.Clone(good).(*prismv1.LookupRequest)
		content.Content = "0123456789abcdef"
		version := proto.Clone(good).(*prismv1.LookupRequest)
		version.Version = 1
		for _, r := range []*prismv1.LookupRequest{good, bad, huge, ctx, allCtx, part, whole, content, version, {Model: good.Model}} {
			b, err := proto.Marshal(r)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.LookupRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		if req.DenseAddr != "" {
			req.DenseAddr = fx.dense
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := fx.srv.Lookup(ctx, &req)
		if c := status.Code(err); !documented(c) {
			t.Fatalf("status %v: %v", c, err)
		}
		if err == nil && len(resp.GetScores()) != int(req.GetNumSamples()) {
			t.Fatalf("%d scores for %d samples", len(resp.GetScores()), req.GetNumSamples())
		}
	})
}

// FuzzUpdate sends EmbeddingTier.Update requests built from arbitrary
// bytes to the fuzz fixture's own store: a documented status, never a
// panic, and the worker still serves a valid Lookup afterwards.
func FuzzUpdate(f *testing.F) {
	fx := fuzzSetup(f)
	tab := fx.plan.Tables[0]
	row := make([]byte, 4*tab.Dim)
	for _, r := range []*prismv1.ApplyUpdateRequest{
		{Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1, 2}, Rows: row}},
		{Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{tab.Rows + 5}, Rows: row}},
		{Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{-1}, Rows: row}},
		{Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: "nope", Ids: []int64{1}, Rows: row}},
		{Seq: 1, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Seq: 1 << 40, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row[:3]}},
		// The sequence an apply names (a shard's, with its sharding's
		// fingerprint; malformed ones), number-only and range calls.
		{Seq: 2, Sequence: fx.plan.Model.Name, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Seq: 3, Sequence: fx.plan.Model.Name + "#shard0@0123abcd", Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Seq: 3, Sequence: "#shard-1@", Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Seq: 4, NumberOnly: true, Sequence: fx.plan.Model.Name, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name}},
		{Seq: 9, NumberFrom: 5, SkippedTables: []string{tab.Name, "nope"}, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name, Table: tab.Name, Ids: []int64{1}, Rows: row}},
		{Seq: 1, NumberFrom: 9, Update: &prismv1.UpdateRequest{Model: fx.plan.Model.Name}},
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	probe := fx.validLookup(2)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.ApplyUpdateRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := fx.srv.Update(ctx, &req); !documented(status.Code(err)) {
			t.Fatalf("status %v: %v", status.Code(err), err)
		}
		if _, err := fx.srv.Lookup(ctx, probe); err != nil {
			t.Fatalf("a valid lookup after the update: %v", err)
		}
	})
}
