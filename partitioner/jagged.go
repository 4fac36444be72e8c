package partitioner

import (
	"fmt"
	"slices"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// A jagged lookup is nn.EmbeddingBag called with 1-D indices and
// offsets, as the TorchScript exporter writes it
// (torch/onnx/symbolic_helper.py _embedding_bag_helper, opset 11 on):
//
//	full   = Concat(offsets, Unsqueeze(Gather(Shape(indices), 0)))   (include_last_offset=False; else offsets itself)
//	starts = Slice(full, [0], [max], [0], [1]);  ends = Slice(full, [1], [max], [0], [1])
//	bags   = Loop(Gather(Shape(ends), 0), true) with body (iter, cond):
//	    s, e = Unsqueeze(Gather(starts, iter)), Unsqueeze(Gather(ends, iter))
//	    rows = Gather(table, Slice(indices, s, e, [0]))
//	    rows = Mul(rows, Unsqueeze(Slice(per_sample_weights, s, e, [0]), [1]))   (optional)
//	    out  = ReduceSum|ReduceMean|ReduceMax(rows, axes [0], keepdims 0)
//
// Called with 2-D ids x [batch, bag] and no offsets (torch.nn.functional
// .embedding_bag then makes indices = Reshape(x, [-1]) and offsets =
// Range(0, numel(x), size(x, 1))), the Loop is a lookup of bag columns
// of x, pooled, with no offsets (flatInput, fixedOffsets).
//
// The Loop's scan output [bags, dim] is the lookup's output; the Loop
// and the integer work on offsets and indices that only feeds it leave
// the graph, and the embedding tier pools each sample's bag (plan.json
// lookup offsets, inputs' offsets).

// jaggedOps are the ops the integer work on offsets and indices around
// the Loop may use.
var jaggedOps = map[string]bool{
	"Shape": true, "Size": true, "Gather": true, "Unsqueeze": true, "Squeeze": true,
	"Reshape": true, "Concat": true, "Slice": true, "Cast": true, "Identity": true,
	"Sub": true, "Add": true, "Constant": true, "Range": true, "ReduceProd": true,
}

// jaggedLoop recognises the Loop at node index li as a jagged lookup.
// It returns nil and why when the Loop reads a table but is not an
// EmbeddingBag it can take ("" when the Loop reads no table).
func jaggedLoop(g *Graph, types map[string]TensorType, li int) (*lookup, string) {
	n := g.Nodes[li]
	if n.GetOpType() != "Loop" {
		return nil, ""
	}
	var body *pb.GraphProto
	for _, a := range n.GetAttribute() {
		if a.GetName() == "body" {
			body = a.GetG()
		}
	}
	if body == nil {
		return nil, ""
	}
	local, producer := bodyIndex(body)
	// The table: an outer table read by a Gather of the body.
	var gather *pb.NodeProto
	var src *tableSource
	for _, bn := range body.GetNode() {
		if bn.GetOpType() == "Gather" && len(bn.GetInput()) == 2 && !local[bn.GetInput()[0]] {
			if s := resolveTable(g, bn.GetInput()[0]); s != nil {
				if gather != nil {
					return nil, fmt.Sprintf("the body of Loop %q reads more than one table", n.GetName())
				}
				gather, src = bn, s
			}
		}
	}
	if gather == nil {
		return nil, ""
	}
	notBag := func(why string) (*lookup, string) {
		return nil, fmt.Sprintf("the table is read inside the body of Loop %q, which is not an EmbeddingBag with offsets: %s", n.GetName(), why)
	}
	ints := func(name string) ([]int64, bool) {
		if p := producer[name]; p != nil {
			if p.GetOpType() != "Constant" {
				return nil, false
			}
			for _, a := range p.GetAttribute() {
				switch a.GetName() {
				case "value":
					v, err := pb.Int64s(a.GetT())
					return v, err == nil
				case "value_ints":
					return a.GetInts(), true
				}
			}
			return nil, false
		}
		for _, t := range body.GetInitializer() {
			if t.GetName() == name {
				v, err := pb.Int64s(t)
				return v, err == nil
			}
		}
		return g.constInts(name)
	}
	axesOf := func(bn *pb.NodeProto) []int64 {
		if len(bn.GetInput()) > 1 && bn.GetInput()[1] != "" {
			v, _ := ints(bn.GetInput()[1])
			return v
		}
		v, _ := attrInts(bn, "axes")
		return v
	}
	if len(n.GetInput()) != 2 || len(n.GetOutput()) != 1 || len(body.GetInput()) != 2 || len(body.GetOutput()) != 2 {
		return notBag("it carries loop state (an EmbeddingBag loop has a trip count, a condition and one scan output)")
	}
	iter := body.GetInput()[0].GetName()
	// The pooling: the scan output reduces the gathered rows over axis 0.
	red := producer[body.GetOutput()[1].GetName()]
	var pool plan.Pooling
	if red != nil {
		switch red.GetOpType() {
		case "ReduceSum":
			pool = plan.PoolSum
		case "ReduceMean":
			pool = plan.PoolMean
		case "ReduceMax":
			pool = plan.PoolMax
		}
	}
	if pool == "" {
		return notBag("its scan output is not a ReduceSum, ReduceMean or ReduceMax of the gathered rows")
	}
	if ax := axesOf(red); len(ax) != 1 || ax[0] != 0 || attrInt(red, "keepdims", 1) != 0 {
		return notBag(fmt.Sprintf("%s %q reduces axes %v (keepdims %d), not the bag's rows (axes [0], keepdims 0)", red.GetOpType(), red.GetName(), ax, attrInt(red, "keepdims", 1)))
	}
	// Optional per-sample weights: Mul(rows, Unsqueeze(Slice(w, s, e), [1])).
	pooled := red.GetInput()[0]
	var weightsSlice *pb.NodeProto
	if m := producer[pooled]; m != nil && m.GetOpType() == "Mul" && len(m.GetInput()) == 2 {
		other := m.GetInput()[1]
		if m.GetInput()[1] == gather.GetOutput()[0] {
			other = m.GetInput()[0]
		} else if m.GetInput()[0] != gather.GetOutput()[0] {
			return notBag(fmt.Sprintf("Mul %q does not scale the gathered rows", m.GetName()))
		}
		u := producer[other]
		if u == nil || u.GetOpType() != "Unsqueeze" || !slices.Equal(axesOf(u), []int64{1}) {
			return notBag(fmt.Sprintf("Mul %q scales the rows by %q, not by the bag's per-sample weights unsqueezed at axis 1", m.GetName(), other))
		}
		weightsSlice = producer[u.GetInput()[0]]
		if weightsSlice == nil || weightsSlice.GetOpType() != "Slice" {
			return notBag(fmt.Sprintf("the weights of Mul %q are not a slice of a weights input", m.GetName()))
		}
		pooled = gather.GetOutput()[0]
	}
	if pooled != gather.GetOutput()[0] {
		return notBag(fmt.Sprintf("%s %q does not pool the rows Gather %q reads from the table", red.GetOpType(), red.GetName(), gather.GetName()))
	}
	if attrInt(gather, "axis", 0) != 0 {
		return notBag(fmt.Sprintf("Gather %q reads the table along axis %d", gather.GetName(), attrInt(gather, "axis", 0)))
	}
	// The bag's ids: Slice(indices, s, e, [0]) with s, e the iteration's
	// start and end, read from two outer slices of the same offsets.
	bagSlice := func(sl *pb.NodeProto, what string) (input, starts, ends string, why string) {
		if sl == nil || sl.GetOpType() != "Slice" || len(sl.GetInput()) < 3 {
			return "", "", "", fmt.Sprintf("the %s are not sliced per bag", what)
		}
		if _, _, flat := flatInput(g, types, sl.GetInput()[0]); local[sl.GetInput()[0]] || !g.IsInput(sl.GetInput()[0]) && !flat {
			return "", "", "", fmt.Sprintf("the %s %q are not a model input (nor one [batch, bag] model input reshaped to [-1])", what, sl.GetInput()[0])
		}
		if len(sl.GetInput()) > 3 && sl.GetInput()[3] != "" {
			if ax, ok := ints(sl.GetInput()[3]); !ok || !slices.Equal(ax, []int64{0}) {
				return "", "", "", fmt.Sprintf("Slice %q of the %s cuts axes %v, not [0]", sl.GetName(), what, ax)
			}
		}
		if len(sl.GetInput()) > 4 && sl.GetInput()[4] != "" {
			if st, ok := ints(sl.GetInput()[4]); !ok || !slices.Equal(st, []int64{1}) {
				return "", "", "", fmt.Sprintf("Slice %q of the %s steps by %v", sl.GetName(), what, st)
			}
		}
		bound := func(name string) string {
			p := producer[name]
			if p != nil && (p.GetOpType() == "Unsqueeze" || p.GetOpType() == "Reshape") {
				p = producer[p.GetInput()[0]]
			}
			if p == nil || p.GetOpType() != "Gather" || p.GetInput()[1] != iter || local[p.GetInput()[0]] || attrInt(p, "axis", 0) != 0 {
				return ""
			}
			return p.GetInput()[0]
		}
		starts, ends = bound(sl.GetInput()[1]), bound(sl.GetInput()[2])
		if starts == "" || ends == "" {
			return "", "", "", fmt.Sprintf("Slice %q of the %s does not run from the iteration's start to its end offset", sl.GetName(), what)
		}
		return sl.GetInput()[0], starts, ends, ""
	}
	indices, starts, ends, why := bagSlice(producer[gather.GetInput()[1]], "ids")
	if why != "" {
		return notBag(why)
	}
	// F.embedding_bag on 2-D ids [batch, bag] (no offsets): the ids
	// reshaped to [-1], offsets arange(0, ids.numel(), ids.size(1)).
	flatIDs := indices
	fixedIDs, fixedBag, fixed := flatInput(g, types, indices)
	var weights string
	if weightsSlice != nil {
		w, ws, we, why := bagSlice(weightsSlice, "per-sample weights")
		if why != "" {
			return notBag(why)
		}
		if ws != starts || we != ends {
			return notBag("the per-sample weights are sliced by other offsets than the ids")
		}
		if fw, wbag, ok := flatInput(g, types, w); ok != fixed || ok && wbag != fixedBag {
			return notBag(fmt.Sprintf("the per-sample weights %q and the ids %q are not both model inputs, or both [batch, bag] inputs of one bag reshaped to [-1]", w, indices))
		} else if ok {
			w = fw
		}
		if t := types[w]; t.Elem != pb.TensorProto_FLOAT {
			return notBag(fmt.Sprintf("the per-sample weights %q are not float32", w))
		}
		if pool != plan.PoolSum {
			return notBag(fmt.Sprintf("per-sample weights with %s pooling (EmbeddingBag takes them with mode \"sum\" only)", pool))
		}
		weights = w
	}
	if fixed {
		indices = fixedIDs
	}
	if t := types[indices]; t.Elem != pb.TensorProto_INT64 && t.Elem != pb.TensorProto_INT32 {
		return notBag(fmt.Sprintf("the ids %q are %s values", indices, elemName(t.Elem)))
	}
	// starts = Slice(full, 0, max), ends = Slice(full, 1, max), full the
	// offsets or Concat(offsets, len(indices)).
	outerSlice := func(name string, from int64) (string, bool) {
		i, ok := g.Producer[name]
		if !ok || g.Nodes[i].GetOpType() != "Slice" || len(g.Nodes[i].GetInput()) < 3 {
			return "", false
		}
		sl := g.Nodes[i]
		s, ok1 := g.constInts(sl.GetInput()[1])
		e, ok2 := g.constInts(sl.GetInput()[2])
		if !ok1 || !ok2 || len(s) != 1 || s[0] != from || len(e) != 1 || e[0] < 1<<31 {
			return "", false
		}
		if len(sl.GetInput()) > 3 && sl.GetInput()[3] != "" {
			if ax, ok := g.constInts(sl.GetInput()[3]); !ok || !slices.Equal(ax, []int64{0}) {
				return "", false
			}
		}
		if len(sl.GetInput()) > 4 && sl.GetInput()[4] != "" {
			if st, ok := g.constInts(sl.GetInput()[4]); !ok || !slices.Equal(st, []int64{1}) {
				return "", false
			}
		}
		return sl.GetInput()[0], true
	}
	fullS, ok1 := outerSlice(starts, 0)
	fullE, ok2 := outerSlice(ends, 1)
	if !ok1 || !ok2 || fullS != fullE {
		return notBag(fmt.Sprintf("the bags' bounds %q and %q are not offsets[0:] and offsets[1:] of one offsets tensor", starts, ends))
	}
	offsets, last := fullS, true
	if i, ok := g.Producer[fullS]; ok {
		c := g.Nodes[i]
		if c.GetOpType() != "Concat" || len(c.GetInput()) != 2 || attrInt(c, "axis", 0) != 0 || !g.IsInput(c.GetInput()[0]) && !fixed {
			return notBag(fmt.Sprintf("the offsets %q are neither a model input nor one completed with the number of ids (Concat)", fullS))
		}
		if !lengthOf(g, c.GetInput()[1], flatIDs) {
			return notBag(fmt.Sprintf("Concat %q completes the offsets with %q, not the number of ids in %q", c.GetName(), c.GetInput()[1], flatIDs))
		}
		offsets, last = c.GetInput()[0], false
	} else if !g.IsInput(fullS) {
		return notBag(fmt.Sprintf("the offsets %q are not a model input", fullS))
	}
	if fixed {
		if !fixedOffsets(g, offsets, indices, fixedBag) {
			return notBag(fmt.Sprintf("the ids are %q reshaped to [-1], but the offsets %q are not arange(0, %s.numel(), %s.size(1))", indices, offsets, indices, indices))
		}
		offsets, last = "", false
	} else if t := types[offsets]; t.Elem != pb.TensorProto_INT64 && t.Elem != pb.TensorProto_INT32 {
		return notBag(fmt.Sprintf("the offsets %q are %s values", offsets, elemName(t.Elem)))
	}
	// Everything outside the body that the Loop reads (its trip count
	// and condition, the names its body reads) is integer work on the
	// ids and offsets only the Loop uses.
	roots := slices.Clone(n.GetInput())
	for _, bn := range body.GetNode() {
		for _, in := range bn.GetInput() {
			if in != "" && !local[in] && in != gather.GetInput()[0] {
				roots = append(roots, in)
			}
		}
	}
	for _, o := range body.GetOutput() {
		if !local[o.GetName()] {
			roots = append(roots, o.GetName())
		}
	}
	closure := map[int]bool{}
	var walk func(name string) string
	walk = func(name string) string {
		if g.IsInput(name) {
			if name != indices && name != offsets && name != weights {
				return fmt.Sprintf("it reads model input %q besides the ids, offsets and weights", name)
			}
			return ""
		}
		i, ok := g.Producer[name]
		if !ok || closure[i] {
			return "" // an initializer, or seen
		}
		op := g.Nodes[i]
		if !jaggedOps[op.GetOpType()] {
			return fmt.Sprintf("it reads %q, made by %s %q: not integer work on the offsets", name, op.GetOpType(), op.GetName())
		}
		if op.GetOpType() == "Gather" && resolveTable(g, op.GetInput()[0]) != nil {
			return fmt.Sprintf("it reads %q, a row of table %q", name, op.GetInput()[0])
		}
		closure[i] = true
		for _, in := range op.GetInput() {
			if in != "" {
				if why := walk(in); why != "" {
					return why
				}
			}
		}
		return ""
	}
	for _, r := range roots {
		if why := walk(r); why != "" {
			return notBag(why)
		}
	}
	l := &lookup{table: src, gather: li, nodes: []int{li}, ids: indices, bag: 1, pooling: pool, weights: weights, output: n.GetOutput()[0], offsets: offsets, lastOffset: last}
	if fixed {
		l.bag = int(fixedBag) // every sample's bag is its row of the ids
	}
	for i := range closure {
		for _, o := range g.Nodes[i].GetOutput() {
			if slices.ContainsFunc(g.Outputs, func(v *pb.ValueInfoProto) bool { return v.GetName() == o }) {
				return notBag(fmt.Sprintf("%q, which it reads, is a graph output", o))
			}
			for _, r := range g.Consumers[o] {
				if r != li && !closure[r] {
					if g.Nodes[i].GetOpType() == "Constant" {
						continue // a constant goes wherever it is read
					}
					return notBag(fmt.Sprintf("%q, which it reads, is also read by %q", o, g.Nodes[r].GetName()))
				}
			}
		}
	}
	for i := range closure {
		if g.Nodes[i].GetOpType() != "Constant" {
			l.nodes = append(l.nodes, i)
		}
	}
	slices.Sort(l.nodes[1:])
	types[l.output] = known(pb.TensorProto_FLOAT, DimBatch, int64(src.dim))
	return l, ""
}

// flatInput says whether name is Reshape(x, [-1]) of a model input x of
// shape [batch, bag] (torch.nn.functional.embedding_bag's 2-D ids and
// per-sample weights), and gives x and bag.
func flatInput(g *Graph, types map[string]TensorType, name string) (string, int64, bool) {
	i, ok := g.Producer[name]
	if !ok || g.Nodes[i].GetOpType() != "Reshape" || len(g.Nodes[i].GetInput()) != 2 {
		return "", 0, false
	}
	x := g.Nodes[i].GetInput()[0]
	shape, ok := g.constInts(g.Nodes[i].GetInput()[1])
	t := types[x]
	if !ok || !slices.Equal(shape, []int64{-1}) || !g.IsInput(x) || !sampleKnown(t) || len(t.Dims) != 2 || t.Dims[1] < 1 {
		return "", 0, false
	}
	return x, t.Dims[1], true
}

// fixedOffsets says whether offsets is Range(0, x.numel(), x.size(1))
// (the offsets torch.nn.functional.embedding_bag makes for 2-D ids x of
// bag columns): numel as Size(x), ReduceProd(Shape(x)) or x.size(0)
// times x.size(1) (Mul), size(k) as Gather(Shape(x), k), Shape(x,
// start=k, end=k+1) (torchlib's sym_size, squeezed) or, for size(1),
// the constant bag, each maybe cast.
func fixedOffsets(g *Graph, offsets, x string, bag int64) bool {
	through := func(name string) (*pb.NodeProto, bool) {
		for range 6 {
			i, ok := g.Producer[name]
			if !ok {
				return nil, false
			}
			n := g.Nodes[i]
			switch n.GetOpType() {
			case "Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape":
				name = n.GetInput()[0]
				continue
			}
			return n, true
		}
		return nil, false
	}
	constIs := func(name string, v int64) bool {
		for range 6 {
			if c, ok := g.constInts(name); ok {
				return len(c) == 1 && c[0] == v
			}
			i, ok := g.Producer[name]
			if !ok || g.Nodes[i].GetOpType() != "Cast" && g.Nodes[i].GetOpType() != "Identity" {
				return false
			}
			name = g.Nodes[i].GetInput()[0]
		}
		return false
	}
	shapeOfX := func(name string) bool {
		n, ok := through(name)
		return ok && n.GetOpType() == "Shape" && n.GetInput()[0] == x && attrInt(n, "start", 0) == 0 && len(n.GetAttribute()) == 0
	}
	// dimOf: which dimension of x name is (x.size(k)), k in [0, 2).
	dimOf := func(name string) (int64, bool) {
		n, ok := through(name)
		if !ok {
			return 0, false
		}
		var k int64
		switch n.GetOpType() {
		case "Gather":
			idx, ok := g.constInts(n.GetInput()[1])
			if !ok || len(idx) != 1 || attrInt(n, "axis", 0) != 0 || !shapeOfX(n.GetInput()[0]) {
				return 0, false
			}
			k = idx[0]
		case "Shape":
			// x is 2-D: start and end (end absent: the rank) at k, k+1.
			k = attrInt(n, "start", 0)
			if k < 0 {
				k += 2
			}
			end := attrInt(n, "end", 2)
			if end < 0 {
				end += 2
			}
			if n.GetInput()[0] != x || end != k+1 {
				return 0, false
			}
		default:
			return 0, false
		}
		if k < 0 {
			k += 2
		}
		return k, k == 0 || k == 1
	}
	isDim := func(name string, k int64) bool {
		d, ok := dimOf(name)
		return ok && d == k
	}
	r, ok := through(offsets)
	if !ok || r.GetOpType() != "Range" || len(r.GetInput()) != 3 || !constIs(r.GetInput()[0], 0) {
		return false
	}
	numel, ok := through(r.GetInput()[1])
	switch {
	case !ok:
		return false
	case numel.GetOpType() == "Size":
		ok = numel.GetInput()[0] == x
	case numel.GetOpType() == "ReduceProd":
		axes, _ := reduceAxes(g, numel)
		ok = len(axes) == 0 && shapeOfX(numel.GetInput()[0])
	case numel.GetOpType() == "Mul":
		a, b := numel.GetInput()[0], numel.GetInput()[1]
		size1 := func(name string) bool { return constIs(name, bag) || isDim(name, 1) }
		ok = isDim(a, 0) && size1(b) || isDim(b, 0) && size1(a)
	default:
		ok = false
	}
	return ok && (constIs(r.GetInput()[2], bag) || isDim(r.GetInput()[2], 1))
}

// lengthOf says whether name is the number of values of the 1-D input
// of: [len] made by Unsqueeze/Reshape of Gather(Shape(of), 0), Size(of)
// or Shape(of).
func lengthOf(g *Graph, name, of string) bool {
	for depth := 0; depth < 6; depth++ {
		i, ok := g.Producer[name]
		if !ok {
			return false
		}
		n := g.Nodes[i]
		switch n.GetOpType() {
		case "Unsqueeze", "Reshape", "Squeeze", "Cast", "Identity":
			name = n.GetInput()[0]
		case "Gather":
			if idx, ok := g.constInts(n.GetInput()[1]); !ok || len(idx) != 1 || idx[0] != 0 {
				return false
			}
			name = n.GetInput()[0]
		case "Shape", "Size":
			return n.GetInput()[0] == of && attrInt(n, "start", 0) == 0
		default:
			return false
		}
	}
	return false
}

// planJagged writes the jagged lookups into p: the lookups' offsets,
// the jagged inputs' offsets, and the offsets inputs read by the CPU
// side.
func (pl *Placement) planJagged(p *plan.Plan) {
	offsets := map[string]string{}
	for _, l := range pl.Lookups {
		if l.offsets == "" {
			continue
		}
		offsets[l.ids] = l.offsets
		if l.weights != "" {
			offsets[l.weights] = l.offsets
		}
		for ti := range p.Tables {
			for li := range p.Tables[ti].Lookups {
				if pl := &p.Tables[ti].Lookups[li]; pl.Output == l.output {
					pl.Offsets, pl.LastOffset = l.offsets, l.lastOffset
				}
			}
		}
	}
	for i := range p.Inputs {
		in := &p.Inputs[i]
		if o, ok := offsets[in.Name]; ok {
			in.Offsets = o
		}
		for _, o := range offsets {
			if o == in.Name && !slices.Contains(in.Sides, plan.CPU) {
				in.Sides = append([]plan.Side{plan.CPU}, in.Sides...)
			}
		}
	}
}

// reinferJagged types the graph again once jagged lookups typed their
// Loops' outputs ([batch, dim]: shape inference cannot see through a
// Loop), so the nodes after them get known shapes; it returns the nodes
// whose outputs stay unknown.
func reinferJagged(g *Graph, types map[string]TensorType, lookups []*lookup, unknownNodes []string) []string {
	loops := map[int]bool{}
	for _, l := range lookups {
		if l.offsets != "" || g.Nodes[l.gather].GetOpType() == "Loop" {
			for _, i := range l.nodes { // they leave the graph; the output keeps its type
				loops[i] = true
			}
		}
	}
	if len(loops) == 0 {
		return unknownNodes
	}
	var out []string
	for i, n := range g.Nodes {
		if loops[i] {
			continue
		}
		outs := inferNode(g, n, types)
		for k, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			t := unknown(pb.TensorProto_FLOAT)
			if k < len(outs) {
				t = outs[k]
			}
			types[o] = t
		}
		if len(outs) == 0 || !outs[0].Known {
			out = append(out, n.GetName()+" ("+n.GetOpType()+")")
		}
	}
	return out
}
