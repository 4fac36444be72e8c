package server

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// taskDense answers tasks values a sample (ScoreResponse.tasks), extra
// more: a multi-task model's dense worker, or a misbehaving one.
type taskDense struct {
	prismv1.UnimplementedDenseTierServer
	tasks int32
	extra int
}

func (d taskDense) Score(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	out := make([]float32, int(req.GetNumSamples())*max(int(d.tasks), 1)+d.extra)
	for i := range out {
		out[i] = float32(i)
	}
	return &prismv1.ScoreResponse{Scores: out, Tasks: d.tasks}, nil
}

// TestLookupPassesTasksOn: the dense worker of a multi-task model
// answers k values a sample with tasks k; the embedding worker passes
// both on to the router, and refuses (Internal) an answer whose count
// is not samples times its tasks, or of more tasks than a plan has.
func TestLookupPassesTasksOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dense taskDense
		want  string // "" for success
	}{
		{"one score", taskDense{}, ""},
		{"two tasks", taskDense{tasks: 2}, ""},
		{"two tasks, a value short", taskDense{tasks: 2, extra: -1}, "returned 9 scores for 5 samples of 2 tasks"},
		{"too many tasks", taskDense{tasks: 65}, "returned 325 scores for 5 samples of 65 tasks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := serveTestPlanWith(t, testPlan(3), Options{}, tc.dense)
			resp, err := s.Lookup(context.Background(), idsLookup(addr, 5, make([]int64, 15)))
			if tc.want != "" {
				if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Lookup: %v, want Internal with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k := max(int(tc.dense.tasks), 1)
			if resp.GetTasks() != tc.dense.tasks || len(resp.GetScores()) != 5*k {
				t.Fatalf("tasks %d, %d scores; want %d, %d", resp.GetTasks(), len(resp.GetScores()), tc.dense.tasks, 5*k)
			}
		})
	}
}
