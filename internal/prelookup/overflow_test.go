package prelookup

import (
	"testing"

	"github.com/prism-serve/prism/plan"
)

// A reshape whose sizes multiply past int64 (wrapping to the sample's
// own count) is refused by PreShape, and a column past the sample is
// refused by Compile, instead of panicking at run time (review finding).
func TestHostileReshapeRefused(t *testing.T) {
	in := plan.TensorInfo{Name: "x", DType: "int64", Shape: []int64{4}}
	ops := []plan.PreOp{{Op: plan.PreReshape, Shape: []int64{4611686018427387905, 4}}, {Op: plan.PreColumn, Index: 2305843009213693952}}
	if _, _, err := plan.PreShape(in.Shape, in.DType, ops); err == nil {
		t.Fatal("PreShape accepted a reshape whose sizes wrap int64")
	}
	if _, err := Compile(in, ops); err == nil {
		t.Fatal("Compile accepted it")
	}
	if _, err := Compile(plan.TensorInfo{Name: "x", DType: "int64", Shape: []int64{4}}, []plan.PreOp{{Op: plan.PreColumn, Index: 4}}); err == nil {
		t.Fatal("Compile accepted a column past the sample")
	}
}
