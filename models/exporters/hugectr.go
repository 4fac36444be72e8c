package exporters

import (
	"math"
	"strconv"

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
//
// hugectr-dcn and hugectr-deepfm add the MultiCross, Slice,
// WeightMultiply, FmOrder2, ReduceSum and three-way Add lowerings;
// hugectr-deepfm-v32 is DeepFM as the first converter wrote it (see
// hcBuilder.v32: Concat on axis -1, bare Gemm, no reserved zero row);
// hugectr-wdl-2503 is Wide&Deep as the newest converter writes it (see
// hcBuilder.perLayer: a key map per embedding layer).
func HugeCTR(seed uint64) []*Model {
	return []*Model{hugectrWDL(seed, false), hugectrDLRM(seed, 1), hugectrDCN(seed), hugectrDeepFM(seed, false), hugectrDeepFM(seed, true), hugectrWDL(seed, true)}
}

// HugeCTRMultiTask is hugectr-dlrm with label_dim 2 (two tasks, as
// HugeCTR's multi-task samples train: the Data layer's label_dim 2 makes
// the output [None, 2], one sigmoid per task): a multi-task model, served
// with both tasks' scores (RecommendResponse.task_scores).
func HugeCTRMultiTask(seed uint64) *Model {
	m := hugectrDLRM(seed, 2)
	m.feats = nil
	return m
}

// hcBuilder writes nodes as GraphBuilder.add_layer does: no node names,
// outputs named after the HugeCTR layer's top.
// v32 writes the first converter's layout (HugeCTR v3.2 to v3.4,
// graph_builder.py and hugectr_loader.py up to commit 1c4ffa577): every
// Concat on axis -1 whatever the layer's axis, InnerProduct a bare Gemm,
// and tables of max_vocabulary_size_global rows with no reserved row:
// the loader gives the keys rows from 0, and a key never trained, which
// the map leaves at 0, reads the first trained key's row.
//
// perLayer writes the newest converter's layout (HugeCTR 25.03,
// graph_builder.py and hugectr_loader.py from commit d4fecdb3f): no
// shared key_to_indice_hash_all_tables; each embedding layer's Gather
// reads its own <top>_hash_table, HugeCTRLoader's map for that layer
// alone, an int64 array as long as the vocabularies of this layer and
// every layer before it (keys of the earlier tables, and of none, map to
// the zero row 0).
type hcBuilder struct {
	*builder
	v32, perLayer bool
}

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
	// first is the row the first key loaded takes: 1 (row 0 reserved),
	// or 0 in the v32 layout.
	first int64
}

// load gives the keys [lo, lo+n) of one table its rows 1, 2, ... in a
// shuffled order, leaving every 7th key untrained, and returns the
// table's rows (vocab+1).
func (k *hcKeys) load(b *builder, lo, n, vocab int64) {
	perm := b.r.Perm(int(n))
	next := k.first
	for _, p := range perm {
		if p%7 == 3 {
			continue
		}
		k.toRow[lo+int64(p)] = next
		next++
	}
	if next > vocab+k.first {
		panic("hugectr fixture: more keys than the vocabulary")
	}
}

// hcTable is <top>_embedding_table: row 0 and the rows no key reaches
// zero, as HugeCTRLoader leaves them.
func (b hcBuilder) hcTable(top string, vocab int64, vec int) [][]float32 {
	if b.v32 {
		return b.table(top+"_embedding_table", int(vocab), vec)
	}
	t := b.table(top+"_embedding_table", int(vocab)+1, vec)
	for j := range t[0] {
		t[0][j] = 0
	}
	return t
}

// embedding lowers one sparse embedding layer as add_layer does.
func (b hcBuilder) embedding(top, keys string, mean bool) string {
	keyMap := "key_to_indice_hash_all_tables"
	if b.perLayer {
		keyMap = top + "_hash_table"
	}
	idx := b.op("Gather", []string{keyMap, keys}, top+"_indice", ai("axis", 0))
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
	if b.v32 {
		b.initF(top+"_weight", []int64{int64(in), int64(out)}, w)
		b.initF(top+"_bias", []int64{1, int64(out)}, bias)
		b.op("Gemm", []string{bottom, top + "_weight", top + "_bias"}, top)
		return w, bias
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

// randF is n weights of scale sd.
func (b hcBuilder) randF(n int, sd float64) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(b.r.NormFloat64() * sd)
	}
	return w
}

