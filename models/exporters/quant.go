package exporters

import (
	"encoding/binary"
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// Quantized returns the corpus's models as users quantize them before
// serving: ONNX Runtime's quantization tools
// (onnxruntime/python/tools/quantization) in both of their formats, and
// onnxconverter-common's float16 conversion.
//
//   - ort-dynamic-quant, ort-dynamic-quant-per-channel: quantize_dynamic
//     (QOperator format, IntegerOps mode; the default activation type
//     QUInt8, weight type QInt8, symmetric). Every MatMul becomes
//     DynamicQuantizeLinear on its activation, MatMulInteger on the
//     int8 weight "W_quantized" (scale "W_scale", zero point
//     "W_zero_point": scalars, or [N] with per_channel=True), Cast to
//     float and a Mul by the product of the two scales
//     (operators/matmul.py MatMulInteger). Every Gather on a float
//     initializer (CommonOpsRegistry: GatherQuant, operators/gather.py)
//     reads the table quantized to the activation type ("T_quantized"
//     uint8, scalars "T_scale" float and "T_zero_point" uint8), its
//     output renamed "X_quantized", and the consumer that is not
//     quantized reads a DequantizeLinear of it named "X_DequantizeLinear"
//     whose output keeps the original name X
//     (onnx_quantizer.py _dequantize_value). Gemm is not quantized in
//     this mode.
//   - ort-qdq-static: quantize_static with QuantFormat.QDQ (activation
//     and weight types QInt8). A table becomes the int8 initializer
//     "T_quantized" read by DequantizeLinear "T_DequantizeLinear" (to
//     "T_DequantizeLinear_Output", the whole table in float) before the
//     Gather; the Gather's output gets a QuantizeLinear/DequantizeLinear
//     pair with the table's scale and zero point (QDQGather:
//     quantize_output_same_as_input); a MatMul reads its activation
//     through a QuantizeLinear/DequantizeLinear pair and its weight
//     through a DequantizeLinear of an int8 initializer (per channel,
//     axis 1).
//   - ort-qdq-gather-int8: the other order, an int8 table gathered
//     first and only the rows dequantized (what ONNX Runtime's QDQ
//     graph transformers fuse a DequantizeLinear-Gather pair into, and
//     quantize_dynamic's Gather with the int8 activation type), a bag of
//     them averaged.
//   - fp16-keep-io-types: onnxconverter-common float16.py
//     convert_float_to_float16(model, keep_io_types=True): every float
//     initializer float16, a Cast to float16 (to=10) after each float
//     graph input ("graph_input_cast0", output "graph_input_cast_0") and
//     a Cast to float (to=1) before each float graph output
//     ("graph_output_cast0"); the tables are float16 initializers read
//     by Gathers with no Cast, and everything after them runs in float16.
func Quantized(seed uint64) []*Model {
	return []*Model{ortDynamic(seed, false), ortDynamic(seed, true), ortQDQ(seed), ortQDQGatherInt8(seed), fp16KeepIO(seed)}
}

// qparams is a quantized tensor's data and its scale and zero point,
// per tensor (one of each) or per channel.
type qparams struct {
	q     []int32 // the quantized values, as their integers
	scale []float32
	zp    []int32
	axis  int // the axis of scale and zp when per channel
	cols  int // the tensor's second dimension (2-D tensors only)
	elem  pb.TensorProto_DataType
}

// quantize quantizes a [rows, cols] float tensor as quant_utils.py
// quantize_data does: per tensor, or per channel along axis (len(scale)
// then equals that dimension). uint8 is asymmetric (the range widened
// to hold 0, zero point round(-rmin/scale)); int8 symmetric (zero point
// 0, scale max|x|/127).
func quantize(flat []float32, rows, cols int, elem pb.TensorProto_DataType, perAxis int) *qparams {
	p := &qparams{q: make([]int32, len(flat)), axis: perAxis, cols: cols, elem: elem}
	channels, chanOf := 1, func(int) int { return 0 }
	switch perAxis {
	case 0:
		channels, chanOf = rows, func(i int) int { return i / cols }
	case 1:
		channels, chanOf = cols, func(i int) int { return i % cols }
	}
	lo, hi := make([]float32, channels), make([]float32, channels)
	for i, v := range flat {
		c := chanOf(i)
		lo[c], hi[c] = min(lo[c], v), max(hi[c], v)
	}
	for c := range channels {
		var s float32
		var z int32
		if elem == pb.TensorProto_UINT8 {
			s = (hi[c] - lo[c]) / 255
			z = int32(math.RoundToEven(float64(-lo[c] / s)))
		} else {
			s = max(-lo[c], hi[c]) / 127
		}
		p.scale, p.zp = append(p.scale, s), append(p.zp, z)
	}
	qlo, qhi := int32(-127), int32(127)
	if elem == pb.TensorProto_UINT8 {
		qlo, qhi = 0, 255
	}
	for i, v := range flat {
		c := chanOf(i)
		p.q[i] = min(max(int32(math.RoundToEven(float64(v/p.scale[c])))+p.zp[c], qlo), qhi)
	}
	return p
}

// deq is element i dequantized as DequantizeLinear computes it:
// float32(q - zero point) * scale, in float32.
func (p *qparams) deq(i int) float32 {
	c := 0
	switch {
	case len(p.scale) > 1 && p.axis == 0:
		c = i / p.cols
	case len(p.scale) > 1:
		c = i % p.cols
	}
	return float32(p.q[i]-p.zp[c]) * p.scale[c]
}

// rows is the dequantized tensor as rows of cols values.
func (p *qparams) rows() [][]float32 {
	out := make([][]float32, len(p.q)/p.cols)
	for r := range out {
		out[r] = make([]float32, p.cols)
		for j := range out[r] {
			out[r][j] = p.deq(r*p.cols + j)
		}
	}
	return out
}

// quantInit adds the initializers quantize_initializer writes for the
// weight name: name_quantized (raw data, as numpy_helper.from_array
// writes it), name_scale and name_zero_point (scalars, or [channels]).
func (b *builder) quantInit(name string, dims []int64, p *qparams) (q, scale, zp string) {
	raw := make([]byte, len(p.q))
	for i, v := range p.q {
		raw[i] = byte(v)
	}
	var sdims []int64
	if len(p.scale) > 1 {
		sdims = []int64{int64(len(p.scale))}
	}
	q, scale, zp = name+"_quantized", name+"_scale", name+"_zero_point"
	b.g.Initializer = append(b.g.Initializer,
		&pb.TensorProto{Name: q, DataType: int32(p.elem), Dims: dims, RawData: raw},
		&pb.TensorProto{Name: scale, DataType: int32(pb.TensorProto_FLOAT), Dims: sdims, FloatData: p.scale},
		&pb.TensorProto{Name: zp, DataType: int32(p.elem), Dims: sdims, Int32Data: p.zp})
	return q, scale, zp
}

// named adds a node with the name and outputs given (the quantization
// tools name what they add after the tensors they quantize).
func (b *builder) named(op, name string, ins, outs []string, attrs ...*pb.AttributeProto) {
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: name, OpType: op, Input: ins, Output: outs, Attribute: attrs})
}

