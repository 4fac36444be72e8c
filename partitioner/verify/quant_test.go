package verify_test

import (
	"errors"
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
	"github.com/prism-serve/prism/plan"
)

// TestQuantizedExporters: models after ONNX Runtime's quantization
// tools and onnxconverter-common's float16 conversion partition with
// every table a lookup (an int8 or uint8 table dequantized before its
// Gather or only its rows after it, a float16 table read directly),
// neither cpu.onnx nor dense.onnx holds a table (no DequantizeLinear or
// Cast of a whole table runs per request: the store holds its float32
// values), every bag is pooled by its lookup, and the partition reproduces the whole model within 1e-5 on
// the plan's samples and on the corpus's own. quantize_dynamic's
// models partition only with AllowBatchDependent (see
// TestDynamicQuantBatchDependent).
func TestQuantizedExporters(t *testing.T) {
	requireORT(t)
	wantTables := map[string][]string{
		"ort-dynamic-quant":             {"emb_l.0.weight", "emb_l.1.weight", "bag.weight"},
		"ort-dynamic-quant-per-channel": {"emb_l.0.weight", "emb_l.1.weight", "bag.weight"},
		"ort-qdq-static":                {"emb_l.0.weight", "emb_l.1.weight"},
		"ort-qdq-gather-int8":           {"user.weight", "items.weight"},
		"fp16-keep-io-types":            {"emb_l.0.weight_float", "emb_l.1.weight_float", "bag.weight_float"},
	}
	for _, m := range exporters.Quantized(5) {
		t.Run(m.Name, func(t *testing.T) {
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			if err := m.Write(model); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "part")
			res, err := partitioner.Partition(model, out, partitioner.Options{AllowBatchDependent: strings.HasPrefix(m.Name, "ort-dynamic")})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tb := range res.Plan.Tables {
				got = append(got, tb.Name)
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(wantTables[m.Name]))
			if !slices.Equal(got, want) {
				t.Fatalf("tables %v, want %v\n%s", got, want, res.Report())
			}
			// Every bag of the corpus is pooled: the lookup pools it (a
			// float16 bag in float32, cast after), and one row crosses.
			for _, tb := range res.Plan.Tables {
				for _, l := range tb.Lookups {
					if l.Bag > 1 && l.Pooling == plan.PoolNone {
						t.Errorf("table %q: a bag of %d not pooled by its lookup\n%s", tb.Name, l.Bag, res.Report())
					}
				}
			}
			for _, c := range res.Placement.Candidates {
				if c.Reason != "" {
					t.Fatalf("table %q not a lookup: %s", c.Table, c.Reason)
				}
			}
			for _, f := range []string{partitioner.CPUFile, partitioner.DenseFile} {
				path := filepath.Join(out, f)
				if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
					continue
				}
				sub, err := pb.ReadModel(path, pb.ReadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for _, init := range sub.GetGraph().GetInitializer() {
					for _, tb := range res.Plan.Tables {
						if slices.Equal(init.GetDims(), []int64{tb.Rows, int64(tb.Dim)}) {
							t.Errorf("%s holds %q %v, the shape of table %q", f, init.GetName(), init.GetDims(), tb.Name)
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
				t.Fatalf("verify on the corpus's samples: %v\n%s", err, res.Report())
			}
			t.Logf("max abs error %.2g (plan's samples), %.2g (corpus's)", rep.MaxAbsErr, rep2.MaxAbsErr)
		})
	}
}

// TestDynamicQuantBatchDependent: a model whose MatMuls
// quantize_dynamic quantized (DynamicQuantizeLinear: one scale for the
// whole batch) is refused with ErrBatchDependent naming the node, and
// --report-only says so; one quantized in the QDQ format (fixed scales)
// or with its tables quantized only is not.
func TestDynamicQuantBatchDependent(t *testing.T) {
	for _, name := range []string{"ort-dynamic-quant", "ort-dynamic-quant-per-channel", "ort-qdq-static", "ort-qdq-gather-int8"} {
		dir := t.TempDir()
		model := filepath.Join(dir, "model.onnx")
		if err := exporters.ByName(name, 5).Write(model); err != nil {
			t.Fatal(err)
		}
		_, err := partitioner.Partition(model, filepath.Join(dir, "part"), partitioner.Options{})
		dynamic := strings.HasPrefix(name, "ort-dynamic")
		if dynamic != errors.Is(err, partitioner.ErrBatchDependent) || (dynamic && !strings.Contains(err.Error(), `DynamicQuantizeLinear "dense_QuantizeLinear"`)) {
			t.Fatalf("%s: got %v, want ErrBatchDependent: %v", name, err, dynamic)
		}
		if !dynamic && err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := partitioner.Partition(model, "", partitioner.Options{ReportOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Report(), "BATCH-DEPENDENT") != dynamic {
			t.Fatalf("%s: report:\n%s", name, res.Report())
		}
	}
}

// TestQOperatorFormatRefused: a model in ONNX Runtime's QOperator
// format (com.microsoft QLinear ops) is refused with an error that says
// to quantize in the QDQ format.
func TestQOperatorFormatRefused(t *testing.T) {
	m := exporters.QOperatorStatic(5)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := m.Write(model); err != nil {
		t.Fatal(err)
	}
	_, err := partitioner.Partition(model, filepath.Join(dir, "part"), partitioner.Options{})
	if err == nil || !strings.Contains(err.Error(), m.WantErr) || !strings.Contains(err.Error(), `QLinearConcat`) {
		t.Fatalf("got %v, want an error saying %q", err, m.WantErr)
	}
	t.Log(err)
}

// TestFloat16InputsRefused: a model converted to float16 without
// keep_io_types (a float16 input the tiers do not send) is refused with
// an error that says to keep the inputs float32.
func TestFloat16InputsRefused(t *testing.T) {
	m := exporters.FP16NoKeepIO(5)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := m.Write(model); err != nil {
		t.Fatal(err)
	}
	_, err := partitioner.Partition(model, filepath.Join(dir, "part"), partitioner.Options{})
	if !errors.Is(err, partitioner.ErrUnsendable) || !strings.Contains(err.Error(), m.WantErr) || !strings.Contains(err.Error(), `"dense" (float16`) {
		t.Fatalf("got %v, want ErrUnsendable saying %q", err, m.WantErr)
	}
}
