package exporters

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// Paddle returns PaddleRec's ranking models (PaddlePaddle/PaddleRec
// models/rank, read at commit 656326ad) as PaddlePaddle/Paddle2ONNX
// (read at commit 3bb6cb88; paths below are in that repository) writes
// them from the inference model PaddleRec saves
// (paddle.static.save_inference_model of the static graph,
// tools/static_trainer.py), at small scale. What paddle2onnx writes,
// whatever the model:
//
//   - the opset the user asks for (the command line's --opset_version
//     defaults to 9, paddle2onnx/command.py), raised to the highest
//     minimum an op's mapper needs (auto_upgrade_opset,
//     ModelExporter::SetOpsetVersion in paddle2onnx/mapper/exporter.cc:
//     reduce_sum needs 13, mapper/tensor/reduce_sum.cc), the IR version
//     that opset goes with (GetIRVersion: 4 at opset 9, 7 at 13), no
//     producer, the graph named "PaddlePaddle Graph 0" (ExportBlock);
//   - every parameter as a Constant node (ExportParameters,
//     MakeConstant in mapper/onnx_helper.cc), not an initializer: no node
//     name, the output and the tensor named after the Paddle parameter
//     ("SparseFeatFactors", "embedding_0.w_0", "linear_0.w_0"), the
//     values in raw_data, first in the graph in the order of their names
//     (PaddleParser::params is a std::map, paddle2onnx/parser/parser.h);
//   - the feed variables as inputs, a batch of -1 written as a symbol
//     of its own per value, "DynamicDimension.0", "DynamicDimension.1",
//     ... (MakeValueInfo): no two inputs share their batch symbol, nor
//     does the output;
//   - nodes named "<Op>.<n>" (MapperHelper::GenName,
//     mapper/register_mapper.h, one counter per op type), their outputs
//     the Paddle variable they compute or, for a helper's intermediate,
//     the next name of that counter; small constants as Constant nodes
//     without a name, output "const.<n>" (OnnxHelper::Constant,
//     mapper/onnx_helper.h);
//   - then onnxoptimizer's passes (ModelExporter::Optimize):
//     eliminate_identity removes the Identity every elementwise op,
//     concat and scale mapper writes (mapper/tensor/elementwise_add.cc,
//     concat.cc, scale.cc), the graph output keeping its name; no pass
//     fuses MatMul and Add into Gemm (fuse_matmul_add_bias_into_gemm
//     needs the bias's shape, and a Constant node's output has none).
//
// The lookups (mapper/tensor/lookup_table.cc, LookupTableMapper, for
// lookup_table and lookup_table_v2): a Gather on the weight; for
// lookup_table (fluid's embedding, ids [B, 1]) a Squeeze of the last
// axis first; with padding_idx (nn.Embedding(padding_idx=0), as
// PaddleRec's DeepFM, DCN and DIEN build their tables) the Gather reads
// Mul(weight, mask), mask a float Constant of the table's shape, ones
// with the padding row zero (at opset 11 and later a ScatterND of a
// zero row instead, only when the weight's shape is dynamic, which a
// saved parameter's is not). A fc layer (nn.Linear: matmul_v2 then
// elementwise_add) is MatMul then Add (mapper/tensor/matmul_v2.cc,
// elementwise_add.cc).
//
// PaddleRec's sequence_pool and the fused lookups of its parameter
// server models (pull_box_sparse, fused_embedding_seq_pool) have no
// mapper in paddle2onnx: such a model does not export at all, so there
// is no graph to partition.
func Paddle(seed uint64) []*Model {
	return []*Model{paddleWideDeep(seed, false), paddleWideDeep(seed, true), paddleDeepFM(seed)}
}

// pdBuilder writes nodes as paddle2onnx's OnnxHelper does.
type pdBuilder struct {
	*builder
	count map[string]int
}

func newPDBuilder(opset int64, seed uint64) *pdBuilder {
	return &pdBuilder{builder: newBuilder("PaddlePaddle Graph 0", opset, seed), count: map[string]int{}}
}

