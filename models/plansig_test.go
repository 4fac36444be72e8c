package models_test

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

func i64(v int64) *int64 { return &v }

// TestPlanSignatureRanges: each id value's valid range is worked back
// from its table through the pre-lookup ops; dense values of a float
// input stay dense; a plain id input keeps Rows without Ranges.
func TestPlanSignatureRanges(t *testing.T) {
	p := &plan.Plan{
		Inputs: []plan.TensorInfo{
			{Name: "ids", DType: "int64", Shape: []int64{5}},
			{Name: "x", DType: "float32", Shape: []int64{4}},
			{Name: "plain", DType: "int64", Shape: []int64{3}},
		},
		Tables: []plan.Table{
			{Name: "fused", Rows: 30, Lookups: []plan.Lookup{{Input: "ids", Pre: []plan.PreOp{{Op: plan.PreSlice, Start: 0, End: 2}, {Op: plan.PreAdd, Values: []int64{0, 10}}}}}},
			{Name: "hash", Rows: 7, Lookups: []plan.Lookup{{Input: "ids", Pre: []plan.PreOp{{Op: plan.PreColumn, Index: 2}, {Op: plan.PreMod, Values: []int64{7}}}}}},
			{Name: "one", Rows: 10, Lookups: []plan.Lookup{{Input: "ids", Pre: []plan.PreOp{{Op: plan.PreColumn, Index: 3}, {Op: plan.PreSub, Values: []int64{1}}}}}},
			{Name: "clip", Rows: 8, Lookups: []plan.Lookup{{Input: "ids", Pre: []plan.PreOp{{Op: plan.PreColumn, Index: 4}, {Op: plan.PreClip, Min: i64(0), Max: i64(7)}}}}},
			{Name: "fid", Rows: 50, Lookups: []plan.Lookup{{Input: "x", Pre: []plan.PreOp{{Op: plan.PreSlice, Start: 2, End: 4}, {Op: plan.PreCast, To: "int64"}, {Op: plan.PreWhereEqual, Equal: -1, Default: 0}}}}},
			{Name: "p", Rows: 9, Lookups: []plan.Lookup{{Input: "plain", Bag: 3}}},
		},
	}
	sig, err := models.PlanSignature(p)
	if err != nil {
		t.Fatal(err)
	}
	r := func(lo, hi int64) models.IDRange { return models.IDRange{Lo: lo, Hi: hi} }
	want := [][]models.IDRange{
		{r(0, 30), r(-10, 20), r(0, 28), r(1, 11), r(-3, 11)},
		{r(0, 0), r(0, 0), r(-1, 50), r(-1, 50)},
		nil,
	}
	for i, in := range sig.Inputs {
		if !reflect.DeepEqual(in.Ranges, want[i]) {
			t.Errorf("input %q: ranges %v, want %v", in.Name, in.Ranges, want[i])
		}
	}
	if sig.Inputs[2].Rows != 9 || sig.Inputs[2].Width != 3 || sig.Inputs[1].Kind != models.DenseKind {
		t.Errorf("signature %+v", sig.Inputs)
	}
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := src.Next(200)
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCriteoPacked: Criteo rows fill a packed [batch, 26] id input (one
// value per categorical column, each in its range) and one dense input,
// or one float input carrying 13 dense values and 26 ids.
func TestCriteoPacked(t *testing.T) {
	row := "1\t" + strings.Repeat("3\t", 13) + strings.TrimSuffix(strings.Repeat("68fd1e64\t", 26), "\t") + "\n"
	ranges := make([]models.IDRange, 26)
	for k := range ranges {
		ranges[k] = models.IDRange{Lo: int64(k), Hi: int64(k + 10)}
	}
	packed := models.Signature{Inputs: []models.InputSpec{
		{Name: "dense", Kind: models.DenseKind, Width: 13},
		{Name: "ids", Kind: models.SparseKind, Width: 26, Ranges: ranges, Rows: 35},
	}}
	mixed := models.Signature{Inputs: []models.InputSpec{
		{Name: "x", Kind: models.DenseKind, Width: 39, Ranges: append(make([]models.IDRange, 13), ranges...)},
	}}
	for _, sig := range []models.Signature{packed, mixed} {
		c, err := models.NewCriteo(strings.NewReader(row+row), "t", sig)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Next(10)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if b.N != 2 {
			t.Fatalf("%d rows", b.N)
		}
		if err := b.Check(); err != nil {
			t.Fatal(err)
		}
	}
}
