package exporters

import (
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// LoopBags are nn.EmbeddingBag called with 1-D indices and offsets, as
// the TorchScript exporter writes it (torch/onnx/symbolic_helper.py
// _embedding_bag_helper): a Loop over the bags whose body slices the
// bag's ids out of the indices by offsets[i]:offsets[i+1], gathers
// their rows from the table, scales them by the bag's per-sample
// weights when given, and reduces them over axis 0. Each model pools
// by sum, mean or max, with include_last_offset False (offsets
// completed with len(indices) by a Concat) or True, and concatenates
// the bags with two dense features before the score.
func LoopBags(seed uint64) []*Model {
	return []*Model{
		loopBag(seed, "ts-embedding-bag-sum", "sum", 13, false, false),
		loopBag(seed, "ts-embedding-bag-mean-last-offset", "mean", 13, true, false),
		loopBag(seed, "ts-embedding-bag-max-opset18", "max", 18, false, false),
		loopBag(seed, "ts-embedding-bag-weighted-last-offset", "sum", 13, true, true),
	}
}

// loopBag builds one EmbeddingBag Loop model (opset 11 to 18: the axes
// of ReduceSum an input from 13, of ReduceMean and ReduceMax from 18).
func loopBag(seed uint64, name, mode string, opset int64, last, weighted bool) *Model {
	m := &Model{Name: name, Source: "torch/onnx/symbolic_helper.py: _embedding_bag_helper (opset 11 to 18)"}
	b := newBuilder("main_graph", opset, seed)
	// The TorchScript exporter names the ids' own dimension so.
	indices, offsets, psw, dense, tab := bagInputs(b, "indices_dynamic_axes_1", weighted)
	one := []int64{1}

	cond := b.node("Cast", []string{b.constI(nil, 1)}, ai("to", int64(pb.TensorProto_BOOL)))
	zero := b.constI(one, 0)
	full := offsets
	if !last {
		n := b.node("Unsqueeze", []string{b.node("Gather", []string{b.node("Shape", []string{indices}), b.constI(nil, 0)}, ai("axis", 0)), b.constI(one, 0)})
		full = b.node("Concat", []string{offsets, n}, ai("axis", 0))
	}
	starts := b.node("Slice", []string{full, b.constI(one, 0), b.constI(one, math.MaxInt64), b.constI(one, 0), b.constI(one, 1)})
	ends := b.node("Slice", []string{full, b.constI(one, 1), b.constI(one, math.MaxInt64), b.constI(one, 0), b.constI(one, 1)})
	count := b.node("Gather", []string{b.node("Shape", []string{ends}), b.constI(nil, 0)}, ai("axis", 0))

	body := &builder{g: &pb.GraphProto{Name: "loop_body"}, r: b.r, opset: opset, n: 1000}
	scalar := func(name string, elem pb.TensorProto_DataType) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{}}}}}
	}
	body.g.Input = []*pb.ValueInfoProto{scalar("iter", pb.TensorProto_INT64), scalar("cond_in", pb.TensorProto_BOOL)}
	s := body.node("Unsqueeze", []string{body.node("Gather", []string{starts, "iter"}, ai("axis", 0)), body.constI(one, 0)})
	e := body.node("Unsqueeze", []string{body.node("Gather", []string{ends, "iter"}, ai("axis", 0)), body.constI(one, 0)})
	emb := body.node("Gather", []string{"embedding_bag.weight", body.node("Slice", []string{indices, s, e, zero})}, ai("axis", 0))
	if weighted {
		w := body.node("Unsqueeze", []string{body.node("Slice", []string{psw, s, e, zero}), body.constI(one, 1)})
		emb = body.node("Mul", []string{emb, w})
	}
	op := map[string]string{"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}[mode]
	if op == "ReduceSum" && opset >= 13 || opset >= 18 {
		emb = body.node(op, []string{emb, body.constI(one, 0)}, ai("keepdims", 0))
	} else {
		emb = body.node(op, []string{emb}, ais("axes", 0), ai("keepdims", 0))
	}
	condOut := body.node("Cast", []string{cond}, ai("to", int64(pb.TensorProto_BOOL)))
	body.g.Output = []*pb.ValueInfoProto{
		scalar(condOut, pb.TensorProto_BOOL),
		{Name: emb, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: dim}}}}}}}},
	}
	bags := b.node("Loop", []string{count, cond}, &pb.AttributeProto{Name: "body", Type: pb.AttributeProto_GRAPH, G: body.g})

	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "indices", Kind: models.SparseKind, Width: 6, Rows: bagRows, Offsets: "offsets"},
		{Name: "offsets", Kind: models.OffsetsKind, Width: 1, Rank1: true, LastOffset: last},
	}}
	if weighted {
		m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "per_sample_weights", Kind: models.DenseKind, Width: 6, Offsets: "offsets"})
	}
	m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "dense", Kind: models.DenseKind, Width: 2})
	m.feats = bagFeats(tab, mode, weighted, len(m.Sig.Inputs)-1)
	b.finish(m, []string{bags, dense}, dim+2)
	return m
}