// concat is the Concat layer: on the layer's axis (1: HugeCTR's Concat
// takes 2-D tensors), on -1 in the v32 layout.
func (b hcBuilder) concat(top string, bottoms ...string) string {
	axis := int64(1)
	if b.v32 {
		axis = -1
	}
	return b.op("Concat", bottoms, top, ai("axis", axis))
}

// slice is the Slice layer: per top and range, Slice(bottom, [lo],
// [hi], axes [-1]) with the constants as initializers named after the
// top (opset 10 Slice takes them as inputs).
func (b hcBuilder) slice(bottom string, tops []string, ranges [][2]int64) {
	for i, top := range tops {
		b.initI(top+"_start", []int64{1}, ranges[i][0])
		b.initI(top+"_end", []int64{1}, ranges[i][1])
		b.initI(top+"_axes", []int64{1}, -1)
		b.op("Slice", []string{bottom, top + "_start", top + "_end", top + "_axes"}, top)
	}
}

// reshape is the Reshape layer (no time step, no selected slots):
// Reshape to [-1, leading_dim].
func (b hcBuilder) reshape(top, bottom string, leading int64) string {
	b.initI(top+"_shape", []int64{2}, -1, leading)
	return b.op("Reshape", []string{bottom, top + "_shape"}, top)
}

// chain is the Add and the ElementwiseMultiply (DotProduct in v32)
// layers: one binary node per further bottom, the partial results
// named top+"1", top+"2", ..., the last top.
func (b hcBuilder) chain(op, top string, bottoms ...string) string {
	x := bottoms[0]
	for i := 0; i < len(bottoms)-1; i++ {
		z := top
		if i < len(bottoms)-2 {
			z = top + strconv.Itoa(i+1)
		}
		x = b.op(op, []string{x, bottoms[i+1]}, z)
	}
	return x
}

// multiCross is the MultiCross layer: per cross layer i, weight
// <top>_weights<i> [in, 1] and bias <top>_biases<i> [1, in];
// MatMul(x_i, w) to <top>_matmul<i+1>, Mul(x0, that) to
// <top>_multiply<i+1>, Add(x_i, b) to <top>_add<i+1>, and their Add to
// <top>_multicross<i+1> (the last one to top). w and b come back for
// the reference.
func (b hcBuilder) multiCross(top, bottom string, in, layers int) (w, bias [][]float32) {
	feed := bottom
	for i := range layers {
		wi, bi := b.randF(in, 0.3), b.randF(in, 0.1)
		w, bias = append(w, wi), append(bias, bi)
		wn, bn := top+"_weights"+strconv.Itoa(i), top+"_biases"+strconv.Itoa(i)
		b.initF(wn, []int64{int64(in), 1}, wi)
		b.initF(bn, []int64{1, int64(in)}, bi)
		s := strconv.Itoa(i + 1)
		out := top
		if i < layers-1 {
			out = top + "_multicross" + s
		}
		mm := b.op("MatMul", []string{feed, wn}, top+"_matmul"+s)
		mul := b.op("Mul", []string{bottom, mm}, top+"_multiply"+s)
		add := b.op("Add", []string{feed, bn}, top+"_add"+s)
		feed = b.op("Add", []string{mul, add}, out)
	}
	return w, bias
}

// weightMultiply is the WeightMultiply layer of weight_dims [n, k]:
// Flatten(bottom, axis 0) to [1, B*n] (the batch folded in), Transpose
// to [B*n, 1], Expand to [B*n, k], Reshape to [-1, n, k], Mul by
// <top>_weight [n, k], Reshape to [-1, n*k]. The weight comes back.
func (b hcBuilder) weightMultiply(top, bottom string, n, k int64) []float32 {
	w := b.randF(int(n*k), 0.4)
	b.initF(top+"_weight", []int64{n, k}, w)
	b.initI(top+"_expand_shape", []int64{2}, 1, k)
	b.initI(top+"_shape1", []int64{3}, -1, n, k)
	b.initI(top+"_shape2", []int64{2}, -1, n*k)
	f := b.op("Flatten", []string{bottom}, top+"_flatten", ai("axis", 0))
	tr := b.op("Transpose", []string{f}, top+"_transpose")
	ex := b.op("Expand", []string{tr, top + "_expand_shape"}, top+"_expand")
	r := b.op("Reshape", []string{ex, top + "_shape1"}, top+"_reshape")
	m := b.op("Mul", []string{r, top + "_weight"}, top+"_multiply")
	b.op("Reshape", []string{m, top + "_shape2"}, top)
	return w
}

