package partitioner

import (
	"fmt"
	"math"
	"strings"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// idChain is the integer work between a graph input and a lookup's ids:
// the pre-lookup ops (plan.PreOp) the embedding tier runs natively, and
// the graph nodes they replace.
type idChain struct {
	input string
	ops   []plan.PreOp
	nodes []int
	// shape is the ids' per-sample shape, elem their type.
	shape []int64
	elem  pb.TensorProto_DataType
	// preOut, for work the native ops do not cover, is the ids tensor
	// pre.onnx outputs (ops then empty, nodes the nodes it runs), made
	// from the graph inputs preInputs (input the first).
	preOut    string
	preInputs []string
}

// notIDs says why a tensor is not a lookup's ids: the node it comes
// from and what is wrong with it.
type notIDs struct {
	node   string
	reason string
}

func (e *notIDs) Error() string { return e.reason }

// traceIDs follows the indices of a Gather back to one graph input
// through the ops the embedding tier runs natively: column picks
// (Gather axis 1 with a scalar index, Slice, Split), Cast to an integer,
// Add/Sub/Mod/Min/Max/Clip with constants, Where(Equal(x, c), d, x) and
// shape-only ops that keep the batch axis first.
func traceIDs(g *Graph, types map[string]TensorType, name string) (*idChain, error) {
	c, err := traceFrom(g, types, name, 0)
	if err != nil {
		return nil, err
	}
	t := types[name]
	c.shape, c.elem = t.SampleShape(), t.Elem
	// What plan.json's check refuses (a Clip whose min is above its max)
	// is work for pre.onnx, not a plan that fails to write.
	in := types[c.input]
	dtype := elemName(in.Elem)
	if dtype == "float" {
		dtype = "float32"
	}
	if _, _, err := plan.PreShape(in.SampleShape(), dtype, c.ops); err != nil {
		return nil, &notIDs{node: name, reason: fmt.Sprintf("indices come from id work the native ops do not run: %v", err)}
	}
	return c, nil
}

func sampleKnown(t TensorType) bool {
	if !t.Known || len(t.Dims) == 0 || t.Dims[0] != DimBatch {
		return false
	}
	for _, d := range t.Dims[1:] {
		if d <= 0 {
			return false
		}
	}
	return true
}

func elemName(e pb.TensorProto_DataType) string {
	switch e {
	case pb.TensorProto_FLOAT, pb.TensorProto_DOUBLE, pb.TensorProto_FLOAT16, pb.TensorProto_BFLOAT16:
		return "float"
	}
	return strings.ToLower(e.String())
}

func isInt(e pb.TensorProto_DataType) bool {
	return e == pb.TensorProto_INT64 || e == pb.TensorProto_INT32
}

func traceFrom(g *Graph, types map[string]TensorType, name string, depth int) (*idChain, error) {
	t := types[name]
	if g.IsInput(name) {
		switch {
		case !sampleKnown(t):
			return nil, &notIDs{node: name, reason: fmt.Sprintf("indices come from input %q whose shape %s is not [batch, known sizes...]", name, dimsString(t))}
		case t.Elem != pb.TensorProto_INT64 && t.Elem != pb.TensorProto_INT32 && t.Elem != pb.TensorProto_FLOAT:
			return nil, &notIDs{node: name, reason: fmt.Sprintf("indices come from input %q of type %s (the embedding tier takes int64 or int32 ids, or float32 values)", name, elemName(t.Elem))}
		}
		return &idChain{input: name}, nil
	}
	if depth > 32 {
		return nil, &notIDs{node: name, reason: "indices come from a chain of more than 32 ops"}
	}
	i, ok := g.Producer[name]
	if !ok {
		return nil, &notIDs{node: name, reason: fmt.Sprintf("indices come from the constant %q, not from the inputs", name)}
	}
	n := g.Nodes[i]
	op := n.GetOpType()
	fail := func(format string, args ...any) (*idChain, error) {
		return nil, &notIDs{node: n.GetName(), reason: fmt.Sprintf("indices come from %s %s (node %q): ", article(elemName(t.Elem)), elemName(t.Elem)+" "+op, n.GetName()) + fmt.Sprintf(format, args...)}
	}
	in0 := ""
	if len(n.GetInput()) > 0 {
		in0 = n.GetInput()[0]
	}
	inT := types[in0]
	if !sampleKnown(t) {
		// Name the first cause on the way from the inputs: the ids'
		// source, or a constant that does not broadcast.
		data := in0
		arith := op == "Add" || op == "Sub" || op == "Mod" || op == "Min" || op == "Max"
		if arith && len(n.GetInput()) == 2 {
			x, c := n.GetInput()[0], n.GetInput()[1]
			if _, _, ok := g.constTensor(x); ok {
				x, c = c, x
			}
			data = x
			if vals, cdims, ok := g.constTensor(c); ok && sampleKnown(types[x]) {
				if _, err := broadcastConst(vals, cdims, types[x]); err != nil {
					return fail("%v", err)
				}
			}
		}
		if data != "" && op != "Constant" {
			if _, err := traceFrom(g, types, data, depth+1); err != nil {
				return nil, err
			}
		}
		return fail("its output shape %s is not [batch, known sizes...]", dimsString(t))
	}
	// prev traces the data input and appends ops.
	prev := func(from string, ops ...plan.PreOp) (*idChain, error) {
		c, err := traceFrom(g, types, from, depth+1)
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, ops...)
		c.nodes = append(c.nodes, i)
		return c, nil
	}
	reshape := func(from string) (*idChain, error) {
		if !sampleKnown(types[from]) {
			return fail("its input shape %s is not [batch, known sizes...]", dimsString(types[from]))
		}
		if equalInts(types[from].SampleShape(), t.SampleShape()) {
			return prev(from)
		}
		return prev(from, plan.PreOp{Op: plan.PreReshape, Shape: t.SampleShape()})
	}
	switch op {
	case "Identity":
		return prev(in0)
	case "Cast":
		to := pb.TensorProto_DataType(attrInt(n, "to", 0))
		switch {
		case !isInt(to):
			return fail("a cast to %s", elemName(to))
		case to == inT.Elem:
			return prev(in0)
		}
		return prev(in0, plan.PreOp{Op: plan.PreCast, To: strings.ToLower(to.String())})
	case "Squeeze", "Unsqueeze", "Reshape", "Flatten":
		return reshape(in0)
	case "Gather":
		if len(n.GetInput()) != 2 {
			return fail("%d inputs, want 2", len(n.GetInput()))
		}
		axis := attrInt(n, "axis", 0)
		if axis < 0 {
			axis += int64(len(inT.Dims))
		}
		if axis != 1 || !sampleKnown(inT) || len(inT.Dims) < 2 {
			return fail("a Gather on axis %d (a column pick is a Gather on axis 1 of [batch, columns, ...])", attrInt(n, "axis", 0))
		}
		idx, dims, ok := g.constTensor(n.GetInput()[1])
		if !ok {
			return fail("its indices are not a constant")
		}
		cols := inT.Dims[1]
		for k := range idx {
			if idx[k] < 0 {
				idx[k] += cols
			}
			if idx[k] < 0 || idx[k] >= cols {
				return fail("index %d outside %d columns", idx[k], cols)
			}
		}
		if len(dims) == 0 && len(idx) == 1 {
			return prev(in0, plan.PreOp{Op: plan.PreColumn, Index: idx[0]})
		}
		if len(dims) == 1 && len(idx) > 0 && idx[len(idx)-1]-idx[0] == int64(len(idx)-1) && consecutive(idx) {
			return prev(in0, plan.PreOp{Op: plan.PreSlice, Start: idx[0], End: idx[0] + int64(len(idx))})
		}
		return fail("its indices %v are not one column or a run of columns", idx)
	case "Slice":
		start, end, ok := sliceRange(g, n, inT)
		if !ok {
			return fail("only a Slice of constant bounds on axis 1 with step 1 is a column pick")
		}
		return prev(in0, plan.PreOp{Op: plan.PreSlice, Start: start, End: end})
	case "Split":
		start, end, ok := splitRange(g, n, inT, name)
		if !ok {
			return fail("only a Split on axis 1 with constant sizes is a column pick")
		}
		return prev(in0, plan.PreOp{Op: plan.PreSlice, Start: start, End: end})
	case "Add", "Sub", "Mod", "Min", "Max":
		if len(n.GetInput()) != 2 {
			return fail("%d inputs, want 2", len(n.GetInput()))
		}
		if !isInt(t.Elem) {
			return fail("arithmetic on float values")
		}
		x, c := n.GetInput()[0], n.GetInput()[1]
		vals, cdims, ok := g.constTensor(c)
		if !ok && (op == "Add" || op == "Min" || op == "Max") {
			x, c = c, x
			vals, cdims, ok = g.constTensor(c)
		}
		if !ok {
			return fail("one side must be a constant")
		}
		per, err := broadcastConst(vals, cdims, t)
		if err != nil {
			return fail("%v", err)
		}
		// The native ops keep a sample's count of ids: a constant that
		// widens them ([batch, 1] + [3] is [batch, 3]) is not one.
		if xt := types[x]; sampleKnown(xt) && !equalInts(xt.SampleShape(), t.SampleShape()) {
			return fail("the constant %v broadcasts the ids %s to %s", cdims, dimsString(xt), dimsString(t))
		}
		switch op {
		case "Add":
			return prev(x, plan.PreOp{Op: plan.PreAdd, Values: per})
		case "Sub":
			return prev(x, plan.PreOp{Op: plan.PreSub, Values: per})
		case "Mod":
			if attrInt(n, "fmod", 0) != 0 {
				return fail("fmod=1 on integers")
			}
			for _, v := range per {
				if v == 0 {
					return fail("divisor 0")
				}
			}
			return prev(x, plan.PreOp{Op: plan.PreMod, Values: per})
		}
		if len(per) != 1 {
			return fail("an elementwise bound; only one bound for every id is a clamp")
		}
		v := per[0]
		if op == "Min" {
			return prev(x, plan.PreOp{Op: plan.PreClip, Max: &v})
		}
		return prev(x, plan.PreOp{Op: plan.PreClip, Min: &v})
	case "Clip":
		if !isInt(t.Elem) {
			return fail("a clip of float values")
		}
		o := plan.PreOp{Op: plan.PreClip}
		for k, dst := range []**int64{&o.Min, &o.Max} {
			if k+1 >= len(n.GetInput()) || n.GetInput()[k+1] == "" {
				continue
			}
			v, dims, ok := g.constTensor(n.GetInput()[k+1])
			if !ok || len(dims) != 0 || len(v) != 1 {
				return fail("its bounds are not scalar constants")
			}
			*dst = &v[0]
		}
		return prev(in0, o)
	case "Where":
		if len(n.GetInput()) != 3 {
			return fail("%d inputs, want 3", len(n.GetInput()))
		}
		cond, a, b := n.GetInput()[0], n.GetInput()[1], n.GetInput()[2]
		ci, ok := g.Producer[cond]
		if !ok || g.Nodes[ci].GetOpType() != "Equal" || len(g.Nodes[ci].GetInput()) != 2 {
			return fail("only Where(Equal(ids, c), default, ids) maps an id to a default row")
		}
		eq := g.Nodes[ci]
		x, c := eq.GetInput()[0], eq.GetInput()[1]
		cv, cd, ok := g.constTensor(c)
		if !ok {
			x, c = c, x
			cv, cd, ok = g.constTensor(c)
		}
		dv, dd, dok := g.constTensor(a)
		if !ok || !dok || len(cd) != 0 || len(dd) != 0 || len(cv) != 1 || len(dv) != 1 || b != x {
			return fail("only Where(Equal(ids, c), default, ids) with scalar constants maps an id to a default row")
		}
		if len(g.Consumers[cond]) != 1 {
			return fail("its condition is read elsewhere too")
		}
		ch, err := prev(x, plan.PreOp{Op: plan.PreWhereEqual, Equal: cv[0], Default: dv[0]})
		if err == nil {
			ch.nodes = append(ch.nodes[:len(ch.nodes)-1], ci, i)
		}
		return ch, err
	}
	return fail("not integer work the embedding tier runs")
}

