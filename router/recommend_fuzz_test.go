package router

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// zeroCN answers every Lookup with num_samples zero scores, whatever the
// candidates hold (fakeCN reads the first input's ids, which a fuzzed
// request need not have).
type zeroCN struct {
	prismv1.UnimplementedEmbeddingTierServer
}

func (zeroCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	return &prismv1.LookupResponse{Scores: make([]float32, req.GetNumSamples())}, nil
}

// FuzzRecommend sends Recommend requests built from arbitrary bytes to a
// router serving three models: "m" plain, "j" with a jagged input
// ("indices", "weights" cut by "offsets"), "f" exported with a fixed
// batch of 4. Each ends in an answer with one score per candidate or a
// documented status, never a panic (a malformed jagged input once
// panicked the router in a micro-batch's goroutine), and every sample
// and byte it was charged is given back.
func FuzzRecommend(f *testing.F) {
	r := testRouter(Options{MicroBatch: 3, MaxCandidates: 64, DefaultTimeout: 2 * time.Second})
	f.Cleanup(r.Close)
	addr := serveInproc(f, func(s *grpc.Server) { prismv1.RegisterEmbeddingTierServer(s, zeroCN{}) })
	for _, w := range []*prismv1.WorkerInfo{
		{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m", "j", "f"}, Healthy: true,
			Jagged:     map[string]*prismv1.JaggedInputs{"j": {Inputs: []string{"indices", "weights"}, Offsets: []string{"offsets", "offsets"}}},
			FixedBatch: map[string]int64{"f": 4}},
		{Id: "d", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m", "j", "f"}, Healthy: true},
	} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
			f.Fatal(err)
		}
	}
	for _, req := range []*prismv1.RecommendRequest{
		request(7),
		{Model: "f", NumCandidates: 5, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "cat_0", Ids: []int64{1, 2, 3, 4, 5}}, {Name: "dense", Values: make([]float32, 10)}}}},
		{Model: "j", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			{Name: "offsets", Ids: []int64{0, 2, 2, 5}},
			{Name: "indices", Ids: []int64{1, 2, 3, 4, 5, 6}},
			{Name: "weights", Values: []float32{1, 1, 1, 1, 1, 1}},
		}}},
		// The shapes that panicked: weights shorter than the ids; the
		// input sent twice with two lengths.
		{Model: "j", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			{Name: "offsets", Ids: []int64{0, 2, 2, 5}},
			{Name: "indices", Ids: []int64{1, 2, 3, 4, 5, 6}, Weights: []float32{1, 1}},
		}}},
		{Model: "j", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			{Name: "offsets", Ids: []int64{0, 2, 2, 5}},
			{Name: "indices", Ids: []int64{1, 2}},
			{Name: "indices", Ids: []int64{1, 2, 3, 4, 5, 6}},
		}}},
		{Model: "m", NumCandidates: 2, Context: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "user", Ids: []int64{9}}}},
			Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "cat_0", Ids: []int64{1, 2}}}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &prismv1.RecommendRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := r.Recommend(ctx, req)
		switch status.Code(err) {
		case codes.OK:
			if got, want := len(resp.GetScores()), int(req.GetNumCandidates()); got != want {
				t.Fatalf("%d scores for %d candidates", got, want)
			}
		case codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.Unimplemented, codes.Unavailable, codes.FailedPrecondition:
		default:
			t.Fatalf("Recommend: %v (not a status a client is told to expect)", err)
		}
		if n, b := r.inflight.Load(), r.inflightBytes.Load(); n != 0 || b != 0 {
			t.Fatalf("after the request: %d samples and %d bytes still charged", n, b)
		}
	})
}
