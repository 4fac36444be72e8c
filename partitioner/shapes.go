package partitioner

import (
	"slices"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Dimension values in a Shape besides sizes >= 0.
const (
	DimBatch   int64 = -1 // the symbolic batch dimension
	DimUnknown int64 = -2 // a dimension shape inference could not fix
)

// TensorType is what shape inference knows of a tensor.
type TensorType struct {
	Elem pb.TensorProto_DataType
	// Dims holds sizes, DimBatch or DimUnknown; nil with Known false
	// when even the rank is unknown.
	Dims  []int64
	Known bool
}

// PerSample is the tensor's elements per sample (its batch dimension left
// out), and whether that is known.
func (t TensorType) PerSample() (int64, bool) {
	if !t.Known {
		return 0, false
	}
	n := int64(1)
	for _, d := range t.Dims {
		switch {
		case d == DimBatch:
		case d < 0:
			return 0, false
		default:
			n *= d
		}
	}
	return n, true
}

// HasBatch says whether the tensor has a batch dimension.
func (t TensorType) HasBatch() bool {
	for _, d := range t.Dims {
		if d == DimBatch {
			return true
		}
	}
	return false
}

// SampleShape is Dims without the batch dimension (for plan.json).
func (t TensorType) SampleShape() []int64 {
	out := []int64{}
	for _, d := range t.Dims {
		if d != DimBatch {
			out = append(out, max(d, -1))
		}
	}
	return out
}

// BytesPerSample is PerSample times the element size.
func (t TensorType) BytesPerSample() (int64, bool) {
	n, ok := t.PerSample()
	es := pb.ElemSize(t.Elem)
	if !ok || es == 0 {
		return 0, false
	}
	return n * int64(es), true
}

func unknown(elem pb.TensorProto_DataType) TensorType { return TensorType{Elem: elem} }

func known(elem pb.TensorProto_DataType, dims ...int64) TensorType {
	return TensorType{Elem: elem, Dims: dims, Known: true}
}

// valueInfoType reads a declared type: dimension 0 given as a symbol, 0
// or -1 is the batch dimension; other symbols are unknown sizes.
func valueInfoType(vi *pb.ValueInfoProto) TensorType {
	tt := vi.GetType().GetTensorType()
	if tt == nil || tt.GetShape() == nil {
		return unknown(pb.TensorProto_DataType(tt.GetElemType()))
	}
	t := TensorType{Elem: pb.TensorProto_DataType(tt.GetElemType()), Known: true}
	for i, d := range tt.GetShape().GetDim() {
		switch v := d.GetValue().(type) {
		case *pb.TensorShapeProto_Dimension_DimValue:
			if i == 0 && v.DimValue <= 0 {
				t.Dims = append(t.Dims, DimBatch)
			} else {
				t.Dims = append(t.Dims, v.DimValue)
			}
		default:
			if i == 0 {
				t.Dims = append(t.Dims, DimBatch)
			} else {
				t.Dims = append(t.Dims, DimUnknown)
			}
		}
	}
	return t
}

// InferShapes types every tensor of g: graph inputs and initializers from
// their declarations, node outputs by the rules of their ops. Tensors of
// ops it does not know get an unknown type; the returned list names the
// nodes that produced them.
func InferShapes(g *Graph) (map[string]TensorType, []string) {
	types := map[string]TensorType{}
	for _, in := range g.Inputs {
		types[in.GetName()] = valueInfoType(in)
	}
	for name, t := range g.Inits {
		types[name] = known(pb.TensorProto_DataType(t.GetDataType()), append([]int64(nil), t.GetDims()...)...)
	}
	var unknownNodes []string
	for _, n := range g.Nodes {
		outs := inferNode(g, n, types)
		for i, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			t := unknown(pb.TensorProto_FLOAT)
			if i < len(outs) {
				t = outs[i]
			}
			types[o] = t
		}
		if len(outs) == 0 || !outs[0].Known {
			unknownNodes = append(unknownNodes, n.GetName()+" ("+n.GetOpType()+")")
		}
	}
	return types, unknownNodes
}