// fmOrder2 is the FmOrder2 layer of out_dim vec on a [B, slots*vec]
// bottom: Reshape to [-1, slots, vec], ReduceSum axes [-2] keepdims 0,
// squared (Mul by itself), the squares' ReduceSum, Sub, and Mul by
// <top>_scalar [0.5]: [B, vec].
func (b hcBuilder) fmOrder2(top, bottom string, slots, vec int64) string {
	b.initI(top+"_shape", []int64{3}, -1, slots, vec)
	b.initF(top+"_scalar", []int64{1}, []float32{0.5})
	r := b.op("Reshape", []string{bottom, top + "_shape"}, top+"_reshape")
	rs := b.op("ReduceSum", []string{r}, top+"_reduce_sum", ai("keepdims", 0), ais("axes", -2))
	ss := b.op("Mul", []string{rs, rs}, top+"_sum_square")
	sq := b.op("Mul", []string{r, r}, top+"_square")
	sqs := b.op("ReduceSum", []string{sq}, top+"_square_sum", ai("keepdims", 0), ais("axes", -2))
	sub := b.op("Sub", []string{ss, sqs}, top+"_sub")
	return b.op("Mul", []string{sub, top + "_scalar"}, top)
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
func hugectrWDL(seed uint64, perLayer bool) *Model {
	m := &Model{Name: "hugectr-wdl", Source: "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, LocalizedSlotSparseEmbeddingHash, Reshape, Concat, InnerProduct, Add, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader key_to_indice_hash_all_tables"}
	if perLayer {
		m.Name = "hugectr-wdl-2503"
		m.Source = "HugeCTR 25.03 (d4fecdb3f) onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, LocalizedSlotSparseEmbeddingHash with <top>_hash_table, Reshape, Concat, InnerProduct, Add, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader key_to_indice_hash_all_tables[i], as long as the vocabularies up to layer i"
	}
	b := hcBuilder{builder: newBuilder("hugectr", 10, seed), perLayer: perLayer}
	wide := hcSparse{name: "wide_data", nnz: 3, lo: []int64{0}, size: []int64{20}}
	deep := hcSparse{name: "deep_data", nnz: 2, lo: []int64{20, 34, 49}, size: []int64{14, 15, 11}}
	const wideVocab, deepVocab, dv = 24, 40, 4
	keys := &hcKeys{toRow: make([]int64, wideVocab+deepVocab)}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, 3),
		noneDims(wide.name, pb.TensorProto_INT64, 1, wide.nnz), noneDims(deep.name, pb.TensorProto_INT64, 3, deep.nnz))
	if !perLayer {
		b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "key_to_indice_hash_all_tables", DataType: int32(pb.TensorProto_INT64), Dims: []int64{wideVocab + deepVocab}})
	}
	tw := b.hcTable("sparse_embedding2", wideVocab, 1)
	keys.load(b.builder, 0, 20, wideVocab)
	wideMap := keys.toRow[:wideVocab]
	if perLayer {
		// The wide layer's map: its keys alone, wideVocab long.
		b.initI("sparse_embedding2_hash_table", []int64{wideVocab}, wideMap...)
		keys.toRow = make([]int64, wideVocab+deepVocab)
	}
	td := b.hcTable("sparse_embedding1", deepVocab, dv)
	keys.load(b.builder, 20, 40, deepVocab)
	if perLayer {
		// The deep layer's: its keys alone, as long as both
		// vocabularies (the wide keys map to the zero row).
		b.initI("sparse_embedding1_hash_table", []int64{wideVocab + deepVocab}, keys.toRow...)
		// The reference's map: both layers' keys (disjoint ranges).
		keys.toRow = append(append([]int64(nil), wideMap[:20]...), keys.toRow[20:]...)
	} else {
		b.g.Initializer[0].Int64Data = keys.toRow
	}
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
	b := hcBuilder{builder: newBuilder("hugectr", 10, seed)}
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

// hcSlots is the rows of one sample's one-hot slots of input in.
func hcSlots(s sample, in, slots int, keys *hcKeys) []int64 {
	rows := make([]int64, slots)
	for k := range rows {
		rows[k] = keys.toRow[s.id(in, k)]
	}
	return rows
}

