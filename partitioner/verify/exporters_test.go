package verify_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// TestExporterCorpusPartitionsAndVerifies: every model of the exporter
// corpus partitions with every table taken as a lookup, and the
// partition reproduces the whole model within 1e-5 both on samples
// drawn from the plan (what prism partition --verify draws: valid ids
// worked back through the pre-lookup ops) and on the corpus's own
// valid inputs.
func TestExporterCorpusPartitionsAndVerifies(t *testing.T) {
	requireORT(t)
	for _, m := range exporters.Corpus(5) {
		t.Run(m.Name, func(t *testing.T) {
			model, out, res := partitionCorpus(t, m)
			if len(res.Plan.Tables) == 0 {
				t.Fatalf("no lookups:\n%s", res.Report())
			}
			for _, in := range res.Plan.Inputs {
				if in.Keys != nil {
					// No key map: every id in [0, rows) is valid.
					t.Errorf("input %q: keys %v in a model without a key map", in.Name, in.Keys)
				}
			}
			rep, err := verify.Verify(model, out, 500, 1)
			if err != nil {
				t.Fatalf("verify on the plan's samples: %v\n%s", err, res.Report())
			}
			src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 2, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			rep2, err := verify.VerifySource(model, out, src, 500)
			if err != nil {
				t.Fatalf("verify on the corpus's samples: %v\n%s", err, res.Report())
			}
			t.Logf("%d tables; max abs error %.2g (plan's samples), %.2g (corpus's)", len(res.Plan.Tables), rep.MaxAbsErr, rep2.MaxAbsErr)
		})
	}
}

// TestExporterBrokenTwins: each broken pattern is refused with an error
// naming the table and why.
func TestExporterBrokenTwins(t *testing.T) {
	for _, m := range exporters.Broken(5) {
		t.Run(m.Name, func(t *testing.T) {
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			if err := m.Write(model); err != nil {
				t.Fatal(err)
			}
			_, err := partitioner.Partition(model, filepath.Join(dir, "part"), partitioner.Options{})
			if !errors.Is(err, partitioner.ErrUnrecognised) || !strings.Contains(err.Error(), m.WantErr) {
				t.Fatalf("got %v\nwant ErrUnrecognised saying %q", err, m.WantErr)
			}
			t.Log(err)
		})
	}
}

// TestExporterFixedBatch: models exported without dynamic axes. The
// rewritable one partitions to a symbolic batch (its Reshape constants
// rewritten) and the parts equal the model, run at its exported batch,
// at batch sizes other than the exported one; the other keeps its
// exported batch, names the node that ties it there, and verifies at
// that size.
func TestExporterFixedBatch(t *testing.T) {
	requireORT(t)
	for _, m := range exporters.FixedBatch(5) {
		t.Run(m.Name, func(t *testing.T) {
			model, out, res := partitionCorpus(t, m)
			p := res.Plan
			if p.Batch == nil || p.Batch.Exported != m.Batch || len(p.Tables) == 0 {
				t.Fatalf("batch %+v, %d tables; want exported %d\n%s", p.Batch, len(p.Tables), m.Batch, res.Report())
			}
			rep, err := verify.Verify(model, out, 300, 1)
			if err != nil {
				t.Fatalf("verify: %v\n%s", err, res.Report())
			}
			src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 2, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := verify.VerifySource(model, out, src, 300); err != nil {
				t.Fatalf("verify on the corpus's samples: %v", err)
			}
			if m.BlockedBy == "" {
				if p.FixedBatch != 0 || len(p.Batch.Rewritten) == 0 || len(p.Batch.Blockers) != 0 {
					t.Fatalf("want a rewrite to a symbolic batch, got fixed_batch %d, batch %+v\n%s", p.FixedBatch, p.Batch, res.Report())
				}
				for _, s := range rep.BatchSizes {
					if s == int(m.Batch) {
						t.Fatalf("verified at the exported batch %d: %v", s, rep.BatchSizes)
					}
				}
				if len(rep.BatchSizes) < 3 {
					t.Fatalf("verified at batch sizes %v only", rep.BatchSizes)
				}
			} else {
				if p.FixedBatch != m.Batch || len(p.Batch.Blockers) != 1 || p.Batch.Blockers[0].Node != strings.TrimSuffix(m.BlockedBy, "_output_0") {
					t.Fatalf("want fixed_batch %d blocked by %q, got %d, %+v\n%s", m.Batch, m.BlockedBy, p.FixedBatch, p.Batch, res.Report())
				}
				if len(rep.BatchSizes) != 1 || rep.BatchSizes[0] != int(m.Batch) {
					t.Fatalf("verified at %v, want the fixed batch %d only", rep.BatchSizes, m.Batch)
				}
				if !strings.Contains(res.Report(), "batch: FIXED at 4") {
					t.Fatalf("the report does not say the batch is fixed:\n%s", res.Report())
				}
				if want := m.BlockedSide; p.Batch.Blockers[0].Side != want {
					t.Fatalf("blocker on side %q, want %q\n%s", p.Batch.Blockers[0].Side, want, res.Report())
				}
			}
			t.Logf("batch sizes %v, max abs error %.2g\n%s", rep.BatchSizes, rep.MaxAbsErr, res.Report())
		})
	}
}