func inferNode(g *Graph, n *pb.NodeProto, types map[string]TensorType) []TensorType {
	in := func(i int) TensorType {
		if i < len(n.GetInput()) && n.GetInput()[i] != "" {
			return types[n.GetInput()[i]]
		}
		return TensorType{}
	}
	x := in(0)
	switch n.GetOpType() {
	case "Identity", "Relu", "Sigmoid", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Abs", "Erf", "Softmax", "LogSoftmax",
		"LeakyRelu", "Dropout", "Clip", "Gelu", "Elu", "Selu", "HardSigmoid", "Softplus", "Reciprocal", "Floor", "Ceil",
		"Round", "Sign", "LayerNormalization", "BatchNormalization", "InstanceNormalization", "BitwiseNot":
		return []TensorType{x}
	case "Not":
		x.Elem = pb.TensorProto_BOOL
		return []TensorType{x}
	case "QuantizeLinear":
		// The zero point's type; uint8 without one (or output_dtype,
		// opset 21).
		x.Elem = pb.TensorProto_DataType(attrInt(n, "output_dtype", int64(pb.TensorProto_UINT8)))
		if z := in(2); z.Elem != 0 {
			x.Elem = z.Elem
		}
		return []TensorType{x}
	case "DequantizeLinear":
		// The scale's type: float, or float16 from opset 19.
		x.Elem = pb.TensorProto_FLOAT
		if s := in(1); s.Elem != 0 {
			x.Elem = s.Elem
		}
		return []TensorType{x}
	case "DynamicQuantizeLinear":
		// The scale and zero point are scalars over the whole tensor.
		x.Elem = pb.TensorProto_UINT8
		return []TensorType{x, known(pb.TensorProto_FLOAT), known(pb.TensorProto_UINT8)}
	case "MatMulInteger":
		t := matmulType(x, in(1))
		t.Elem = pb.TensorProto_INT32
		return []TensorType{t}
	case "QLinearMatMul":
		t := matmulType(x, in(3))
		t.Elem = in(7).Elem
		return []TensorType{t}
	case "Cast":
		x.Elem = pb.TensorProto_DataType(attrInt(n, "to", int64(x.Elem)))
		return []TensorType{x}
	case "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "PRelu",
		"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor":
		out := x
		for i := 1; i < len(n.GetInput()); i++ {
			out = broadcastB(out, in(i), g.FixedBatch)
		}
		return []TensorType{out}
	case "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor":
		out := broadcastB(x, in(1), g.FixedBatch)
		out.Elem = pb.TensorProto_BOOL
		return []TensorType{out}
	case "Where":
		out := broadcastB(broadcastB(x, in(1), g.FixedBatch), in(2), g.FixedBatch)
		out.Elem = in(1).Elem
		return []TensorType{out}
	case "Gather":
		data, idx := x, in(1)
		if !data.Known || !idx.Known {
			return []TensorType{unknown(data.Elem)}
		}
		axis := normAxis(attrInt(n, "axis", 0), len(data.Dims))
		if axis < 0 {
			return []TensorType{unknown(data.Elem)}
		}
		dims := append(append(append([]int64{}, data.Dims[:axis]...), idx.Dims...), data.Dims[axis+1:]...)
		return []TensorType{known(data.Elem, dims...)}
	case "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp":
		if !x.Known {
			return []TensorType{unknown(x.Elem)}
		}
		axes, ok := reduceAxes(g, n)
		if !ok {
			return []TensorType{unknown(x.Elem)}
		}
		keep := attrInt(n, "keepdims", 1) == 1
		red := map[int]bool{}
		if len(axes) == 0 {
			if attrInt(n, "noop_with_empty_axes", 0) == 1 {
				return []TensorType{x}
			}
			for i := range x.Dims {
				red[i] = true
			}
		}
		for _, a := range axes {
			i := normAxis(a, len(x.Dims))
			if i < 0 {
				return []TensorType{unknown(x.Elem)}
			}
			red[i] = true
		}
		var dims []int64
		for i, d := range x.Dims {
			switch {
			case !red[i]:
				dims = append(dims, d)
			case keep:
				dims = append(dims, 1)
			}
		}
		return []TensorType{known(x.Elem, dims...)}
	case "Gemm":
		a, b := x, in(1)
		if !a.Known || !b.Known || len(a.Dims) != 2 || len(b.Dims) != 2 {
			return []TensorType{unknown(x.Elem)}
		}
		m := a.Dims[0]
		if attrInt(n, "transA", 0) == 1 {
			m = a.Dims[1]
		}
		nn := b.Dims[1]
		if attrInt(n, "transB", 0) == 1 {
			nn = b.Dims[0]
		}
		return []TensorType{known(x.Elem, m, nn)}
	case "MatMul":
		return []TensorType{matmulType(x, in(1))}
	case "Concat":
		if !x.Known {
			return []TensorType{unknown(x.Elem)}
		}
		axis := normAxis(attrInt(n, "axis", 0), len(x.Dims))
		if axis < 0 {
			return []TensorType{unknown(x.Elem)}
		}
		dims := append([]int64(nil), x.Dims...)
		for i := 1; i < len(n.GetInput()); i++ {
			t := in(i)
			if !t.Known || len(t.Dims) != len(dims) {
				return []TensorType{unknown(x.Elem)}
			}
			if dims[axis] < 0 || t.Dims[axis] < 0 {
				dims[axis] = DimUnknown
			} else {
				dims[axis] += t.Dims[axis]
			}
		}
		return []TensorType{known(x.Elem, dims...)}
	case "Reshape":
		var shape []int64
		ok := false
		if len(n.GetInput()) > 1 {
			shape, ok = g.constInts(n.GetInput()[1])
		} else {
			shape, ok = attrInts(n, "shape") // Reshape-1
		}
		if !ok {
			return []TensorType{unknown(x.Elem)}
		}
		return []TensorType{reshapeType(x, shape, attrInt(n, "allowzero", 0) == 1)}
	case "Flatten":
		if !x.Known {
			return []TensorType{unknown(x.Elem)}
		}
		// axis is in [-r, r]: -1 is r-1, not r as normAxis(a, r+1) would say.
		axis := attrInt(n, "axis", 1)
		if axis < 0 {
			axis += int64(len(x.Dims))
		}
		if axis < 0 || axis > int64(len(x.Dims)) {
			return []TensorType{unknown(x.Elem)}
		}
		return []TensorType{known(x.Elem, prodDims(x.Dims[:axis]), prodDims(x.Dims[axis:]))}
	case "Transpose":
		if !x.Known {
			return []TensorType{unknown(x.Elem)}
		}
		perm, ok := attrInts(n, "perm")
		if !ok {
			perm = make([]int64, len(x.Dims))
			for i := range perm {
				perm[i] = int64(len(x.Dims) - 1 - i)
			}
		}
		if len(perm) != len(x.Dims) {
			return []TensorType{unknown(x.Elem)}
		}
		dims := make([]int64, len(perm))
		seen := make([]bool, len(perm))
		for i, p := range perm {
			if p < 0 || p >= int64(len(perm)) || seen[p] {
				return []TensorType{unknown(x.Elem)}
			}
			seen[p] = true
			dims[i] = x.Dims[p]
		}
		return []TensorType{known(x.Elem, dims...)}
	case "Unsqueeze":
		axes, ok := opAxes(g, n)
		if !x.Known || !ok {
			return []TensorType{unknown(x.Elem)}
		}
		r := len(x.Dims) + len(axes)
		ins := map[int]bool{}
		for _, a := range axes {
			i := normAxis(a, r)
			if i < 0 || ins[i] {
				return []TensorType{unknown(x.Elem)}
			}
			ins[i] = true
		}
		var dims []int64
		j := 0
		for i := range r {
			if ins[i] {
				dims = append(dims, 1)
			} else if j < len(x.Dims) {
				dims = append(dims, x.Dims[j])
				j++
			}
		}
		return []TensorType{known(x.Elem, dims...)}
	case "Squeeze":
		axes, ok := opAxes(g, n)
		if !x.Known || !ok {
			return []TensorType{unknown(x.Elem)}
		}
		rm := map[int]bool{}
		for _, a := range axes {
			i := normAxis(a, len(x.Dims))
			if i < 0 || x.Dims[i] >= 0 && x.Dims[i] != 1 {
				return []TensorType{unknown(x.Elem)}
			}
			rm[i] = true
		}
		var dims []int64
		for i, d := range x.Dims {
			if len(axes) == 0 && d < 0 {
				// Without axes every 1 goes, and a symbolic size may be
				// 1 (a batch of one), so the output's rank is unknown.
				return []TensorType{unknown(x.Elem)}
			}
			if (len(axes) == 0 && d == 1) || rm[i] {
				continue
			}
			dims = append(dims, d)
		}
		return []TensorType{known(x.Elem, dims...)}
	case "Slice":
		return []TensorType{sliceType(g, n, x)}
	case "Split":
		return splitTypes(g, n, x)
	case "Constant":
		for _, a := range n.GetAttribute() {
			switch a.GetName() {
			case "value":
				return []TensorType{known(pb.TensorProto_DataType(a.GetT().GetDataType()), a.GetT().GetDims()...)}
			case "value_ints":
				return []TensorType{known(pb.TensorProto_INT64, int64(len(a.GetInts())))}
			case "value_int":
				return []TensorType{known(pb.TensorProto_INT64)}
			case "value_float":
				return []TensorType{known(pb.TensorProto_FLOAT)}
			case "value_floats":
				return []TensorType{known(pb.TensorProto_FLOAT, int64(len(a.GetFloats())))}
			}
		}
	// Ops whose output shapes depend on values (or are not worked out
	// here), but whose element types are fixed: an unknown shape, the
	// right type (not the float every other unknown output gets, which
	// named an int64 Unique "a float Unique" in a refusal).
	case "Unique":
		// y, indices, inverse_indices, counts.
		i64 := unknown(pb.TensorProto_INT64)
		return []TensorType{unknown(x.Elem), i64, i64, i64}
	case "TopK":
		return []TensorType{unknown(x.Elem), unknown(pb.TensorProto_INT64)}
	case "ArgMax", "ArgMin", "NonZero", "Size":
		return []TensorType{unknown(pb.TensorProto_INT64)}
	case "OneHot":
		// F.one_hot(ids, n) through torch.onnx: OneHot(ids, n, [0, 1]
		// int64) then a Cast to float. The indices' shape with the
		// depth inserted at axis, of the values' type.
		elem := in(2).Elem
		if elem == pb.TensorProto_UNDEFINED {
			elem = pb.TensorProto_FLOAT
		}
		depth, ok := g.constInts(n.GetInput()[1])
		r := len(x.Dims) + 1
		axis := normAxis(attrInt(n, "axis", -1), r)
		if !x.Known || !ok || len(depth) != 1 || depth[0] <= 0 || axis < 0 {
			return []TensorType{unknown(elem)}
		}
		return []TensorType{known(elem, slices.Insert(slices.Clone(x.Dims), axis, depth[0])...)}
	case "Range", "Expand", "Tile", "CumSum":
		return []TensorType{unknown(x.Elem)}
	case "ScatterND", "ScatterElements":
		return []TensorType{x} // the data's shape and type
	case "ConstantOfShape":
		elem := pb.TensorProto_FLOAT // the default value: float32 0
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" && a.GetT() != nil {
				elem = pb.TensorProto_DataType(a.GetT().GetDataType())
			}
		}
		return []TensorType{unknown(elem)}
	case "Shape":
		if !x.Known {
			return []TensorType{unknown(pb.TensorProto_INT64)}
		}
		// start and end (opset 15) slice the shape, clamped to [0, r].
		r := int64(len(x.Dims))
		clamp := func(a int64) int64 {
			if a < 0 {
				a += r
			}
			return min(max(a, 0), r)
		}
		start, end := clamp(attrInt(n, "start", 0)), clamp(attrInt(n, "end", r))
		return []TensorType{known(pb.TensorProto_INT64, max(end-start, 0))}
	}
	return nil
}