func article(w string) string {
	if strings.ContainsAny(w[:1], "aeiou") {
		return "an"
	}
	return "a"
}

func consecutive(v []int64) bool {
	for k := 1; k < len(v); k++ {
		if v[k] != v[k-1]+1 {
			return false
		}
	}
	return true
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func dimsString(t TensorType) string {
	if !t.Known {
		return "unknown"
	}
	s := make([]string, len(t.Dims))
	for i, d := range t.Dims {
		switch {
		case d == DimBatch:
			s[i] = "batch"
		case d < 0:
			s[i] = "?"
		default:
			s[i] = fmt.Sprint(d)
		}
	}
	return "[" + strings.Join(s, ",") + "]"
}

// constTensor reads an integer constant (initializer or Constant node):
// its values and dims. One whose values do not fill its dims (malformed)
// is not read.
func (g *Graph) constTensor(name string) ([]int64, []int64, bool) {
	var t *pb.TensorProto
	if init, ok := g.Inits[name]; ok {
		t = init
	} else if i, ok := g.Producer[name]; ok && g.Nodes[i].GetOpType() == "Constant" {
		for _, a := range g.Nodes[i].GetAttribute() {
			switch a.GetName() {
			case "value":
				t = a.GetT()
			case "value_int":
				return []int64{a.GetI()}, nil, true
			case "value_ints":
				return a.GetInts(), []int64{int64(len(a.GetInts()))}, true
			}
		}
	}
	if t == nil || t.GetDataLocation() == pb.TensorProto_EXTERNAL {
		return nil, nil, false
	}
	v, err := pb.Int64s(t)
	if err != nil || int64(len(v)) != numElements(t.GetDims()) {
		return nil, nil, false
	}
	return v, t.GetDims(), true
}

// broadcastConst expands a constant broadcast against ids of type t
// (numpy rules) to one value per id of a sample, or one value for all.
func broadcastConst(vals, cdims []int64, t TensorType) ([]int64, error) {
	if int64(len(vals)) != numElements(cdims) {
		return nil, fmt.Errorf("the constant of shape %v holds %d values", cdims, len(vals))
	}
	if len(vals) == 1 {
		return vals, nil
	}
	if len(cdims) > len(t.Dims) {
		return nil, fmt.Errorf("the constant %v has more axes than the ids %s", cdims, dimsString(t))
	}
	off := len(t.Dims) - len(cdims)
	for k, d := range cdims {
		td := t.Dims[off+k]
		if off+k == 0 && d != 1 {
			return nil, fmt.Errorf("the constant %v varies along the batch axis of the ids %s", cdims, dimsString(t))
		}
		if d != 1 && d != td {
			return nil, fmt.Errorf("the constant of shape %v does not broadcast to the ids %s (%d values where %d ids are)", cdims, dimsString(t), d, td)
		}
	}
	sample := t.SampleShape()
	n := int64(1)
	for _, d := range sample {
		n *= d
	}
	out := make([]int64, n)
	// Strides of the constant, aligned to the sample's axes.
	cs := make([]int64, len(sample))
	stride := int64(1)
	for k := len(cdims) - 1; k >= 0; k-- {
		ax := off + k - 1 // sample axis (batch dropped)
		if ax >= 0 && cdims[k] != 1 {
			cs[ax] = stride
		}
		stride *= cdims[k]
	}
	for j := range n {
		rem, ci := j, int64(0)
		for ax := len(sample) - 1; ax >= 0; ax-- {
			ci += (rem % sample[ax]) * cs[ax]
			rem /= sample[ax]
		}
		out[j] = vals[ci]
	}
	return out, nil
}

// numElements is the number of values of dims (1 for a scalar), -1 for
// dims that are negative or overflow.
func numElements(dims []int64) int64 {
	n := int64(1)
	for _, d := range dims {
		if d < 0 || (d != 0 && n > math.MaxInt64/d) {
			return -1
		}
		n *= d
	}
	return n
}

// sliceRange reads a Slice on axis 1 with step 1 and constant bounds
// (inputs from opset 10, attributes before), clamped to the axis.
func sliceRange(g *Graph, n *pb.NodeProto, in TensorType) (int64, int64, bool) {
	var starts, ends, axes, steps []int64
	ok := true
	if len(n.GetInput()) >= 3 {
		var ok1, ok2 bool
		starts, _, ok1 = g.constTensor(n.GetInput()[1])
		ends, _, ok2 = g.constTensor(n.GetInput()[2])
		ok = ok1 && ok2
		if len(n.GetInput()) > 3 && n.GetInput()[3] != "" {
			axes, _, ok1 = g.constTensor(n.GetInput()[3])
			ok = ok && ok1
		}
		if len(n.GetInput()) > 4 && n.GetInput()[4] != "" {
			steps, _, ok1 = g.constTensor(n.GetInput()[4])
			ok = ok && ok1
		}
	} else {
		starts, _ = attrInts(n, "starts")
		ends, _ = attrInts(n, "ends")
		axes, _ = attrInts(n, "axes")
	}
	if !ok || len(starts) != 1 || len(ends) != 1 || len(in.Dims) < 2 {
		return 0, 0, false
	}
	if len(axes) == 0 {
		axes = []int64{0}
	}
	if len(axes) != 1 || (axes[0] != 1 && axes[0] != 1-int64(len(in.Dims))) || (len(steps) > 0 && (len(steps) != 1 || steps[0] != 1)) {
		return 0, 0, false
	}
	size := in.Dims[1]
	clamp := func(v int64) int64 {
		if v < 0 {
			v += size
		}
		return min(max(v, 0), size)
	}
	s, e := clamp(starts[0]), clamp(min(ends[0], math.MaxInt64))
	if e <= s {
		return 0, 0, false
	}
	return s, e, true
}

// splitRange reads which columns output out of a Split on axis 1 holds:
// sizes from the split input (opset 13), the split attribute (before),
// or equal parts.
func splitRange(g *Graph, n *pb.NodeProto, in TensorType, out string) (int64, int64, bool) {
	axis := attrInt(n, "axis", 0)
	if axis < 0 {
		axis += int64(len(in.Dims))
	}
	if axis != 1 || len(in.Dims) < 2 || in.Dims[1] <= 0 {
		return 0, 0, false
	}
	k := -1
	for j, o := range n.GetOutput() {
		if o == out {
			k = j
		}
	}
	parts := len(n.GetOutput())
	var sizes []int64
	if len(n.GetInput()) > 1 && n.GetInput()[1] != "" {
		v, _, ok := g.constTensor(n.GetInput()[1])
		if !ok {
			return 0, 0, false
		}
		sizes = v
	} else if v, ok := attrInts(n, "split"); ok {
		sizes = v
	} else {
		size := in.Dims[1]
		each := (size + int64(parts) - 1) / int64(parts)
		for range parts {
			sizes = append(sizes, min(each, size))
			size -= min(each, size)
		}
	}
	if k < 0 || len(sizes) != parts {
		return 0, 0, false
	}
	var start int64
	for j := range k {
		start += sizes[j]
	}
	return start, start + sizes[k], sizes[k] > 0
}