// dynamicQuant is DynamicQuantizeLinear of column in of a batch (every
// sample's values, as the op reduces over the whole tensor): the
// quantized values of sample s, and the scale and zero point (ONNX
// operator spec: range widened to hold 0, uint8, round half to even).
func dynamicQuant(b *models.Batch, in, s int) ([]int32, float32, int32) {
	w := b.Sig.Inputs[in].Width
	col := b.Columns[in].F32
	var lo, hi float32
	for _, v := range col {
		lo, hi = min(lo, v), max(hi, v)
	}
	scale := (hi - lo) / 255
	zp := min(max(int32(math.RoundToEven(float64(-lo/scale))), 0), 255)
	q := make([]int32, w)
	for j := range q {
		q[j] = min(max(int32(math.RoundToEven(float64(col[s*w+j]/scale)))+zp, 0), 255)
	}
	return q, scale, zp
}

// ortDynamic: a small DLRM (bottom MLP on the dense features, two
// one-hot tables and a bag summed, the top layer a Gemm) after
// quantize_dynamic(model, out) or, perChannel, quantize_dynamic(...,
// per_channel=True); opset 13.
func ortDynamic(seed uint64, perChannel bool) *Model {
	m := &Model{Name: "ort-dynamic-quant", Source: "onnxruntime quantize_dynamic: operators/gather.py GatherQuant, operators/matmul.py MatMulInteger, onnx_quantizer.py _dequantize_value (opset 13)"}
	axis := -1
	if perChannel {
		m.Name, m.Source, axis = "ort-dynamic-quant-per-channel", m.Source+", per_channel=True", 1
	}
	b := newBuilder("main_graph", 13, seed)
	dense := b.input("dense", pb.TensorProto_FLOAT, 4)
	sparse := b.input("sparse", pb.TensorProto_INT64, 2)
	bag := b.input("bag", pb.TensorProto_INT64, 3)
	const hidden = 8
	wf := make([]float32, 4*hidden)
	for i := range wf {
		wf[i] = float32(b.r.NormFloat64() * 0.4)
	}
	w := quantize(wf, 4, hidden, pb.TensorProto_INT8, axis)
	bias := make([]float32, hidden)
	for i := range bias {
		bias[i] = float32(b.r.NormFloat64() * 0.1)
	}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "bot.bias", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{hidden}, FloatData: bias})
	wq, ws, wz := b.quantInit("bot.weight", []int64{4, hidden}, w)
	b.named("DynamicQuantizeLinear", "dense_QuantizeLinear", []string{dense}, []string{"dense_quantized", "dense_scale", "dense_zero_point"})
	mm := "/bot/MatMul_output_0"
	b.named("MatMulInteger", "/bot/MatMul_quant", []string{"dense_quantized", wq, "dense_zero_point", wz}, []string{mm + "_output_quantized"})
	b.named("Cast", mm+"_output_quantized_cast", []string{mm + "_output_quantized"}, []string{mm + "_output_quantized_cast_output"}, ai("to", int64(pb.TensorProto_FLOAT)))
	b.named("Mul", "/bot/MatMul_quant_scales_mul", []string{"dense_scale", ws}, []string{"/bot/MatMul_quant_scales_mul:0"})
	b.named("Mul", "/bot/MatMul_quant_output_scale_mul", []string{mm + "_output_quantized_cast_output", "/bot/MatMul_quant_scales_mul:0"}, []string{mm})
	bot := b.node("Relu", []string{b.node("Add", []string{mm, "bot.bias"})})

	// The tables: quantized to the activation type, uint8, per tensor.
	rows := []int{30, 40}
	var tabs [][][]float32
	parts := []string{bot}
	for k, r := range rows {
		name := "emb_l." + string(rune('0'+k)) + ".weight"
		_, flat := b.tableValues(r, dim)
		p := quantize(flat, r, dim, pb.TensorProto_UINT8, -1)
		tabs = append(tabs, p.rows())
		q, s, z := b.quantInit(name, []int64{int64(r), dim}, p)
		col := b.node("Gather", []string{sparse, b.constI(nil, int64(k))}, ai("axis", 1))
		out := "/emb_l." + string(rune('0'+k)) + "/Gather_output_0"
		b.named("Gather", "/emb_l."+string(rune('0'+k))+"/Gather", []string{q, col}, []string{out + "_quantized"})
		b.named("DequantizeLinear", out+"_DequantizeLinear", []string{out + "_quantized", s, z}, []string{out})
		parts = append(parts, out)
	}
	_, flat := b.tableValues(50, dim)
	pbag := quantize(flat, 50, dim, pb.TensorProto_UINT8, -1)
	tbag := pbag.rows()
	q, s, z := b.quantInit("bag.weight", []int64{50, dim}, pbag)
	b.named("Gather", "/bag/Gather", []string{q, bag}, []string{"/bag/Gather_output_0_quantized"})
	b.named("DequantizeLinear", "/bag/Gather_output_0_DequantizeLinear", []string{"/bag/Gather_output_0_quantized", s, z}, []string{"/bag/Gather_output_0"})
	parts = append(parts, b.node("ReduceSum", []string{"/bag/Gather_output_0", b.constI([]int64{1}, 1)}, ai("keepdims", 0)))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "dense", Kind: models.DenseKind, Width: 4},
		ranged("sparse", models.SparseKind, rng(0, 30), rng(0, 40)),
		{Name: "bag", Kind: models.SparseKind, Width: 3, Rows: 50},
	}}
	m.feats = func(s sample) []float64 {
		xq, xs, xz := dynamicQuant(s.b, 0, s.s)
		var x []float64
		for j := range hidden {
			acc := int32(0)
			for k := range 4 {
				c := 0
				if len(w.zp) > 1 {
					c = j
				}
				acc += (xq[k] - xz) * (w.q[k*hidden+j] - w.zp[c])
			}
			c := 0
			if len(w.scale) > 1 {
				c = j
			}
			v := float32(acc)*(xs*w.scale[c]) + bias[j]
			x = append(x, float64(max(v, 0)))
		}
		for k := range rows {
			x = append(x, row64(tabs[k], s.id(1, k))...)
		}
		return append(x, pool(tbag, []int64{s.id(2, 0), s.id(2, 1), s.id(2, 2)}, "sum")...)
	}
	b.finish(m, parts, hidden+3*dim)
	m.Proto.ProducerName = "onnx.quantize"
	return m
}