// hugectrDCN: HugeCTR's DCN sample (samples/dcn, and the converter's
// test train_scripts/dcn.py): one DistributedSlotSparseEmbeddingHash of
// 4 one-hot slots, vec_size 4, combiner sum, reshaped to [-1, 16]
// (Reshape, leading_dim 16), concatenated with the 3 dense features
// (Concat), the concat sliced twice whole (Slice, ranges (0, 19) and
// (0, 19)); one copy through a MultiCross of 2 layers, the other through
// an InnerProduct to 6, ReLU and Dropout; the two concatenated
// (Concat), an InnerProduct to 1 and the Sigmoid.
func hugectrDCN(seed uint64) *Model {
	m := &Model{Name: "hugectr-dcn", Source: "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, DistributedSlotSparseEmbeddingHash, Reshape, Concat, Slice, MultiCross, InnerProduct, ReLU, Dropout, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader (MultiCross weights [in, 1], biases [1, in]); test/onnx_converter_test/train_scripts/dcn.py"}
	b := hcBuilder{builder: newBuilder("hugectr", 10, seed)}
	const slots, vec, vocab, dense = 4, 4, 48, 3
	const in = slots*vec + dense
	sp := hcSparse{name: "data1", nnz: 1, lo: []int64{0, 9, 20, 31}, size: []int64{9, 11, 11, 10}}
	keys := &hcKeys{toRow: make([]int64, vocab), first: 1}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, dense), noneDims(sp.name, pb.TensorProto_INT64, slots, 1))
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "key_to_indice_hash_all_tables", DataType: int32(pb.TensorProto_INT64), Dims: []int64{vocab}})
	t := b.hcTable("sparse_embedding1", vocab, vec)
	keys.load(b.builder, 0, 41, vocab)
	b.g.Initializer[0].Int64Data = keys.toRow
	emb := b.embedding("sparse_embedding1", sp.name, false)
	r1 := b.reshape("reshape1", emb, slots*vec)
	c1 := b.concat("concat1", r1, "dense")
	b.slice(c1, []string{"slice11", "slice12"}, [][2]int64{{0, in}, {0, in}})
	cw, cb := b.multiCross("multicross1", "slice11", in, 2)
	w1, b1 := b.innerProduct("fc1", "slice12", in, 6)
	relu := b.op("Relu", []string{"fc1"}, "relu1")
	drop := b.op("Dropout", []string{relu}, "dropout1")
	c2 := b.concat("concat2", drop, "multicross1")
	w, bias := b.innerProduct("fc2", c2, 6+in, 1)
	b.hcFinish(m, "fc2", 1)
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: dense}, sp.spec()}}
	m.bias = float64(bias[0])
	for _, v := range w {
		m.w = append(m.w, float64(v))
	}
	m.feats = func(s sample) []float64 {
		var x0 []float64
		for _, r := range hcSlots(s, 1, slots, keys) {
			x0 = append(x0, row64(t, r)...)
		}
		for j := range dense {
			x0 = append(x0, s.f(0, j))
		}
		// deep: relu(x0 W1 + b1)
		deep := make([]float64, 6)
		for o := range deep {
			z := float64(b1[o])
			for i := range in {
				z += x0[i] * float64(w1[i*6+o])
			}
			deep[o] = math.Max(z, 0)
		}
		// cross: x_{l+1} = x0 (x_l . w_l) + x_l + b_l
		x := append([]float64(nil), x0...)
		for l := range cw {
			d := 0.0
			for i := range in {
				d += x[i] * float64(cw[l][i])
			}
			next := make([]float64, in)
			for i := range in {
				next[i] = x0[i]*d + x[i] + float64(cb[l][i])
			}
			x = next
		}
		return append(deep, x...)
	}
	return m
}

