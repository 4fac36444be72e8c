// Package exporters is the exporter-pattern corpus: one small
// recommendation model per pattern in which real exporters write the
// lookups of a model (PyTorch's TorchScript exporter at opsets 11 to 18,
// TorchRec's fused tables, DLRM-style single float inputs), each with a
// float64 reference that shares no code with its graph, and the valid
// inputs a sample of it takes. Broken twins are the same patterns gone
// wrong, each with the error the partitioner must give.
//
// Every model ends the same way: the pattern's features (pooled or
// picked embeddings, dense values) are concatenated along axis 1, and a
// Gemm and a Sigmoid make the score [batch, 1].
package exporters

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// Model is one corpus model.
type Model struct {
	Name string
	// Source names the exporter source whose node pattern it follows.
	Source string
	Proto  *pb.ModelProto
	// Sig draws valid inputs (written by hand from the pattern, not from
	// the plan: the plan's ranges are checked against it).
	Sig models.Signature
	// WantErr, for a broken twin, is what the partition error must say.
	WantErr string
	// Batch, when not 0, is the fixed batch size the model was exported
	// with (its inputs take batches of exactly this size): run it in
	// chunks of Batch samples.
	Batch int64
	// BlockedBy, for a fixed-batch model that cannot be rewritten to a
	// symbolic batch, names the node that ties it to Batch.
	BlockedBy string
	// BlockedSide is the side the partition puts that node on: "cpu"
	// (the embedding tier) or "gpu" (dense.onnx).
	BlockedSide plan.Side
	// Tol, when not 0, is how far ONNX Runtime's scores may be from the
	// reference (1e-5 otherwise): a model computing in float16.
	Tol float64

	feats func(s sample) []float64
	// half: the model's logit and score are float16 (the reference
	// rounds them as it does).
	half bool
	w    []float64
	bias float64
}

// Reference scores a batch in float64, from the pattern's own equations.
func (m *Model) Reference(b *models.Batch) ([]float64, error) {
	if m.feats == nil {
		return nil, fmt.Errorf("%s: a broken twin has no reference", m.Name)
	}
	if err := b.Check(); err != nil {
		return nil, err
	}
	out := make([]float64, b.N)
	for s := range b.N {
		x := m.feats(sample{b, s})
		if len(x) != len(m.w) {
			return nil, fmt.Errorf("%s: %d features, %d weights", m.Name, len(x), len(m.w))
		}
		z := m.bias
		for i := range x {
			z += x[i] * m.w[i]
		}
		if m.half {
			z = roundF16(z)
		}
		out[s] = 1 / (1 + math.Exp(-z))
		if m.half {
			out[s] = roundF16(out[s])
		}
	}
	return out, nil
}

// roundF16 rounds v to the nearest float16 (half to even; normal
// values only, which is all the corpus's are).
func roundF16(v float64) float64 {
	if v == 0 {
		return 0
	}
	frac, exp := math.Frexp(v)
	return math.Ldexp(math.RoundToEven(math.Ldexp(frac, 11)), exp-11)
}

// sample reads one sample's inputs.
type sample struct {
	b *models.Batch
	s int
}

func (s sample) f(in, j int) float64 {
	w := s.b.Sig.Inputs[in].Width
	return float64(s.b.Columns[in].F32[s.s*w+j])
}

func (s sample) id(in, j int) int64 {
	w := s.b.Sig.Inputs[in].Width
	return s.b.Columns[in].I64[s.s*w+j]
}

// builder writes a graph the way an exporter does: named nodes in
// order, small constants as Constant nodes (the TorchScript exporter's
// g.op("Constant", value_t=...)), weights as initializers.
type builder struct {
	g     *pb.GraphProto
	r     *rand.Rand
	opset int64
	n     int
}

func newBuilder(name string, opset int64, seed uint64) *builder {
	return &builder{g: &pb.GraphProto{Name: name}, r: rand.New(rand.NewPCG(seed, 0xe4b0)), opset: opset}
}

func (b *builder) fresh(op string) string {
	b.n++
	return fmt.Sprintf("/%s_%d", op, b.n)
}

func (b *builder) nodeN(op string, ins []string, nout int, attrs ...*pb.AttributeProto) []string {
	name := b.fresh(op)
	outs := make([]string, nout)
	for i := range outs {
		outs[i] = fmt.Sprintf("%s_output_%d", name, i)
	}
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: name, OpType: op, Input: ins, Output: outs, Attribute: attrs})
	return outs
}

func (b *builder) node(op string, ins []string, attrs ...*pb.AttributeProto) string {
	return b.nodeN(op, ins, 1, attrs...)[0]
}

// constI is a Constant node holding int64 values of dims (nil: scalar).
func (b *builder) constI(dims []int64, v ...int64) string {
	t := &pb.TensorProto{DataType: int32(pb.TensorProto_INT64), Dims: dims, Int64Data: v}
	return b.node("Constant", nil, &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: t})
}

// initI is an int64 initializer (constant folding's output).
func (b *builder) initI(name string, dims []int64, v ...int64) string {
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_INT64), Dims: dims, Int64Data: v})
	return name
}

// table is a float32 initializer [rows, dim] of values k/256 (exact in
// float16 too), returned for the reference.
func (b *builder) table(name string, rows, dim int) [][]float32 {
	t, flat := b.tableValues(rows, dim)
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{int64(rows), int64(dim)}, FloatData: flat})
	return t
}

