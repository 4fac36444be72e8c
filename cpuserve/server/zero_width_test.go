package server

import (
	"strings"
	"testing"

	prismv1 "github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
)

// TestZeroWidthInput: an input of per-sample shape [0] (HugeCTR's Data
// layer with dense_dim 0 declares dense as [None, 0]) takes no values;
// it was taken for an input of unknown width and refused ("0 values,
// not a multiple of 13 samples"). Values sent for it are refused; an
// input of unknown width still takes any multiple of the samples.
func TestZeroWidthInput(t *testing.T) {
	m := &model{name: "m", plan: &plan.Plan{}, inputs: map[string]*inputSpec{
		"dense": {name: "dense", shape: []int64{0}, width: 0},
		"any":   {name: "any", shape: []int64{-1}, width: -1},
	}, order: []string{"dense", "any"}}
	for _, tc := range []struct {
		name   string
		inputs []*prismv1.Input
		err    string
		width  map[string]int
	}{
		{"empty", []*prismv1.Input{{Name: "dense"}, {Name: "any", Values: make([]float32, 26)}}, "", map[string]int{"dense": 0, "any": 2}},
		{"values for none", []*prismv1.Input{{Name: "dense", Values: []float32{1}}}, `input "dense" has 1 values, want 0 x 13`, nil},
		{"unknown width, none", []*prismv1.Input{{Name: "any"}}, `input "any" has 0 values, not a multiple of 13 samples`, nil},
	} {
		vals := map[string]*value{}
		err := m.decodeSide(vals, "candidates", &prismv1.Features{Inputs: tc.inputs}, 13, false)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for name, w := range tc.width {
			if vals[name] == nil || vals[name].width != w || vals[name].shape[0] != 13 {
				t.Errorf("%s: input %q decoded as %+v, want width %d for 13 samples", tc.name, name, vals[name], w)
			}
		}
	}
}