// hugectrDeepFM: HugeCTR's DeepFM sample (samples/deepfm, and the
// converter's test train_scripts/deepfm.py): one
// DistributedSlotSparseEmbeddingHash of 4 one-hot slots, vec_size 5,
// combiner sum, reshaped to [-1, 5] (Reshape, leading_dim 5: one row
// per sample and slot, the batch folded into the first dimension),
// sliced into the factors (0, 4) and the first-order weight (4, 5) and
// each reshaped back per sample ([-1, 16], [-1, 4]); the 3 dense
// features sliced twice whole, through WeightMultiply [3, 4] (their
// factors) and WeightMultiply [3, 1] (their first-order weights); the
// factors concatenated (Concat) and sliced twice whole, one copy
// through InnerProduct 16+12 to 6, ReLU, Dropout and InnerProduct to 1,
// the other through FmOrder2 (out_dim 4) and ReduceSum (axis 1); the
// first-order weights concatenated and summed (ReduceSum, axis 1); the
// three added (Add of three bottoms) and the Sigmoid. v32 writes it in
// the first converter's layout (hcBuilder.v32).
func hugectrDeepFM(seed uint64, v32 bool) *Model {
	m := &Model{Name: "hugectr-deepfm", Source: "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py: GraphBuilder.add_layer (Data, DistributedSlotSparseEmbeddingHash, Reshape, Slice, WeightMultiply, Concat, InnerProduct, ReLU, Dropout, FmOrder2, ReduceSum, Add, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py: HugeCTRLoader (WeightMultiply weight [n, k]); test/onnx_converter_test/train_scripts/deepfm.py"}
	if v32 {
		m.Name = "hugectr-deepfm-v32"
		m.Source = "HugeCTR onnx_converter/hugectr2onnx/graph_builder.py at 59dcd7e1c..1c4ffa577 (v3.2-v3.4): GraphBuilder.add_layer (Concat always axis -1, InnerProduct a bare Gemm; DistributedSlotSparseEmbeddingHash, Reshape, Slice, WeightMultiply, FmOrder2, ReduceSum, Add, Sigmoid as later); hugectr_loader.py there: tables [max_vocabulary_size_global, vec], keys' rows from 0, none reserved"
	}
	b := hcBuilder{builder: newBuilder("hugectr", 10, seed), v32: v32}
	const slots, vec, vocab, dense, k = 4, 5, 44, 3, 4
	sp := hcSparse{name: "data1", nnz: 1, lo: []int64{0, 10, 19, 30}, size: []int64{10, 9, 11, 10}}
	keys := &hcKeys{toRow: make([]int64, vocab), first: 1}
	if v32 {
		keys.first = 0
	}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, dense), noneDims(sp.name, pb.TensorProto_INT64, slots, 1))
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "key_to_indice_hash_all_tables", DataType: int32(pb.TensorProto_INT64), Dims: []int64{vocab}})
	t := b.hcTable("sparse_embedding1", vocab, vec)
	keys.load(b.builder, 0, 40, vocab)
	b.g.Initializer[0].Int64Data = keys.toRow
	emb := b.embedding("sparse_embedding1", sp.name, false)
	r1 := b.reshape("reshape1", emb, vec)
	b.slice(r1, []string{"slice11", "slice12"}, [][2]int64{{0, k}, {k, vec}})
	r2 := b.reshape("reshape2", "slice11", slots*k)
	r3 := b.reshape("reshape3", "slice12", slots)
	b.slice("dense", []string{"slice21", "slice22"}, [][2]int64{{0, dense}, {0, dense}})
	wm1 := b.weightMultiply("weight_multiply1", "slice21", dense, k)
	wm2 := b.weightMultiply("weight_multiply2", "slice22", dense, 1)
	const in = (slots + dense) * k
	c1 := b.concat("concat1", r2, "weight_multiply1")
	b.slice(c1, []string{"slice31", "slice32"}, [][2]int64{{0, in}, {0, in}})
	w1, b1 := b.innerProduct("fc1", "slice31", in, 6)
	relu := b.op("Relu", []string{"fc1"}, "relu1")
	b.op("Dropout", []string{relu}, "dropout1")
	w, bias := b.innerProduct("fc2", "dropout1", 6, 1)
	fm := b.fmOrder2("fmorder2", "slice32", slots+dense, k)
	rs1 := b.op("ReduceSum", []string{fm}, "reducesum1", ai("keepdims", 1), ais("axes", 1))
	c2 := b.concat("concat2", r3, "weight_multiply2")
	rs2 := b.op("ReduceSum", []string{c2}, "reducesum2", ai("keepdims", 1), ais("axes", 1))
	sum := b.chain("Add", "add", "fc2", rs1, rs2)
	b.hcFinish(m, sum, 1)
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: dense}, sp.spec()}}
	m.bias = float64(bias[0])
	for _, v := range w {
		m.w = append(m.w, float64(v))
	}
	m.w = append(m.w, 1, 1)
	m.feats = func(s sample) []float64 {
		var factors [][]float64 // slots+dense vectors of k
		lin := 0.0
		for _, r := range hcSlots(s, 1, slots, keys) {
			e := row64(t, r)
			factors = append(factors, e[:k])
			lin += e[k]
		}
		for i := range dense {
			x := s.f(0, i)
			f := make([]float64, k)
			for j := range f {
				f[j] = x * float64(wm1[i*k+j])
			}
			factors = append(factors, f)
			lin += x * float64(wm2[i])
		}
		var flat []float64
		for _, f := range factors {
			flat = append(flat, f...)
		}
		deep := make([]float64, 6)
		for o := range deep {
			z := float64(b1[o])
			for i := range in {
				z += flat[i] * float64(w1[i*6+o])
			}
			deep[o] = math.Max(z, 0)
		}
		fmSum := 0.0
		for j := range k {
			s, sq := 0.0, 0.0
			for _, f := range factors {
				s += f[j]
				sq += f[j] * f[j]
			}
			fmSum += 0.5 * (s*s - sq)
		}
		return append(deep, fmSum, lin)
	}
	return m
}