// qdq quantizes v to [lo, hi] with scale and zero point and back, as a
// QuantizeLinear/DequantizeLinear pair does.
func qdq(v, scale float32, zp, lo, hi int32) float32 {
	q := min(max(int32(math.RoundToEven(float64(v/scale)))+zp, lo), hi)
	return float32(q-zp) * scale
}

// ortQDQ: the DLRM of ortDynamic after quantize_static(...,
// quant_format=QuantFormat.QDQ, per_channel=True) with a calibration
// that gave the dense input the range [0, 10.2]; the top Gemm left in
// float (op_types_to_quantize=["MatMul", "Gather"]); opset 13.
func ortQDQ(seed uint64) *Model {
	m := &Model{Name: "ort-qdq-static", Source: "onnxruntime quantize_static QuantFormat.QDQ: qdq_quantizer.py, operators/gather.py QDQGather, operators/matmul.py QDQMatMul (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	dense := b.input("dense", pb.TensorProto_FLOAT, 4)
	sparse := b.input("sparse", pb.TensorProto_INT64, 2)
	const hidden = 8
	// The activation's calibrated range: int8, asymmetric.
	const dscale, dzp = float32(0.04), int32(-128)
	b.g.Initializer = append(b.g.Initializer,
		&pb.TensorProto{Name: "dense_scale", DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{dscale}},
		&pb.TensorProto{Name: "dense_zero_point", DataType: int32(pb.TensorProto_INT8), Int32Data: []int32{dzp}})
	b.named("QuantizeLinear", "dense_QuantizeLinear", []string{dense, "dense_scale", "dense_zero_point"}, []string{"dense_QuantizeLinear_Output"})
	b.named("DequantizeLinear", "dense_DequantizeLinear", []string{"dense_QuantizeLinear_Output", "dense_scale", "dense_zero_point"}, []string{"dense_DequantizeLinear_Output"})
	wf := make([]float32, 4*hidden)
	for i := range wf {
		wf[i] = float32(b.r.NormFloat64() * 0.4)
	}
	w := quantize(wf, 4, hidden, pb.TensorProto_INT8, 1)
	wd := w.rows()
	wq, ws, wz := b.quantInit("bot.weight", []int64{4, hidden}, w)
	b.named("DequantizeLinear", "bot.weight_DequantizeLinear", []string{wq, ws, wz}, []string{"bot.weight_DequantizeLinear_Output"}, ai("axis", 1))
	bias := make([]float32, hidden)
	for i := range bias {
		bias[i] = float32(b.r.NormFloat64() * 0.1)
	}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "bot.bias", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{hidden}, FloatData: bias})
	mm := b.node("MatMul", []string{"dense_DequantizeLinear_Output", "bot.weight_DequantizeLinear_Output"})
	bot := b.node("Relu", []string{b.node("Add", []string{mm, "bot.bias"})})
	rows := []int{30, 40}
	var tabs [][][]float32
	parts := []string{bot}
	for k, r := range rows {
		name := "emb_l." + string(rune('0'+k)) + ".weight"
		_, flat := b.tableValues(r, dim)
		// The second table per row (axis 0: a scale and zero point a
		// row, as weight-only quantizers write a table).
		axis := []int{-1, 0}[k]
		p := quantize(flat, r, dim, pb.TensorProto_INT8, axis)
		tabs = append(tabs, p.rows())
		q, s, z := b.quantInit(name, []int64{int64(r), dim}, p)
		var attrs []*pb.AttributeProto
		if axis == 0 {
			attrs = append(attrs, ai("axis", 0))
			// The rows' QuantizeLinear/DequantizeLinear pair takes a scale
			// of its own (per tensor).
			s, z = name+"_rows_scale", name+"_rows_zero_point"
			b.g.Initializer = append(b.g.Initializer,
				&pb.TensorProto{Name: s, DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{1.0 / 127}},
				&pb.TensorProto{Name: z, DataType: int32(pb.TensorProto_INT8), Int32Data: []int32{0}})
			for i := range tabs[k] {
				for j := range tabs[k][i] {
					tabs[k][i][j] = qdq(tabs[k][i][j], 1.0/127, 0, -128, 127)
				}
			}
			b.named("DequantizeLinear", name+"_DequantizeLinear", []string{name + "_quantized", name + "_scale", name + "_zero_point"}, []string{name + "_DequantizeLinear_Output"}, attrs...)
		} else {
			b.named("DequantizeLinear", name+"_DequantizeLinear", []string{q, s, z}, []string{name + "_DequantizeLinear_Output"})
		}
		col := b.node("Gather", []string{sparse, b.constI(nil, int64(k))}, ai("axis", 1))
		out := "/emb_l." + string(rune('0'+k)) + "/Gather_output_0"
		b.named("Gather", "/emb_l."+string(rune('0'+k))+"/Gather", []string{name + "_DequantizeLinear_Output", col}, []string{out})
		b.named("QuantizeLinear", out+"_QuantizeLinear", []string{out, s, z}, []string{out + "_QuantizeLinear_Output"})
		b.named("DequantizeLinear", out+"_DequantizeLinear", []string{out + "_QuantizeLinear_Output", s, z}, []string{out + "_DequantizeLinear_Output"})
		parts = append(parts, out+"_DequantizeLinear_Output")
	}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "dense", Kind: models.DenseKind, Width: 4},
		ranged("sparse", models.SparseKind, rng(0, 30), rng(0, 40)),
	}}
	m.feats = func(s sample) []float64 {
		var xd [4]float32
		for k := range xd {
			xd[k] = qdq(float32(s.f(0, k)), dscale, dzp, -128, 127)
		}
		var x []float64
		for j := range hidden {
			acc := 0.0
			for k := range 4 {
				acc += float64(xd[k]) * float64(wd[k][j])
			}
			x = append(x, max(acc+float64(bias[j]), 0))
		}
		for k := range rows {
			x = append(x, row64(tabs[k], s.id(1, k))...)
		}
		return x
	}
	b.finish(m, parts, hidden+2*dim)
	m.Proto.ProducerName = "onnx.quantize"
	return m
}

