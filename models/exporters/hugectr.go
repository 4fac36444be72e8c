package exporters

import (
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// HugeCTR returns the models NVIDIA HugeCTR's converter hugectr2onnx
// writes (onnx_converter/hugectr2onnx: graph_builder.py GraphBuilder,
// hugectr_loader.py HugeCTRLoader, converter.py convert), at small
// scale. What it writes, whatever the model:
//
//   - opset 10 and IR version 7 (GraphBuilder.save_model defaults), no
//     producer, nodes without names;
//   - the graph inputs of the Data layer: the dense features
//     float [None, dense_dim], then one int64 [None, slot_num, max_nnz]
//     tensor of HugeCTR's hash keys per sparse input (the batch
//     dimension neither a number nor a symbol); one output "output",
//     float [None, label_dim];
//   - one int64 initializer key_to_indice_hash_all_tables, first, of
//     size the sum of every table's max_vocabulary_size_global, indexed
//     by key: the row of the key in its table (HugeCTRLoader reads each
//     table's key and emb_vector files in order; row 0 of each table is
//     reserved, zero, for keys never trained, which the map leaves at
//     0);
//   - per DistributedSlotSparseEmbeddingHash or
//     LocalizedSlotSparseEmbeddingHash layer: the table
//     <top>_embedding_table [max_vocabulary_size_global+1, vec_size],
//     Gather(key_to_indice_hash_all_tables, keys) to the rows, Gather
//     on the table ([B, slots, nnz, vec]), and ReduceSum (combiner sum)
//     or ReduceMean (combiner mean) with the axes attribute [-2] and
//     keepdims 0: one pooled vector per slot, [B, slots, vec].
func HugeCTR(seed uint64) []*Model {
	return []*Model{hugectrWDL(seed), hugectrDLRM(seed, 1)}
}

// HugeCTRMultiTask is hugectr-dlrm with label_dim 2 (two tasks, as
// HugeCTR's multi-task samples train: the Data layer's label_dim 2 makes
// the output [None, 2], one sigmoid per task): a model with no single
// score.
func HugeCTRMultiTask(seed uint64) *Model {
	m := hugectrDLRM(seed, 2)
	m.feats = nil
	return m
}

// hcBuilder writes nodes as GraphBuilder.add_layer does: no node names,
// outputs named after the HugeCTR layer's top.
type hcBuilder struct{ *builder }

func (b hcBuilder) op(op string, ins []string, out string, attrs ...*pb.AttributeProto) string {
	b.g.Node = append(b.g.Node, &pb.NodeProto{OpType: op, Input: ins, Output: []string{out}, Attribute: attrs})
	return out
}

// noneDims is a value info whose first dimension is None (neither a
// number nor a symbol: onnx.helper.make_tensor_value_info with None).
func noneDims(name string, elem pb.TensorProto_DataType, dims ...int64) *pb.ValueInfoProto {
	d := []*pb.TensorShapeProto_Dimension{{}}
	for _, v := range dims {
		d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: v}})
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: d}}}}}
}

// hcSparse is one sparse input of the Data layer: slot s of a sample
// takes keys in [lo[s], lo[s]+n[s]).
type hcSparse struct {
	name     string
	nnz      int64
	lo, size []int64
}

func (s hcSparse) spec() models.InputSpec {
	var r []models.IDRange
	for k := range s.lo {
		for range s.nnz {
			r = append(r, rng(s.lo[k], s.lo[k]+s.size[k]))
		}
	}
	sp := ranged(s.name, models.SparseKind, r...)
	sp.Dims = []int64{int64(len(s.lo)), s.nnz}
	return sp
}

// hcKeys is HugeCTRLoader's key_to_indice_hash_all_tables: keys of the
// tables in files written in a shuffled order, some keys of each range
// never trained (they stay 0: the zero row).
type hcKeys struct {
	toRow []int64
}