func prodDims(d []int64) int64 {
	p := int64(1)
	for _, v := range d {
		if v == DimBatch {
			if len(d) == 1 {
				return DimBatch
			}
			// The batch folded with other dims: only right when those are 1.
			for _, w := range d {
				if w != DimBatch && w != 1 {
					return DimUnknown
				}
			}
			return DimBatch
		}
		if v < 0 {
			return DimUnknown
		}
		p *= v
	}
	return p
}

func normAxis(a int64, rank int) int {
	if a < 0 {
		a += int64(rank)
	}
	if a < 0 || a >= int64(rank) {
		return -1
	}
	return int(a)
}

// reduceAxes reads a Reduce op's axes: an attribute before opset 18 (13
// for ReduceSum), an optional second input after.
func reduceAxes(g *Graph, n *pb.NodeProto) ([]int64, bool) {
	if len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		return g.constInts(n.GetInput()[1])
	}
	axes, _ := attrInts(n, "axes")
	return axes, true
}

// opAxes reads Squeeze/Unsqueeze axes (attribute before opset 13, input after).
func opAxes(g *Graph, n *pb.NodeProto) ([]int64, bool) {
	if len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		return g.constInts(n.GetInput()[1])
	}
	axes, ok := attrInts(n, "axes")
	return axes, ok || n.GetOpType() == "Squeeze"
}

