package plan

import "testing"

// jaggedPlan is valid() with an EmbeddingBag with offsets: ids and
// per-id weights jagged over "offsets", pooled by sum into emb_2.
func jaggedPlan() *Plan {
	p := valid()
	p.Inputs = append(p.Inputs,
		TensorInfo{Name: "indices", DType: "int64", Shape: []int64{}, Sides: []Side{CPU}, Offsets: "offsets"},
		TensorInfo{Name: "offsets", DType: "int64", Shape: []int64{}, Sides: []Side{CPU}},
		TensorInfo{Name: "psw", DType: "float32", Shape: []int64{}, Sides: []Side{CPU}, Offsets: "offsets"},
	)
	p.Tables = append(p.Tables, Table{Name: "bag", File: "tables/bag.arrow", Rows: 40, Dim: 16, DType: "float32",
		Lookups: []Lookup{{Input: "indices", Offsets: "offsets", Bag: 1, Pooling: PoolSum, Weights: "psw", Output: "emb_2"}}})
	return p
}

func TestValidateJagged(t *testing.T) {
	last := func(p *Plan) *Lookup { return &p.Tables[len(p.Tables)-1].Lookups[0] }
	in := func(p *Plan, name string) *TensorInfo {
		for i := range p.Inputs {
			if p.Inputs[i].Name == name {
				return &p.Inputs[i]
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name  string
		edit  func(p *Plan)
		error string // "" for valid
	}{
		{"valid", func(*Plan) {}, ""},
		{"last offset", func(p *Plan) { last(p).LastOffset = true }, ""},
		{"mean, no weights", func(p *Plan) { last(p).Pooling, last(p).Weights = PoolMean, "" }, ""},
		{"version 3", func(p *Plan) { p.Version = 3 }, "jagged inputs in a version 3 plan (they came in version 4)"},
		{"offsets not an input", func(p *Plan) { in(p, "indices").Offsets = "nope" },
			`inputs[5] "indices": offsets "nope" is not a model input`},
		{"offsets jagged", func(p *Plan) { in(p, "offsets").Offsets = "indices" },
			`inputs[5] "indices": offsets "offsets" is itself jagged`},
		{"float offsets", func(p *Plan) { in(p, "offsets").DType = "float32" },
			`inputs[5] "indices": offsets "offsets" of dtype "float32", want int64 or int32`},
		{"offsets of shape", func(p *Plan) { in(p, "offsets").Shape = []int64{2} },
			`inputs[5] "indices": offsets "offsets" of per-sample shape [2], want one value per sample ([])`},
		{"jagged of shape", func(p *Plan) { in(p, "indices").Shape = []int64{3} },
			`inputs[5] "indices": a jagged input has per-sample shape [] (its values are 1-D), got [3]`},
		{"dense side", func(p *Plan) { in(p, "offsets").Sides = []Side{CPU, GPU} },
			`inputs[5] "indices": the dense side reads a jagged input or its offsets "offsets"; only lookups read them`},
		{"lookup without offsets", func(p *Plan) { last(p).Offsets = "" },
			`tables "bag" lookups[0]: input "indices" is jagged but the lookup names no offsets`},
		{"last offset alone", func(p *Plan) {
			last(p).Offsets, in(p, "indices").Offsets, in(p, "psw").Offsets = "", "", ""
			last(p).LastOffset = true
		},
			`tables "bag" lookups[0]: last_offset without offsets`},
		{"other offsets", func(p *Plan) { last(p).Offsets = "cat_0" },
			`tables "bag" lookups[0]: offsets "cat_0", but input "indices" is not jagged over them (its offsets: "offsets")`},
		{"weights not jagged", func(p *Plan) { last(p).Weights = "w_1" },
			`tables "bag" lookups[0]: weights "w_1" are not jagged over the offsets "offsets" of the ids`},
		{"bag", func(p *Plan) { last(p).Bag = 4 },
			`tables "bag" lookups[0]: a jagged lookup has bag 1 and no rank1 (its bags are as long as its offsets say)`},
		{"unpooled", func(p *Plan) { last(p).Pooling, last(p).Weights = PoolNone, "" },
			`tables "bag" lookups[0]: a jagged lookup pools its bags (sum, mean or max)`},
		{"pre ops", func(p *Plan) { last(p).Pre = []PreOp{{Op: PreAdd, Values: []int64{1}}} },
			`tables[2] "bag" lookups[0]: pre-lookup ops make ids of per-sample shape [], rank1 is false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := jaggedPlan()
			tc.edit(p)
			err := p.Validate()
			switch {
			case tc.error == "" && err != nil:
				t.Fatalf("valid plan refused: %v", err)
			case tc.error != "" && err == nil:
				t.Fatalf("accepted, want error %q", tc.error)
			case tc.error != "" && err.Error() != tc.error:
				t.Fatalf("error %q, want %q", err, tc.error)
			}
		})
	}
	p := jaggedPlan()
	if j := p.Jagged(); len(j) != 2 || j[0] != (JaggedInput{"indices", "offsets"}) || j[1] != (JaggedInput{"psw", "offsets"}) {
		t.Fatalf("Jagged() = %v", j)
	}
	if !p.IsOffsets("offsets") || p.IsOffsets("indices") || p.LastOffset("offsets") {
		t.Fatalf("IsOffsets/LastOffset wrong")
	}
}
