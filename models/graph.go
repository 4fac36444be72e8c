package models

import (
	"fmt"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Opset and IR version of the graphs the zoo writes: what torch.onnx.export
// writes for opset 18 (ReduceSum, ReduceMean and ReduceMax take axes as an
// input from opset 18 on).
const (
	Opset     = 18
	IRVersion = 8
)

// BatchDim is the name of the symbolic batch dimension.
const BatchDim = "batch"

// Input and output names of zoo models.
const (
	DenseInput  = "dense"
	ScoreOutput = "score"
)

// PackedInput is the one id input of a packed model (Config.Packed),
// [batch, tables] int64.
const PackedInput = "sparse"

// SparseInput is the name of table k's id input.
func SparseInput(k int) string { return fmt.Sprintf("cat_%d", k) }

// TableName is the initializer name of table k, as PyTorch names the
// weight of an nn.EmbeddingBag in a ModuleList.
func TableName(k int) string { return fmt.Sprintf("emb_l.%d.weight", k) }

// graphBuilder emits nodes the way torch.onnx.export does: one node per
// op, initializers for weights, constants as initializers.
type graphBuilder struct {
	g   *pb.GraphProto
	seq map[string]int
	// cols are a packed model's picked id columns, by table.
	cols map[int]string
}

func newGraphBuilder(name string) *graphBuilder {
	return &graphBuilder{g: &pb.GraphProto{Name: name}, seq: map[string]int{}}
}

func (b *graphBuilder) fresh(op string) string {
	b.seq[op]++
	return fmt.Sprintf("/%s_%d", op, b.seq[op])
}

// node adds one node and returns its first output's name.
func (b *graphBuilder) node(op string, inputs []string, attrs ...*pb.AttributeProto) string {
	name := b.fresh(op)
	out := name + "_output_0"
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: name, OpType: op, Input: inputs, Output: []string{out}, Attribute: attrs})
	return out
}

func (b *graphBuilder) floatInit(name string, dims []int64, data []float32) string {
	b.g.Initializer = append(b.g.Initializer, pb.NewFloatTensor(name, dims, data))
	return name
}

func (b *graphBuilder) int64Const(vals ...int64) string {
	name := b.fresh("Constant") + "_value"
	b.g.Initializer = append(b.g.Initializer, pb.NewInt64Tensor(name, []int64{int64(len(vals))}, vals))
	return name
}

// int64Scalar is a rank-0 int64 constant (torch.onnx writes select's
// index so).
func (b *graphBuilder) int64Scalar(v int64) string {
	name := b.fresh("Constant") + "_value"
	b.g.Initializer = append(b.g.Initializer, pb.NewInt64Tensor(name, nil, []int64{v}))
	return name
}

// packedIDs is table k's id column of a packed model: x[:, k] as
// TorchScript exports it, Gather(x, k, axis=1) with a scalar k, [batch].
func (b *graphBuilder) packedIDs(k int) string {
	if c, ok := b.cols[k]; ok {
		return c
	}
	if b.cols == nil {
		b.cols = map[int]string{}
	}
	b.cols[k] = b.node("Gather", []string{PackedInput, b.int64Scalar(int64(k))}, intAttr("axis", 1))
	return b.cols[k]
}

func (b *graphBuilder) floatConst(v float32) string {
	name := b.fresh("Constant") + "_value"
	b.g.Initializer = append(b.g.Initializer, pb.NewFloatTensor(name, nil, []float32{v}))
	return name
}

func intAttr(name string, v int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INT, I: v}
}

func intsAttr(name string, v ...int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INTS, Ints: v}
}

func tensorType(elem pb.TensorProto_DataType, dims ...any) *pb.TypeProto {
	shape := &pb.TensorShapeProto{}
	for _, d := range dims {
		switch d := d.(type) {
		case string:
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: d}})
		case int:
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
		}
	}
	return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: shape}}}
}

func (b *graphBuilder) input(name string, t *pb.TypeProto) string {
	b.g.Input = append(b.g.Input, &pb.ValueInfoProto{Name: name, Type: t})
	return name
}

// gemm is nn.Linear on a 2-D input as PyTorch exports it: Gemm with transB.
func (b *graphBuilder) gemm(x string, l Linear, prefix string) string {
	w := b.floatInit(prefix+".weight", []int64{int64(l.Out), int64(l.In)}, l.W)
	bias := b.floatInit(prefix+".bias", []int64{int64(l.Out)}, l.B)
	return b.node("Gemm", []string{x, w, bias}, &pb.AttributeProto{Name: "alpha", Type: pb.AttributeProto_FLOAT, F: 1}, &pb.AttributeProto{Name: "beta", Type: pb.AttributeProto_FLOAT, F: 1}, intAttr("transB", 1))
}