func broadcast(a, b TensorType) TensorType { return broadcastB(a, b, 0) }

// broadcastB is broadcast in a graph kept at the fixed batch fixed (0:
// none), where a dimension of that size meets the batch.
func broadcastB(a, b TensorType, fixed int64) TensorType {
	if !a.Known || !b.Known {
		return unknown(a.Elem)
	}
	r := max(len(a.Dims), len(b.Dims))
	dims := make([]int64, r)
	for i := range r {
		da, db := int64(1), int64(1)
		if j := i - (r - len(a.Dims)); j >= 0 {
			da = a.Dims[j]
		}
		if j := i - (r - len(b.Dims)); j >= 0 {
			db = b.Dims[j]
		}
		switch {
		case da == 1:
			dims[i] = db
		case db == 1:
			dims[i] = da
		case da == db:
			dims[i] = da
		case fixed > 1 && (da == DimBatch && db == fixed || db == DimBatch && da == fixed):
			// A graph kept at its exported batch (plan.json
			// fixed_batch): a constant of that size along the batch.
			dims[i] = DimBatch
		default:
			dims[i] = DimUnknown
		}
	}
	return known(a.Elem, dims...)
}

func matmulType(a, b TensorType) TensorType {
	if !a.Known || !b.Known || len(a.Dims) == 0 || len(b.Dims) == 0 {
		return unknown(a.Elem)
	}
	ad, bd := a.Dims, b.Dims
	if len(ad) == 1 {
		ad = []int64{1, ad[0]}
	}
	if len(bd) == 1 {
		bd = []int64{bd[0], 1}
	}
	batchA := TensorType{Elem: a.Elem, Dims: ad[:len(ad)-2], Known: true}
	batchB := TensorType{Elem: a.Elem, Dims: bd[:len(bd)-2], Known: true}
	lead := broadcast(batchA, batchB).Dims
	dims := append(append([]int64{}, lead...), ad[len(ad)-2])
	dims = append(dims, bd[len(bd)-1])
	if len(a.Dims) == 1 {
		dims = append(dims[:len(dims)-2], dims[len(dims)-1])
	}
	if len(b.Dims) == 1 {
		dims = dims[:len(dims)-1]
	}
	return known(a.Elem, dims...)
}

