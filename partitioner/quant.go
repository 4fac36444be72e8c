package partitioner

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/prism-serve/prism/internal/leview"
	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Quantized and float16 tables, as ONNX Runtime's quantization tools and
// onnxconverter-common's float16 conversion write them. The embedding
// store holds float32 rows; a table whose values the graph computes
// from its initializer element by element (a DequantizeLinear, a Cast
// to float) is stored as those values, computed once when the table is
// written, so only the looked-up rows ever leave the store and nothing
// dequantizes or casts a whole table per request.
//
//   - QDQ format (quantize_static, QuantFormat.QDQ): the int8 or uint8
//     initializer T_quantized, a DequantizeLinear of it (scale and zero
//     point per tensor, or per row or column), then the Gather. The
//     table is resolved through the DequantizeLinear (resolveTable).
//   - QOperator format (quantize_dynamic; GatherQuant): the Gather reads
//     T_quantized and only its output is dequantized. rewriteTables
//     moves the DequantizeLinear before the Gather (the same values: it
//     is element-wise, per tensor or per column), which makes it the
//     QDQ form.
//   - float16 (convert_float_to_float16): the Gather reads a float16
//     table and everything after it runs in float16. rewriteTables
//     casts the table to float before the Gather and the rows back to
//     float16 after it (exact both ways): the lookup gives float32 rows,
//     as the store does, and the graph after it is unchanged.

// dequant is how a table part's values are dequantized (a
// DequantizeLinear): (q - zero point) * scale, per tensor or per row
// (axis 0) or column (axis 1) of the table.
type dequant struct {
	scale, zp *pb.TensorProto // zp nil: 0
	axis      int             // -1: per tensor
}

// quantElem says whether dt is a type the tables' DequantizeLinear
// reads (8-bit integers: what the quantization tools write).
func quantElem(dt pb.TensorProto_DataType) bool {
	return dt == pb.TensorProto_INT8 || dt == pb.TensorProto_UINT8
}

// dequantOf checks node n, a DequantizeLinear of the 2-D 8-bit table t,
// and says how it dequantizes, or why it is not taken.
func dequantOf(g *Graph, n *pb.NodeProto, t *pb.TensorProto) (*dequant, string) {
	in := n.GetInput()
	if len(in) < 2 {
		return nil, "no scale"
	}
	scale, ok := g.Inits[in[1]]
	if !ok || pb.TensorProto_DataType(scale.GetDataType()) != pb.TensorProto_FLOAT {
		return nil, fmt.Sprintf("its scale %q is not a float initializer", in[1])
	}
	d := &dequant{scale: scale, axis: -1}
	if len(in) > 2 && in[2] != "" {
		zp, ok := g.Inits[in[2]]
		if !ok || zp.GetDataType() != t.GetDataType() || !slices.Equal(zp.GetDims(), scale.GetDims()) {
			return nil, fmt.Sprintf("its zero point %q is not an initializer of the table's type and the scale's shape", in[2])
		}
		d.zp = zp
	}
	n1 := int64(1)
	for _, v := range scale.GetDims() {
		n1 *= v
	}
	switch {
	case len(scale.GetDims()) == 0 || (len(scale.GetDims()) == 1 && n1 == 1):
	case len(scale.GetDims()) == 1:
		d.axis = normAxis(attrInt(n, "axis", 1), 2)
		if d.axis < 0 || scale.GetDims()[0] != t.GetDims()[d.axis] {
			return nil, fmt.Sprintf("its scale has %d values for axis %d of a table %v", scale.GetDims()[0], attrInt(n, "axis", 1), t.GetDims())
		}
	default:
		return nil, fmt.Sprintf("its scale has shape %v (blocked quantization)", scale.GetDims())
	}
	return d, ""
}

// params reads d's scale and zero point (loading external data from
// dir).
func (d *dequant) params(dir string) ([]float32, []int32, error) {
	if err := pb.LoadData(d.scale, dir); err != nil {
		return nil, nil, err
	}
	s, err := pb.Float32s(d.scale)
	if err != nil {
		return nil, nil, err
	}
	zp := make([]int32, len(s))
	if d.zp != nil {
		if err := pb.LoadData(d.zp, dir); err != nil {
			return nil, nil, err
		}
		z, err := int8Values(d.zp)
		if err != nil {
			return nil, nil, err
		}
		if len(z) != len(s) {
			return nil, nil, fmt.Errorf("zero point %q has %d values for %d scales", d.zp.GetName(), len(z), len(s))
		}
		zp = z
	}
	return s, zp, nil
}