// HugeCTRSharedBottom is HugeCTR's multi-task sample
// samples/mmoe/shared_bottom.py as the newest converter writes it (the
// 25.03 layout, hcBuilder.perLayer): label_dims [1, 1] with
// label_names 50k_label and married_label make the Data layer declare
// two outputs, each [None, 1], and each BinaryCrossEntropyLoss becomes a
// Sigmoid whose top is its label's name (hugectr_loader.py); dense_dim 0
// declares the input dense as [None, 0], which no node reads. One
// LocalizedSlotSparseEmbeddingHash of 4 one-hot slots (combiner sum,
// vec_size 4), Reshape to [-1, 16], InnerProduct to 8, ReLU, Dropout,
// Slice twice whole into the towers; tower A's Dropout reads A_fc1, not
// its ReLU (the sample's own wiring: A_relu1 is computed and unused),
// tower B's reads B_relu1; InnerProduct to 1 and the Sigmoid each. The
// converter's test (test/onnx_converter_test/hugectr2onnx_mmoe_test.py)
// reads both outputs: a model served with both tasks' scores.
func HugeCTRSharedBottom(seed uint64) *Model {
	m := &Model{Name: "hugectr-shared-bottom", Source: "HugeCTR 25.03 (d4fecdb3f) samples/mmoe/shared_bottom.py through onnx_converter/hugectr2onnx: graph_builder.py GraphBuilder.add_layer (Data with label_name and label_dim lists: one output per label; LocalizedSlotSparseEmbeddingHash with <top>_hash_table, Reshape, InnerProduct, ReLU, Dropout, Slice, Sigmoid), save_model (opset 10, IR 7); hugectr_loader.py BinaryCrossEntropyLoss to Sigmoid topped by the label name"}
	b := hcBuilder{builder: newBuilder("hugectr", 10, seed), perLayer: true}
	const slots, vec, vocab, shared, tower = 4, 4, 40, 8, 4
	sp := hcSparse{name: "data", nnz: 1, lo: []int64{0, 9, 19, 30}, size: []int64{9, 10, 11, 7}}
	keys := &hcKeys{toRow: make([]int64, vocab)}
	b.g.Input = append(b.g.Input, noneDims("dense", pb.TensorProto_FLOAT, 0), noneDims(sp.name, pb.TensorProto_INT64, slots, 1))
	b.hcTable("embedding", vocab, vec)
	keys.load(b.builder, 0, 37, vocab)
	b.initI("embedding_hash_table", []int64{vocab}, keys.toRow...)
	emb := b.embedding("embedding", sp.name, false)
	r := b.reshape("reshape_embedding", emb, slots*vec)
	b.innerProduct("shared1", r, slots*vec, shared)
	drop := b.op("Dropout", []string{b.op("Relu", []string{"shared1"}, "relu1")}, "dropout1")
	b.slice(drop, []string{"sliceA", "sliceB"}, [][2]int64{{0, shared}, {0, shared}})
	b.innerProduct("A_fc1", "sliceA", shared, tower)
	b.op("Relu", []string{"A_fc1"}, "A_relu1")
	b.innerProduct("A_out", b.op("Dropout", []string{"A_fc1"}, "A_dropout1"), tower, 1)
	b.innerProduct("B_fc1", "sliceB", shared, tower)
	b.innerProduct("B_out", b.op("Dropout", []string{b.op("Relu", []string{"B_fc1"}, "B_relu1")}, "B_dropout1"), tower, 1)
	for _, o := range [][2]string{{"A_out", "50k_label"}, {"B_out", "married_label"}} {
		b.op("Sigmoid", []string{o[0]}, o[1])
		b.g.Output = append(b.g.Output, noneDims(o[1], pb.TensorProto_FLOAT, 1))
	}
	m.Proto = &pb.ModelProto{IrVersion: 7, OpsetImport: []*pb.OperatorSetIdProto{{Version: 10}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "dense", Kind: models.DenseKind, Width: 0}, sp.spec()}}
	return m
}