// reshapeType resolves a Reshape to constant shape: 0 copies the input
// dimension (is a literal 0 with allowZero), -1 takes what is left. The
// batch dimension survives when the target accounts for exactly one
// sample's elements besides it.
func reshapeType(x TensorType, shape []int64, allowZero bool) TensorType {
	if !x.Known {
		return unknown(x.Elem)
	}
	per, ok := x.PerSample()
	if !ok {
		return unknown(x.Elem)
	}
	dims := make([]int64, len(shape))
	inferAt := -1
	knownProd := int64(1)
	batchPlaced := false
	for i, s := range shape {
		switch {
		case s == 0 && allowZero:
			dims[i] = 0
			knownProd = 0
		case s == 0 && i < len(x.Dims):
			dims[i] = x.Dims[i]
			if dims[i] == DimBatch {
				batchPlaced = true
			} else if dims[i] < 0 {
				return unknown(x.Elem)
			} else {
				knownProd *= dims[i]
			}
		case s == -1:
			if inferAt >= 0 {
				return unknown(x.Elem)
			}
			inferAt = i
		case s > 0:
			dims[i] = s
			knownProd *= s
		default:
			return unknown(x.Elem)
		}
	}
	if !x.HasBatch() {
		if inferAt >= 0 {
			if knownProd == 0 || per%knownProd != 0 {
				return unknown(x.Elem)
			}
			dims[inferAt] = per / knownProd
		} else if knownProd != per {
			return unknown(x.Elem)
		}
		return known(x.Elem, dims...)
	}
	switch {
	case batchPlaced && inferAt >= 0:
		if knownProd == 0 || per%knownProd != 0 {
			return unknown(x.Elem)
		}
		dims[inferAt] = per / knownProd
	case batchPlaced:
		if knownProd != per {
			return unknown(x.Elem)
		}
	case inferAt >= 0 && knownProd == per:
		dims[inferAt] = DimBatch
	default:
		return unknown(x.Elem)
	}
	return known(x.Elem, dims...)
}