// DynamoBags are nn.EmbeddingBag with offsets as the dynamo exporter
// decomposes it (torchlib aten_embedding_bag, _aten_embedding_bag_onnx;
// opset 18): the rows of every id gathered at once by Reshape(indices,
// [-1]), multiplied by Unsqueeze(per_sample_weights or ones, [1]) and
// cast to float, then a Loop carrying an index and a sequence: each
// iteration slices the bag's rows by offsets[i]:offsets[i+1], an If
// gives an empty bag zeros and otherwise pools (ReduceSum, ReduceMean;
// for max a nested If slices the last bag to the end of the rows; for
// mean a nested If sums the last bag and divides it by the number of
// ids after its start), and SequenceInsert appends it;
// ConcatFromSequence joins the bags and CastLike casts them to the
// table's type.
func DynamoBags(seed uint64) []*Model {
	return []*Model{
		dynamoBag(seed, "dynamo-embedding-bag-sum", "sum", false, false, 0, ""),
		dynamoBag(seed, "dynamo-embedding-bag-max-last-offset", "max", true, false, 0, ""),
		dynamoBag(seed, "dynamo-embedding-bag-weighted", "sum", false, true, 0, ""),
		dynamoBag(seed, "dynamo-embedding-bag-mean", "mean", false, false, 0, ""),
	}
}

// fixedBag is the width of the 2-D ids of DynamoFixedBags.
const fixedBag = 5

// DynamoFixedBags are nn.EmbeddingBag called with 2-D ids [batch, 5] and
// no offsets (fixed-size bags) as the dynamo exporter writes it.
// torch.nn.functional.embedding_bag first makes offsets =
// torch.arange(0, input.numel(), input.size(1), dtype=input.dtype) and
// input = input.reshape(-1) (per_sample_weights.reshape(-1) too), with
// include_last_offset False; torch.export traces input.size(1) as the
// constant 5 and input.numel() as sym_size.int(input, 0) * 5
// (torchlib aten_sym_size: Squeeze(Shape(input, start=0, end=1)), then
// _operator.mul: Mul) or as sym_numel (Size); aten_arange_start_step
// with dtype int64 casts start, end and step to int64 for a Range;
// aten_view writes Reshape(input, [-1], allowzero=1). Then the same
// aten_embedding_bag decomposition as DynamoBags, over the Range as its
// offsets.
func DynamoFixedBags(seed uint64) []*Model {
	return []*Model{
		dynamoBag(seed, "dynamo-embedding-bag-2d-sum", "sum", false, false, fixedBag, "sym_size"),
		dynamoBag(seed, "dynamo-embedding-bag-2d-mean", "mean", false, false, fixedBag, "sym_numel"),
		dynamoBag(seed, "dynamo-embedding-bag-2d-max", "max", false, false, fixedBag, "sym_size"),
		dynamoBag(seed, "dynamo-embedding-bag-2d-weighted", "sum", false, true, fixedBag, "sym_size"),
	}
}