// load gives the keys [lo, lo+n) of one table its rows 1, 2, ... in a
// shuffled order, leaving every 7th key untrained, and returns the
// table's rows (vocab+1).
func (k *hcKeys) load(b *builder, lo, n, vocab int64) {
	perm := b.r.Perm(int(n))
	next := int64(1)
	for _, p := range perm {
		if p%7 == 3 {
			continue
		}
		k.toRow[lo+int64(p)] = next
		next++
	}
	if next > vocab+1 {
		panic("hugectr fixture: more keys than the vocabulary")
	}
}

// hcTable is <top>_embedding_table: row 0 and the rows no key reaches
// zero, as HugeCTRLoader leaves them.
func (b hcBuilder) hcTable(top string, vocab int64, vec int) [][]float32 {
	t := b.table(top+"_embedding_table", int(vocab)+1, vec)
	for j := range t[0] {
		t[0][j] = 0
	}
	return t
}

// embedding lowers one sparse embedding layer as add_layer does.
func (b hcBuilder) embedding(top, keys string, mean bool) string {
	idx := b.op("Gather", []string{"key_to_indice_hash_all_tables", keys}, top+"_indice", ai("axis", 0))
	feat := b.op("Gather", []string{top + "_embedding_table", idx}, top+"_embedding_feature", ai("axis", 0))
	red := "ReduceSum"
	if mean {
		red = "ReduceMean"
	}
	return b.op(red, []string{feat}, top, ai("keepdims", 0), ais("axes", -2))
}

// initF is a float32 initializer.
func (b hcBuilder) initF(name string, dims []int64, v []float32) string {
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_FLOAT), Dims: dims, FloatData: v})
	return name
}

// innerProduct is the InnerProduct layer as the converter writes it:
// Reshape to [-1, in], Gemm with weight [in, out] and bias [1, out],
// Reshape to [-1, out]. w and bias are returned for the reference.
func (b hcBuilder) innerProduct(top, bottom string, in, out int) ([]float32, []float32) {
	w := make([]float32, in*out)
	for i := range w {
		w[i] = float32(b.r.NormFloat64() * 0.3)
	}
	bias := make([]float32, out)
	for i := range bias {
		bias[i] = float32(b.r.NormFloat64() * 0.1)
	}
	b.initI(top+"_shape1", []int64{2}, -1, int64(in))
	b.initI(top+"_shape2", []int64{2}, -1, int64(out))
	b.initF(top+"_weight", []int64{int64(in), int64(out)}, w)
	b.initF(top+"_bias", []int64{1, int64(out)}, bias)
	r1 := b.op("Reshape", []string{bottom, top + "_shape1"}, bottom+"_reshape_fc1")
	r2 := b.op("Gemm", []string{r1, top + "_weight", top + "_bias"}, top+"_reshape_fc2")
	b.op("Reshape", []string{r2, top + "_shape2"}, top)
	return w, bias
}