// ortQDQGatherInt8: int8 tables gathered first and the rows dequantized
// (DequantizeLinear after the Gather, as the Gather of quantize_dynamic
// with activation_type=QuantType.QInt8 writes it), one one-hot and one
// bag averaged over its ids (ReduceMean), the bag's table with a scale
// per column (DequantizeLinear axis -1 on the [batch, bag, dim] rows);
// opset 13.
func ortQDQGatherInt8(seed uint64) *Model {
	m := &Model{Name: "ort-qdq-gather-int8", Source: "onnxruntime quantize_dynamic activation_type=QInt8: operators/gather.py GatherQuant, onnx_quantizer.py _dequantize_value (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64)
	bag := b.input("bag", pb.TensorProto_INT64, 4)
	dense := b.input("dense", pb.TensorProto_FLOAT, 2)
	var tabs [][][]float32
	var outs []string
	for k, in := range []string{ids, bag} {
		name := []string{"user.weight", "items.weight"}[k]
		r := []int{45, 60}[k]
		_, flat := b.tableValues(r, dim)
		// The bag's table per column (a scale a column: DequantizeLinear
		// on the rows' last axis).
		axis := []int{-1, 1}[k]
		p := quantize(flat, r, dim, pb.TensorProto_INT8, axis)
		tabs = append(tabs, p.rows())
		q, s, z := b.quantInit(name, []int64{int64(r), dim}, p)
		out := "/" + name + "/Gather_output_0"
		b.named("Gather", "/"+name+"/Gather", []string{q, in}, []string{out + "_quantized"})
		var attrs []*pb.AttributeProto
		if axis == 1 {
			attrs = append(attrs, ai("axis", -1))
		}
		b.named("DequantizeLinear", out+"_DequantizeLinear", []string{out + "_quantized", s, z}, []string{out}, attrs...)
		outs = append(outs, out)
	}
	pooled := b.node("ReduceMean", []string{outs[1]}, ais("axes", 1), ai("keepdims", 0))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "ids", Kind: models.SparseKind, Width: 1, Rank1: true, Rows: 45},
		{Name: "bag", Kind: models.SparseKind, Width: 4, Rows: 60},
		{Name: "dense", Kind: models.DenseKind, Width: 2},
	}}
	m.feats = func(s sample) []float64 {
		x := append(row64(tabs[0], s.id(0, 0)), pool(tabs[1], []int64{s.id(1, 0), s.id(1, 1), s.id(1, 2), s.id(1, 3)}, "mean")...)
		return append(x, s.f(2, 0), s.f(2, 1))
	}
	b.finish(m, []string{outs[0], pooled, dense}, 2*dim+2)
	m.Proto.ProducerName = "onnx.quantize"
	return m
}