// matmulAdd is nn.Linear as PyTorch exports it for inputs it cannot prove
// 2-D: MatMul with the transposed weight, then Add of the bias.
func (b *graphBuilder) matmulAdd(x string, l Linear, prefix string) string {
	wt := make([]float32, len(l.W))
	for o := range l.Out {
		for i := range l.In {
			wt[i*l.Out+o] = l.W[o*l.In+i]
		}
	}
	w := b.floatInit(prefix+".weight_T", []int64{int64(l.In), int64(l.Out)}, wt)
	y := b.node("MatMul", []string{x, w})
	if l.B == nil {
		return y
	}
	bias := b.floatInit(prefix+".bias", []int64{int64(l.Out)}, l.B)
	return b.node("Add", []string{y, bias})
}

// mlp applies layers with ReLU after each, except the last when lastLinear.
func (b *graphBuilder) mlp(x string, layers []Linear, prefix string, lastLinear bool) string {
	for i, l := range layers {
		x = b.gemm(x, l, fmt.Sprintf("%s.%d", prefix, 2*i))
		if !(lastLinear && i == len(layers)-1) {
			x = b.node("Relu", []string{x})
		}
	}
	return x
}

// embedding looks table k up for its input and pools a multi-hot bag with
// ReduceSum over the bag axis, as an exported nn.EmbeddingBag(mode="sum").
func (b *graphBuilder) embedding(m *Model, k int) string {
	c := &m.Config
	table := b.floatInit(TableName(k), []int64{c.TableRows[k], int64(c.EmbDim)}, m.Tables[k])
	var in string
	switch {
	case c.Packed:
		in = b.packedIDs(k)
	case c.BagSizes[k] == 0:
		in = b.input(SparseInput(k), tensorType(pb.TensorProto_INT64, BatchDim))
	default:
		in = b.input(SparseInput(k), tensorType(pb.TensorProto_INT64, BatchDim, c.BagSizes[k]))
	}
	e := b.node("Gather", []string{table, in}, intAttr("axis", 0))
	if c.BagSizes[k] == 0 {
		return e
	}
	return b.node("ReduceSum", []string{e, b.int64Const(1)}, intAttr("keepdims", 0))
}

// Graph returns m as an ONNX model. Its initializers alias m's weights.
func (m *Model) Graph() *pb.ModelProto {
	c := &m.Config
	b := newGraphBuilder(c.Name)
	dense := b.input(DenseInput, tensorType(pb.TensorProto_FLOAT, BatchDim, c.NumDense))
	if c.Packed {
		b.input(PackedInput, tensorType(pb.TensorProto_INT64, BatchDim, c.NumTables()))
	}
	var score string
	switch c.Family {
	case DLRM:
		score = m.dlrmGraph(b, dense)
	case DCNv2:
		score = m.dcnGraph(b, dense)
	case DeepFM:
		score = m.deepfmGraph(b, dense)
	}
	// Rename the last node's output to the public output name.
	last := b.g.Node[len(b.g.Node)-1]
	if last.Output[0] != score {
		panic("models: score is not the last node's output")
	}
	last.Output[0] = ScoreOutput
	b.g.Output = []*pb.ValueInfoProto{{Name: ScoreOutput, Type: tensorType(pb.TensorProto_FLOAT, BatchDim, 1)}}
	return &pb.ModelProto{
		IrVersion:       IRVersion,
		OpsetImport:     []*pb.OperatorSetIdProto{{Domain: "", Version: Opset}},
		ProducerName:    "prism",
		ProducerVersion: "models",
		Graph:           b.g,
		MetadataProps:   []*pb.StringStringEntryProto{{Key: "prism.model", Value: c.Name}, {Key: "prism.family", Value: string(c.Family)}, {Key: "prism.seed", Value: fmt.Sprint(m.Seed)}},
	}
}