// sliceType: each sliced axis of known size d keeps the elements of
// [start, end) by step (positive steps only; bounds clamped to [0, d]),
// the others are unchanged. Bounds are inputs from opset 10, attributes
// before; the batch axis sliced is unknown unless taken whole.
func sliceType(g *Graph, n *pb.NodeProto, x TensorType) TensorType {
	if !x.Known {
		return unknown(x.Elem)
	}
	var starts, ends, axes, steps []int64
	if len(n.GetInput()) >= 3 {
		var ok1, ok2 bool
		starts, ok1 = g.constInts(n.GetInput()[1])
		ends, ok2 = g.constInts(n.GetInput()[2])
		if !ok1 || !ok2 {
			return unknown(x.Elem)
		}
		if len(n.GetInput()) > 3 && n.GetInput()[3] != "" {
			if axes, ok1 = g.constInts(n.GetInput()[3]); !ok1 {
				return unknown(x.Elem)
			}
		}
		if len(n.GetInput()) > 4 && n.GetInput()[4] != "" {
			if steps, ok1 = g.constInts(n.GetInput()[4]); !ok1 {
				return unknown(x.Elem)
			}
		}
	} else {
		starts, _ = attrInts(n, "starts")
		ends, _ = attrInts(n, "ends")
		axes, _ = attrInts(n, "axes")
	}
	if len(axes) == 0 {
		for i := range starts {
			axes = append(axes, int64(i))
		}
	}
	if len(starts) != len(ends) || len(axes) != len(starts) || (len(steps) > 0 && len(steps) != len(starts)) {
		return unknown(x.Elem)
	}
	dims := append([]int64(nil), x.Dims...)
	for k, a := range axes {
		ax := normAxis(a, len(dims))
		step := int64(1)
		if len(steps) > 0 {
			step = steps[k]
		}
		if ax < 0 || step <= 0 {
			return unknown(x.Elem)
		}
		d := x.Dims[ax]
		if d < 0 {
			if starts[k] == 0 && ends[k] >= 1<<62 && step == 1 {
				continue // the whole axis
			}
			dims[ax] = DimUnknown
			continue
		}
		clamp := func(v int64) int64 {
			if v < 0 {
				v += d
			}
			return min(max(v, 0), d)
		}
		st, en := clamp(starts[k]), clamp(ends[k])
		dims[ax] = max(0, (en-st+step-1)/step)
	}
	return known(x.Elem, dims...)
}

// splitTypes: the outputs cut axis into the sizes of the split input
// (opset 13) or attribute (before), or into equal parts (the last one
// smaller when the size does not divide).
func splitTypes(g *Graph, n *pb.NodeProto, x TensorType) []TensorType {
	outs := len(n.GetOutput())
	res := make([]TensorType, outs)
	for i := range res {
		res[i] = unknown(x.Elem)
	}
	if !x.Known {
		return res
	}
	ax := normAxis(attrInt(n, "axis", 0), len(x.Dims))
	if ax < 0 {
		return res
	}
	var sizes []int64
	if len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		v, ok := g.constInts(n.GetInput()[1])
		if !ok {
			return res
		}
		sizes = v
	} else if v, ok := attrInts(n, "split"); ok && len(v) > 0 {
		sizes = v
	} else {
		d := x.Dims[ax]
		if d < 0 {
			return res
		}
		each := (d + int64(outs) - 1) / int64(outs)
		for range outs {
			sizes = append(sizes, min(each, d))
			d -= min(each, d)
		}
	}
	if len(sizes) != outs {
		return res
	}
	var sum int64
	for i, sz := range sizes {
		dims := append([]int64(nil), x.Dims...)
		dims[ax] = sz
		res[i] = known(x.Elem, dims...)
		sum += sz
	}
	if x.Dims[ax] >= 0 && sum != x.Dims[ax] {
		for i := range res {
			res[i] = unknown(x.Elem)
		}
	}
	return res
}