// f16raw is a float16 initializer of values float16 holds exactly.
func f16raw(name string, dims []int64, v []float32) *pb.TensorProto {
	raw := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(raw[2*i:], f16(x))
	}
	return &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_FLOAT16), Dims: dims, RawData: raw}
}

// fp16KeepIO: a packed id tensor picked by select into two tables and
// a bag summed, dense features, after convert_float_to_float16(model,
// keep_io_types=True): float16 tables and weights, the float input
// cast to float16 and the score cast back to float; opset 13.
func fp16KeepIO(seed uint64) *Model {
	m := &Model{Name: "fp16-keep-io-types", Source: "onnxconverter-common float16.py convert_float_to_float16 keep_io_types=True (opset 13)",
		// float16 arithmetic: the reference rounds where the model does
		// (the input cast, the Gemm's output, the Sigmoid's), but not
		// each product of the Gemm.
		Tol: 1e-3, half: true}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 2)
	bag := b.input("bag", pb.TensorProto_INT64, 3)
	b.input("dense", pb.TensorProto_FLOAT, 3)
	b.named("Cast", "graph_input_cast0", []string{"dense"}, []string{"graph_input_cast_0"}, ai("to", int64(pb.TensorProto_FLOAT16)))
	var tabs [][][]float32
	parts := []string{"graph_input_cast_0"}
	for k, r := range []int{30, 40, 50} {
		name := []string{"emb_l.0.weight", "emb_l.1.weight", "bag.weight"}[k]
		t, flat := b.tableValues(r, dim)
		tabs = append(tabs, t)
		b.g.Initializer = append(b.g.Initializer, f16raw(name, []int64{int64(r), dim}, flat))
		if k < 2 {
			col := b.node("Gather", []string{ids, b.constI(nil, int64(k))}, ai("axis", 1))
			parts = append(parts, b.node("Gather", []string{name, col}))
			continue
		}
		parts = append(parts, b.node("ReduceSum", []string{b.node("Gather", []string{name, bag}), b.constI([]int64{1}, 1)}, ai("keepdims", 0)))
	}
	const width = 3 + 3*dim
	cat := b.node("Concat", parts, ai("axis", 1))
	// Weights k/64 and a bias k/16: exact in float16.
	wf := make([]float32, width)
	m.w = make([]float64, width)
	for i := range wf {
		wf[i] = float32(b.r.IntN(33)-16) / 64
		m.w[i] = float64(wf[i])
	}
	bias := float32(b.r.IntN(9)-4) / 16
	m.bias = float64(bias)
	b.g.Initializer = append(b.g.Initializer, f16raw("top.weight", []int64{width, 1}, wf), f16raw("top.bias", []int64{1}, []float32{bias}))
	logit := b.node("Gemm", []string{cat, "top.weight", "top.bias"})
	b.named("Sigmoid", "/Sigmoid", []string{logit}, []string{"graph_output_cast_0"})
	b.named("Cast", "graph_output_cast0", []string{"graph_output_cast_0"}, []string{models.ScoreOutput}, ai("to", int64(pb.TensorProto_FLOAT)))
	b.g.Output = append(b.g.Output, &pb.ValueInfoProto{Name: models.ScoreOutput, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1}}}}}}}})
	m.Proto = &pb.ModelProto{IrVersion: 8, ProducerName: "pytorch", OpsetImport: []*pb.OperatorSetIdProto{{Version: b.opset}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 30), rng(0, 40)),
		{Name: "bag", Kind: models.SparseKind, Width: 3, Rows: 50},
		{Name: "dense", Kind: models.DenseKind, Width: 3},
	}}
	m.feats = func(s sample) []float64 {
		x := []float64{roundF16(s.f(2, 0)), roundF16(s.f(2, 1)), roundF16(s.f(2, 2))}
		for k := range 2 {
			x = append(x, row64(tabs[k], s.id(0, k))...)
		}
		return append(x, pool(tabs[2], []int64{s.id(1, 0), s.id(1, 1), s.id(1, 2)}, "sum")...)
	}
	return m
}