// hcFinish declares the output and the model as save_model writes them.
func (b hcBuilder) hcFinish(m *Model, logit string, labelDim int64) {
	b.op("Sigmoid", []string{logit}, "output")
	b.g.Output = append(b.g.Output, noneDims("output", pb.TensorProto_FLOAT, labelDim))
	m.Proto = &pb.ModelProto{IrVersion: 7, OpsetImport: []*pb.OperatorSetIdProto{{Version: 10}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
}

// hugectrWDL: HugeCTR's Wide&Deep sample (samples/wdl): a wide input of
// one multi-hot slot (max nnz 3) through a table of vec_size 1, combiner
// sum, and a deep input of 3 slots with max nnz 2 through a table of
// vec_size 4, combiner mean; the deep embedding reshaped to
// [-1, 3*4] (Reshape layer, leading_dim 12), concatenated with the
// dense features (Concat, axis 1), an InnerProduct to 1, added to the
// wide embedding reshaped to [-1, 1] (Add), and the
// BinaryCrossEntropyLoss turned into a Sigmoid.
func hugectrWDL(seed uint64) *Model {
	m := &Model{Name: "hugectr-wdl", Source: "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, LocalizedSlotSparseEmbeddingHash, Reshape, Concat, InnerProduct, Add, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader key_to_indice_hash_all_tables"}
	b := hcBuilder{newBuilder("hugectr", 10, seed)}
	wide := hcSparse{name: "wide_data", nnz: 3, lo: []int64{0}, size: []int64{20}}
	deep := hcSparse{name: "deep_data", nnz: 2, lo: []int64{20, 34, 49}, size: []int64{14, 15, 11}}
	const wideVocab, deepVocab, dv = 24, 40, 4
	keys := &hcKeys{toRow: make([]int64, wideVocab+deepVocab)}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, 3),
		noneDims(wide.name, pb.TensorProto_INT64, 1, wide.nnz), noneDims(deep.name, pb.TensorProto_INT64, 3, deep.nnz))
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "key_to_indice_hash_all_tables", DataType: int32(pb.TensorProto_INT64), Dims: []int64{wideVocab + deepVocab}})
	tw := b.hcTable("sparse_embedding2", wideVocab, 1)
	keys.load(b.builder, 0, 20, wideVocab)
	td := b.hcTable("sparse_embedding1", deepVocab, dv)
	keys.load(b.builder, 20, 40, deepVocab)
	b.g.Initializer[0].Int64Data = keys.toRow
	we := b.embedding("sparse_embedding2", wide.name, false)
	de := b.embedding("sparse_embedding1", deep.name, true)
	b.initI("reshape1_shape", []int64{2}, -1, 3*dv)
	b.initI("reshape2_shape", []int64{2}, -1, 1)
	r1 := b.op("Reshape", []string{de, "reshape1_shape"}, "reshape1")
	r2 := b.op("Reshape", []string{we, "reshape2_shape"}, "reshape2")
	cat := b.op("Concat", []string{r1, "dense"}, "concat1", ai("axis", 1))
	w, bias := b.innerProduct("fc1", cat, 3*dv+3, 1)
	sum := b.op("Add", []string{"fc1", r2}, "add1")
	b.hcFinish(m, sum, 1)
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: 3}, wide.spec(), deep.spec()}}
	// The reference: logit = fc1 . [deep rows pooled by mean per slot,
	// dense] + bias + the wide rows summed.
	m.bias = float64(bias[0])
	for _, v := range w {
		m.w = append(m.w, float64(v))
	}
	m.w = append(m.w, 1)
	m.feats = func(s sample) []float64 {
		var x []float64
		for slot := range 3 {
			var rows []int64
			for j := range 2 {
				rows = append(rows, keys.toRow[s.id(2, slot*2+j)])
			}
			x = append(x, pool(td, rows, "mean")...)
		}
		x = append(x, s.f(0, 0), s.f(0, 1), s.f(0, 2))
		wsum := 0.0
		for j := range 3 {
			wsum += float64(tw[keys.toRow[s.id(1, j)]][0])
		}
		return append(x, wsum)
	}
	return m
}