// gen is MapperHelper::GenName: op.0, op.1, ... per op.
func (b *pdBuilder) gen(op string) string {
	n, ok := b.count[op]
	if ok {
		n++
	}
	b.count[op] = n
	return op + "." + strconv.Itoa(n)
}

// op is OnnxHelper::MakeNode: the node named gen(op), its output out
// or, when out is "", the next name of op's counter.
func (b *pdBuilder) op(op string, ins []string, out string, attrs ...*pb.AttributeProto) string {
	name := b.gen(op)
	if out == "" {
		out = b.gen(op)
	}
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: name, OpType: op, Input: ins, Output: []string{out}, Attribute: attrs})
	return out
}

// constant is a Constant node without a name, its tensor named after
// its output, the values raw.
func (b *pdBuilder) constant(out string, elem pb.TensorProto_DataType, dims []int64, raw []byte) string {
	t := &pb.TensorProto{Name: out, DataType: int32(elem), Dims: dims, RawData: raw}
	b.g.Node = append(b.g.Node, &pb.NodeProto{OpType: "Constant", Output: []string{out},
		Attribute: []*pb.AttributeProto{{Name: "value", Type: pb.AttributeProto_TENSOR, T: t}}})
	return out
}

func rawF32(v []float32) []byte {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
	}
	return raw
}

// constI64 is OnnxHelper::Constant of a 1-D int64 vector.
func (b *pdBuilder) constI64(v ...int64) string {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	return b.constant(b.gen("const"), pb.TensorProto_INT64, []int64{int64(len(v))}, raw)
}

// constF32 is OnnxHelper::Constant of float values of shape dims.
func (b *pdBuilder) constF32(dims []int64, v ...float32) string {
	return b.constant(b.gen("const"), pb.TensorProto_FLOAT, dims, rawF32(v))
}

// param is a parameter, a Constant named name (ExportParameters).
func (b *pdBuilder) param(name string, dims []int64, v []float32) string {
	return b.constant(name, pb.TensorProto_FLOAT, dims, rawF32(v))
}

// normal draws n float32 values of standard deviation sd.
func (b *pdBuilder) normal(n int, sd float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(b.r.NormFloat64() * sd)
	}
	return v
}

// pdInput is a feed variable: dims of -1 are DynamicDimension symbols.
func (b *pdBuilder) pdInput(name string, elem pb.TensorProto_DataType, dims ...int64) string {
	b.g.Input = append(b.g.Input, b.valueInfo(name, elem, dims...))
	return name
}

func (b *pdBuilder) valueInfo(name string, elem pb.TensorProto_DataType, dims ...int64) *pb.ValueInfoProto {
	var d []*pb.TensorShapeProto_Dimension
	for _, v := range dims {
		if v < 0 {
			d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: b.gen("DynamicDimension")}})
		} else {
			d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: v}})
		}
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: d}}}}}
}

// pdLinear is a paddle.nn.Linear layer (static graph: matmul_v2, then
// elementwise_add with axis -1): MatMul to the Paddle variable
// linear_<k>.tmp_0, then Add, whose Identity to linear_<k>.tmp_1 the
// optimizer removed. The weight is [in, out], as Paddle stores it.
type pdLinear struct {
	w, bias []float32
	in, out int
}

func (l pdLinear) apply(x []float64) []float64 {
	y := make([]float64, l.out)
	for o := range y {
		z := float64(l.bias[o])
		for i := range l.in {
			z += x[i] * float64(l.w[i*l.out+o])
		}
		y[o] = z
	}
	return y
}

// linear writes layer k; its parameters were declared by params.
func (b *pdBuilder) linear(k int, x string, l pdLinear) string {
	mm := b.op("MatMul", []string{x, fmt.Sprintf("linear_%d.w_0", k)}, fmt.Sprintf("linear_%d.tmp_0", k))
	return b.op("Add", []string{mm, fmt.Sprintf("linear_%d.b_0", k)}, "")
}