// dynamoBag builds one model of the dynamo exporter's EmbeddingBag: with
// bag 0, 1-D indices and an offsets input; else 2-D ids [batch, bag],
// their numel traced as numel ("sym_size" or "sym_numel").
func dynamoBag(seed uint64, name, mode string, last, weighted bool, bag int64, numel string) *Model {
	m := &Model{Name: name, Source: "torch/onnx/_internal/exporter/_torchlib/ops/core.py: aten_embedding_bag, _aten_embedding_bag_onnx (opset 18)"}
	b := newBuilder("main_graph", 18, seed)
	one := []int64{1}
	neg1 := b.constI(one, -1)
	var indices, offsets, psw, dense string
	var tab [][]float32
	if bag == 0 {
		indices, offsets, psw, dense, tab = bagInputs(b, "s0", weighted)
	} else {
		m.Source = "torch/nn/functional.py: embedding_bag (2-D input); " + m.Source
		x := b.input("input", pb.TensorProto_INT64, bag)
		var xw string
		if weighted {
			xw = b.input("per_sample_weights", pb.TensorProto_FLOAT, bag)
		}
		dense = b.input("dense", pb.TensorProto_FLOAT, 2)
		tab = b.table("embedding_bag.weight", bagRows, dim)
		toI64 := ai("to", int64(pb.TensorProto_INT64))
		var n string
		switch numel {
		case "sym_size":
			n = b.node("Mul", []string{b.node("Squeeze", []string{b.node("Shape", []string{x}, ai("end", 1), ai("start", 0))}), b.constI(nil, bag)})
		case "sym_numel":
			n = b.node("Size", []string{x})
		default:
			panic("numel " + numel)
		}
		offsets = b.node("Range", []string{b.node("Cast", []string{b.constI(nil, 0)}, toI64), b.node("Cast", []string{n}, toI64), b.node("Cast", []string{b.constI(nil, bag)}, toI64)})
		indices = b.node("Reshape", []string{x, neg1}, ai("allowzero", 1))
		if weighted {
			psw = b.node("Reshape", []string{xw, neg1}, ai("allowzero", 1))
		}
	}
	constF := func(b *builder, dims []int64, v ...float32) string {
		t := &pb.TensorProto{DataType: int32(pb.TensorProto_FLOAT), Dims: dims, FloatData: v}
		return b.node("Constant", nil, &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: t})
	}
	i1d := b.node("Reshape", []string{indices, neg1})
	w := psw
	if !weighted {
		ones := b.node("Expand", []string{constF(b, nil, 1), b.node("Shape", []string{i1d})})
		w = b.node("CastLike", []string{ones, "embedding_bag.weight"})
	}
	scaled := b.node("Mul", []string{b.node("Gather", []string{"embedding_bag.weight", i1d}), b.node("Unsqueeze", []string{w, b.constI(one, 1)})})
	allRows := b.node("Cast", []string{scaled}, ai("to", int64(pb.TensorProto_FLOAT)))
	isize := b.node("Shape", []string{i1d})
	off, numBag := offsets, b.node("Size", []string{offsets})
	if last {
		numBag = b.node("Sub", []string{numBag, b.constI(nil, 1)})
	} else {
		off = b.node("Concat", []string{offsets, isize}, ai("axis", 0))
	}
	seq0 := b.node("SequenceEmpty", nil, ai("dtype", int64(pb.TensorProto_FLOAT)))
	idx0 := b.constI(nil, 0)
	cond0 := b.node("Less", []string{idx0, numBag})

	tensorOut := func(name string, elem pb.TensorProto_DataType) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem)}}}}
	}
	sub := func(name string) *builder {
		return &builder{g: &pb.GraphProto{Name: name}, r: b.r, opset: 18, n: 1000 + len(b.g.Node)*10}
	}
	body := sub("loop_body")
	body.n = 2000
	scalar := func(name string, elem pb.TensorProto_DataType) *pb.ValueInfoProto {
		v := tensorOut(name, elem)
		v.Type.GetTensorType().Shape = &pb.TensorShapeProto{}
		return v
	}
	body.g.Input = []*pb.ValueInfoProto{scalar("iter_num", pb.TensorProto_INT64), scalar("cond_in", pb.TensorProto_BOOL), scalar("index", pb.TensorProto_INT64), {Name: "seq"}}
	si := body.node("Reshape", []string{"index", neg1})
	si1 := body.node("Add", []string{si, body.constI(one, 1)})
	si2 := body.node("Add", []string{si, body.constI(one, 2)})
	start := body.node("Slice", []string{off, si, si1})
	end := body.node("Slice", []string{off, si1, si2})
	// then: an empty bag is zeros [1, dim].
	thenB := sub("empty_bag")
	thenB.n = 3000
	zeros := thenB.node("Expand", []string{constF(thenB, one, 0), thenB.constI([]int64{2}, 1, dim)})
	thenB.g.Output = []*pb.ValueInfoProto{tensorOut(zeros, pb.TensorProto_FLOAT)}
	elseB := sub("bag")
	elseB.n = 4000
	var pooled string
	axes0 := func(b *builder) string { return b.constI(one, 0) }
	switch mode {
	case "sum":
		pooled = elseB.node("ReduceSum", []string{elseB.node("Slice", []string{allRows, start, end}), axes0(elseB)})
	case "mean":
		// The last bag: its sum divided by the number of ids after its
		// start, when there are any.
		rows := elseB.node("Slice", []string{allRows, start, end})
		isLast := elseB.node("Equal", []string{"index", elseB.node("Sub", []string{numBag, elseB.constI(nil, 1)})})
		lastB, midB := sub("last_bag"), sub("mid_bag")
		lastB.n, midB.n = 5000, 6000
		sum := lastB.node("ReduceSum", []string{rows, axes0(lastB)})
		den := lastB.node("Sub", []string{lastB.node("Shape", []string{indices}, ai("end", 1), ai("start", 0)), start})
		divB, keepB := sub("divide"), sub("keep")
		divB.n, keepB.n = 7000, 8000
		div := divB.node("Div", []string{sum, divB.node("CastLike", []string{den, allRows})})
		keep := keepB.node("Identity", []string{sum})
		divB.g.Output = []*pb.ValueInfoProto{tensorOut(div, pb.TensorProto_FLOAT)}
		keepB.g.Output = []*pb.ValueInfoProto{tensorOut(keep, pb.TensorProto_FLOAT)}
		l := lastB.node("If", []string{lastB.node("Greater", []string{den, lastB.constI(nil, 0)})},
			&pb.AttributeProto{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: divB.g},
			&pb.AttributeProto{Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: keepB.g})
		mid := midB.node("ReduceMean", []string{rows, axes0(midB)})
		lastB.g.Output = []*pb.ValueInfoProto{tensorOut(l, pb.TensorProto_FLOAT)}
		midB.g.Output = []*pb.ValueInfoProto{tensorOut(mid, pb.TensorProto_FLOAT)}
		pooled = elseB.node("If", []string{isLast},
			&pb.AttributeProto{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: lastB.g},
			&pb.AttributeProto{Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: midB.g})
	case "max":
		// The last bag runs to the end of the rows.
		isLast := elseB.node("Equal", []string{"index", elseB.node("Sub", []string{numBag, elseB.constI(nil, 1)})})
		lastB, midB := sub("last_bag"), sub("mid_bag")
		lastB.n, midB.n = 5000, 6000
		l := lastB.node("Slice", []string{allRows, start, isize})
		mid := midB.node("Slice", []string{allRows, start, end})
		lastB.g.Output = []*pb.ValueInfoProto{tensorOut(l, pb.TensorProto_FLOAT)}
		midB.g.Output = []*pb.ValueInfoProto{tensorOut(mid, pb.TensorProto_FLOAT)}
		sl := elseB.node("If", []string{isLast},
			&pb.AttributeProto{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: lastB.g},
			&pb.AttributeProto{Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: midB.g})
		pooled = elseB.node("ReduceMax", []string{sl, axes0(elseB)})
	}
	elseB.g.Output = []*pb.ValueInfoProto{tensorOut(pooled, pb.TensorProto_FLOAT)}
	row := body.node("If", []string{body.node("Equal", []string{start, end})},
		&pb.AttributeProto{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: thenB.g},
		&pb.AttributeProto{Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: elseB.g})
	seq1 := body.node("SequenceInsert", []string{"seq", row})
	idx1 := body.node("Add", []string{"index", body.constI(nil, 1)})
	cond1 := body.node("Less", []string{idx1, numBag})
	body.g.Output = []*pb.ValueInfoProto{tensorOut(cond1, pb.TensorProto_BOOL), tensorOut(idx1, pb.TensorProto_INT64), {Name: seq1}}
	outs := b.nodeN("Loop", []string{"", cond0, idx0, seq0}, 2, &pb.AttributeProto{Name: "body", Type: pb.AttributeProto_GRAPH, G: body.g})
	bags := b.node("CastLike", []string{b.node("ConcatFromSequence", []string{outs[1]}, ai("axis", 0)), "embedding_bag.weight"})

	if bag > 0 {
		m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "input", Kind: models.SparseKind, Width: int(bag), Rows: bagRows}}}
		if weighted {
			m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "per_sample_weights", Kind: models.DenseKind, Width: int(bag)})
		}
		m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "dense", Kind: models.DenseKind, Width: 2})
		m.feats = fixedBagFeats(tab, mode, weighted, int(bag), len(m.Sig.Inputs)-1)
		b.finish(m, []string{bags, dense}, dim+2)
		return m
	}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "indices", Kind: models.SparseKind, Width: 6, Rows: bagRows, Offsets: "offsets"},
		{Name: "offsets", Kind: models.OffsetsKind, Width: 1, Rank1: true, LastOffset: last},
	}}
	if weighted {
		m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "per_sample_weights", Kind: models.DenseKind, Width: 6, Offsets: "offsets"})
	}
	m.Sig.Inputs = append(m.Sig.Inputs, models.InputSpec{Name: "dense", Kind: models.DenseKind, Width: 2})
	m.feats = bagFeats(tab, mode, weighted, len(m.Sig.Inputs)-1)
	b.finish(m, []string{bags, dense}, dim+2)
	return m
}

