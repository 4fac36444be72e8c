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

// TestPlanSignatureKeys: an input whose ids pass through a key map
// (plan.json's keys) is drawn among its keys alone, Zipf-skewed or
// uniform, every key reached, and Criteo rows hash into them; an input
// without keys keeps [0, rows).
func TestPlanSignatureKeys(t *testing.T) {
	keys := []plan.KeyRange{{Lo: 0, Hi: 3}, {Lo: 10, Hi: 11}, {Lo: 40, Hi: 44}}
	p := &plan.Plan{
		Inputs: []plan.TensorInfo{
			{Name: "keys", DType: "int64", Shape: []int64{2, 3}, Keys: keys},
			{Name: "plain", DType: "int64", Shape: []int64{2}},
		},
		PreModel: "pre.onnx",
		Tables: []plan.Table{
			{Name: "t", Rows: 5, Lookups: []plan.Lookup{
				{Input: "keys", PreOutput: "rows0", PreInputs: []string{"keys"}, Bag: 3},
				{Input: "keys", PreOutput: "rows1", PreInputs: []string{"keys"}, Bag: 3},
			}},
			{Name: "p", Rows: 9, Lookups: []plan.Lookup{{Input: "plain", Bag: 2}}},
		},
	}
	sig, err := models.PlanSignature(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []plan.KeyRange{{Lo: 0, Hi: 3}, {Lo: 10, Hi: 11}, {Lo: 40, Hi: 44}}
	if in := sig.Inputs[0]; !reflect.DeepEqual(in.Keys, want) || in.Ranges != nil || in.Width != 6 || in.Rows != 44 {
		t.Fatalf("keyed input %+v, want keys %v, width 6, rows 44", in, want)
	}
	if in := sig.Inputs[1]; in.Keys != nil || in.Rows != 9 {
		t.Fatalf("plain input %+v, want rows 9 and no keys", in)
	}
	valid := map[int64]bool{0: true, 1: true, 2: true, 10: true, 40: true, 41: true, 42: true, 43: true}
	for _, o := range []models.SyntheticOptions{{Seed: 1}, {Seed: 1, Uniform: true}, {Seed: 2, Stream: 3}} {
		src, err := models.NewSynthetic(sig, o)
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Next(500)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Check(); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		seen := map[int64]bool{}
		for _, id := range b.Columns[0].I64 {
			if !valid[id] {
				t.Fatalf("%+v: drew key %d, not one of %v", o, id, keys)
			}
			seen[id] = true
		}
		if len(seen) != len(valid) {
			t.Errorf("%+v: drew %d distinct keys of %d in 500 samples", o, len(seen), len(valid))
		}
		for _, id := range b.Columns[1].I64 {
			if id < 0 || id >= 9 {
				t.Fatalf("%+v: plain id %d outside [0, 9)", o, id)
			}
		}
	}
	// Batch.Check refuses a value that is not a key.
	b := &models.Batch{N: 1, Sig: &sig, Columns: []models.Column{{I64: []int64{0, 1, 2, 10, 40, 5}}, {I64: []int64{0, 0}}}}
	if err := b.Check(); err == nil || !strings.Contains(err.Error(), "id 5 is not one of the input's valid keys") {
		t.Fatalf("Check on a key outside the set: %v", err)
	}
	// Criteo rows: one sparse input per categorical column, the keyed
	// one's ids hashed into its keys.
	crit := models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: 13}}}
	for k := range 26 {
		in := models.InputSpec{Name: "c" + string(rune('a'+k)), Kind: models.SparseKind, Width: 3, Rows: 1000}
		if k == 0 {
			in.Keys, in.Rows = want, 44
		}
		crit.Inputs = append(crit.Inputs, in)
	}
	var rows strings.Builder
	for i := range 50 {
		rows.WriteString("1\t" + strings.Repeat("3\t", 13))
		for k := range 26 {
			rows.WriteString(strings.Repeat("a", k%3+1) + string(rune('0'+i%10)) + string(rune('0'+i/10)))
			if k < 25 {
				rows.WriteString("\t")
			}
		}
		rows.WriteString("\n")
	}
	c, err := models.NewCriteo(strings.NewReader(rows.String()), "t", crit)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := c.Next(100)
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if cb.N != 50 {
		t.Fatalf("%d rows", cb.N)
	}
	if err := cb.Check(); err != nil {
		t.Fatal(err)
	}
}