// QuantizedBroken returns the quantized tables the partitioner cannot
// take, each with the ErrUnrecognised error it must give.
func QuantizedBroken(seed uint64) []*Model {
	return []*Model{int8RowScale(seed)}
}

// QOperatorStatic is a model in ONNX Runtime's QOperator format, which
// the partitioner refuses before looking for tables (its ops are not
// standard ONNX) with an error saying WantErr.
func QOperatorStatic(seed uint64) *Model { return qlinearConcat(seed) }

// int8RowScale: an int8 table whose rows are dequantized by hand with
// a scale per row (FBGEMM's row-wise quantized tables written out with
// standard ops: the rows Cast to float, times a [rows, 1] scale table
// gathered at the same ids), not by a DequantizeLinear.
func int8RowScale(seed uint64) *Model {
	m := &Model{Name: "broken-int8-row-scale", WantErr: `table "emb.qweight" (30 x 4, 480 B) at Gather "/Gather_1": the table is int8 (quantized) and its rows are not dequantized by a DequantizeLinear alone`}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64)
	_, flat := b.tableValues(30, dim)
	p := quantize(flat, 30, dim, pb.TensorProto_INT8, 0)
	raw := make([]byte, len(p.q))
	for i, v := range p.q {
		raw[i] = byte(v)
	}
	b.g.Initializer = append(b.g.Initializer,
		&pb.TensorProto{Name: "emb.qweight", DataType: int32(pb.TensorProto_INT8), Dims: []int64{30, dim}, RawData: raw},
		&pb.TensorProto{Name: "emb.row_scale", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{30, 1}, FloatData: p.scale})
	rows := b.node("Cast", []string{b.node("Gather", []string{"emb.qweight", ids})}, ai("to", int64(pb.TensorProto_FLOAT)))
	e := b.node("Mul", []string{rows, b.node("Gather", []string{"emb.row_scale", ids})})
	b.finish(m, []string{e}, dim)
	m.feats = nil
	return m
}

