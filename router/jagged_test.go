package router

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestJaggedCut: a request's jagged inputs are checked against its
// candidates and cut per micro-batch by their offsets: the micro-batch
// of candidates [lo, hi) gets ids [offsets[lo], offsets[hi]), the same
// span of the weights, and offsets[lo:hi] rebased to 0; the other
// inputs are cut evenly as before.
func TestJaggedCut(t *testing.T) {
	jagged := map[string]string{"indices": "offsets", "psw": "offsets"}
	req := func(off ...int64) *prismv1.RecommendRequest {
		return &prismv1.RecommendRequest{Model: "m", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			{Name: "dense", Values: []float32{0, 0, 1, 1, 2, 2, 3, 3}},
			{Name: "indices", Ids: []int64{10, 11, 12, 13, 14, 15}},
			{Name: "offsets", Ids: off},
			{Name: "psw", Values: []float32{.0, .1, .2, .3, .4, .5}},
		}}}
	}
	// Bags [10 11] [] [12 13 14] [15].
	for _, off := range [][]int64{{0, 2, 2, 5}, {0, 2, 2, 5, 6}} {
		c, err := newJaggedCut(jagged, req(off...), 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			lo, hi  int
			ids     []int64
			offsets []int64
			psw     []float32
			dense   []float32
		}{
			{0, 2, []int64{10, 11}, []int64{0, 2}, []float32{.0, .1}, []float32{0, 0, 1, 1}},
			{1, 3, []int64{12, 13, 14}, []int64{0, 0}, []float32{.2, .3, .4}, []float32{1, 1, 2, 2}},
			{2, 4, []int64{12, 13, 14, 15}, []int64{0, 3}, []float32{.2, .3, .4, .5}, []float32{2, 2, 3, 3}},
			{3, 4, []int64{15}, []int64{0}, []float32{.5}, []float32{3, 3}},
		} {
			f, err := c.sliceFeatures(req(off...).Candidates, 4, tc.lo, tc.hi)
			if err != nil {
				t.Fatal(err)
			}
			in := f.GetInputs()
			if len(in) != 4 || in[0].Name != "dense" || in[1].Name != "indices" || in[2].Name != "offsets" || in[3].Name != "psw" {
				t.Fatalf("[%d, %d): inputs %v", tc.lo, tc.hi, in)
			}
			if !slices.Equal(in[1].Ids, tc.ids) || !slices.Equal(in[2].Ids, tc.offsets) || !slices.Equal(in[3].Values, tc.psw) || !slices.Equal(in[0].Values, tc.dense) {
				t.Fatalf("offsets %v [%d, %d): ids %v offsets %v psw %v dense %v, want %v %v %v %v", off, tc.lo, tc.hi,
					in[1].Ids, in[2].Ids, in[3].Values, in[0].Values, tc.ids, tc.offsets, tc.psw, tc.dense)
			}
		}
	}
	for _, tc := range []struct {
		name string
		off  []int64
		want string
	}{
		{"first", []int64{1, 2, 2, 5}, `candidate input "offsets" (offsets of "indices"): the first offset is 1, want 0`},
		{"decreasing", []int64{0, 3, 2, 5}, "offset 2 is 2, less than offset 1 (3): offsets never decrease"},
		{"past", []int64{0, 2, 2, 7}, "offset 3 is 7, past the 6 values"},
		{"count", []int64{0, 2, 2}, `candidate input "offsets": 3 offsets for 4 candidates: want one per candidate`},
		{"last", []int64{0, 2, 2, 5, 7}, `candidate input "offsets": 5 offsets for 4 candidates end at 7, but "indices" has 6 values`},
		{"missing", nil, `candidate input "offsets": 0 offsets for 4 candidates`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newJaggedCut(jagged, req(tc.off...), 4)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument saying %q", err, tc.want)
			}
		})
	}
	if c, err := newJaggedCut(nil, req(0, 2, 2, 5), 4); c != nil || err != nil {
		t.Fatalf("a model without jagged inputs: %v, %v", c, err)
	}
}