// newLinear draws layer k's weights (nn.initializer.Normal(std =
// 1/sqrt(in)) in PaddleRec's nets).
func (b *pdBuilder) newLinear(in, out int) pdLinear {
	return pdLinear{w: b.normal(in*out, 1/math.Sqrt(float64(in))), bias: b.normal(out, 0.1), in: in, out: out}
}

// pdParam is a parameter to declare, in name order, before any node.
type pdParam struct {
	name string
	dims []int64
	v    []float32
}

func (b *pdBuilder) params(ps []pdParam) {
	// std::map order: byte order of the names.
	sorted := append([]pdParam(nil), ps...)
	for i := 1; i < len(sorted); i++ {
		for j := i; j > 0 && sorted[j].name < sorted[j-1].name; j-- {
			sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
		}
	}
	for _, p := range sorted {
		b.param(p.name, p.dims, p.v)
	}
}

func linearParams(k int, l pdLinear) []pdParam {
	return []pdParam{
		{fmt.Sprintf("linear_%d.w_0", k), []int64{int64(l.in), int64(l.out)}, l.w},
		{fmt.Sprintf("linear_%d.b_0", k), []int64{int64(l.out)}, l.bias},
	}
}

// pdFinish declares the output: the scale op save_inference_model
// appends to each fetch variable (paddle/static/io.py normalize_program:
// paddle.scale(var, 1.0, name="save_infer_model/scale_<i>")) is an
// Identity (mapper/tensor/scale.cc, scale 1, bias 0) that the optimizer
// removed, giving its name to the Sigmoid's output.
func (b *pdBuilder) pdFinish(m *Model, logit string) {
	out := "save_infer_model/scale_0.tmp_0"
	b.op("Sigmoid", []string{logit}, out)
	b.g.Output = append(b.g.Output, b.valueInfo(out, pb.TensorProto_FLOAT, -1, 1))
	m.Proto = &pb.ModelProto{IrVersion: map[int64]int64{9: 4, 11: 6, 13: 7}[b.opset], OpsetImport: []*pb.OperatorSetIdProto{{Domain: "", Version: b.opset}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
}

// paddleWideDeep is PaddleRec's models/rank/wide_deep (net.py
// WideDeepLayer, static_model.py create_feeds) exported by paddle2onnx
// at its default opset 9: one int64 [-1, 1] input per sparse slot,
// named "1", "2", ... (PaddleRec's config.yaml feeds "1".."26"), a float
// "dense_input" [-1, dense]; every slot reads the one table
// SparseFeatFactors (nn.Embedding with ParamAttr name
// "SparseFeatFactors", shared by the slots) through a Gather to
// embedding_<k>.tmp_0 ([B, 1, dim]) and a Reshape to [-1, dim]
// (reshape2: Reshape with a Constant shape); the embeddings and the
// dense input concatenated (Concat axis 1), an MLP of Linear and ReLU
// to one value, plus the wide part (a Linear of the dense input), and a
// Sigmoid.
//
// v1 is the same model written with fluid's embedding (lookup_table,
// ids [B, 1]): paddle2onnx squeezes the ids' last axis (Squeeze with
// axes [-1], an attribute below opset 13) and the Gather gives [B, dim],
// no Reshape. Exported at opset 11: at 9 that Squeeze's negative axis
// is invalid (ONNX Runtime refuses the model).
func paddleWideDeep(seed uint64, v1 bool) *Model {
	m := &Model{Name: "paddle-wide-deep", Source: "Paddle2ONNX paddle2onnx/mapper/tensor/lookup_table.cc (lookup_table_v2: Gather), reshape2.cc, concat.cc, matmul_v2.cc, elementwise_add.cc, activation/sigmoid.cc, scale.cc; mapper/exporter.cc (parameters as Constant nodes, DynamicDimension inputs, opset 9 default of command.py, onnxoptimizer passes); PaddleRec models/rank/wide_deep/net.py, static_model.py"}
	if v1 {
		m.Name = "paddle-wide-deep-lookup-v1"
		m.Source = "Paddle2ONNX paddle2onnx/mapper/tensor/lookup_table.cc (lookup_table: Squeeze of the last axis, then Gather), onnx_helper.cc Squeeze (axes attribute below opset 13); the rest as paddle-wide-deep"
	}
	const slots, rows, dim, dense, hidden = 3, 60, 4, 2, 6
	opset := int64(9)
	if v1 {
		// Squeeze-1 takes no negative axis: the model loads from
		// opset 11 on.
		opset = 11
	}
	b := newPDBuilder(opset, seed)
	tab, flat := b.tableValues(rows, dim)
	wide := b.newLinear(dense, 1)
	l1 := b.newLinear(slots*dim+dense, hidden)
	l2 := b.newLinear(hidden, 1)
	var ps []pdParam
	ps = append(ps, pdParam{"SparseFeatFactors", []int64{rows, dim}, flat})
	ps = append(append(append(ps, linearParams(0, wide)...), linearParams(1, l1)...), linearParams(2, l2)...)
	b.params(ps)
	var parts []string
	var sig []models.InputSpec
	for k := range slots {
		name := strconv.Itoa(k + 1)
		b.pdInput(name, pb.TensorProto_INT64, -1, 1)
		sig = append(sig, models.InputSpec{Name: name, Kind: models.SparseKind, Width: 1, Rows: rows})
	}
	b.pdInput("dense_input", pb.TensorProto_FLOAT, -1, dense)
	sig = append(sig, models.InputSpec{Name: "dense_input", Kind: models.DenseKind, Width: dense})
	wideOut := b.linear(0, "dense_input", wide)
	for k := range slots {
		ids := strconv.Itoa(k + 1)
		if v1 {
			sq := b.op("Squeeze", []string{ids}, b.gen("helper.squeeze"), ais("axes", -1))
			parts = append(parts, b.op("Gather", []string{"SparseFeatFactors", sq}, fmt.Sprintf("embedding_%d.tmp_0", k)))
			continue
		}
		emb := b.op("Gather", []string{"SparseFeatFactors", ids}, fmt.Sprintf("embedding_%d.tmp_0", k))
		parts = append(parts, b.op("Reshape", []string{emb, b.constI64(-1, dim)}, fmt.Sprintf("reshape2_%d.tmp_0", k)))
	}
	cat := b.op("Concat", append(parts, "dense_input"), "", ai("axis", 1))
	h := b.op("Relu", []string{b.linear(1, cat, l1)}, "relu_0.tmp_0")
	deep := b.linear(2, h, l2)
	b.pdFinish(m, b.op("Add", []string{wideOut, deep}, ""))
	m.Sig = models.Signature{Inputs: sig}
	// The reference: z = deep + wide, with l2 as the final weights.
	m.bias = float64(l2.bias[0])
	for _, v := range l2.w {
		m.w = append(m.w, float64(v))
	}
	m.w = append(m.w, 1)
	m.feats = func(s sample) []float64 {
		var x []float64
		for k := range slots {
			x = append(x, row64(tab, s.id(k, 0))...)
		}
		d := []float64{s.f(slots, 0), s.f(slots, 1)}
		x = append(x, d...)
		hid := l1.apply(x)
		for i := range hid {
			hid[i] = math.Max(hid[i], 0)
		}
		return append(hid, wide.apply(d)[0])
	}
	return m
}

// paddleDeepFM is PaddleRec's models/rank/deepfm (net.py DeepFMLayer,
// FM, DNN) exported by paddle2onnx: reduce_sum needs opset 13, so the
// export is at 13 (ReduceSum and Unsqueeze take their axes as Constant
// inputs). The int64 [-1, 1] slot inputs "C1", "C2", ... are
// concatenated to [B, slots] (paddle.concat: Concat axis 1) and read by
// both tables, embedding_0.w_0 [rows, 1] (first order) and
// embedding_1.w_0 [rows, dim] (factors), each nn.Embedding with
// padding_idx=0: Gather(Mul(weight, mask)) with mask a Constant of the
// weight's shape, ones, the row 0 zero. The dense input is weighted by
// create_parameter_0.w_0 [dense] (first order: Mul, Unsqueeze axis 2,
// ReduceSum axis 1) and create_parameter_1.w_0 [1, dense, dim] (its
// factors: Unsqueeze axis 2, Mul); the factors concatenated on axis 1
// give the FM term (ReduceSum, square as Mul(x, x), Sub, ReduceSum
// keepdims 1, 0.5 * as scale: Mul by a scalar Constant) and, reshaped
// to [-1, (slots+dense)*dim], the DNN's input.
func paddleDeepFM(seed uint64) *Model {
	m := &Model{Name: "paddle-deepfm", Source: "Paddle2ONNX paddle2onnx/mapper/tensor/lookup_table.cc (lookup_table_v2 with padding_idx: Mul by a mask Constant, then Gather), concat.cc, reduce_sum.cc (opset 13), unsqueeze2.cc, elementwise_mul.cc, elementwise.cc (elementwise_sub), activation/activation.cc (square: Mul), scale.cc, reshape2.cc, matmul_v2.cc, elementwise_add.cc; mapper/exporter.cc; PaddleRec models/rank/deepfm/net.py, static_model.py"}
	const slots, rows, dim, dense, hidden = 3, 50, 4, 2, 6
	const fields = slots + dense
	b := newPDBuilder(13, seed)
	one, oneFlat := b.tableValues(rows, 1)
	tab, flat := b.tableValues(rows, dim)
	wOne := b.normal(dense, 0.3)
	wDense := b.normal(dense*dim, 0.3)
	l0 := b.newLinear(fields*dim, hidden)
	l1 := b.newLinear(hidden, 1)
	ps := []pdParam{
		{"embedding_0.w_0", []int64{rows, 1}, oneFlat},
		{"embedding_1.w_0", []int64{rows, dim}, flat},
		{"create_parameter_0.w_0", []int64{dense}, wOne},
		{"create_parameter_1.w_0", []int64{1, dense, dim}, wDense},
	}
	b.params(append(append(ps, linearParams(0, l0)...), linearParams(1, l1)...))
	var sig []models.InputSpec
	var ids []string
	for k := range slots {
		name := "C" + strconv.Itoa(k+1)
		ids = append(ids, b.pdInput(name, pb.TensorProto_INT64, -1, 1))
		sig = append(sig, models.InputSpec{Name: name, Kind: models.SparseKind, Width: 1, Rows: rows})
	}
	b.pdInput("dense_input", pb.TensorProto_FLOAT, -1, dense)
	sig = append(sig, models.InputSpec{Name: "dense_input", Kind: models.DenseKind, Width: dense})
	// padded is lookup_table_v2 with padding_idx 0 on a weight of a
	// static shape.
	padded := func(weight string, d int, out string, x string) string {
		mask := make([]float32, rows*d)
		for i := d; i < len(mask); i++ {
			mask[i] = 1
		}
		c := b.constF32([]int64{rows, int64(d)}, mask...)
		return b.op("Gather", []string{b.op("Mul", []string{weight, c}, ""), x}, out)
	}
	// FM.forward, first order.
	cat := b.op("Concat", ids, "", ai("axis", 1))
	embOne := padded("embedding_0.w_0", 1, "embedding_2.tmp_0", cat)
	denseOne := b.op("Mul", []string{"dense_input", "create_parameter_0.w_0"}, "")
	denseOne = b.op("Unsqueeze", []string{denseOne, b.constI64(2)}, "unsqueeze2_0.tmp_0")
	sum1 := func(x string, keep int64) string {
		return b.op("ReduceSum", []string{x, b.constI64(1)}, "", ai("keepdims", keep))
	}
	first := b.op("Add", []string{sum1(embOne, 0), sum1(denseOne, 0)}, "")
	// Second order.
	embs := padded("embedding_1.w_0", dim, "embedding_3.tmp_0", cat)
	denseRe := b.op("Unsqueeze", []string{"dense_input", b.constI64(2)}, "unsqueeze2_1.tmp_0")
	denseEmb := b.op("Mul", []string{denseRe, "create_parameter_1.w_0"}, "")
	feat := b.op("Concat", []string{embs, denseEmb}, "", ai("axis", 1))
	summed := sum1(feat, 0)
	summedSq := b.op("Mul", []string{summed, summed}, "square_0.tmp_0")
	sq := b.op("Mul", []string{feat, feat}, "square_1.tmp_0")
	sqSum := sum1(sq, 0)
	diff := b.op("Sub", []string{summedSq, sqSum}, "")
	second := b.op("Mul", []string{sum1(diff, 1), b.constF32(nil, 0.5)}, "")
	// DNN.forward.
	flatFeat := b.op("Reshape", []string{feat, b.constI64(-1, fields*dim)}, "reshape2_0.tmp_0")
	h := b.op("Relu", []string{b.linear(0, flatFeat, l0)}, "relu_0.tmp_0")
	dnn := b.linear(1, h, l1)
	b.pdFinish(m, b.op("Add", []string{b.op("Add", []string{first, second}, ""), dnn}, ""))
	m.Sig = models.Signature{Inputs: sig}
	m.bias = float64(l1.bias[0])
	for _, v := range l1.w {
		m.w = append(m.w, float64(v))
	}
	m.w = append(m.w, 1, 1)
	m.feats = func(s sample) []float64 {
		var factors [][]float64
		lin := 0.0
		for k := range slots {
			id := s.id(k, 0)
			e, o := row64(tab, id), row64(one, id)[0]
			if id == 0 {
				// padding_idx: the row reads as zero.
				e, o = make([]float64, dim), 0
			}
			factors = append(factors, e)
			lin += o
		}
		for i := range dense {
			x := s.f(slots, i)
			lin += x * float64(wOne[i])
			f := make([]float64, dim)
			for j := range f {
				f[j] = x * float64(wDense[i*dim+j])
			}
			factors = append(factors, f)
		}
		var flat []float64
		fm := 0.0
		for j := range dim {
			s, sq := 0.0, 0.0
			for _, f := range factors {
				s += f[j]
				sq += f[j] * f[j]
			}
			fm += 0.5 * (s*s - sq)
		}
		for _, f := range factors {
			flat = append(flat, f...)
		}
		hid := l0.apply(flat)
		for i := range hid {
			hid[i] = math.Max(hid[i], 0)
		}
		return append(hid, lin, fm)
	}
	return m
}

// PaddleMultiTask is PaddleRec's models/multitask/esmm (net.py
// ESMMLayer, static_model.py, config.yaml) as paddle2onnx writes it, at
// opset 13 (reduce_sum): one int64 [-1, max_len] input per field,
// "field_0", "field_1", ... (a bag of ids padded with 0), every field
// read by the one table SparseFeatFactors (padding_idx 0: a Mul by a
// mask of its own per field, mapper/tensor/lookup_table.cc) and
// sum-pooled (paddle.sum axis 1: ReduceSum with a Constant axes input,
// keepdims 0, reduce_sum.cc); the pooled fields concatenated feed two
// towers (Linear, ReLU, Linear to 2), each ending in a Softmax (axis
// -1 at opset 13, activation.cc SoftMaxMapper::Opset13). The fetch
// variables PaddleRec's config.yaml names, softmax_0.tmp_0 (the CTR
// tower's [B, 2]) and concat_1.tmp_0 ([1 - p, p] with p the product of
// both towers' second column: Slice with Constant starts, ends, axes
// and steps (slice.cc Opset10), Mul, 1 - p as scale -1 bias 1 (a Mul
// and an Add, scale.cc), Concat), are the outputs
// save_infer_model/scale_0.tmp_0 and save_infer_model/scale_1.tmp_0,
// [B, 2] each (the scale ops' Identity removed, its name given to the
// Softmax and Concat outputs; the Slice reads the Softmax's output by
// that name). It has no float64 reference: the whole model is the
// reference.
func PaddleMultiTask(seed uint64) *Model {
	m := &Model{Name: "paddle-esmm", Source: "Paddle2ONNX paddle2onnx/mapper/tensor/lookup_table.cc (padding_idx: Mul by a mask Constant per lookup), reduce_sum.cc, concat.cc, matmul_v2.cc, elementwise_add.cc, activation/activation.cc (softmax Opset13), slice.cc (Opset10), elementwise_mul.cc, scale.cc; mapper/exporter.cc; PaddleRec models/multitask/esmm/net.py, static_model.py, config.yaml"}
	const fields, bag, rows, dim, hidden = 3, 3, 40, 4, 6
	b := newPDBuilder(13, seed)
	_, flat := b.tableValues(rows, dim)
	towers := []pdLinear{b.newLinear(fields*dim, hidden), b.newLinear(hidden, 2), b.newLinear(fields*dim, hidden), b.newLinear(hidden, 2)}
	ps := []pdParam{{"SparseFeatFactors", []int64{rows, dim}, flat}}
	for k, l := range towers {
		ps = append(ps, linearParams(k, l)...)
	}
	b.params(ps)
	var sig []models.InputSpec
	var pooled []string
	for k := range fields {
		name := "field_" + strconv.Itoa(k)
		b.pdInput(name, pb.TensorProto_INT64, -1, bag)
		sig = append(sig, models.InputSpec{Name: name, Kind: models.SparseKind, Width: bag, Rows: rows})
	}
	for k := range fields {
		mask := make([]float32, rows*dim)
		for i := dim; i < len(mask); i++ {
			mask[i] = 1
		}
		c := b.constF32([]int64{rows, dim}, mask...)
		emb := b.op("Gather", []string{b.op("Mul", []string{"SparseFeatFactors", c}, ""), "field_" + strconv.Itoa(k)}, fmt.Sprintf("embedding_%d.tmp_0", k))
		pooled = append(pooled, b.op("ReduceSum", []string{emb, b.constI64(1)}, "", ai("keepdims", 0)))
	}
	cat := b.op("Concat", pooled, "", ai("axis", 1))
	tower := func(k int, out string) string {
		h := b.op("Relu", []string{b.linear(k, cat, towers[k])}, fmt.Sprintf("relu_%d.tmp_0", k/2))
		return b.op("Softmax", []string{b.linear(k+1, h, towers[k+1])}, out, ai("axis", -1))
	}
	const ctrOut, ctcvrOut = "save_infer_model/scale_0.tmp_0", "save_infer_model/scale_1.tmp_0"
	ctr := tower(0, ctrOut)
	cvr := tower(2, "softmax_1.tmp_0")
	second := func(x, out string) string {
		st, en, steps, axes := b.constI64(1), b.constI64(2), b.constI64(1), b.constI64(1)
		return b.op("Slice", []string{x, st, en, axes, steps}, out)
	}
	p := b.op("Mul", []string{second(ctr, "slice_0.tmp_0"), second(cvr, "slice_1.tmp_0")}, "")
	neg := b.op("Mul", []string{p, b.constF32(nil, -1)}, "")
	oneMinus := b.op("Add", []string{neg, b.constF32(nil, 1)}, "")
	b.op("Concat", []string{oneMinus, p}, ctcvrOut, ai("axis", 1))
	for _, o := range []string{ctrOut, ctcvrOut} {
		b.g.Output = append(b.g.Output, b.valueInfo(o, pb.TensorProto_FLOAT, -1, 2))
	}
	m.Proto = &pb.ModelProto{IrVersion: 7, OpsetImport: []*pb.OperatorSetIdProto{{Domain: "", Version: b.opset}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
	m.Sig = models.Signature{Inputs: sig}
	return m
}