// dlrmGraph: bottom MLP, embeddings, pairwise dot interaction of the 27
// vectors without self pairs (the strict lower triangle, Meta's order),
// concatenated with the bottom output, then the top MLP and a sigmoid.
func (m *Model) dlrmGraph(b *graphBuilder, dense string) string {
	c := &m.Config
	x := b.mlp(dense, m.Bottom, "bot_l", false)
	parts := []string{x}
	for k := range c.NumTables() {
		parts = append(parts, b.embedding(m, k))
	}
	f := int64(c.NumTables() + 1)
	cat := b.node("Concat", parts, intAttr("axis", 1))
	t := b.node("Reshape", []string{cat, b.int64Const(-1, f, int64(c.EmbDim))})
	tt := b.node("Transpose", []string{t}, intsAttr("perm", 0, 2, 1))
	z := b.node("MatMul", []string{t, tt})
	zf := b.node("Reshape", []string{z, b.int64Const(-1, f*f)})
	var idx []int64
	for i := int64(0); i < f; i++ {
		for j := int64(0); j < i; j++ {
			idx = append(idx, i*f+j)
		}
	}
	zflat := b.node("Gather", []string{zf, b.int64Const(idx...)}, intAttr("axis", 1))
	r := b.node("Concat", []string{x, zflat}, intAttr("axis", 1))
	logit := b.mlp(r, m.Top, "top_l", true)
	return b.node("Sigmoid", []string{logit})
}

// dcnGraph: bottom MLP, pooled multi-hot embeddings, concatenation, the
// low-rank cross network and the top MLP, as MLPerf DLRMv2 (TorchRec
// DLRM_DCN) computes it.
func (m *Model) dcnGraph(b *graphBuilder, dense string) string {
	c := &m.Config
	x := b.mlp(dense, m.Bottom, "dense_arch.model", false)
	parts := []string{x}
	for k := range c.NumTables() {
		parts = append(parts, b.embedding(m, k))
	}
	x0 := b.node("Concat", parts, intAttr("axis", 1))
	xl := x0
	for i, cr := range m.Cross {
		v := b.matmulAdd(xl, cr.V, fmt.Sprintf("inter_arch.crossnet.V_kernels.%d", i))
		w := b.matmulAdd(v, cr.W, fmt.Sprintf("inter_arch.crossnet.W_kernels.%d", i))
		xl = b.node("Add", []string{b.node("Mul", []string{x0, w}), xl})
	}
	logit := b.mlp(xl, m.Top, "over_arch.model", true)
	return b.node("Sigmoid", []string{logit})
}

// deepfmGraph: first-order weights of ids and dense features, the FM
// second-order term 0.5*sum_d((sum_i v_id)^2 - sum_i v_id^2) over the 26
// field embeddings, and a deep MLP over [embeddings, dense]; the three
// logits add, then a sigmoid.
func (m *Model) deepfmGraph(b *graphBuilder, dense string) string {
	c := &m.Config
	nt := int64(c.NumTables())
	var embs, firsts []string
	for k := range c.NumTables() {
		embs = append(embs, b.embedding(m, k))
		lin := b.floatInit(fmt.Sprintf("linear.emb_l.%d.weight", k), []int64{c.TableRows[k], 1}, m.FirstOrder[k])
		ids := SparseInput(k)
		if c.Packed {
			ids = b.packedIDs(k)
		}
		firsts = append(firsts, b.node("Gather", []string{lin, ids}, intAttr("axis", 0)))
	}
	first := b.node("ReduceSum", []string{b.node("Concat", firsts, intAttr("axis", 1)), b.int64Const(1)}, intAttr("keepdims", 1))
	first = b.node("Add", []string{first, b.gemm(dense, m.DenseLinear, "linear.dense")})

	flat := b.node("Concat", embs, intAttr("axis", 1))
	e := b.node("Reshape", []string{flat, b.int64Const(-1, nt, int64(c.EmbDim))})
	s := b.node("ReduceSum", []string{e, b.int64Const(1)}, intAttr("keepdims", 0))
	q := b.node("ReduceSum", []string{b.node("Mul", []string{e, e}), b.int64Const(1)}, intAttr("keepdims", 0))
	d := b.node("Sub", []string{b.node("Mul", []string{s, s}), q})
	fm := b.node("Mul", []string{b.node("ReduceSum", []string{d, b.int64Const(1)}, intAttr("keepdims", 1)), b.floatConst(0.5)})

	deep := b.mlp(b.node("Concat", []string{flat, dense}, intAttr("axis", 1)), m.Top, "dnn", true)
	logit := b.node("Add", []string{b.node("Add", []string{first, fm}), deep})
	return b.node("Sigmoid", []string{logit})
}