// partitionCorpus writes the corpus model m into a test folder and
// partitions it with the default options: the model's path, the
// partition folder and the result.
func partitionCorpus(t *testing.T, m *exporters.Model) (model, out string, res *partitioner.Result) {
	t.Helper()
	dir := t.TempDir()
	model = filepath.Join(dir, "model.onnx")
	if err := m.Write(model); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return model, out, res
}

// TestExporterHugeCTR: the models NVIDIA HugeCTR's hugectr2onnx writes
// ([batch, slots, nnz] hash keys remapped to rows through the shared
// key_to_indice_hash_all_tables, or each layer's own <top>_hash_table in
// the newest converter, pooled per slot by sum or mean) partition
// into one lookup per slot, the remap run in pre.onnx, and the partition
// reproduces the whole model within 1e-5 on the models' valid keys.
func TestExporterHugeCTR(t *testing.T) {
	requireORT(t)
	want := map[string][]string{ // per lookup: table, bag, pooling
		"hugectr-wdl": {"sparse_embedding2_embedding_table 3 sum", "sparse_embedding1_embedding_table 2 mean",
			"sparse_embedding1_embedding_table 2 mean", "sparse_embedding1_embedding_table 2 mean"},
		"hugectr-dlrm":       {"sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum"},
		"hugectr-dcn":        {"sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum"},
		"hugectr-deepfm":     {"sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum"},
		"hugectr-deepfm-v32": {"sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum", "sparse_embedding1_embedding_table 1 sum"},
		"hugectr-wdl-2503": {"sparse_embedding2_embedding_table 3 sum", "sparse_embedding1_embedding_table 2 mean",
			"sparse_embedding1_embedding_table 2 mean", "sparse_embedding1_embedding_table 2 mean"},
	}
	for _, m := range exporters.HugeCTR(5) {
		t.Run(m.Name, func(t *testing.T) {
			model, out, res := partitionCorpus(t, m)
			var got []string
			for _, tb := range res.Plan.Tables {
				for _, l := range tb.Lookups {
					got = append(got, fmt.Sprintf("%s %d %s", tb.Name, l.Bag, l.Pooling))
				}
			}
			if !slices.Equal(got, want[m.Name]) {
				t.Fatalf("lookups %q, want %q\n%s", got, want[m.Name], res.Report())
			}
			src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 2, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := verify.VerifySource(model, out, src, 500)
			if err != nil {
				t.Fatalf("verify on the model's samples: %v\n%s", err, res.Report())
			}
			t.Logf("max abs error %.2g\n%s", rep.MaxAbsErr, res.Report())
			// Samples drawn from the plan, as prism partition --verify,
			// prism score --plan and prism loadgen --plan draw them:
			// keys the shared map sends to valid rows of every table
			// the input reaches (plan.json's keys), Zipf or uniform.
			// Ids in [0, rows) sent other tables' keys, and keys past
			// the map, out of bounds.
			for _, in := range res.Plan.Inputs {
				// The v32 layout reserves no row: the map sends every key
				// below the table's rows to a row (untrained ones to row
				// 0), and the ids drawn without keys are all valid.
				keyed := in.DType == "int64" && m.Name != "hugectr-deepfm-v32"
				if keyed != (len(in.Keys) > 0) {
					t.Errorf("input %q (%s): keys %v, want keys on the key inputs alone", in.Name, in.DType, in.Keys)
				}
			}
			if _, err := verify.Verify(model, out, 296, 3); err != nil {
				t.Fatalf("verify on samples drawn from the plan: %v\n%s", err, res.Report())
			}
			sig, err := models.PlanSignature(res.Plan)
			if err != nil {
				t.Fatal(err)
			}
			src, err = models.NewSynthetic(sig, models.SyntheticOptions{Seed: 4, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := verify.VerifySource(model, out, src, 296); err != nil {
				t.Fatalf("verify on uniform samples drawn from the plan: %v\n%s", err, res.Report())
			}
		})
	}
}

// TestExporterMultiTaskShape: a model whose output has more than one
// value per sample (HugeCTR's label_dim 2: [None, 2], one sigmoid per
// task) gets that per-sample shape in plan.json even where shape
// inference does not reach the output (the opset-10 Pad before it): the
// plan said [] (one score per sample), so the dense tier, which refuses
// a first output of more than one value per sample, loaded it and served
// the tasks' values as scores.
func TestExporterMultiTaskShape(t *testing.T) {
	requireORT(t)
	m := exporters.HugeCTRMultiTask(5)
	_, _, res := partitionCorpus(t, m)
	outs := res.Plan.Outputs
	if len(outs) != 1 || outs[0].Name != "output" || !slices.Equal(outs[0].Shape, []int64{2}) {
		t.Fatalf("plan outputs %+v, want output of per-sample shape [2]", outs)
	}
}

// TestExporterHugeCTRExternalKeyMap: a key map stored as external data
// (a real key_to_indice_hash_all_tables holds every key of every table)
// gives plan.json the same keys as an inline one, and samples drawn
// from the plan verify.
func TestExporterHugeCTRExternalKeyMap(t *testing.T) {
	requireORT(t)
	m := exporters.ByName("hugectr-wdl", 5)
	_, _, inline := partitionCorpus(t, m)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, m.Proto, pb.WriteOptions{External: pb.ExternalAlways, MinExternalBytes: 64}); err != nil {
		t.Fatal(err)
	}
	meta, err := pb.ReadModel(model, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, init := range meta.GetGraph().GetInitializer() {
		if init.GetName() == "key_to_indice_hash_all_tables" && init.GetDataLocation() != pb.TensorProto_EXTERNAL {
			t.Fatal("the key map was written inline")
		}
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range res.Plan.Inputs {
		if !slices.Equal(in.Keys, inline.Plan.Inputs[i].Keys) {
			t.Errorf("input %q: keys %v with the map external, %v inline", in.Name, in.Keys, inline.Plan.Inputs[i].Keys)
		}
	}
	if _, err := verify.Verify(model, out, 296, 3); err != nil {
		t.Fatalf("verify on samples drawn from the plan: %v\n%s", err, res.Report())
	}
}

// TestExporterTaskOutputs: a multi-task model exported with one output
// per task (HugeCTR's shared-bottom sample: 50k_label and
// married_label, each [None, 1]; a [None, 0] dense input no node reads)
// partitions into a plan whose scores are both outputs, in the model's
// order (task_outputs 2, version 5), and verifies against the whole
// model on both. Before, the plan served the first output alone and the
// second task was dropped without a word; --tasks picks and orders them.
func TestExporterTaskOutputs(t *testing.T) {
	requireORT(t)
	m := exporters.HugeCTRSharedBottom(5)
	model, out, res := partitionCorpus(t, m)
	p := res.Plan
	names, err := p.TaskNames()
	if err != nil || p.TaskOutputs != 2 || p.Version != 5 || !slices.Equal(names, []string{"50k_label", "married_label"}) {
		t.Fatalf("task outputs %d, version %d, tasks %q, %v; want both labels at version 5\n%s", p.TaskOutputs, p.Version, names, err, res.Report())
	}
	if !strings.Contains(res.Report(), "scores: 2 tasks a sample, in this order: 50k_label, married_label") {
		t.Errorf("the report does not name the tasks:\n%s", res.Report())
	}
	rep, err := verify.Verify(model, out, 296, 3)
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
	t.Logf("max abs error %.2g\n%s", rep.MaxAbsErr, res.Report())
	for _, tc := range []struct {
		tasks []string
		want  []string
		n     int
		err   string
	}{
		{[]string{"married_label"}, []string{"married_label"}, 0, ""},
		{[]string{"married_label", "50k_label"}, []string{"married_label", "50k_label"}, 2, ""},
		{[]string{"ctr"}, nil, 0, `--tasks "ctr": the model has no output of that name (outputs: "50k_label", "married_label")`},
		{[]string{"50k_label", "50k_label"}, nil, 0, `--tasks "50k_label": named twice`},
	} {
		res, err := partitioner.Partition(model, filepath.Join(t.TempDir(), "p"), partitioner.Options{Tasks: tc.tasks})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("--tasks %q: %v; want an error with %q", tc.tasks, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("--tasks %q: %v", tc.tasks, err)
		}
		names, _ := res.Plan.TaskNames()
		if !slices.Equal(names, tc.want) || res.Plan.TaskOutputs != tc.n || res.Plan.Version != 4+min(tc.n/2, 1) {
			t.Errorf("--tasks %q: tasks %q (task_outputs %d, version %d), want %q", tc.tasks, names, res.Plan.TaskOutputs, res.Plan.Version, tc.want)
		}
	}
}

// TestExporterTorchTupleHeads: a PyTorch module returning a tuple of
// heads, exported with output_names (ctr [batch, 1], cvr squeezed to
// [batch]), partitions into a plan serving both, ctr first (the model's
// order), at version 5, and verifies against the whole model.
func TestExporterTorchTupleHeads(t *testing.T) {
	requireORT(t)
	model, out, res := partitionCorpus(t, exporters.TorchTupleHeads(5))
	p := res.Plan
	names, err := p.TaskNames()
	if err != nil || p.TaskOutputs != 2 || p.Version != 5 || !slices.Equal(names, []string{"ctr", "cvr"}) {
		t.Fatalf("task outputs %d, version %d, tasks %q, %v; want ctr and cvr at version 5\n%s", p.TaskOutputs, p.Version, names, err, res.Report())
	}
	if !slices.Equal(p.Outputs[1].Shape, []int64{}) || !slices.Equal(p.Outputs[0].Shape, []int64{1}) {
		t.Errorf("output shapes %v and %v, want [1] and []", p.Outputs[0].Shape, p.Outputs[1].Shape)
	}
	rep, err := verify.Verify(model, out, 200, 3)
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
	t.Logf("max abs error %.2g\n%s", rep.MaxAbsErr, res.Report())
}

// TestExporterPaddle: PaddleRec's models as Paddle2ONNX writes them
// (every weight a Constant node, one int64 [-1, 1] input per slot, each
// input's batch a DynamicDimension symbol of its own) partition with
// every table a lookup and reproduce the whole model within 1e-5, on
// the plan's samples and on the models' own. DeepFM's tables have
// padding_idx 0, which Paddle2ONNX writes as Gather(Mul(W, mask)) with
// a mask Constant as large as the table: the table is W with the
// padding row zeroed, and neither cpu.onnx nor dense.onnx keeps W or
// the mask. Before, the Mul hid the tables: the plan had no lookup, W
// and the mask stayed in cpu.onnx (the whole table multiplied on every
// request), and verify refused the plan (an id input no table reads).
func TestExporterPaddle(t *testing.T) {
	requireORT(t)
	want := map[string][]string{ // per lookup: table, input, bag, pooling
		"paddle-wide-deep":           {"SparseFeatFactors 1 1 none", "SparseFeatFactors 2 1 none", "SparseFeatFactors 3 1 none"},
		"paddle-wide-deep-lookup-v1": {"SparseFeatFactors 1 1 none", "SparseFeatFactors 2 1 none", "SparseFeatFactors 3 1 none"},
		"paddle-deepfm":              {"embedding_0.w_0 C1 3 sum", "embedding_1.w_0 C1 3 none"},
	}
	for _, m := range exporters.Paddle(5) {
		t.Run(m.Name, func(t *testing.T) {
			model, out, res := partitionCorpus(t, m)
			var got []string
			for _, tb := range res.Plan.Tables {
				for _, l := range tb.Lookups {
					got = append(got, fmt.Sprintf("%s %s %d %s", tb.Name, l.Input, l.Bag, l.Pooling))
				}
			}
			if !slices.Equal(got, want[m.Name]) {
				t.Fatalf("lookups %q, want %q\n%s", got, want[m.Name], res.Report())
			}
			// The padding row is recorded, so the embedding tier zeroes
			// it in an online update as the table was written.
			for _, tb := range res.Plan.Tables {
				padded := m.Name == "paddle-deepfm"
				if f, ok := tb.RowFactors[0]; padded != ok || (ok && (f != 0 || len(tb.RowFactors) != 1)) {
					t.Errorf("table %q: row_factors %v, want {0: 0} for padding_idx 0 (%v)", tb.Name, tb.RowFactors, padded)
				}
			}
			for _, f := range []string{partitioner.CPUFile, partitioner.DenseFile} {
				sub, err := pb.ReadModel(filepath.Join(out, f), pb.ReadOptions{})
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range sub.GetGraph().GetNode() {
					for _, a := range n.GetAttribute() {
						for _, tb := range res.Plan.Tables {
							if a.GetT() != nil && slices.Equal(a.GetT().GetDims(), []int64{tb.Rows, int64(tb.Dim)}) {
								t.Errorf("%s holds Constant %q %v, the shape of table %q", f, n.GetOutput()[0], a.GetT().GetDims(), tb.Name)
							}
						}
					}
				}
			}
			rep, err := verify.Verify(model, out, 500, 1)
			if err != nil {
				t.Fatalf("verify on the plan's samples: %v\n%s", err, res.Report())
			}
			src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 2, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			rep2, err := verify.VerifySource(model, out, src, 500)
			if err != nil {
				t.Fatalf("verify on the model's samples: %v\n%s", err, res.Report())
			}
			t.Logf("max abs error %.2g (plan's samples), %.2g (model's)\n%s", rep.MaxAbsErr, rep2.MaxAbsErr, res.Report())
		})
	}
}

// TestExporterPaddleExternalData: a Paddle2ONNX model over 2 GB keeps
// every Constant's value larger than 128 bytes as external data
// (ModelExporter::SaveExternalData), the padding masks among them: the
// masks are read from the data file, and DeepFM partitions into its two
// lookups and verifies as it does inline.
func TestExporterPaddleExternalData(t *testing.T) {
	requireORT(t)
	m := exporters.ByName("paddle-deepfm", 5)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, m.Proto, pb.WriteOptions{External: pb.ExternalAlways, MinExternalBytes: 129}); err != nil {
		t.Fatal(err)
	}
	meta, err := pb.ReadModel(model, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		t.Fatal(err)
	}
	external := 0
	for _, tt := range pb.Tensors(meta) {
		if tt.GetDataLocation() == pb.TensorProto_EXTERNAL && slices.Equal(tt.GetDims(), []int64{50, 4}) {
			external++
		}
	}
	if external != 2 {
		t.Fatalf("%d [50 4] tensors external, want the table and its mask", external)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tb := range res.Plan.Tables {
		got = append(got, tb.Name)
	}
	if !slices.Equal(got, []string{"embedding_0.w_0", "embedding_1.w_0"}) {
		t.Fatalf("tables %q, want both embeddings\n%s", got, res.Report())
	}
	if _, err := verify.Verify(model, out, 296, 3); err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
}

// TestExporterPaddleMultiTask: PaddleRec's ESMM as Paddle2ONNX writes
// it (bags of ids padded with 0, one table with padding_idx 0 read by
// every field through a mask of its own, two softmax heads [B, 2] as
// outputs) partitions into one table of three sum-pooled lookups, serves
// the first head's two values by default and says the second is not
// served (before, the report named the first alone and the ctcvr head
// was dropped without a word), and serves both heads with --tasks; both
// verify against the whole model.
func TestExporterPaddleMultiTask(t *testing.T) {
	requireORT(t)
	m := exporters.PaddleMultiTask(5)
	model, out, res := partitionCorpus(t, m)
	var got []string
	for _, tb := range res.Plan.Tables {
		for _, l := range tb.Lookups {
			got = append(got, fmt.Sprintf("%s %s %d %s", tb.Name, l.Input, l.Bag, l.Pooling))
		}
	}
	want := []string{"SparseFeatFactors field_0 3 sum", "SparseFeatFactors field_1 3 sum", "SparseFeatFactors field_2 3 sum"}
	if !slices.Equal(got, want) {
		t.Fatalf("lookups %q, want %q\n%s", got, want, res.Report())
	}
	if k, err := res.Plan.Tasks(); err != nil || k != 2 {
		t.Fatalf("tasks %d, %v; want the first head's 2\n%s", k, err, res.Report())
	}
	if !strings.Contains(res.Report(), `not served: output "save_infer_model/scale_1.tmp_0" [2]`) {
		t.Errorf("the report does not say the second head is not served:\n%s", res.Report())
	}
	if _, err := verify.Verify(model, out, 296, 3); err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
	heads := []string{"save_infer_model/scale_0.tmp_0", "save_infer_model/scale_1.tmp_0"}
	out2 := filepath.Join(t.TempDir(), "both")
	res2, err := partitioner.Partition(model, out2, partitioner.Options{Tasks: heads})
	if err != nil {
		t.Fatal(err)
	}
	if k, err := res2.Plan.Tasks(); err != nil || k != 4 || strings.Contains(res2.Report(), "not served") {
		t.Fatalf("--tasks both heads: tasks %d, %v; want 4\n%s", k, err, res2.Report())
	}
	if _, err := verify.Verify(model, out2, 296, 3); err != nil {
		t.Fatalf("verify with both heads: %v\n%s", err, res2.Report())
	}
}
