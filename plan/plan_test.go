package plan

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// valid is a small plan of the shape the partitioner writes: two tables,
// one pooled bag with weights, one cpu.onnx output on the cut.
func valid() *Plan {
	return &Plan{
		Version: Version,
		Model:   ModelInfo{Name: "m", Path: "model.onnx", Opset: 18},
		Inputs: []TensorInfo{
			{Name: "dense", DType: "float32", Shape: []int64{13}, Sides: []Side{GPU}},
			{Name: "cat_0", DType: "int64", Shape: []int64{}, Sides: []Side{CPU}},
			{Name: "cat_1", DType: "int64", Shape: []int64{4}, Sides: []Side{CPU}},
			{Name: "w_1", DType: "float32", Shape: []int64{4}, Sides: []Side{CPU}},
			{Name: "packed", DType: "float32", Shape: []int64{4}, Sides: []Side{CPU}},
		},
		Outputs: []TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut: []CutTensor{
			{TensorInfo: TensorInfo{Name: "emb_0", DType: "float32", Shape: []int64{16}}, BytesPerSample: 64, From: "lookup"},
			{TensorInfo: TensorInfo{Name: "t", DType: "float32", Shape: []int64{16}}, BytesPerSample: 64, From: "cpu"},
			{TensorInfo: TensorInfo{Name: "dense", DType: "float32", Shape: []int64{13}}, BytesPerSample: 52, From: "input"},
		},
		Tables: []Table{
			{Name: "t0", File: "tables/t0.arrow", Rows: 10, Dim: 16, DType: "float32", UnknownIDs: UnknownError,
				Lookups: []Lookup{{Input: "cat_0", Bag: 1, Rank1: true, Pooling: PoolNone, Output: "emb_0"}}},
			{Name: "t1", File: "tables/t1.arrow", Rows: 10, Dim: 16, DType: "float32",
				Lookups: []Lookup{{Input: "cat_1", Bag: 4, Pooling: PoolSum, Weights: "w_1", Output: "emb_1"}}},
		},
		CPUModel:   "cpu.onnx",
		DenseModel: "dense.onnx",
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(p *Plan)
		error string // "" for valid
	}{
		{"valid", func(*Plan) {}, ""},
		{"no cpu model", func(p *Plan) { p.CPUModel = "" }, ""},
		{"version", func(p *Plan) { p.Version = Version + 1 }, "version 6, this build reads versions 1 to 5"},
		{"version 0", func(p *Plan) { p.Version = 0 }, "version 0, this build reads versions 1 to 5"},
		{"version 1 reads", func(p *Plan) { p.Version = 1 }, ""},
		{"task outputs", func(p *Plan) {
			p.Outputs = append(p.Outputs, TensorInfo{Name: "cvr", DType: "float32", Shape: []int64{1}})
			p.TaskOutputs = 2
		}, ""},
		{"task outputs past the outputs", func(p *Plan) { p.TaskOutputs = len(p.Outputs) + 1 }, "task_outputs 2: the plan has 1 outputs"},
		{"task outputs negative", func(p *Plan) { p.TaskOutputs = -1 }, "task_outputs -1: the plan has 1 outputs"},
		{"task outputs in version 4", func(p *Plan) {
			p.Version = 4
			p.Outputs = append(p.Outputs, TensorInfo{Name: "cvr", DType: "float32", Shape: []int64{1}})
			p.TaskOutputs = 2
		}, "task_outputs in a version 4 plan (it came in version 5)"},
		{"pre in version 1", func(p *Plan) { p.Version = 1; p.Tables[0].Lookups[0].Pre = packedPre(3) },
			`tables[0] "t0" lookups[0]: pre-lookup ops in a version 1 plan (they came in version 2)`},
		{"pre model", func(p *Plan) {
			p.PreModel = "pre.onnx"
			l := &p.Tables[0].Lookups[0]
			l.Input, l.PreOutput, l.PreInputs = "packed", "hashed", []string{"packed"}
		}, ""},
		{"pre model in version 2", func(p *Plan) { p.Version = 2; p.PreModel = "pre.onnx" }, "pre_model in a version 2 plan (it came in version 3)"},
		{"pre model outside", func(p *Plan) { p.PreModel = "../pre.onnx" }, `pre_model "../pre.onnx" is not a path inside the plan folder`},
		{"pre output without model", func(p *Plan) {
			l := &p.Tables[0].Lookups[0]
			l.PreOutput, l.PreInputs = "hashed", []string{l.Input}
		}, `tables[0] "t0" lookups[0]: pre_output "hashed", but the plan has no pre_model`},
		{"pre output and ops", func(p *Plan) {
			p.PreModel = "pre.onnx"
			l := &p.Tables[0].Lookups[0]
			l.Input, l.PreOutput, l.PreInputs, l.Pre = "packed", "hashed", []string{"packed"}, packedPre(3)
		}, `tables[0] "t0" lookups[0]: both pre-lookup ops and a pre_output "hashed": the ids come from one or the other`},
		{"pre inputs not the input", func(p *Plan) {
			p.PreModel = "pre.onnx"
			l := &p.Tables[0].Lookups[0]
			l.PreOutput, l.PreInputs = "hashed", []string{"packed"}
		}, `tables[0] "t0" lookups[0]: pre_inputs [packed] must start with the lookup's input "cat_0"`},
		{"pre inputs unknown", func(p *Plan) {
			p.PreModel = "pre.onnx"
			l := &p.Tables[0].Lookups[0]
			l.PreOutput, l.PreInputs = "hashed", []string{l.Input, "nope"}
		}, `tables[0] "t0" lookups[0]: pre_inputs: "nope" is not a model input`},
		{"pre packed", func(p *Plan) { p.Tables[0].Lookups[0].Input = "packed"; p.Tables[0].Lookups[0].Pre = packedPre(3) }, ""},
		{"pre column range", func(p *Plan) { p.Tables[0].Lookups[0].Input = "packed"; p.Tables[0].Lookups[0].Pre = packedPre(9) },
			`tables[0] "t0" lookups[0]: pre[0] column: index 9 outside a sample of shape [4]`},
		{"pre float ids", func(p *Plan) {
			p.Tables[0].Lookups[0].Input = "packed"
			p.Tables[0].Lookups[0].Pre = []PreOp{{Op: PreColumn, Index: 1}}
		}, `tables[0] "t0" lookups[0]: pre-lookup ops end in float32 values, want integer ids (a cast)`},
		{"pre add before cast", func(p *Plan) {
			p.Tables[0].Lookups[0].Input = "packed"
			p.Tables[0].Lookups[0].Pre = []PreOp{{Op: PreColumn, Index: 1}, {Op: PreAdd, Values: []int64{1}}, {Op: PreCast, To: "int64"}}
		}, `tables[0] "t0" lookups[0]: pre[1] add: on float32 values; arithmetic needs integers (cast first)`},
		{"pre offsets length", func(p *Plan) {
			p.Tables[1].Lookups[0].Pre = []PreOp{{Op: PreAdd, Values: []int64{0, 10, 20}}}
		}, `tables[1] "t1" lookups[0]: pre[0] add: 3 values for a sample of shape [4] (want 1 or 4)`},
		{"pre bag", func(p *Plan) {
			p.Tables[1].Lookups[0].Pre = []PreOp{{Op: PreSlice, Start: 0, End: 2}}
		}, `tables[1] "t1" lookups[0]: pre-lookup ops make 2 ids per sample (shape [2]), bag is 4`},
		{"pre weights", func(p *Plan) { packedWeights(p, "w_1") }, ""},
		{"pre weights width", func(p *Plan) { packedWeights(p, "w_8") },
			`tables[1] "t1" lookups[0]: weights "w_8" hold 8 values per sample, but the pre-lookup ops make 4 ids (shape [4]): one weight per id`},
		{"pre unknown op", func(p *Plan) { p.Tables[1].Lookups[0].Pre = []PreOp{{Op: "hash"}} },
			`tables[1] "t1" lookups[0]: pre[0] hash: unknown op (want column, slice, cast, add, sub, mod, clip, where_equal or reshape)`},
		{"keys", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{0, 3}, {5, 9}} }, ""},
		{"keys in version 1", func(p *Plan) { p.Version = 1; p.Inputs[2].Keys = []KeyRange{{0, 3}} }, ""}, // advisory: no version
		{"keys empty", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{} },
			`inputs[2] "cat_1": keys is empty (leave it out when any id of the tables is a valid key)`},
		{"keys empty range", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{0, 3}, {5, 5}} }, `inputs[2] "cat_1": keys[1] [5, 5) is empty`},
		{"keys unsorted", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{5, 9}, {0, 3}} },
			`inputs[2] "cat_1": keys[1] [0, 3) does not start after keys[0] [5, 9) (ranges sorted, disjoint and apart)`},
		{"keys touching", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{0, 3}, {3, 9}} },
			`inputs[2] "cat_1": keys[1] [3, 9) does not start after keys[0] [0, 3) (ranges sorted, disjoint and apart)`},
		{"keys float", func(p *Plan) { p.Inputs[4].Keys = []KeyRange{{0, 3}} },
			`inputs[4] "packed": keys on a float32 input (keys are ids of an int64 or int32 input)`},
		{"keys too many", func(p *Plan) {
			for k := range MaxKeyRanges + 1 {
				p.Inputs[2].Keys = append(p.Inputs[2].Keys, KeyRange{int64(2 * k), int64(2*k + 1)})
			}
		}, `inputs[2] "cat_1": 257 key ranges, want at most 256`},
		{"keys overflow", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{-1 << 62, 0}, {1, 1<<62 + 2}} },
			`inputs[2] "cat_1": keys: the count of keys overflows`},
		{"keys range overflow", func(p *Plan) { p.Inputs[2].Keys = []KeyRange{{math.MinInt64, math.MaxInt64}} },
			`inputs[2] "cat_1": keys: the count of keys overflows`},
		{"keys on the cut", func(p *Plan) { p.Cut[0].Keys = []KeyRange{{0, 3}} }, `cut[0] "emb_0": keys on a tensor that is not a model input`},
		{"no dense model", func(p *Plan) { p.DenseModel = "" }, "dense_model is empty"},
		{"dense model escapes", func(p *Plan) { p.DenseModel = "../x/dense.onnx" }, `dense_model "../x/dense.onnx" is not a path inside the plan folder`},
		{"cpu model absolute", func(p *Plan) { p.CPUModel = "/etc/passwd" }, `cpu_model "/etc/passwd" is not a path inside the plan folder`},
		{"table file escapes", func(p *Plan) { p.Tables[1].File = "tables/../../t1.arrow" }, `tables[1] "t1" file "tables/../../t1.arrow" is not a path inside the plan folder`},
		{"no inputs", func(p *Plan) { p.Inputs = nil }, "inputs: none"},
		{"input twice", func(p *Plan) { p.Inputs[2].Name = "cat_0" }, `inputs[2]: input "cat_0" listed twice`},
		{"input side", func(p *Plan) { p.Inputs[0].Sides = []Side{"tpu"} }, `inputs[0] "dense": side "tpu", want "cpu" or "gpu"`},
		{"input dtype", func(p *Plan) { p.Inputs[1].DType = "" }, `inputs[1] "cat_0": dtype is empty`},
		{"no outputs", func(p *Plan) { p.Outputs = nil }, "outputs: none"},
		{"cut twice", func(p *Plan) { p.Cut[1].Name = "emb_0" }, `cut[1]: tensor "emb_0" listed twice`},
		{"cut from", func(p *Plan) { p.Cut[0].From = "gpu" }, `cut[0] "emb_0": from "gpu", want lookup, cpu or input`},
		{"table name", func(p *Plan) { p.Tables[0].Name = "" }, "tables[0]: name is empty"},
		{"table twice", func(p *Plan) { p.Tables[1].Name = "t0" }, `tables[1] "t0": listed twice`},
		{"rows", func(p *Plan) { p.Tables[0].Rows = 0 }, `tables[0] "t0": rows 0, want > 0`},
		{"dim", func(p *Plan) { p.Tables[0].Dim = -1 }, `tables[0] "t0": dim -1, want > 0`},
		{"no lookups", func(p *Plan) { p.Tables[0].Lookups = nil }, `tables[0] "t0": no lookups`},
		{"shape dim", func(p *Plan) { p.Inputs[2].Shape = []int64{-4} }, `inputs[2] "cat_1": shape [-4]: dimension -4, want -1 (unknown) or more`},
		{"shape overflow", func(p *Plan) { p.Cut[0].Shape = []int64{1 << 32, 1 << 32, 16} }, `cut[0] "emb_0": shape [4294967296 4294967296 16]: more than 16777216 values per sample`},
		{"bytes per sample", func(p *Plan) { p.Cut[0].BytesPerSample = -2 }, `cut[0] "emb_0": bytes_per_sample -2, want -1 (unknown) or more`},
		{"dim max", func(p *Plan) { p.Tables[0].Dim = MaxDim + 1 }, `tables[0] "t0": dim 1048577, want at most 1048576`},
		{"rows overflow", func(p *Plan) { p.Tables[0].Rows = 1 << 62 }, `tables[0] "t0": 4611686018427387904 rows of 16 float32 overflow a byte count`},
		{"bag max", func(p *Plan) { p.Tables[1].Lookups[0].Bag = MaxBag + 1 }, `tables[1] "t1" lookups[0]: bag 1048577, want at most 1048576`},
		{"unknown ids", func(p *Plan) { p.Tables[0].UnknownIDs = "drop" }, `tables[0] "t0": unknown_ids "drop", want error, hash or zero`},
		{"row factor outside the table", func(p *Plan) { p.Tables[0].RowFactors = map[int64]float32{p.Tables[0].Rows: 0} }, `tables[0] "t0": row_factors: row 10 factor 0, want a row in [0, 10) and a finite factor`},
		{"row factor not finite", func(p *Plan) { p.Tables[0].RowFactors = map[int64]float32{0: float32(math.Inf(1))} }, `tables[0] "t0": row_factors: row 0 factor +Inf, want a row in [0, 10) and a finite factor`},
		{"lookup input", func(p *Plan) { p.Tables[0].Lookups[0].Input = "cat_9" }, `tables[0] "t0" lookups[0]: input "cat_9" is not a model input`},
		{"lookup weights", func(p *Plan) { p.Tables[1].Lookups[0].Weights = "w_9" }, `tables[1] "t1" lookups[0]: weights "w_9" is not a model input`},
		{"bag", func(p *Plan) { p.Tables[1].Lookups[0].Bag = 0 }, `tables[1] "t1" lookups[0]: bag 0, want >= 1`},
		{"rank1 bag", func(p *Plan) { p.Tables[0].Lookups[0].Bag = 2 }, `tables[0] "t0" lookups[0]: rank1 with bag 2, want 1`},
		{"pooling", func(p *Plan) { p.Tables[1].Lookups[0].Pooling = "avg" }, `tables[1] "t1" lookups[0]: pooling "avg", want none, sum, mean or max`},
		{"output twice", func(p *Plan) { p.Tables[1].Lookups[0].Output = "emb_0" }, `tables[1] "t1" lookups[0]: output "emb_0" produced twice`},
		{"batch rewritten", func(p *Plan) { p.Batch = &BatchInfo{Exported: 8, Rewritten: []string{"/Reshape_3"}} }, ""},
		{"fixed batch", func(p *Plan) {
			p.Batch = &BatchInfo{Exported: 4, Blockers: []BatchBlocker{{Node: "/Add_7", Op: "Add", Reason: "r", Side: CPU}}}
			p.FixedBatch = 4
		}, ""},
		{"fixed batch without blockers", func(p *Plan) { p.Batch = &BatchInfo{Exported: 4}; p.FixedBatch = 4 },
			"fixed_batch 4: batch must say the model was exported at that size and name the nodes that keep it there"},
		{"fixed batch not exported", func(p *Plan) { p.FixedBatch = 4 },
			"fixed_batch 4: batch must say the model was exported at that size and name the nodes that keep it there"},
		{"blockers without fixed batch", func(p *Plan) {
			p.Batch = &BatchInfo{Exported: 4, Blockers: []BatchBlocker{{Node: "/Add_7", Op: "Add", Reason: "r"}}}
		}, "batch: 1 node(s) keep the graph at batch 4, but fixed_batch is not set"},
		{"fixed batch negative", func(p *Plan) { p.FixedBatch = -1 }, "fixed_batch -1 is negative"},
		{"blocker side", func(p *Plan) {
			p.Batch = &BatchInfo{Exported: 4, Blockers: []BatchBlocker{{Node: "n", Op: "Add", Reason: "r", Side: "tpu"}}}
			p.FixedBatch = 4
		}, `batch.blockers[0] "n": side "tpu", want "cpu" or "gpu"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := valid()
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
}

// TestWriteThroughLink: a plan.json that is a symbolic link (to a
// plan kept elsewhere) is written where it points, and stays a link
// (found by review: the rename put a regular file in its place and the
// file it pointed to kept the old plan).
func TestWriteThroughLink(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "kept.json")
	if err := os.WriteFile(target, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, File)); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, valid()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, File)); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Fatalf("plan.json is now %v (%v), want the link", fi.Mode().Type(), err)
	}
	if b, _ := os.ReadFile(target); !strings.Contains(string(b), "cpu.onnx") {
		t.Fatalf("the linked file holds %q, want the plan", b)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 1 {
		t.Fatalf("the linked file's folder holds %d entries, want the one", len(ents))
	}
}

func TestReadWrite(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, valid()); err != nil {
		t.Fatal(err)
	}
	p, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tables[1].Lookups[0].Weights != "w_1" || p.Cut[2].From != "input" || p.CPUModel != "cpu.onnx" {
		t.Fatalf("round trip lost fields: %+v", p)
	}

	// A models build folder (model.onnx, no plan.json) given for a
	// partition folder says what to run.
	built := t.TempDir()
	os.WriteFile(filepath.Join(built, "model.onnx"), nil, 0o644)
	if _, err := Read(built); err == nil || !strings.Contains(err.Error(), "holds a model, not a partition: run prism partition "+filepath.Join(built, "model.onnx")+" -o OUT") {
		t.Fatalf("Read of a model folder: %v", err)
	}

	bad := valid()
	bad.Tables[0].File = "../t0.arrow"
	if err := Write(t.TempDir(), bad); err == nil || !strings.Contains(err.Error(), "not a path inside the plan folder") {
		t.Fatalf("Write of an escaping plan: %v", err)
	}

	for _, tc := range []struct{ name, body, error string }{
		{"not json", "{", "unexpected end of JSON input"},
		{"version", `{"version": 7}`, "version 7, this build reads versions 1 to 5"},
		{"escaping table", strings.Replace(mustJSON(t, dir), `"tables/t0.arrow"`, `"/tmp/t0.arrow"`, 1), `file "/tmp/t0.arrow" is not a path inside the plan folder`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, File), []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Read(d)
			if err == nil || !strings.Contains(err.Error(), tc.error) || !strings.Contains(err.Error(), filepath.Join(d, File)) {
				t.Fatalf("error %v, want one naming the file and %q", err, tc.error)
			}
		})
	}
	if _, err := Read(t.TempDir()); err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing plan: %v", err)
	}
}

func mustJSON(t *testing.T, dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// packedWeights has t1 look up columns 0 to 3 of a packed [batch, 8]
// id input, weighted by the input weights.
func packedWeights(p *Plan, weights string) {
	p.Inputs = append(p.Inputs,
		TensorInfo{Name: "cat_8", DType: "int64", Shape: []int64{8}, Sides: []Side{CPU}},
		TensorInfo{Name: "w_8", DType: "float32", Shape: []int64{8}, Sides: []Side{CPU}})
	l := &p.Tables[1].Lookups[0]
	l.Input, l.Weights, l.Pre = "cat_8", weights, []PreOp{{Op: PreSlice, Start: 0, End: 4}}
}

// packedPre picks column k of a float [batch, 4] input and casts it.
func packedPre(k int64) []PreOp {
	return []PreOp{{Op: PreColumn, Index: k}, {Op: PreCast, To: "int64"}}
}