// bagFeats is the float64 reference of an EmbeddingBag model: the bag
// pooled as torch.nn.EmbeddingBag defines it (an empty bag zeros), then
// the dense input's two values (input di).
func bagFeats(tab [][]float32, mode string, weighted bool, di int) func(sample) []float64 {
	return func(smp sample) []float64 {
		lo, hi := smp.b.Bag(0, smp.s)
		x := make([]float64, dim)
		for j := lo; j < hi; j++ {
			r := row64(tab, smp.b.Columns[0].I64[j])
			w := 1.0
			if weighted {
				w = float64(smp.b.Columns[2].F32[j])
			}
			for i, v := range r {
				switch {
				case mode == "max" && j == lo:
					x[i] = v
				case mode == "max":
					x[i] = max(x[i], v)
				default:
					x[i] += w * v
				}
			}
		}
		if mode == "mean" && hi > lo {
			for i := range x {
				x[i] /= float64(hi - lo)
			}
		}
		return append(x, smp.f(di, 0), smp.f(di, 1))
	}
}

// fixedBagFeats is the float64 reference of an EmbeddingBag model on
// 2-D ids [batch, bag] (input 0; per-sample weights input 1 when
// weighted): every sample's row of ids pooled, then the dense input's
// two values (input di).
func fixedBagFeats(tab [][]float32, mode string, weighted bool, bag, di int) func(sample) []float64 {
	return func(smp sample) []float64 {
		x := make([]float64, dim)
		for j := range bag {
			r := row64(tab, smp.id(0, j))
			w := 1.0
			if weighted {
				w = smp.f(1, j)
			}
			for i, v := range r {
				switch {
				case mode == "max" && j == 0:
					x[i] = v
				case mode == "max":
					x[i] = max(x[i], v)
				default:
					x[i] += w * v
				}
			}
		}
		if mode == "mean" {
			for i := range x {
				x[i] /= float64(bag)
			}
		}
		return append(x, smp.f(di, 0), smp.f(di, 1))
	}
}

// bagRows is the EmbeddingBag table's rows in the corpus.
const bagRows = 40

// bagInputs declares an EmbeddingBag model's inputs as both exporters
// write them: 1-D indices (and per-sample weights when weighted) whose
// dimension, named idsDim, is every bag's ids and not the batch; the
// offsets, one per bag; a dense input of 2; and the table.
func bagInputs(b *builder, idsDim string, weighted bool) (indices, offsets, psw, dense string, tab [][]float32) {
	indices = b.input("indices", pb.TensorProto_INT64)
	offsets = b.input("offsets", pb.TensorProto_INT64)
	b.g.Input[0].Type.GetTensorType().Shape.Dim[0].Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: idsDim}
	if weighted {
		psw = b.input("per_sample_weights", pb.TensorProto_FLOAT)
		b.g.Input[2].Type.GetTensorType().Shape.Dim[0].Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: idsDim}
	}
	dense = b.input("dense", pb.TensorProto_FLOAT, 2)
	tab = b.table("embedding_bag.weight", bagRows, dim)
	return indices, offsets, psw, dense, tab
}
