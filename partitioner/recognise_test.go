package partitioner

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// TestRecogniseDataDriven runs testdata/recognise/*: one small graph per
// block, in the text form of TestInferShapesDataDriven, and what lookup
// recognition and the cut make of it. One file per pattern family.
//
//	recognise [opset=N]
//	<graph>                    (also: output NAME TYPE [DIMS]; "body [ATTR]"
//	                           ... "end" after a node: its subgraph ATTR,
//	                           "body" by default, nested blocks inside)
//	----
//	lookup TABLE ROWSxDIM: INPUT [pre OP; OP; ...] -> bag B POOLING [weights W] [offsets O [last]] -> OUTPUT
//	                           ([pre.onnx INPUTS -> IDS]: ids from pre.onnx)
//	native: NODE, ...          id-chain nodes that leave the graph
//	pre.onnx: NODE, ...        id-chain nodes cut into pre.onnx ("(kept)":
//	                           also read elsewhere, so left in the graph too)
//	not a lookup: TABLE at GATHER: REASON
//	path TABLE: INPUT -> OP -> ... -> Gather
//	cut: NAME (FROM), ...
//	error: ...                 Place failed
//
// Regenerate with -rewrite, then check every line by hand against the
// ONNX operator spec: the files are the answer, not a record.
func TestRecogniseDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/recognise", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "recognise" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			m, err := parseGraph(d.Input)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			var opset int
			if d.HasArg("opset") {
				d.ScanArgs(t, "opset", &opset)
				m.OpsetImport = []*pb.OperatorSetIdProto{{Version: int64(opset)}}
			}
			return recogniseText(m)
		})
	})
}

func recogniseText(m *pb.ModelProto) string {
	g, err := NewGraph(m)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	pl, err := Place(g, CostModel{}, nil, nil)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	var b strings.Builder
	for _, l := range pl.Lookups {
		fmt.Fprintf(&b, "lookup %s %dx%d: %s", l.table.name, l.table.rows, l.table.dim, l.ids)
		if len(l.pre) > 0 {
			fmt.Fprintf(&b, " [pre %s]", preText(l.pre))
		}
		if l.preOut != "" {
			fmt.Fprintf(&b, " [pre.onnx %s -> %s]", strings.Join(l.preInputs, ","), l.preOut)
		}
		pool := string(l.pooling)
		if l.weights != "" {
			pool += " weights " + l.weights
		}
		if l.offsets != "" {
			pool += " offsets " + l.offsets
			if l.lastOffset {
				pool += " last"
			}
		}
		rank := ""
		if l.rank1 {
			rank = " rank1"
		}
		fmt.Fprintf(&b, " -> bag %d%s %s -> %s\n", l.bag, rank, pool, l.output)
	}
	onnx := map[int]bool{}
	for _, l := range pl.Lookups {
		if l.preOut != "" {
			for _, i := range l.preNodes {
				onnx[i] = true
			}
		}
	}
	var native, preNodes []string
	for i := range pl.Pre {
		if !onnx[i] {
			native = append(native, g.Nodes[i].GetName())
		}
	}
	for i := range onnx {
		name := g.Nodes[i].GetName()
		if !pl.Pre[i] {
			name += " (kept)"
		}
		preNodes = append(preNodes, name)
	}
	sort.Strings(native)
	sort.Strings(preNodes)
	if len(native) > 0 {
		fmt.Fprintf(&b, "native: %s\n", strings.Join(native, ", "))
	}
	if len(preNodes) > 0 {
		fmt.Fprintf(&b, "pre.onnx: %s\n", strings.Join(preNodes, ", "))
	}
	for _, c := range pl.Candidates {
		if c.Reason != "" {
			fmt.Fprintf(&b, "not a lookup: %s at %s: %s\n", c.Table, c.Gather, c.Reason)
		}
		if c.Path != "" {
			fmt.Fprintf(&b, "path %s: %s\n", c.Table, c.Path)
		}
	}
	var cut []string
	for _, c := range pl.Cut {
		cut = append(cut, fmt.Sprintf("%s (%s)", c.Name, c.From))
	}
	fmt.Fprintf(&b, "cut: %s\n", strings.Join(cut, ", "))
	return b.String()
}

// preText writes pre-lookup ops compactly.
func preText(ops []plan.PreOp) string {
	var s []string
	for _, o := range ops {
		switch o.Op {
		case plan.PreColumn:
			s = append(s, fmt.Sprintf("column %d", o.Index))
		case plan.PreSlice:
			s = append(s, fmt.Sprintf("slice [%d,%d)", o.Start, o.End))
		case plan.PreCast:
			s = append(s, "cast "+o.To)
		case plan.PreAdd, plan.PreSub, plan.PreMod:
			s = append(s, fmt.Sprintf("%s %v", o.Op, o.Values))
		case plan.PreClip:
			lo, hi := "-inf", "+inf"
			if o.Min != nil {
				lo = fmt.Sprint(*o.Min)
			}
			if o.Max != nil {
				hi = fmt.Sprint(*o.Max)
			}
			s = append(s, fmt.Sprintf("clip [%s,%s]", lo, hi))
		case plan.PreWhereEqual:
			s = append(s, fmt.Sprintf("where_equal %d->%d", o.Equal, o.Default))
		case plan.PreReshape:
			s = append(s, fmt.Sprintf("reshape %v", o.Shape))
		default:
			s = append(s, string(o.Op))
		}
	}
	return strings.Join(s, "; ")
}