// qlinearConcat: quantize_static in the QOperator format
// (QuantFormat.QOperator): the Gather reads a uint8 table and its
// quantized rows go on to com.microsoft QLinearConcat
// (operators/concat.py QLinearConcat), never dequantized on their own.
func qlinearConcat(seed uint64) *Model {
	m := &Model{Name: "broken-qoperator-static", WantErr: `QuantFormat.QDQ`}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 2)
	var parts []string
	for k := range 2 {
		name := "emb_l." + string(rune('0'+k)) + ".weight"
		_, flat := b.tableValues(20, dim)
		q, s, z := b.quantInit(name, []int64{20, dim}, quantize(flat, 20, dim, pb.TensorProto_UINT8, -1))
		col := b.node("Gather", []string{ids, b.constI(nil, int64(k))}, ai("axis", 1))
		parts = append(parts, b.node("Gather", []string{q, col}), s, z)
	}
	b.g.Initializer = append(b.g.Initializer,
		&pb.TensorProto{Name: "cat_scale", DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{1.0 / 128}},
		&pb.TensorProto{Name: "cat_zero_point", DataType: int32(pb.TensorProto_UINT8), Int32Data: []int32{128}})
	b.named("QLinearConcat", "/Concat_quant", append([]string{"cat_scale", "cat_zero_point"}, parts...), []string{"cat_quantized"}, ai("axis", 1))
	b.g.Node[len(b.g.Node)-1].Domain = "com.microsoft"
	b.named("DequantizeLinear", "cat_DequantizeLinear", []string{"cat_quantized", "cat_scale", "cat_zero_point"}, []string{"cat"})
	b.finish(m, []string{"cat"}, 2*dim)
	m.Proto.OpsetImport = append(m.Proto.OpsetImport, &pb.OperatorSetIdProto{Domain: "com.microsoft", Version: 1})
	m.feats = nil
	return m
}