func (b *builder) tableValues(rows, dim int) ([][]float32, []float32) {
	flat := make([]float32, rows*dim)
	for i := range flat {
		flat[i] = float32(b.r.IntN(513)-256) / 256
	}
	t := make([][]float32, rows)
	for i := range t {
		t[i] = flat[i*dim : (i+1)*dim]
	}
	return t, flat
}

// tableF16 is a float16 initializer [rows, dim] (raw little-endian
// data, as torch.onnx writes a half model's weights).
func (b *builder) tableF16(name string, rows, dim int) [][]float32 {
	t, flat := b.tableValues(rows, dim)
	raw := make([]byte, 2*len(flat))
	for i, v := range flat {
		binary.LittleEndian.PutUint16(raw[2*i:], f16(v))
	}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_FLOAT16), Dims: []int64{int64(rows), int64(dim)}, RawData: raw})
	return t
}

// f16 converts a float32 that float16 holds exactly (normal or zero).
func f16(v float32) uint16 {
	if v == 0 {
		return 0
	}
	bits := math.Float32bits(v)
	sign := uint16(bits>>16) & 0x8000
	exp := int((bits>>23)&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16((bits>>13)&0x3ff)
}

// constTable is a table as a Constant node (an exporter that folds
// weights into the graph).
func (b *builder) constTable(rows, dim int) (string, [][]float32) {
	t, flat := b.tableValues(rows, dim)
	v := &pb.TensorProto{DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{int64(rows), int64(dim)}, FloatData: flat}
	return b.node("Constant", nil, &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: v}), t
}

func (b *builder) input(name string, elem pb.TensorProto_DataType, dims ...int64) string {
	return b.inputB(name, 0, elem, dims...)
}

// inputB declares an input whose batch is the number batch (0: the
// symbol "batch").
func (b *builder) inputB(name string, batch int64, elem pb.TensorProto_DataType, dims ...int64) string {
	d := []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}}
	if batch > 0 {
		d[0].Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: batch}
	}
	for _, v := range dims {
		d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: v}})
	}
	b.g.Input = append(b.g.Input, &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: d}}}}})
	return name
}

// finish concatenates parts ([batch, k] float each, width features in
// all) and scores them: Concat, Gemm, Sigmoid.
func (b *builder) finish(m *Model, parts []string, width int) {
	b.finishB(m, parts, width, 0)
}

// finishB is finish with the output's batch the number batch (0: the
// symbol "batch").
func (b *builder) finishB(m *Model, parts []string, width int, batch int64) {
	cat := b.node("Concat", parts, ai("axis", 1))
	w := make([]float32, width)
	m.w = make([]float64, width)
	for i := range w {
		w[i] = float32(b.r.NormFloat64() * 0.3)
		m.w[i] = float64(w[i])
	}
	bias := float32(b.r.NormFloat64() * 0.1)
	m.bias = float64(bias)
	b.g.Initializer = append(b.g.Initializer,
		&pb.TensorProto{Name: "top.weight", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{int64(width), 1}, FloatData: w},
		&pb.TensorProto{Name: "top.bias", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{1}, FloatData: []float32{bias}})
	logit := b.node("Gemm", []string{cat, "top.weight", "top.bias"})
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: "/Sigmoid", OpType: "Sigmoid", Input: []string{logit}, Output: []string{models.ScoreOutput}})
	b.g.Output = append(b.g.Output, &pb.ValueInfoProto{Name: models.ScoreOutput, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1}}}}}}}})
	if batch > 0 {
		b.g.Output[len(b.g.Output)-1].GetType().GetTensorType().GetShape().Dim[0].Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: batch}
	}
	m.Proto = &pb.ModelProto{IrVersion: 8, ProducerName: "pytorch", OpsetImport: []*pb.OperatorSetIdProto{{Version: b.opset}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
}

func ai(name string, v int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INT, I: v}
}

func ais(name string, v ...int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INTS, Ints: v}
}

// row64 is a table row in float64.
func row64(t [][]float32, id int64) []float64 {
	out := make([]float64, len(t[id]))
	for i, v := range t[id] {
		out[i] = float64(v)
	}
	return out
}

// pool sums (or averages, or maxes) rows.
func pool(t [][]float32, ids []int64, how string) []float64 {
	out := row64(t, ids[0])
	for _, id := range ids[1:] {
		for i, v := range t[id] {
			if how == "max" {
				out[i] = max(out[i], float64(v))
			} else {
				out[i] += float64(v)
			}
		}
	}
	if how == "mean" {
		for i := range out {
			out[i] /= float64(len(ids))
		}
	}
	return out
}

// ranged is a sparse or float input spec with one id range per value
// (Hi 0: a dense value).
func ranged(name string, kind models.InputKind, r ...models.IDRange) models.InputSpec {
	hi := int64(0)
	for _, x := range r {
		hi = max(hi, x.Hi)
	}
	return models.InputSpec{Name: name, Kind: kind, Width: len(r), Ranges: r, Rows: hi}
}

func rng(lo, hi int64) models.IDRange { return models.IDRange{Lo: lo, Hi: hi} }

// Write writes m's graph to path (tables inline: the corpus is small).
func (m *Model) Write(path string) error {
	return pb.WriteModel(path, m.Proto, pb.WriteOptions{})
}
