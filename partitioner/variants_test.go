package partitioner_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// TestPartitionVariantsDataDriven runs testdata/variants/*: graphs in
// the text form of TestInferShapesDataDriven (float initializers filled
// with seeded values) as exporters write them, partitioned to a folder
// and verified against the whole model in ONNX Runtime.
//
//	partition [opset=N] [external]
//	<graph>                          (external: tensors of 1 KiB and
//	                                 more in model.onnx.data)
//	----
//	table NAME ROWSxDIM FILE: one line per table of plan.json
//	lookup TABLE: INPUT [pre N] [pre.onnx OUT] bag B [rank1] POOLING [weights W] -> OUTPUT
//	cut NAME [SHAPE]
//	cut NAME not servable: DTYPE SHAPE  (not float32 of a known shape)
//	outputs NAME,...                 plan.json's outputs, when more than one
//	verify: ok | the error
//	error (unrecognised BOOL): ...   Partition failed
func TestPartitionVariantsDataDriven(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	datadriven.Walk(t, "testdata/variants", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			m, err := partitioner.ParseGraph(d.Input)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			if d.HasArg("opset") {
				var opset int
				d.ScanArgs(t, "opset", &opset)
				imports := m.OpsetImport
				for _, f := range m.Functions {
					imports = append(imports, f.OpsetImport...)
				}
				for _, o := range imports {
					if o.GetDomain() == "" {
						o.Version = int64(opset)
					}
				}
			}
			nameBodies(m.Graph)
			for _, f := range m.Functions {
				nameBodies(&pb.GraphProto{Node: f.Node})
			}
			r := rand.New(rand.NewPCG(1, 2))
			for _, in := range m.Graph.Initializer {
				if in.GetDataType() == int32(pb.TensorProto_BOOL) && len(in.Int32Data) == 0 {
					in.Int32Data = []int32{1} // a Loop's condition: true
				}
				if in.GetDataType() == int32(pb.TensorProto_FLOAT) && len(in.FloatData) == 0 {
					n := int64(1)
					for _, d := range in.Dims {
						n *= d
					}
					in.FloatData = make([]float32, n)
					for i := range in.FloatData {
						in.FloatData[i] = float32(r.NormFloat64())
					}
				}
			}
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			wo := pb.WriteOptions{External: pb.ExternalNever}
			if d.HasArg("external") {
				wo.External = pb.ExternalAlways // tensors of 1 KiB and more
			}
			if err := pb.WriteModel(model, m, wo); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "part")
			res, err := partitioner.Partition(model, out, partitioner.Options{})
			var b strings.Builder
			if err != nil {
				fmt.Fprintf(&b, "error (unrecognised %v): %v\n", errors.Is(err, partitioner.ErrUnrecognised), err)
				return strings.ReplaceAll(b.String(), dir, "DIR")
			}
			for _, tb := range res.Plan.Tables {
				fmt.Fprintf(&b, "table %s %dx%d %s\n", tb.Name, tb.Rows, tb.Dim, tb.File)
			}
			for _, tb := range res.Plan.Tables {
				for _, l := range tb.Lookups {
					fmt.Fprintf(&b, "lookup %s: %s", tb.Name, l.Input)
					if len(l.Pre) > 0 {
						fmt.Fprintf(&b, " pre %d", len(l.Pre))
					}
					if l.PreOutput != "" {
						fmt.Fprintf(&b, " pre.onnx %s", l.PreOutput)
					}
					fmt.Fprintf(&b, " bag %d", l.Bag)
					if l.Offsets != "" {
						fmt.Fprintf(&b, " offsets %s", l.Offsets)
						if l.LastOffset {
							b.WriteString(" last")
						}
					}
					if l.Rank1 {
						b.WriteString(" rank1")
					}
					fmt.Fprintf(&b, " %s", l.Pooling)
					if l.Weights != "" {
						fmt.Fprintf(&b, " weights %s", l.Weights)
					}
					fmt.Fprintf(&b, " -> %s\n", l.Output)
				}
			}
			for _, c := range res.Plan.Cut {
				fmt.Fprintf(&b, "cut %s %v\n", c.Name, c.Shape)
				// The tiers send float32 rows of a known shape only.
				if c.DType != "float32" || slices.ContainsFunc(c.Shape, func(d int64) bool { return d < 0 }) {
					fmt.Fprintf(&b, "cut %s not servable: %s %v\n", c.Name, c.DType, c.Shape)
				}
			}
			if len(res.Plan.Outputs) > 1 {
				var names []string
				for _, o := range res.Plan.Outputs {
					names = append(names, o.Name)
				}
				fmt.Fprintf(&b, "outputs %s\n", strings.Join(names, ","))
			}
			rep, err := verify.Verify(model, out, 64, 1)
			switch {
			case err != nil:
				fmt.Fprintf(&b, "verify: %v\n", err)
			case rep.MaxAbsErr > verify.Tolerance:
				fmt.Fprintf(&b, "verify: max abs error %g\n", rep.MaxAbsErr)
			default:
				b.WriteString("verify: ok\n")
			}
			t.Log(res.Report())
			return strings.ReplaceAll(b.String(), dir, "DIR")
		})
	})
}

// nameBodies names the subgraphs of g's nodes (ONNX Runtime requires a
// graph name; the text form gives none).
func nameBodies(g *pb.GraphProto) {
	for _, n := range g.GetNode() {
		for _, a := range n.GetAttribute() {
			if b := a.GetG(); b != nil {
				if b.Name == "" {
					b.Name = n.GetName() + "_" + a.GetName()
				}
				nameBodies(b)
			}
		}
	}
}