// hugectrDLRM: HugeCTR's DLRM sample (samples/dlrm): the dense
// features through a FusedInnerProduct (Gemm, Relu) to vec_size 4, one
// LocalizedSlotSparseEmbeddingHash of 3 one-hot slots, combiner sum
// ([B, 3, 4]), the Interaction layer as add_layer writes it (Reshape
// the MLP output to [-1, 1, 4], Concat on axis -2, Transpose, MatMul,
// Reshape to [-1, 16], Gather axis 1 of the 6 pairs below the diagonal,
// Concat with the MLP output on axis -1, Pad one zero at the end), an
// InnerProduct to 1 and the Sigmoid.
func hugectrDLRM(seed uint64, labelDim int) *Model {
	name := "hugectr-dlrm"
	if labelDim > 1 {
		name = "hugectr-dlrm-multitask"
	}
	m := &Model{Name: name, Source: "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, LocalizedSlotSparseEmbeddingHash, FusedInnerProduct, Interaction, InnerProduct, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader key_to_indice_hash_all_tables"}
	b := hcBuilder{newBuilder("hugectr", 10, seed)}
	const slots, vec, vocab = 3, 4, 36
	sp := hcSparse{name: "data1", nnz: 1, lo: []int64{0, 10, 22}, size: []int64{10, 12, 11}}
	keys := &hcKeys{toRow: make([]int64, vocab)}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, 2), noneDims(sp.name, pb.TensorProto_INT64, slots, 1))
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "key_to_indice_hash_all_tables", DataType: int32(pb.TensorProto_INT64), Dims: []int64{vocab}})
	t := b.hcTable("sparse_embedding1", vocab, vec)
	keys.load(b.builder, 0, 33, vocab)
	b.g.Initializer[0].Int64Data = keys.toRow
	emb := b.embedding("sparse_embedding1", sp.name, false)
	// FusedInnerProduct fc1: Gemm and Relu.
	w1 := make([]float32, 2*vec)
	for i := range w1 {
		w1[i] = float32(b.r.NormFloat64() * 0.5)
	}
	b1 := []float32{0.05, -0.1, 0.2, 0.1}
	b.initF("fc1_weight", []int64{2, vec}, w1)
	b.initF("fc1_bias", []int64{1, vec}, b1)
	mlp := b.op("Relu", []string{b.op("Gemm", []string{"dense", "fc1_weight", "fc1_bias"}, "fc1_gemm")}, "fc1")
	// Interaction.
	b.initI("interaction1_shape1", []int64{3}, -1, 1, vec)
	b.initI("interaction1_shape2", []int64{2}, -1, (slots+1)*(slots+1))
	var pairs []int64
	for j := int64(1); j <= slots; j++ {
		for i := range j {
			pairs = append(pairs, i*(slots+1)+j)
		}
	}
	b.initI("interaction1_indices", []int64{int64(len(pairs))}, pairs...)
	r1 := b.op("Reshape", []string{mlp, "interaction1_shape1"}, "interaction1_reshape1")
	c := b.op("Concat", []string{r1, emb}, "interaction1_concat", ai("axis", -2))
	tr := b.op("Transpose", []string{c}, "interaction1_transpose", ais("perm", 0, 2, 1))
	mm := b.op("MatMul", []string{c, tr}, "interaction1_matmul")
	r2 := b.op("Reshape", []string{mm, "interaction1_shape2"}, "interaction1_reshape2")
	ga := b.op("Gather", []string{r2, "interaction1_indices"}, "interaction1_gather", ai("axis", 1))
	ic := b.op("Concat", []string{mlp, ga}, "interaction1_interaction", ai("axis", -1))
	b.op("Pad", []string{ic}, "interaction1", ais("pads", 0, 0, 0, 1))
	width := vec + len(pairs) + 1
	w, bias := b.innerProduct("fc2", "interaction1", width, labelDim)
	b.hcFinish(m, "fc2", int64(labelDim))
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: 2}, sp.spec()}}
	m.bias = float64(bias[0])
	for _, v := range w {
		m.w = append(m.w, float64(v))
	}
	m.feats = func(s sample) []float64 {
		z := make([]float64, vec)
		for k := range vec {
			v := float64(b1[k]) + s.f(0, 0)*float64(w1[k]) + s.f(0, 1)*float64(w1[vec+k])
			z[k] = math.Max(v, 0)
		}
		vecs := [][]float64{z}
		for slot := range slots {
			vecs = append(vecs, row64(t, keys.toRow[s.id(1, slot)]))
		}
		x := append([]float64(nil), z...)
		for j := 1; j <= slots; j++ {
			for i := range j {
				d := 0.0
				for k := range vec {
					d += vecs[i][k] * vecs[j][k]
				}
				x = append(x, d)
			}
		}
		return append(x, 0)
	}
	return m
}