// FP16NoKeepIO is fp16-keep-io-types converted without keep_io_types
// (convert_float_to_float16's default): the float input and the score
// are float16, which the tiers do not send or answer; the partitioner
// refuses it with an error saying WantErr.
func FP16NoKeepIO(seed uint64) *Model {
	m := fp16KeepIO(seed)
	m.Name, m.feats, m.WantErr = "broken-fp16-io", nil, "keep_io_types=True"
	g := m.Proto.Graph
	var nodes []*pb.NodeProto
	for _, n := range g.Node {
		if n.Name == "graph_input_cast0" || n.Name == "graph_output_cast0" {
			continue
		}
		for i, in := range n.Input {
			if in == "graph_input_cast_0" {
				n.Input[i] = "dense"
			}
		}
		for i, o := range n.Output {
			if o == "graph_output_cast_0" {
				n.Output[i] = models.ScoreOutput
			}
		}
		nodes = append(nodes, n)
	}
	g.Node = nodes
	for _, vi := range append(g.Input, g.Output...) {
		if tt := vi.GetType().GetTensorType(); tt.GetElemType() == int32(pb.TensorProto_FLOAT) {
			tt.ElemType = int32(pb.TensorProto_FLOAT16)
		}
	}
	m.Proto.MetadataProps[0].Value = m.Name
	return m
}
