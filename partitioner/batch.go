package partitioner

import (
	"fmt"
	"slices"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// A model exported without dynamic axes (torch.onnx.export with no
// dynamic_axes) declares its batch as a number B in every input's and
// output's first dimension, and bakes B into the constants of the
// Reshapes it traced (x.view(B, -1) becomes Reshape(x, [B, F*D]),
// ids.view(-1) Reshape(ids, [B*F])). Debatch makes such a graph
// batch-free where it can: it follows the batch through the graph on
// the exported shapes, rewrites each Reshape's shape constant so that
// the one dimension that carries the batch is -1 (the others are
// per-sample sizes), and declares the inputs and outputs with a
// symbolic batch. A node that ties the graph to B in a way it cannot
// rewrite (a constant sized B broadcast against the samples, a slice or
// concat along the batch, a Reshape that splits the batch over two
// dimensions, an op it cannot follow the batch through) is a blocker:
// the graph then serves at B only (plan.json fixed_batch).

// batchAt is where a tensor carries the batch: dimension axis holds
// outer * B * inner elements, in that order (1 and 1 for a plain batch
// dimension; ids.view(-1) of [B, F] gives inner F).
type batchAt struct {
	axis         int
	outer, inner int64
}

// exportedBatch is the number every graph input declares as its first
// dimension, or 0 when the batch is symbolic (or the inputs disagree).
func exportedBatch(m *pb.ModelProto) int64 {
	var b int64
	inits := map[string]bool{}
	for _, t := range m.GetGraph().GetInitializer() {
		inits[t.GetName()] = true
	}
	n := 0
	for _, in := range m.GetGraph().GetInput() {
		if inits[in.GetName()] {
			continue
		}
		n++
		dims := in.GetType().GetTensorType().GetShape().GetDim()
		if len(dims) == 0 {
			return 0
		}
		v, ok := dims[0].GetValue().(*pb.TensorShapeProto_Dimension_DimValue)
		if !ok || v.DimValue <= 0 || (b != 0 && v.DimValue != b) {
			return 0
		}
		b = v.DimValue
	}
	if n == 0 {
		return 0
	}
	return b
}

// Debatch rewrites m in place to a symbolic batch when its inputs
// declare a fixed one (see the comment above), and returns what it did:
// nil for a model whose batch is already symbolic. With blockers, the
// rewrites that could be made are still made (the inputs and outputs
// are declared symbolic, so that shape inference sees the batch), and
// the model serves at BatchInfo.Exported only.
func Debatch(m *pb.ModelProto) (*plan.BatchInfo, error) {
	B := exportedBatch(m)
	if B == 0 {
		return nil, nil
	}
	g, err := NewGraph(m)
	if err != nil {
		return nil, err
	}
	types, _ := InferShapes(g) // every dim concrete: the batch is the number B
	info := &plan.BatchInfo{Exported: B}
	at := map[string]batchAt{}
	lost := map[string]int{} // tensor -> node the batch was lost at
	for _, in := range g.Inputs {
		at[in.GetName()] = batchAt{0, 1, 1}
	}
	// quiet marks tensors downstream of a blocker whose batch could
	// not be followed: they raise no blocker of their own (one cause,
	// named once).
	quiet := map[string]bool{}
	block := func(n *pb.NodeProto, format string, args ...any) {
		info.Blockers = append(info.Blockers, plan.BatchBlocker{Node: n.GetName(), Op: n.GetOpType(), Reason: fmt.Sprintf(format, args...)})
		for _, o := range n.GetOutput() {
			quiet[o] = true
		}
	}
	type rewrite struct {
		node  *pb.NodeProto
		input int
		shape []int64
	}
	var rewrites []rewrite
	for ni, n := range g.Nodes {
		ins := n.GetInput()
		isQuiet := false
		for _, in := range ins {
			isQuiet = isQuiet || quiet[in]
		}
		if isQuiet {
			for _, o := range n.GetOutput() {
				quiet[o] = true
			}
			continue
		}
		var batched []int // inputs carrying the batch
		lostAt := -1
		for i, in := range ins {
			if _, ok := at[in]; ok && in != "" {
				batched = append(batched, i)
			}
			if l, ok := lost[in]; ok && lostAt < 0 {
				lostAt = l
			}
		}
		if lostAt >= 0 {
			// An op downstream of one the batch could not be followed
			// through: only shape-free ops may follow.
			for _, o := range n.GetOutput() {
				lost[o] = lostAt
			}
			if needsBatch(n.GetOpType()) {
				block(n, "its input comes through node %q (%s), which the batch cannot be followed through", g.Nodes[lostAt].GetName(), g.Nodes[lostAt].GetOpType())
				for _, o := range n.GetOutput() {
					quiet[o] = true
				}
			}
			continue
		}
		if len(batched) == 0 {
			continue
		}
		set := func(b batchAt, outs ...int) {
			if len(outs) == 0 {
				outs = []int{0}
			}
			for _, i := range outs {
				if i < len(n.GetOutput()) && n.GetOutput()[i] != "" {
					at[n.GetOutput()[i]] = b
					delete(quiet, n.GetOutput()[i])
				}
			}
		}
		x := at[ins[batched[0]]]
		xt := types[ins[batched[0]]]
		if !xt.Known || x.axis >= len(xt.Dims) {
			for _, o := range n.GetOutput() {
				lost[o] = ni
			}
			switch {
			case n.GetOpType() == "Reshape" && len(ins) > 1 && !fromShape(g, ins[1]):
				if _, isConst := g.constInts(ins[1]); !isConst {
					block(n, "its shape is computed from constants, not from the Shape of a tensor")
				} else {
					block(n, "the shape of its input %q is not known", ins[batched[0]])
				}
			case needsBatch(n.GetOpType()):
				block(n, "the shape of its input %q is not known", ins[batched[0]])
			}
			continue
		}
		outT := TensorType{}
		if len(n.GetOutput()) > 0 {
			outT = types[n.GetOutput()[0]]
		}
		switch op := n.GetOpType(); op {
		case "Identity", "Relu", "Sigmoid", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Abs", "Erf", "Softmax", "LogSoftmax",
			"LeakyRelu", "Dropout", "Gelu", "Elu", "Selu", "HardSigmoid", "Softplus", "Reciprocal", "Floor", "Ceil",
			"Round", "Sign", "LayerNormalization", "BatchNormalization", "InstanceNormalization", "Not", "Cast", "IsNaN", "IsInf":
			if batched[0] != 0 {
				block(n, "reads the samples as a parameter, not as its data")
				continue
			}
			if op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization" {
				if ax := normAxis(attrInt(n, "axis", -1), len(xt.Dims)); ax == x.axis || (op == "LayerNormalization" && ax <= x.axis) {
					block(n, "normalises along the batch dimension")
					continue
				}
			}
			set(x)
		case "Clip", "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "PRelu",
			"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "BitShift",
			"BitwiseAnd", "BitwiseOr", "BitwiseXor":
			if !outT.Known {
				block(n, "its output shape is not known")
				continue
			}
			r := len(outT.Dims)
			ax := x.axis + r - len(xt.Dims)
			ok := true
			for i, in := range ins {
				if in == "" {
					continue
				}
				t := types[in]
				if !t.Known {
					block(n, "input %q has an unknown shape", in)
					ok = false
					break
				}
				j := ax - (r - len(t.Dims))
				if b, has := at[in]; has {
					if b.axis != j || b.outer != x.outer || b.inner != x.inner {
						block(n, "its inputs carry the batch differently")
						ok = false
						break
					}
					continue
				}
				if j >= 0 && t.Dims[j] != 1 {
					// Blocked; the output still carries the batch.
					block(n, "input %d (%q, shape %v) is sized for the exported batch %d along the batch dimension: a per-sample constant baked at that batch", i, in, t.Dims, B)
					break
				}
			}
			if ok {
				set(batchAt{ax, x.outer, x.inner})
			}
		case "Gather":
			axis := normAxis(attrInt(n, "axis", 0), len(types[ins[0]].Dims))
			idxT := types[ins[1]]
			switch {
			case len(batched) == 2:
				block(n, "both its data and its indices carry the batch")
			case batched[0] == 0 && axis == x.axis:
				block(n, "gathers along the batch dimension")
			case batched[0] == 0 && x.axis < axis:
				set(x)
			case batched[0] == 0:
				set(batchAt{x.axis - 1 + len(idxT.Dims), x.outer, x.inner})
			default:
				set(batchAt{axis + x.axis, x.outer, x.inner})
			}
		case "Squeeze", "Unsqueeze":
			if batched[0] != 0 {
				block(n, "its axes come from the samples")
				continue
			}
			axes, ok := opAxes(g, n)
			if !ok || (op == "Squeeze" && len(axes) == 0) {
				block(n, "its axes are not constant")
				continue
			}
			r := len(xt.Dims)
			if op == "Unsqueeze" {
				r += len(axes)
			}
			ks := map[int]bool{}
			for _, a := range axes {
				ks[normAxis(a, r)] = true
			}
			if op == "Squeeze" {
				if ks[x.axis] {
					block(n, "squeezes the batch dimension (exported as %d)", B)
					continue
				}
				k := 0
				for a := range ks {
					if a < x.axis {
						k++
					}
				}
				set(batchAt{x.axis - k, x.outer, x.inner})
				continue
			}
			// Unsqueeze: the batch is the x.axis-th dimension not inserted.
			j := 0
			for a := range r {
				if ks[a] {
					continue
				}
				if j == x.axis {
					set(batchAt{a, x.outer, x.inner})
					break
				}
				j++
			}
		case "Flatten":
			a := int(attrInt(n, "axis", 1))
			if a < 0 {
				a += len(xt.Dims)
			}
			if x.axis < a {
				set(batchAt{0, x.outer * prodDims(xt.Dims[:x.axis]), x.inner * prodDims(xt.Dims[x.axis+1:a])})
			} else {
				set(batchAt{1, x.outer * prodDims(xt.Dims[a:x.axis]), x.inner * prodDims(xt.Dims[x.axis+1:])})
			}
		case "Reshape":
			if batched[0] != 0 {
				block(n, "its shape input comes from the samples")
				continue
			}
			if len(ins) > 1 {
				if _, isConst := g.constInts(ins[1]); !isConst && !fromShape(g, ins[1]) {
					block(n, "its shape is computed from constants, not from the Shape of a tensor")
					continue
				}
				if !outT.Known && fromShape(g, ins[1]) {
					// A shape made at run time from x.size(0) and
					// constants: the batch is taken to stay where it is
					// (verify checks it at other batch sizes).
					set(x)
					continue
				}
			}
			if !outT.Known {
				block(n, "its output shape is not known")
				continue
			}
			in, out := xt.Dims, outT.Dims
			var cands []batchAt
			for i := range out {
				if b, ok := carries(in, out, x, i, B); ok {
					cands = append(cands, b)
				}
			}
			if len(cands) == 0 {
				block(n, "reshapes %v to %v, which splits the batch (exported %d) over several dimensions", in, out, B)
				continue
			}
			pick := cands[0]
			for _, c := range cands {
				if c.axis == x.axis {
					pick = c
					break
				}
			}
			if len(ins) > 1 {
				shape, isConst := g.constInts(ins[1])
				if !isConst {
					if !fromShape(g, ins[1]) {
						block(n, "its shape is computed from constants, not from the Shape of a tensor")
						continue
					}
				} else if len(shape) == len(out) && (shape[pick.axis] != -1 && !(shape[pick.axis] == 0 && attrInt(n, "allowzero", 0) == 0 && pick.axis == x.axis && pick == x)) {
					ns := append([]int64(nil), out...)
					ns[pick.axis] = -1
					rewrites = append(rewrites, rewrite{n, 1, ns})
				}
			} else {
				block(n, "a Reshape-1 with the shape as an attribute")
				continue
			}
			set(pick)
		case "Transpose":
			perm, ok := attrInts(n, "perm")
			if !ok {
				for i := len(xt.Dims) - 1; i >= 0; i-- {
					perm = append(perm, int64(i))
				}
			}
			k := slices.Index(perm, int64(x.axis))
			if k < 0 {
				block(n, "its perm does not name the batch dimension")
				continue
			}
			set(batchAt{k, x.outer, x.inner})
		case "Concat":
			axis := normAxis(attrInt(n, "axis", 0), len(xt.Dims))
			if axis == x.axis {
				block(n, "concatenates along the batch dimension")
				continue
			}
			ok := true
			for _, in := range ins {
				if b, has := at[in]; has {
					if b != x {
						block(n, "its inputs carry the batch differently")
						ok = false
						break
					}
				} else {
					block(n, "concatenates %q, which does not carry the batch, with the samples: a constant sized for the exported batch %d", in, B)
					ok = false
					break
				}
			}
			if ok {
				set(x)
			}
		case "Slice":
			if batched[0] != 0 {
				block(n, "its bounds come from the samples")
				continue
			}
			if !outT.Known || outT.Dims[x.axis] != xt.Dims[x.axis] {
				block(n, "slices the batch dimension")
				continue
			}
			set(x)
		case "Split":
			axis := normAxis(attrInt(n, "axis", 0), len(xt.Dims))
			if batched[0] != 0 || axis == x.axis {
				block(n, "splits along the batch dimension")
				continue
			}
			outs := make([]int, len(n.GetOutput()))
			for i := range outs {
				outs[i] = i
			}
			set(x, outs...)
		case "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin":
			if batched[0] != 0 {
				block(n, "its axes come from the samples")
				continue
			}
			var axes []int64
			if op == "ArgMax" || op == "ArgMin" {
				axes = []int64{attrInt(n, "axis", 0)}
			} else if a, ok := reduceAxes(g, n); ok {
				axes = a
			} else {
				block(n, "its axes are not constant")
				continue
			}
			if len(axes) == 0 && attrInt(n, "noop_with_empty_axes", 0) == 0 {
				block(n, "reduces over every dimension, the batch included")
				continue
			}
			shift, red := 0, false
			for _, a := range axes {
				k := normAxis(a, len(xt.Dims))
				red = red || k == x.axis
				if k < x.axis {
					shift++
				}
			}
			if red {
				block(n, "reduces over the batch dimension")
				continue
			}
			if attrInt(n, "keepdims", 1) == 1 {
				shift = 0
			}
			set(batchAt{x.axis - shift, x.outer, x.inner})
		case "MatMul":
			r := len(outT.Dims)
			switch {
			case !outT.Known:
				block(n, "its output shape is not known")
			case len(batched) == 2 || batched[0] != 0:
				block(n, "multiplies by a matrix made from the samples")
			case x.axis == len(xt.Dims)-1:
				block(n, "contracts over the batch dimension")
			default:
				set(batchAt{x.axis + r - len(xt.Dims), x.outer, x.inner})
			}
		case "Gemm":
			if batched[0] != 0 || len(batched) > 1 || attrInt(n, "transA", 0) != 0 || x.axis != 0 {
				block(n, "multiplies with the batch not as the rows of A")
				continue
			}
			if len(ins) > 2 && ins[2] != "" {
				if t := types[ins[2]]; t.Known && len(t.Dims) == 2 && t.Dims[0] != 1 {
					block(n, "its bias C (shape %v) is sized for the exported batch %d", t.Dims, B)
					continue
				}
			}
			set(x)
		case "Expand":
			if batched[0] != 0 {
				block(n, "its shape comes from the samples")
				continue
			}
			shape, isConst := g.constInts(ins[1])
			if !isConst {
				if !fromShape(g, ins[1]) {
					block(n, "its shape is computed from constants, not from the Shape of a tensor")
					continue
				}
			} else {
				r := max(len(xt.Dims), len(shape))
				ax := x.axis + r - len(xt.Dims)
				if j := ax - (r - len(shape)); j >= 0 && shape[j] != 1 {
					ns := append([]int64(nil), shape...)
					ns[j] = 1 // 1 keeps the input's dimension: the batch
					rewrites = append(rewrites, rewrite{n, 1, ns})
				}
				set(batchAt{ax, x.outer, x.inner})
				continue
			}
			set(batchAt{x.axis + len(outT.Dims) - len(xt.Dims), x.outer, x.inner})
		case "Shape", "Size":
			// The batch becomes a value computed at run time: nothing
			// baked. Its outputs carry no batch dimension.
		default:
			for _, o := range n.GetOutput() {
				lost[o] = ni
			}
			if needsBatch(op) {
				block(n, "the partitioner cannot follow the batch through %s", op)
			}
		}
	}
	for _, o := range g.Outputs {
		if quiet[o.GetName()] {
			continue
		}
		if l, ok := lost[o.GetName()]; ok {
			info.Blockers = append(info.Blockers, plan.BatchBlocker{Node: g.Nodes[l].GetName(), Op: g.Nodes[l].GetOpType(), Reason: fmt.Sprintf("output %q comes through it, and the batch cannot be followed through it", o.GetName())})
			continue
		}
		if b, ok := at[o.GetName()]; !ok || b != (batchAt{0, 1, 1}) {
			node := "(input)"
			op := ""
			if i, has := g.Producer[o.GetName()]; has {
				node, op = g.Nodes[i].GetName(), g.Nodes[i].GetOpType()
			}
			info.Blockers = append(info.Blockers, plan.BatchBlocker{Node: node, Op: op, Reason: fmt.Sprintf("output %q does not have the batch as its first dimension", o.GetName())})
		}
	}
	// Apply: shapes rewritten, inputs and outputs declared symbolic.
	for _, rw := range rewrites {
		name := rw.node.GetName() + "/prism_batch_free_shape"
		m.Graph.Initializer = append(m.Graph.Initializer, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_INT64), Dims: []int64{int64(len(rw.shape))}, Int64Data: rw.shape})
		rw.node.Input[rw.input] = name
		info.Rewritten = append(info.Rewritten, rw.node.GetName())
	}
	sym := func(vi *pb.ValueInfoProto) {
		dims := vi.GetType().GetTensorType().GetShape().GetDim()
		if len(dims) > 0 {
			if v, ok := dims[0].GetValue().(*pb.TensorShapeProto_Dimension_DimValue); ok && v.DimValue == B {
				dims[0].Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}
			}
		}
	}
	for _, in := range g.Inputs {
		sym(in)
	}
	for _, o := range m.GetGraph().GetOutput() {
		sym(o)
	}
	m.Graph.ValueInfo = nil // intermediate shapes declared at B
	return info, nil
}

