package router

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// versionCN serves one active version of its model, as cpuserve does: a
// request pinned to another is NotFound; a score is 1000*version + id.
type versionCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	v int64
}

func (f *versionCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if v := req.GetVersion(); v != 0 && v != f.v {
		return nil, status.Errorf(codes.NotFound, "model %q version %d is not served (serving version %d; 0 asks for it)", req.GetModel(), v, f.v)
	}
	ids := req.GetCandidates().GetInputs()[0].GetIds()
	out := make([]float32, req.GetNumSamples())
	for i := range out {
		out[i] = float32(1000*f.v + ids[i])
	}
	return &prismv1.LookupResponse{Scores: out, Version: f.v}, nil
}

// TestVersionRollout: while the replicas of a model switch from
// version 1 to 2, one request is scored by one version, the one its
// response names, and a request pinned to a version is served by the
// replicas that serve it.
func TestVersionRollout(t *testing.T) {
	r := testRouter(Options{MicroBatch: 2})
	for i, v := range []int64{1, 2} {
		addr := startCN(t, &versionCN{v: v})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu" + addr, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu" + string(rune('a'+i)), Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + string(rune('a'+i)), Models: []string{"m"}, Healthy: true}})
	}
	t.Run("unpinned", func(t *testing.T) {
		for range 20 {
			resp, err := r.Recommend(context.Background(), request(8))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range resp.GetScores() {
				if want := float32(1000*resp.GetVersion() + int64(i)); s != want {
					t.Fatalf("version %d answered, but candidate %d scored %v (want %v): scores of two versions in one response %v", resp.GetVersion(), i, s, want, resp.GetScores())
				}
			}
		}
	})
	t.Run("pinned", func(t *testing.T) {
		for _, v := range []int64{1, 2} {
			for range 20 {
				req := request(8)
				req.Version = v
				resp, err := r.Recommend(context.Background(), req)
				if err != nil {
					t.Fatalf("pinned to version %d, which a replica serves: %v", v, err)
				}
				if resp.GetVersion() != v {
					t.Fatalf("pinned to %d, answered %d", v, resp.GetVersion())
				}
			}
		}
	})
}

// TestSplitVersions: one version answers alone (no micro-batch to score
// again, 0s aside); of two, the one that scored more candidates wins
// (the higher on a tie), and the other's micro-batches are scored again.
func TestSplitVersions(t *testing.T) {
	parts := [][2]int{{0, 2}, {2, 4}, {4, 5}}
	for _, c := range []struct {
		vers   []int64
		want   int64
		others []int
	}{
		{[]int64{3, 3, 3}, 3, nil},
		{[]int64{0, 3, 0}, 3, nil},
		{[]int64{0, 0, 0}, 0, nil},
		{[]int64{1, 2, 2}, 2, []int{0}},
		{[]int64{1, 1, 2}, 1, []int{2}},
		{[]int64{2, 1, 0}, 2, []int{1}},
	} {
		v, others := splitVersions(parts, c.vers)
		if v != c.want || !slices.Equal(others, c.others) {
			t.Errorf("splitVersions(%v) = %d, %v; want %d, %v", c.vers, v, others, c.want, c.others)
		}
	}
}
