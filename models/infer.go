package models

import (
	"encoding/binary"
	"fmt"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// InferSignature reads the inputs of any recommendation model from its
// graph, so samples can be drawn for models the zoo did not build: a float
// input [batch, k] is k dense features; an integer input [batch] or
// [batch, bag] is a sparse feature whose id range is the row count of the
// table it indexes (the data of the Gather it feeds, through Cast or
// Identity; the smallest table when it indexes several); a [batch, n] integer input whose columns TorchScript's
// x[:, k] picks (Gather axis 1, scalar k) gets each column's range. m may be read with SkipExternalData: only dims are used.
func InferSignature(m *pb.ModelProto) (Signature, error) {
	g := m.GetGraph()
	inits := map[string]*pb.TensorProto{}
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = t
	}
	producer := map[string]*pb.NodeProto{}
	consumers := map[string][]*pb.NodeProto{}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			producer[o] = n
		}
		for _, in := range n.GetInput() {
			consumers[in] = append(consumers[in], n)
		}
	}
	// tableRows follows Cast/Identity/Concat(axis 0) back to initializers
	// and returns the table's row count (0 if it is not a table).
	var tableRows func(name string, depth int) int64
	tableRows = func(name string, depth int) int64 {
		if depth > 8 {
			return 0
		}
		if t, ok := inits[name]; ok {
			if len(t.GetDims()) < 2 {
				return 0
			}
			return t.GetDims()[0]
		}
		p, ok := producer[name]
		if !ok {
			return 0
		}
		switch p.GetOpType() {
		case "Cast", "Identity":
			return tableRows(p.GetInput()[0], depth+1)
		case "Concat":
			if attrAxis(p) != 0 {
				return 0
			}
			var rows int64
			for _, in := range p.GetInput() {
				r := tableRows(in, depth+1)
				if r == 0 {
					return 0
				}
				rows += r
			}
			return rows
		}
		return 0
	}
	// rowsFor finds the tables an id tensor indexes, looking through
	// Cast/Identity/Reshape/Flatten applied to the ids, and returns the
	// smallest one's rows: ids shared by several tables must be valid
	// in each (as PlanSignature takes them).
	var rowsFor func(name string, depth int) int64
	rowsFor = func(name string, depth int) int64 {
		if depth > 4 {
			return 0
		}
		var rows int64
		smallest := func(r int64) {
			if r > 0 && (rows == 0 || r < rows) {
				rows = r
			}
		}
		for _, n := range consumers[name] {
			switch n.GetOpType() {
			case "Gather":
				if len(n.GetInput()) == 2 && n.GetInput()[1] == name && attrAxis(n) == 0 {
					smallest(tableRows(n.GetInput()[0], 0))
				}
			case "Cast", "Identity", "Reshape", "Flatten", "Unsqueeze", "Squeeze":
				smallest(rowsFor(n.GetOutput()[0], depth+1))
			}
		}
		return rows
	}
	// packedRanges: a [batch, width] id input whose every column k is
	// picked by Gather(axis=1) with the scalar constant k (TorchScript's
	// x[:, k]) and indexes a table gets each column's row range; nil if
	// any column does not.
	packedRanges := func(name string, width int) []IDRange {
		rows := make([]int64, width)
		for _, n := range consumers[name] {
			if n.GetOpType() != "Gather" || len(n.GetInput()) != 2 || n.GetInput()[0] != name || attrAxis(n) != 1 {
				continue
			}
			t, ok := inits[n.GetInput()[1]]
			if !ok || len(t.GetDims()) != 0 {
				continue
			}
			var k int64
			switch {
			case len(t.GetInt64Data()) == 1:
				k = t.GetInt64Data()[0]
			case len(t.GetRawData()) == 8:
				k = int64(binary.LittleEndian.Uint64(t.GetRawData()))
			default:
				continue
			}
			if k < 0 {
				k += int64(width)
			}
			if k < 0 || k >= int64(width) {
				continue
			}
			if r := rowsFor(n.GetOutput()[0], 0); r > 0 {
				rows[k] = r
			}
		}
		out := make([]IDRange, width)
		for k, r := range rows {
			if r <= 0 {
				return nil
			}
			out[k] = IDRange{Lo: 0, Hi: r}
		}
		return out
	}
	var sig Signature
	for _, vi := range g.GetInput() {
		if _, isInit := inits[vi.GetName()]; isInit {
			continue // old exporters list initializers as inputs
		}
		tt := vi.GetType().GetTensorType()
		if tt == nil {
			return sig, fmt.Errorf("input %q is not a tensor", vi.GetName())
		}
		dims := tt.GetShape().GetDim()
		if len(dims) < 1 || len(dims) > 2 {
			return sig, fmt.Errorf("input %q has rank %d; want [batch] or [batch, n]", vi.GetName(), len(dims))
		}
		width := 1
		if len(dims) == 2 {
			v, ok := dims[1].GetValue().(*pb.TensorShapeProto_Dimension_DimValue)
			if !ok || v.DimValue <= 0 {
				return sig, fmt.Errorf("input %q: dimension 1 must be a fixed size", vi.GetName())
			}
			width = int(v.DimValue)
		}
		spec := InputSpec{Name: vi.GetName(), Width: width, Rank1: len(dims) == 1}
		switch pb.TensorProto_DataType(tt.GetElemType()) {
		case pb.TensorProto_FLOAT:
			spec.Kind = DenseKind
			if spec.Rank1 {
				return sig, fmt.Errorf("input %q: a dense input must be [batch, n]", vi.GetName())
			}
		case pb.TensorProto_INT64, pb.TensorProto_INT32:
			spec.Kind = SparseKind
			spec.Rows = rowsFor(vi.GetName(), 0)
			if spec.Rows <= 0 && !spec.Rank1 {
				spec.Ranges = packedRanges(vi.GetName(), width)
				for _, r := range spec.Ranges {
					spec.Rows = max(spec.Rows, r.Hi)
				}
			}
			if spec.Rows <= 0 {
				return sig, fmt.Errorf("input %q: ids that index no embedding table (no Gather on a 2-D initializer)", vi.GetName())
			}
		default:
			return sig, fmt.Errorf("input %q: element type %v is not supported (float32 dense, int64 or int32 ids)", vi.GetName(), pb.TensorProto_DataType(tt.GetElemType()))
		}
		sig.Inputs = append(sig.Inputs, spec)
	}
	if len(sig.Inputs) == 0 {
		return sig, fmt.Errorf("model has no inputs")
	}
	return sig, nil
}

// attrAxis is a Gather's axis attribute (default 0).
func attrAxis(n *pb.NodeProto) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "axis" {
			return a.GetI()
		}
	}
	return 0
}