// int8Values reads an INT8 or UINT8 tensor's values.
func int8Values(t *pb.TensorProto) ([]int32, error) {
	signed := pb.TensorProto_DataType(t.GetDataType()) == pb.TensorProto_INT8
	if len(t.GetRawData()) == 0 {
		return t.GetInt32Data(), nil
	}
	out := make([]int32, len(t.GetRawData()))
	for i, b := range t.GetRawData() {
		out[i] = int32(b)
		if signed {
			out[i] = int32(int8(b))
		}
	}
	return out, nil
}

// dequantRows converts rows of 8-bit values b (the table's rows from
// row first on, dim values each) into out.
func dequantRows(out []float32, b []byte, signed bool, scale []float32, zp []int32, axis, first, dim int) {
	for i := range out {
		c := 0
		switch axis {
		case 0:
			c = first + i/dim
		case 1:
			c = i % dim
		}
		q := int32(b[i])
		if signed {
			q = int32(int8(b[i]))
		}
		out[i] = float32(q-zp[c]) * scale[c]
	}
}

// convertRows fills out with the float32 values of one chunk of table
// part rows b (element type dt, dequantized by d when set; row first
// of the part first).
func convertRows(out []float32, b []byte, dt pb.TensorProto_DataType, d *dequant, scale []float32, zp []int32, first, dim int) {
	switch {
	case d != nil:
		dequantRows(out, b, dt == pb.TensorProto_INT8, scale, zp, d.axis, first, dim)
	case dt == pb.TensorProto_FLOAT16:
		for i := range out {
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	default:
		copy(out, leview.Float32s(b))
	}
}

// rewriteTables rewrites the Gathers that read a quantized table and
// dequantize only the rows, or read a float16 table, into forms
// resolveTable takes (see above). It reports whether it changed the
// graph (the caller indexes it again).
func rewriteTables(g *Graph) bool {
	types, _ := InferShapes(g)
	gp := g.Model.GetGraph()
	fresh := freshNames(gp)
	isOutput := func(name string) bool {
		return slices.ContainsFunc(g.Outputs, func(o *pb.ValueInfoProto) bool { return o.GetName() == name })
	}
	drop := map[int]bool{}
	before := map[int][]*pb.NodeProto{}
	after := map[int][]*pb.NodeProto{}
	// One DequantizeLinear or Cast per table (and dequantization).
	made := map[string]string{}
	for gi, n := range g.Nodes {
		if n.GetOpType() != "Gather" || len(n.GetInput()) != 2 || (attrInt(n, "axis", 0) != 0 && attrInt(n, "axis", 0) != -2) {
			continue
		}
		t := initBehindIdentity(g, n.GetInput()[0])
		if t == nil || len(t.GetDims()) != 2 {
			continue
		}
		out := n.GetOutput()[0]
		switch dt := pb.TensorProto_DataType(t.GetDataType()); {
		case quantElem(dt):
			di, ok := soleConsumer(g, out)
			if !ok || isOutput(out) {
				continue
			}
			dq := g.Nodes[di]
			if dq.GetOpType() != "DequantizeLinear" || dq.GetInput()[0] != out {
				continue
			}
			// The rows' DequantizeLinear: its axis is the rows' last
			// (the table's columns) for a per-column scale.
			d, why := dequantOf(g, &pb.NodeProto{Input: dq.GetInput()}, t)
			if why != "" || d.axis == 0 {
				continue
			}
			if d.axis == 1 {
				// Per column: the rows' last axis.
				it := types[n.GetInput()[1]]
				if !it.Known || normAxis(attrInt(dq, "axis", 1), len(it.Dims)+1) != len(it.Dims) {
					continue
				}
			}
			key := strings.Join(append([]string{t.GetName()}, dq.GetInput()[1:]...), "\x00")
			table, ok := made[key]
			if !ok {
				table = fresh(strings.TrimSuffix(t.GetName(), "_quantized"))
				nd := &pb.NodeProto{Name: fresh(table + "/DequantizeLinear"), OpType: "DequantizeLinear",
					Input: append([]string{t.GetName()}, dq.GetInput()[1:]...), Output: []string{table}}
				if d.axis == 1 {
					nd.Attribute = []*pb.AttributeProto{intAttr("axis", 1)}
				}
				made[key] = table
				before[gi] = append(before[gi], nd)
			}
			n.Input[0] = table
			n.Output[0] = dq.GetOutput()[0]
			drop[di] = true
		case dt == pb.TensorProto_FLOAT16:
			key := t.GetName()
			table, ok := made[key]
			if !ok {
				table = fresh(t.GetName() + "_float")
				made[key] = table
				before[gi] = append(before[gi], &pb.NodeProto{Name: fresh(table + "/Cast"), OpType: "Cast", Input: []string{t.GetName()}, Output: []string{table},
					Attribute: []*pb.AttributeProto{intAttr("to", int64(pb.TensorProto_FLOAT))}})
			}
			rows := fresh(out + "_float")
			n.Input[0], n.Output[0] = table, rows
			// A bag pooled by the reduction that reads the rows alone is
			// pooled in float32 and cast after: the lookup pools it, and
			// one pooled row, not the bag's rows, crosses the cut. ONNX
			// Runtime reduces float16 accumulating in float32 and rounds
			// once, as this does: the partition verifies exactly.
			at, cast, back := gi, rows, out
			if ri, ok := soleConsumer(g, out); ok && !isOutput(out) {
				switch r := g.Nodes[ri]; r.GetOpType() {
				case "ReduceSum", "ReduceMean", "ReduceMax":
					if r.GetInput()[0] == out && !isOutput(r.GetOutput()[0]) {
						r.Input[0] = rows
						at, back = ri, r.GetOutput()[0]
						cast = fresh(back + "_float")
						r.Output[0] = cast
					}
				}
			}
			after[at] = append(after[at], &pb.NodeProto{Name: fresh(back + "/Cast_float16"), OpType: "Cast", Input: []string{cast}, Output: []string{back},
				Attribute: []*pb.AttributeProto{intAttr("to", int64(pb.TensorProto_FLOAT16))}})
		}
	}
	if len(before) == 0 && len(after) == 0 {
		return false
	}
	var nodes []*pb.NodeProto
	for i, n := range g.Nodes {
		nodes = append(nodes, before[i]...)
		if !drop[i] {
			nodes = append(nodes, n)
		}
		nodes = append(nodes, after[i]...)
	}
	gp.Node = nodes
	return true
}

// initBehindIdentity is the initializer name is, or that Identity nodes
// pass on as name; nil if none.
func initBehindIdentity(g *Graph, name string) *pb.TensorProto {
	for range 8 {
		if t, ok := g.Inits[name]; ok {
			return t
		}
		i, ok := g.Producer[name]
		if !ok || g.Nodes[i].GetOpType() != "Identity" {
			return nil
		}
		name = g.Nodes[i].GetInput()[0]
	}
	return nil
}

// untakenTable says why a Gather reading name, a table resolveTable does
// not take (a 2-D initializer, through Identity nodes, of a type that is
// not float), is not a lookup; "" when name is no such table.
func untakenTable(g *Graph, name string) (*pb.TensorProto, string) {
	t := initBehindIdentity(g, name)
	if t == nil {
		return nil, ""
	}
	dt := pb.TensorProto_DataType(t.GetDataType())
	switch {
	case len(t.GetDims()) != 2 || dt == pb.TensorProto_FLOAT || dt == pb.TensorProto_FLOAT16 || isInt(dt) || dt == pb.TensorProto_BOOL:
		return nil, ""
	case quantElem(dt):
		return t, fmt.Sprintf("the table is %s (quantized) and its rows are not dequantized by a DequantizeLinear alone (scale and zero point initializers, per tensor or per column): the embedding store holds float32 rows; quantize the table in the QDQ format (quantize_static with QuantFormat.QDQ), or leave Gather out of op_types_to_quantize", elemName(dt))
	}
	return t, fmt.Sprintf("the table is %s, which the embedding store does not read (float32, float16, or int8/uint8 with a DequantizeLinear)", strings.ToLower(dt.String()))
}
