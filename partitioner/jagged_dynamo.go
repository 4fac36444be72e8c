package partitioner

import (
	"fmt"
	"maps"
	"slices"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// The dynamo exporter (torch.onnx.export(..., dynamo=True); torchlib's
// aten_embedding_bag, _aten_embedding_bag_onnx) decomposes
// nn.EmbeddingBag with offsets another way: the rows of every id are
// gathered at once outside the loop, scaled by the per-sample weights
// (ones without them) and cast to float,
//
//	rows = Cast(Mul(Gather(table, Reshape(indices, [-1])), Unsqueeze(weights, [1])))
//	offsets = Concat(offsets, Shape(indices))        (include_last_offset=False)
//
// and a Loop carrying an index and a sequence slices each bag's rows
// out of them by offsets[i]:offsets[i+1], pools them (ReduceSum,
// ReduceMean or ReduceMax over axis 0; an If gives zeros to an empty
// bag, and mean and max treat the last bag apart), appends the result
// (SequenceInsert) and ConcatFromSequence joins the bags. The loop is
// recognised by those ingredients: the sequence it carries feeds a
// ConcatFromSequence on axis 0, its body (Ifs included) slices rows
// gathered from one table by one ids input, pools them and inserts
// them, and everything else it reads is integer work on the ids and one
// offsets input.
//
// nn.EmbeddingBag called with 2-D ids x [batch, bag] and no offsets
// (fixed-size bags) reaches the same decomposition through
// torch.nn.functional.embedding_bag, which makes the indices
// x.reshape(-1) (Reshape(x, [-1])) and the offsets
// torch.arange(0, x.numel(), x.size(1)) (a Range of x.numel() as
// Size(x), ReduceProd(Shape(x)) or x.size(0) * bag, torchlib's
// sym_size Squeeze(Shape(x, start=0, end=1)) times the constant bag),
// include_last_offset False. That loop is an ordinary lookup of bag
// columns of x, pooled, with no offsets (jagged.go's flatInput,
// fixedOffsets), once the bags it slices are checked to be that Range
// completed with the number of ids: anything else that reads a 2-D ids
// input is refused, saying why.

// dynamoOps are the ops of the integer work around a dynamo bag loop:
// the TorchScript form's (jaggedOps) and the comparisons, sequence and
// scatter ops of torchlib's decomposition.
var dynamoOps = func() map[string]bool {
	m := maps.Clone(jaggedOps)
	for _, op := range []string{"Equal", "Less", "Greater", "SequenceEmpty", "ScatterElements", "Expand", "CastLike"} {
		m[op] = true
	}
	return m
}()

// dynamoBags recognises the dynamo exporter's EmbeddingBag loops of g:
// the lookups, and per Gather of the rows of a loop that is not one,
// why (node index of the Gather -> reason).
func dynamoBags(g *Graph, types map[string]TensorType) (out []*lookup, refused map[int]string) {
	refused = map[int]string{}
	for ci, n := range g.Nodes {
		if n.GetOpType() != "ConcatFromSequence" || len(n.GetInput()) != 1 {
			continue
		}
		l, gi, why := dynamoBag(g, types, ci)
		if l != nil {
			out = append(out, l)
		} else if why != "" {
			refused[gi] = why
		}
	}
	return out, refused
}

// subgraphNodes lists the nodes of body and of every subgraph in it
// (If branches, nested loops), and every name defined in them.
func subgraphNodes(body *pb.GraphProto, nodes *[]*pb.NodeProto, local map[string]bool) {
	for _, in := range body.GetInput() {
		local[in.GetName()] = true
	}
	for _, t := range body.GetInitializer() {
		local[t.GetName()] = true
	}
	for _, bn := range body.GetNode() {
		*nodes = append(*nodes, bn)
		for _, o := range bn.GetOutput() {
			local[o] = true
		}
		for _, a := range bn.GetAttribute() {
			for _, sg := range attrBodies(a) {
				subgraphNodes(sg, nodes, local)
			}
		}
	}
}

// dynamoBag recognises the ConcatFromSequence at ci as the end of a
// dynamo EmbeddingBag loop; nil and "" when it reads no loop over a
// table's rows, else nil, the rows' Gather and why it is not one.
func dynamoBag(g *Graph, types map[string]TensorType, ci int) (*lookup, int, string) {
	cat := g.Nodes[ci]
	li, ok := g.Producer[cat.GetInput()[0]]
	if !ok || g.Nodes[li].GetOpType() != "Loop" {
		return nil, 0, ""
	}
	loop := g.Nodes[li]
	var body *pb.GraphProto
	for _, a := range loop.GetAttribute() {
		if a.GetName() == "body" {
			body = a.GetG()
		}
	}
	if body == nil {
		return nil, 0, ""
	}
	var nodes []*pb.NodeProto
	local := map[string]bool{}
	subgraphNodes(body, &nodes, local)
	// The rows: an outer tensor the body slices, made by a Gather on a
	// table (through the weights' Mul and a Cast).
	var rows, flat string
	var gi int
	var src *tableSource
	for _, bn := range nodes {
		if bn.GetOpType() != "Slice" || local[bn.GetInput()[0]] {
			continue
		}
		if i, s := rowsGather(g, bn.GetInput()[0]); s != nil {
			rows, gi, src = bn.GetInput()[0], i, s
			break
		}
	}
	if src == nil {
		return nil, 0, ""
	}
	notBag := func(why string) (*lookup, int, string) {
		return nil, gi, fmt.Sprintf("the table is read by Loop %q, which is not an EmbeddingBag with offsets as the dynamo exporter writes it: %s", loop.GetName(), why)
	}
	if attrInt(cat, "axis", 0) != 0 || attrInt(cat, "new_axis", 0) != 0 {
		return notBag(fmt.Sprintf("ConcatFromSequence %q joins the bags along axis %d (new_axis %d), not 0", cat.GetName(), attrInt(cat, "axis", 0), attrInt(cat, "new_axis", 0)))
	}
	// The sequence is carried: Loop input 2+k is its initial value
	// (SequenceEmpty), output k its final one.
	k := slices.Index(loop.GetOutput(), cat.GetInput()[0])
	if k < 0 || 2+k >= len(loop.GetInput()) {
		return notBag("the joined sequence is not a value the loop carries")
	}
	if p, ok := g.Producer[loop.GetInput()[2+k]]; !ok || g.Nodes[p].GetOpType() != "SequenceEmpty" {
		return notBag("the sequence the loop carries does not start empty")
	}
	for j, o := range loop.GetOutput() {
		if j != k && o != "" && len(g.Consumers[o]) > 0 {
			return notBag(fmt.Sprintf("its output %q is read besides the bags", o))
		}
	}
	var pool plan.Pooling
	inserts := false
	for _, bn := range nodes {
		switch bn.GetOpType() {
		case "ReduceMax":
			pool = plan.PoolMax
		case "ReduceMean":
			if pool != plan.PoolMax {
				pool = plan.PoolMean
			}
		case "ReduceSum":
			if pool == "" {
				pool = plan.PoolSum
			}
		case "SequenceInsert":
			inserts = true
		case "Loop", "Scan":
			return notBag("its body loops again")
		}
	}
	if pool == "" || !inserts {
		return notBag("its body does not pool the rows of a bag (ReduceSum, ReduceMean or ReduceMax) into the sequence (SequenceInsert)")
	}
	// The rows' chain: Gather(table, Reshape(indices) or indices), Mul by
	// Unsqueeze(weights or ones, [1]), Cast/CastLike.
	l := &lookup{table: src, gather: li, nodes: []int{li, ci}, bag: 1, pooling: pool, output: cat.GetOutput()[0]}
	absorbed := map[int]bool{li: true, ci: true}
	ids := g.Nodes[gi].GetInput()[1]
	flatIDs := []string{ids} // the 1-D ids on the way: their length ends the last bag
	for {
		if g.IsInput(ids) {
			break
		}
		p, ok := g.Producer[ids]
		if !ok || (g.Nodes[p].GetOpType() != "Reshape" && g.Nodes[p].GetOpType() != "Flatten") {
			return notBag(fmt.Sprintf("the rows are gathered by ids %q, not a model input", ids))
		}
		absorbed[p] = true
		if g.IsInput(g.Nodes[p].GetInput()[0]) {
			flat = ids // the last step: the model input reshaped
		} else {
			flatIDs = append(flatIDs, g.Nodes[p].GetInput()[0])
		}
		ids = g.Nodes[p].GetInput()[0]
	}
	if t := types[ids]; t.Elem != pb.TensorProto_INT64 && t.Elem != pb.TensorProto_INT32 {
		return notBag(fmt.Sprintf("the ids %q are %s values", ids, elemName(t.Elem)))
	}
	// 2-D ids [batch, bag]: F.embedding_bag's Reshape(x, [-1]).
	_, fixedBag, fixed := flatInput(g, types, flat)
	if t := types[ids]; len(t.Dims) > 1 && !fixed {
		return notBag(fmt.Sprintf("the ids %q have shape %s, and are not one [batch, bag] model input reshaped to [-1]", ids, dimsString(t)))
	}
	l.ids = ids
	absorbed[gi] = true
	for cur := rows; ; {
		p, ok := g.Producer[cur]
		if !ok || p == gi {
			break
		}
		n := g.Nodes[p]
		absorbed[p] = true
		switch n.GetOpType() {
		case "Cast", "CastLike", "Identity":
			cur = n.GetInput()[0]
		case "Mul":
			a, b := n.GetInput()[0], n.GetInput()[1]
			if fromGather(g, b, gi) {
				a, b = b, a
			}
			w, why := weightsOf(g, types, b, ids, absorbed)
			if why != "" {
				return notBag(why)
			}
			l.weights = w
			cur = a
		default:
			return notBag(fmt.Sprintf("the gathered rows go through %s %q", n.GetOpType(), n.GetName()))
		}
	}
	if l.weights != "" && pool != plan.PoolSum {
		return notBag(fmt.Sprintf("per-sample weights with %s pooling (EmbeddingBag takes them with mode \"sum\" only)", pool))
	}
	if w := types[l.weights]; l.weights != "" && ((len(w.Dims) > 1) != fixed || fixed && (len(w.Dims) != 2 || w.Dims[1] != fixedBag)) {
		return notBag(fmt.Sprintf("the per-sample weights %q and the ids %q are not both model inputs, or both [batch, bag] inputs of one bag reshaped to [-1]", l.weights, l.ids))
	}
	// Everything else the loop reads: integer work on the ids and one
	// offsets input.
	roots := slices.Clone(loop.GetInput())
	for _, bn := range nodes {
		for _, in := range bn.GetInput() {
			if in != "" && !local[in] && in != rows {
				roots = append(roots, in)
			}
		}
	}
	closure := map[int]bool{}
	var offsets string
	var walk func(name string) string
	walk = func(name string) string {
		if g.IsInput(name) {
			switch {
			case name == ids || name == l.weights:
			case offsets == "" || offsets == name:
				if t := types[name]; t.Elem != pb.TensorProto_INT64 && t.Elem != pb.TensorProto_INT32 {
					return fmt.Sprintf("it reads model input %q, %s values, besides the ids and their offsets", name, elemName(t.Elem))
				}
				offsets = name
			default:
				return fmt.Sprintf("it reads model inputs %q and %q besides the ids: one of them must be the offsets", offsets, name)
			}
			return ""
		}
		i, ok := g.Producer[name]
		if !ok || closure[i] || absorbed[i] {
			return ""
		}
		op := g.Nodes[i]
		// x.numel() of 2-D ids x may be x.size(0) * bag: a Mul, which
		// fixedOffsets checks.
		if !dynamoOps[op.GetOpType()] && !(fixed && op.GetOpType() == "Mul") {
			return fmt.Sprintf("it reads %q, made by %s %q: not integer work on the offsets", name, op.GetOpType(), op.GetName())
		}
		if op.GetOpType() == "Gather" && resolveTable(g, op.GetInput()[0]) != nil {
			return fmt.Sprintf("it reads %q, rows of table %q", name, op.GetInput()[0])
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
	switch {
	case fixed && offsets != "":
		return notBag(fmt.Sprintf("it reads model input %q besides the [batch, %d] ids %q, which take no offsets", offsets, fixedBag, l.ids))
	case fixed:
		if why := fixedBags(g, nodes, local, rows, l.ids, fixedBag, flatIDs); why != "" {
			return notBag(why)
		}
		l.bag = int(fixedBag) // every sample's bag is its row of the ids
	case offsets == "":
		return notBag("it reads no offsets input")
	default:
		l.offsets, l.lastOffset = offsets, true
		for i := range closure {
			if n := g.Nodes[i]; n.GetOpType() == "Concat" && n.GetInput()[0] == offsets {
				l.lastOffset = false // offsets completed with the number of ids
			}
		}
	}
	// A CastLike of the bags back to the table's type is part of it.
	if cs := g.Consumers[l.output]; len(cs) == 1 && g.Nodes[cs[0]].GetOpType() == "CastLike" && g.Nodes[cs[0]].GetInput()[0] == l.output {
		absorbed[cs[0]] = true
		l.output = g.Nodes[cs[0]].GetOutput()[0]
	}
	for i := range closure {
		absorbed[i] = true
	}
	for i := range absorbed {
		n := g.Nodes[i]
		for _, o := range n.GetOutput() {
			if o == "" || o == l.output {
				continue
			}
			if slices.ContainsFunc(g.Outputs, func(v *pb.ValueInfoProto) bool { return v.GetName() == o }) {
				return notBag(fmt.Sprintf("%q, which it reads, is a graph output", o))
			}
			for _, r := range g.Consumers[o] {
				if !absorbed[r] && n.GetOpType() != "Constant" {
					return notBag(fmt.Sprintf("%q, which it reads, is also read by %q", o, g.Nodes[r].GetName()))
				}
			}
		}
		if i != li && n.GetOpType() != "Constant" {
			l.nodes = append(l.nodes, i)
		}
	}
	slices.Sort(l.nodes[1:])
	types[l.output] = known(pb.TensorProto_FLOAT, DimBatch, int64(src.dim))
	return l, gi, ""
}

// fixedBags checks the bags a dynamo loop over 2-D ids x [batch, bag]
// slices (the outer tensor its body slices besides the rows) are
// Concat(arange(0, x.numel(), x.size(1)), the number of ids): one bag
// per row of x, the last one ending with the ids; else it says why.
func fixedBags(g *Graph, nodes []*pb.NodeProto, local map[string]bool, rows, x string, bag int64, flatIDs []string) string {
	var sliced []string
	for _, bn := range nodes {
		if in := bn.GetInput(); bn.GetOpType() == "Slice" && len(in) > 0 && !local[in[0]] && in[0] != rows && !slices.Contains(sliced, in[0]) {
			sliced = append(sliced, in[0])
		}
	}
	if len(sliced) != 1 {
		return fmt.Sprintf("the ids are %q reshaped to [-1], but its body slices bounds out of %q, not out of one offsets tensor", x, sliced)
	}
	full := sliced[0]
	c, ok := g.Producer[full]
	if !ok || g.Nodes[c].GetOpType() != "Concat" || len(g.Nodes[c].GetInput()) != 2 || attrInt(g.Nodes[c], "axis", 0) != 0 ||
		!slices.ContainsFunc(flatIDs, func(ids string) bool { return lengthOf(g, g.Nodes[c].GetInput()[1], ids) }) {
		return fmt.Sprintf("the ids are %q reshaped to [-1], but the bags' bounds %q are not offsets completed with the number of ids (Concat)", x, full)
	}
	if offsets := g.Nodes[c].GetInput()[0]; !fixedOffsets(g, offsets, x, bag) {
		return fmt.Sprintf("the ids are %q reshaped to [-1], but the offsets %q are not arange(0, %s.numel(), %s.size(1))", x, offsets, x, x)
	}
	return ""
}

// rowsGather follows Cast/CastLike/Identity and a Mul back from name to
// a Gather on a table: its node index and the table.
func rowsGather(g *Graph, name string) (int, *tableSource) {
	for depth := 0; depth < 6; depth++ {
		i, ok := g.Producer[name]
		if !ok {
			return 0, nil
		}
		n := g.Nodes[i]
		switch n.GetOpType() {
		case "Cast", "CastLike", "Identity":
			name = n.GetInput()[0]
		case "Mul":
			if j, s := rowsGather(g, n.GetInput()[0]); s != nil {
				return j, s
			}
			name = n.GetInput()[1]
		case "Gather":
			if attrInt(n, "axis", 0) != 0 {
				return 0, nil
			}
			s := resolveTable(g, n.GetInput()[0])
			return i, s
		default:
			return 0, nil
		}
	}
	return 0, nil
}

// fromGather says whether name is the Gather gi's output (through
// Cast/Identity).
func fromGather(g *Graph, name string, gi int) bool {
	for depth := 0; depth < 4; depth++ {
		i, ok := g.Producer[name]
		if !ok {
			return false
		}
		if i == gi {
			return true
		}
		if op := g.Nodes[i].GetOpType(); op != "Cast" && op != "Identity" {
			return false
		}
		name = g.Nodes[i].GetInput()[0]
	}
	return false
}

// weightsOf reads the Mul's other side: Unsqueeze(weights, [1]) of a
// float model input (the per-sample weights: returned), or of ones made
// from the ids' shape (Expand, CastLike: no weights).
func weightsOf(g *Graph, types map[string]TensorType, name, ids string, absorbed map[int]bool) (string, string) {
	i, ok := g.Producer[name]
	if !ok || g.Nodes[i].GetOpType() != "Unsqueeze" {
		return "", fmt.Sprintf("the rows are scaled by %q, not by per-sample weights unsqueezed at axis 1", name)
	}
	if ax, ok := opAxes(g, g.Nodes[i]); !ok || !slices.Equal(ax, []int64{1}) {
		return "", fmt.Sprintf("the per-sample weights are unsqueezed at axes %v, not [1]", ax)
	}
	absorbed[i] = true
	w := g.Nodes[i].GetInput()[0]
	if x, _, ok := flatInput(g, types, w); ok {
		// 2-D weights [batch, bag] reshaped to [-1] as the ids are: the
		// caller checks they match.
		absorbed[g.Producer[w]] = true
		w = x
	}
	if g.IsInput(w) {
		if t := types[w]; t.Elem != pb.TensorProto_FLOAT {
			return "", fmt.Sprintf("the per-sample weights %q are not float32", w)
		}
		return w, ""
	}
	// Ones: Expand(1, Shape(ids...)) through CastLike; the walk over the
	// loop's inputs checks it reads nothing else.
	var ones func(name string, depth int) bool
	ones = func(name string, depth int) bool {
		if depth > 6 {
			return false
		}
		j, ok := g.Producer[name]
		if !ok {
			return g.Inits[name] != nil
		}
		n := g.Nodes[j]
		switch n.GetOpType() {
		case "Constant":
			return true
		case "CastLike", "Cast", "Identity", "Expand", "Shape", "Reshape", "Size", "Concat", "Unsqueeze":
			absorbed[j] = true
			for _, in := range n.GetInput() {
				if in == "" || in == ids {
					continue
				}
				if n.GetOpType() == "CastLike" && in == n.GetInput()[1] {
					continue // the type's tensor: the table
				}
				if !ones(in, depth+1) {
					return false
				}
			}
			return true
		}
		return false
	}
	if !ones(w, 0) {
		return "", fmt.Sprintf("the rows are scaled by %q, neither a weights input nor ones", w)
	}
	return "", ""
}
