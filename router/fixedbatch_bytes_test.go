package router

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestPaddingCharged: a fixed-batch model's request is charged
// against MaxInflightBytes for the bytes the router actually builds (its
// candidates padded to the fixed batch), not for the bytes the client
// sent: one candidate of 8 KiB padded to 4096 is 32 MiB of Lookup.
func TestPaddingCharged(t *testing.T) {
	r := testRouter(Options{MaxInflightBytes: 8 << 20})
	echoStack(t, r, 4096)
	req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 1, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "dense", Values: make([]float32, 2048)}}}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := r.Recommend(context.Background(), req)
	runtime.ReadMemStats(&after)
	t.Logf("request %d bytes; router allocated %d MiB; err %v", len(req.String()), (after.TotalAlloc-before.TotalAlloc)>>20, err)
	// Over the limit on its own, it is never admitted: InvalidArgument,
	// not ResourceExhausted (retry later).
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request of 33607688 bytes") {
		t.Fatalf("a request padded to 32 MiB admitted under an 8 MiB limit of bytes in flight: %v, want InvalidArgument naming its padded bytes", err)
	}
}

// echoCN answers every Lookup with num_samples zero scores.
type echoCN struct {
	prismv1.UnimplementedEmbeddingTierServer
}

func (echoCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	return &prismv1.LookupResponse{Scores: make([]float32, req.GetNumSamples())}, nil
}

// echoStack registers with r an embedding worker (echoCN, taking
// messages of up to 128 MiB) of model "m", fixed at batch fixed when not
// 0, and a dense worker.
func echoStack(t *testing.T, r *Router, fixed int64) {
	t.Helper()
	addr, lis := listen(t)
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(128 << 20))
	prismv1.RegisterEmbeddingTierServer(srv, echoCN{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	emb := &prismv1.WorkerInfo{Id: "c", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}
	if fixed > 0 {
		emb.FixedBatch = map[string]int64{"m": fixed}
	}
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: emb})
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "g", Role: prismv1.Role_ROLE_DENSE, Addr: "d", Models: []string{"m"}, Healthy: true}})
}
