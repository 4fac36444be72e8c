package router

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestJaggedShortField: a jagged input whose weights (or a second
// input of the same name) hold fewer values than its ids is refused with
// InvalidArgument; it used to pass the checks (the count was the longest
// field) and panic the router when a micro-batch cut past the short one.
func TestJaggedShortField(t *testing.T) {
	cn := &fakeCN{}
	r := newRouter(t, Options{MicroBatch: 2}, cn)
	// The embedding worker announces the jagged input "indices" over "offsets".
	for _, w := range func() []*prismv1.WorkerInfo {
		l, _ := r.Reg.List(context.Background(), nil)
		return l.GetWorkers()
	}() {
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			w.Jagged = map[string]*prismv1.JaggedInputs{"m": {Inputs: []string{"indices"}, Offsets: []string{"offsets"}}}
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, inputs := range map[string][]*prismv1.Input{
		"short weights": {{Name: "indices", Ids: []int64{10, 11, 12, 13, 14, 15}, Weights: []float32{1, 1}}},
		"duplicate":     {{Name: "indices", Ids: []int64{10, 11}}, {Name: "indices", Ids: []int64{10, 11, 12, 13, 14, 15}}},
	} {
		t.Run(name, func(t *testing.T) {
			req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: append([]*prismv1.Input{
				{Name: "cat_0", Ids: []int64{0, 1, 2, 3}},
				{Name: "offsets", Ids: []int64{0, 2, 2, 5}},
			}, inputs...)}}
			_, err := r.Recommend(context.Background(), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
}
