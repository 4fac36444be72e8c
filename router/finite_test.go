package router

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestNonFiniteScoreNamesTheFeature: a non-finite score is refused only
// when the candidate's own float features (its bag, for a jagged input)
// or the context's hold a non-finite value, and the status names it.
func TestNonFiniteScoreNamesTheFeature(t *testing.T) {
	nan := float32(math.NaN())
	// Three candidates; "bag" is jagged over "bag_offsets": bags [0,2),
	// [2,2) (empty), [2,5).
	jc := &jaggedCut{of: map[string]string{"bag": "bag_offsets"}, offsets: map[string][]int64{"bag_offsets": {0, 2, 2, 5}}}
	req := func(bagW, dense, ctx []float32) *prismv1.RecommendRequest {
		r := &prismv1.RecommendRequest{Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			{Name: "bag", Weights: bagW},
			{Name: "dense", Values: dense},
		}}}
		if ctx != nil {
			r.Context = &prismv1.Features{Inputs: []*prismv1.Input{{Name: "user", Values: ctx}}}
		}
		return r
	}
	ok := []float32{1, 1, 1, 1, 1}
	for _, tc := range []struct {
		name   string
		req    *prismv1.RecommendRequest
		scores []float32
		want   string // "" for no error
	}{
		{"all finite", req(ok, []float32{1, 2, 3}, nil), []float32{.1, .2, .3}, ""},
		{"NaN score of finite features: the model's own", req(ok, []float32{1, 2, 3}, nil), []float32{.1, nan, .3}, ""},
		{"NaN in candidate 2's bag", req([]float32{1, 1, 1, nan, 1}, []float32{1, 2, 3}, nil), []float32{.1, .2, nan}, `candidate input "bag": weights[3]`},
		{"NaN in candidate 2's bag, candidate 0 scored NaN", req([]float32{1, 1, 1, nan, 1}, []float32{1, 2, 3}, nil), []float32{nan, .2, .3}, ""},
		{"Inf in a dense value", req(ok, []float32{1, float32(math.Inf(1)), 3}, nil), []float32{.1, nan, .3}, `candidate input "dense": values[1]`},
		{"NaN in the context", req(ok, []float32{1, 2, 3}, []float32{nan}), []float32{nan, nan, nan}, `context input "user": values[0]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := nonFiniteScore(tc.req, jc, tc.scores, 3)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.want)
			}
		})
	}
}

// TestNonFiniteTaskScore: a multi-task model's scores (candidate-major,
// k a candidate) are judged by the candidate each belongs to: a NaN of
// task 1 of candidate 2, whose features hold a NaN, is refused naming
// it; one of a candidate of finite features is the model's own.
func TestNonFiniteTaskScore(t *testing.T) {
	nan := float32(math.NaN())
	req := &prismv1.RecommendRequest{Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "dense", Values: []float32{1, 2, nan}}}}}
	for _, tc := range []struct {
		name   string
		scores []float32
		want   string
	}{
		{"all finite", []float32{.1, .2, .3, .4, .5, .6}, ""},
		{"task 1 of candidate 2 NaN", []float32{.1, .2, .3, .4, .5, nan}, `candidate 2 scored NaN: candidate input "dense": values[2]`},
		{"task 1 of candidate 1 NaN: the model's own", []float32{.1, .2, .3, nan, .5, .6}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := nonFiniteTaskScore(req, nil, tc.scores, 3, 2)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.want)
			}
		})
	}
}