// carries says whether output dimension i of a reshape of in (batch at
// x) to out holds the batch whole, and how: the dimensions before i
// multiply to a divisor q of the elements before the batch (pre), i
// holds (pre/q) * B * k, and k times the dimensions after i are the
// elements after the batch (post). Then out[i] = -1 reshapes a batch of
// any size the same way.
func carries(in, out []int64, x batchAt, i int, B int64) (batchAt, bool) {
	pre, post := x.outer, x.inner
	for _, d := range in[:x.axis] {
		pre *= d
	}
	for _, d := range in[x.axis+1:] {
		post *= d
	}
	q := int64(1)
	for _, d := range out[:i] {
		q *= d
	}
	after := int64(1)
	for _, d := range out[i+1:] {
		after *= d
	}
	if q <= 0 || pre%q != 0 || after <= 0 {
		return batchAt{}, false
	}
	mB := pre / q * B
	if out[i]%mB != 0 {
		return batchAt{}, false
	}
	k := out[i] / mB
	if k*after != post {
		return batchAt{}, false
	}
	return batchAt{i, pre / q, k}, true
}

// fromShape says whether a computed shape tensor depends on a Shape
// (or Size) node: then it follows the batch at run time.
func fromShape(g *Graph, name string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(t string) bool {
		if seen[t] {
			return false
		}
		seen[t] = true
		i, ok := g.Producer[t]
		if !ok {
			return false
		}
		n := g.Nodes[i]
		if n.GetOpType() == "Shape" || n.GetOpType() == "Size" {
			return true
		}
		for _, in := range n.GetInput() {
			if walk(in) {
				return true
			}
		}
		return false
	}
	return walk(name)
}

// needsBatch says whether an op's result depends on where the batch is
// in its input's shape (everything but element-wise ops).
func needsBatch(op string) bool {
	switch op {
	case "Identity", "Relu", "Sigmoid", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Abs", "Erf", "Cast", "Not", "Floor", "Ceil", "Round", "Sign", "Reciprocal":
		return false
	}
	return true
}
