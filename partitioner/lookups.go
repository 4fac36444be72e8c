package partitioner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prism-serve/prism/plan"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// lookup is one recognised embedding lookup: a Gather on a table, with
// its pooling, that leaves the graph for the embedding store.
type lookup struct {
	table  *tableSource
	gather int    // node index of the Gather
	nodes  []int  // every node index it absorbs (Gather, Mul, Unsqueeze, Reduce)
	ids    string // the graph input the ids come from
	// pre are the pre-lookup ops making the ids from ids, preNodes the
	// graph nodes they stand for.
	pre      []plan.PreOp
	preNodes []int
	// preOut, when set, is the pre.onnx output holding the ids, made
	// from the graph inputs preInputs (ids the first) by preNodes.
	preOut    string
	preInputs []string
	rank1     bool
	bag       int
	pooling   plan.Pooling
	weights   string
	output    string
	// offsets, when set, makes the lookup jagged (jagged.go): ids holds
	// every bag's ids, offsets each bag's start; lastOffset: offsets
	// ends with the number of ids.
	offsets    string
	lastOffset bool
}

// tableSource is where a table's rows come from: one 2-D initializer, or
// several concatenated along the row axis, possibly behind a Cast.
type tableSource struct {
	name  string
	parts []*pb.TensorProto
	rows  int64
	dim   int
	chain []int // Identity/Cast/DequantizeLinear/Mul/Concat node indices between the parts and the Gathers
	// deq, by part name, dequantizes an 8-bit part (quant.go).
	deq map[string]*dequant
	// scale, by part name, are the factors a row mask multiplies a
	// part's rows by (rowmask.go).
	scale map[string]rowFactors
}

// TableCandidate is a Gather on a table (a 2-D float initializer or
// Constant, through Cast/Identity/Concat): a lookup when recognised,
// otherwise a table left in the graph, with the reason.
type TableCandidate struct {
	Table  string
	Rows   int64
	Dim    int
	Gather string
	// Op is the reading node's op when it is not a Gather (an ATen
	// fallback's embedding); "" for a Gather.
	Op string
	// Path runs from a graph input to the Gather's indices ("x -> Slice
	// -> Cast -> Gather"); when not recognised, as far as it was traced.
	Path string
	// Reason is why it was not taken ("" when it is a lookup).
	Reason string
}

// Bytes is the table's size in float32.
func (c TableCandidate) Bytes() int64 { return c.Rows * int64(c.Dim) * 4 }

// bagIDs names an EmbeddingBag lookup's inputs for its path: the ids
// and their offsets, or the 2-D ids alone (fixed bags).
func bagIDs(l *lookup) string {
	if l.offsets == "" {
		return l.ids
	}
	return l.ids + " + " + l.offsets
}

// findLookups recognises embedding lookups: a Gather on a table whose
// indices are a graph input, or come from one through integer work the
// embedding tier runs natively (traceIDs), with its pooling. A Gather on
// a table that is not recognised stays in the graph, is placed by the
// cut like any other node, and is listed in the candidates with why.
// pre holds the nodes of the id chains that serve only lookups: they
// leave the graph with them.
func findLookups(g *Graph, types map[string]TensorType) (out []*lookup, cands []TableCandidate, pre map[int]bool) {
	tables := map[string]*tableSource{}
	absorbed := map[int]bool{}
	candOf := map[*lookup]int{}
	dynamo, refused := dynamoBags(g, types) // jagged_dynamo.go
	claimed := map[int]bool{}
	for _, l := range dynamo {
		for _, i := range l.nodes {
			claimed[i] = true
		}
	}
	for gi, n := range g.Nodes {
		if n.GetOpType() != "Gather" || len(n.GetInput()) != 2 || claimed[gi] {
			continue
		}
		if why, ok := refused[gi]; ok {
			if src := resolveTable(g, n.GetInput()[0]); src != nil {
				cands = append(cands, TableCandidate{Table: src.name, Rows: src.rows, Dim: src.dim, Gather: n.GetName(), Reason: why})
				continue
			}
		}
		src := resolveTable(g, n.GetInput()[0])
		if src == nil {
			// A table of a type the store does not take: never a table
			// quietly left in the dense graph.
			if t, why := untakenTable(g, n.GetInput()[0]); t != nil {
				cands = append(cands, TableCandidate{Table: t.GetName(), Rows: t.GetDims()[0], Dim: int(t.GetDims()[1]), Gather: n.GetName(), Reason: why})
			} else if t, why := maskedTable(g, n.GetInput()[0]); t != nil {
				cands = append(cands, TableCandidate{Table: t.name, Rows: t.rows, Dim: t.dim, Gather: n.GetName(), Reason: why})
			}
			continue
		}
		cand := TableCandidate{Table: src.name, Rows: src.rows, Dim: src.dim, Gather: n.GetName()}
		if prev, ok := tables[tableKey(src)]; ok {
			cand.Table = prev.name
		}
		ids := n.GetInput()[1]
		// The table is 2-D: axis -2 is its rows as well.
		rowsAxis := attrInt(n, "axis", 0) == 0 || attrInt(n, "axis", 0) == -2
		chain, err := traceIDs(g, types, ids)
		if err != nil && rowsAxis {
			chain, err = preFallback(g, types, ids) // integer work for pre.onnx
		}
		switch {
		case !rowsAxis:
			cand.Reason = fmt.Sprintf("the Gather reads the table along axis %d, not its rows", attrInt(n, "axis", 0))
		case err != nil:
			cand.Reason = err.Error()
		case !isInt(chain.elem):
			cand.Reason = fmt.Sprintf("indices are %s values never cast to integers", elemName(chain.elem))
		case len(chain.shape) > 1:
			cand.Reason = fmt.Sprintf("indices have per-sample shape %v; a lookup takes one id or a bag of ids per sample", chain.shape)
		}
		if chain != nil {
			cand.Path = chainPath(g, chain, n)
		}
		if cand.Reason != "" {
			cands = append(cands, cand)
			continue
		}
		src = shareTable(tables, src)
		l := &lookup{table: src, gather: gi, nodes: []int{gi}, ids: chain.input, pre: chain.ops, preNodes: chain.nodes, rank1: len(chain.shape) == 0, bag: 1, pooling: plan.PoolNone, output: n.GetOutput()[0]}
		l.preOut, l.preInputs = chain.preOut, chain.preInputs
		if !l.rank1 {
			l.bag = int(chain.shape[0])
			matchPooling(g, types, l)
		}
		if why := mixesSamples(g, types, l.output); why != "" {
			cand.Reason = why
			cands = append(cands, cand)
			continue
		}
		candOf[l] = len(cands)
		cands = append(cands, cand)
		out = append(out, l)
		for _, i := range l.nodes {
			absorbed[i] = true
		}
	}
	for _, l := range dynamo {
		l.table = shareTable(tables, l.table)
		candOf[l] = len(cands)
		cands = append(cands, TableCandidate{Table: l.table.name, Rows: l.table.rows, Dim: l.table.dim, Gather: g.Nodes[l.gather].GetName(),
			Path: bagIDs(l) + " -> Gather -> Loop -> ConcatFromSequence (EmbeddingBag)"})
		out = append(out, l)
		for _, i := range l.nodes {
			absorbed[i] = true
		}
	}
	// A table read by an embedding op that is not ONNX (the TorchScript
	// exporter's ATen fallback) is a candidate with the reason: never a
	// table quietly left in the dense graph.
	for _, n := range g.Nodes {
		op, ok := atenEmbedding(n)
		if !ok || len(n.GetInput()) == 0 {
			continue
		}
		if src := resolveTable(g, n.GetInput()[0]); src != nil {
			cands = append(cands, TableCandidate{Table: src.name, Rows: src.rows, Dim: src.dim, Gather: n.GetName(), Op: n.GetOpType(),
				Reason: fmt.Sprintf("the table is read by %s %q (%s), the TorchScript exporter's ATen fallback (operator_export_type=ONNX_ATEN_FALLBACK), which is not an ONNX lookup and which ONNX Runtime's standard builds do not run: export with operator_export_type=ONNX (opset 11 or later writes embedding_bag as a Loop, embedding as a Gather)", n.GetOpType(), n.GetName(), op)})
		}
	}
	// Tables read inside a subgraph (a Loop's body: the exporters'
	// EmbeddingBag with offsets) are candidates with the reason, and
	// neither they nor their other Gathers leave the graph.
	inBody := map[string]string{}
	for gi, n := range g.Nodes {
		if l, why := jaggedLoop(g, types, gi); l != nil || why != "" {
			c := TableCandidate{Gather: n.GetName(), Reason: why}
			if l != nil {
				l.table = shareTable(tables, l.table)
				c.Table, c.Rows, c.Dim, c.Path = l.table.name, l.table.rows, l.table.dim, bagIDs(l)+" -> Loop (EmbeddingBag)"
				candOf[l] = len(cands)
				out = append(out, l)
				for _, i := range l.nodes {
					absorbed[i] = true
				}
			} else if bc := bodyCandidates(g, n); len(bc) > 0 {
				c.Table, c.Rows, c.Dim, c.Gather, c.Path = bc[0].Table, bc[0].Rows, bc[0].Dim, bc[0].Gather, bc[0].Path
				if _, ok := inBody[c.Table]; !ok {
					inBody[c.Table] = n.GetName()
				}
			}
			cands = append(cands, c)
			continue
		}
		for _, c := range bodyCandidates(g, n) {
			if _, ok := inBody[c.Table]; !ok {
				inBody[c.Table] = n.GetName()
			}
			cands = append(cands, c)
		}
	}
	// A table's chain (Cast, Identity, Concat) and its initializers must
	// serve only recognised lookups; otherwise the table stays in the graph
	// and so do its Gathers.
	var keep []*lookup
	for _, l := range out {
		for _, c := range l.table.chain {
			absorbed[c] = true
		}
	}
	for _, l := range out {
		other := ""
		for _, c := range l.table.chain {
			for _, o := range g.Nodes[c].GetOutput() {
				for _, r := range g.Consumers[o] {
					if !absorbed[r] && other == "" {
						other = g.Nodes[r].GetName()
					}
				}
			}
		}
		for _, p := range l.table.parts {
			for _, r := range g.Consumers[p.GetName()] {
				if !absorbed[r] && other == "" {
					other = g.Nodes[r].GetName()
				}
			}
			if slices.ContainsFunc(g.Outputs, func(o *pb.ValueInfoProto) bool { return o.GetName() == p.GetName() }) {
				other = "a graph output"
			}
		}
		if loop, ok := inBody[l.table.name]; ok && other == "" {
			cands[candOf[l]].Reason = fmt.Sprintf("the table is also read inside the body of %s %q", g.Nodes[g.nodeIndex(loop)].GetOpType(), loop)
			continue
		}
		if other != "" {
			cands[candOf[l]].Reason = fmt.Sprintf("the table is also read by %q, outside the lookups", other)
			continue
		}
		keep = append(keep, l)
	}
	// Id chain nodes leave the graph when every reader of their outputs
	// leaves it too (a lookup's Gather, or another such node); one read
	// elsewhere stays in the graph as well, and the embedding tier runs
	// its native copy.
	pre = map[int]bool{}
	gone := map[int]bool{}
	for _, l := range keep {
		for _, i := range l.nodes {
			gone[i] = true
		}
		for _, i := range l.preNodes {
			pre[i] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for i := range pre {
			for _, o := range g.Nodes[i].GetOutput() {
				isOut := slices.ContainsFunc(g.Outputs, func(v *pb.ValueInfoProto) bool { return v.GetName() == o })
				for _, r := range g.Consumers[o] {
					if !gone[r] && !pre[r] {
						isOut = true
					}
				}
				if isOut && pre[i] {
					delete(pre, i)
					changed = true
				}
			}
		}
	}
	return keep, cands, pre
}

// atenEmbedding says whether n is an embedding as an ATen op: ATen
// (domain org.pytorch.aten, or "" before PyTorch 1.13) with operator
// embedding or embedding_bag, or com.microsoft ATenOp named
// aten::embedding...; and which.
func atenEmbedding(n *pb.NodeProto) (string, bool) {
	attr := ""
	switch n.GetOpType() {
	case "ATen":
		attr = "operator"
	case "ATenOp":
		attr = "name"
	default:
		return "", false
	}
	for _, a := range n.GetAttribute() {
		if a.GetName() == attr {
			op := strings.TrimPrefix(string(a.GetS()), "aten::")
			return op, strings.HasPrefix(strings.TrimLeft(op, "_"), "embedding")
		}
	}
	return "", false
}

// tableKey identifies a table by the tensors its rows come from: Gathers
// on one initializer, directly or through Identity nodes of their own
// (how exporters alias a tied or reused weight), read one table. An
// 8-bit part counts with its scale and zero point: dequantized by two
// DequantizeLinear nodes of other scales, it is two tables.
func tableKey(src *tableSource) string {
	names := make([]string, len(src.parts))
	for i, p := range src.parts {
		names[i] = p.GetName()
		if d := src.deq[p.GetName()]; d != nil {
			names[i] += fmt.Sprintf("\x01%s\x01%s\x01%d", d.scale.GetName(), d.zp.GetName(), d.axis)
		}
		if f, ok := src.scale[p.GetName()]; ok {
			names[i] += "\x02" + f.key()
		}
	}
	return strings.Join(names, "\x00")
}

// shareTable returns the table already found with src's parts, its chain
// extended with src's nodes (they leave the graph with it), or records
// src as a new one.
func shareTable(tables map[string]*tableSource, src *tableSource) *tableSource {
	key := tableKey(src)
	prev, ok := tables[key]
	if !ok {
		tables[key] = src
		return src
	}
	for _, c := range src.chain {
		if !slices.Contains(prev.chain, c) {
			prev.chain = append(prev.chain, c)
		}
	}
	return prev
}

// chainPath writes the path from the graph input to the Gather.
func chainPath(g *Graph, c *idChain, gather *pb.NodeProto) string {
	parts := []string{c.input}
	for _, i := range c.nodes {
		parts = append(parts, g.Nodes[i].GetOpType())
	}
	return strings.Join(append(parts, gather.GetOpType()), " -> ")
}

// resolveTable follows Identity/Cast(to float) and Concat(axis 0) back to
// 2-D float or float16 initializers, and DequantizeLinear to 2-D int8
// or uint8 ones (quant.go).
func resolveTable(g *Graph, name string) *tableSource {
	src := &tableSource{name: name}
	var walk func(name string, depth int) bool
	walk = func(name string, depth int) bool {
		if depth > 8 {
			return false
		}
		if t, ok := g.Inits[name]; ok {
			dt := pb.TensorProto_DataType(t.GetDataType())
			if len(t.GetDims()) != 2 || (dt != pb.TensorProto_FLOAT && dt != pb.TensorProto_FLOAT16) {
				return false
			}
			if dt == pb.TensorProto_FLOAT16 && !castSeen(src, g) {
				return false
			}
			if src.dim != 0 && src.dim != int(t.GetDims()[1]) {
				return false
			}
			src.dim = int(t.GetDims()[1])
			src.rows += t.GetDims()[0]
			src.parts = append(src.parts, t)
			return true
		}
		i, ok := g.Producer[name]
		if !ok {
			return false
		}
		n := g.Nodes[i]
		switch n.GetOpType() {
		case "Constant":
			// A table as a Constant node (exporters that fold weights):
			// its value tensor is the part, named after the output.
			for _, a := range n.GetAttribute() {
				if a.GetName() != "value" || a.GetT() == nil {
					continue
				}
				t := a.GetT()
				dt := pb.TensorProto_DataType(t.GetDataType())
				if len(t.GetDims()) != 2 || (dt != pb.TensorProto_FLOAT && dt != pb.TensorProto_FLOAT16) || (src.dim != 0 && src.dim != int(t.GetDims()[1])) {
					return false
				}
				if dt == pb.TensorProto_FLOAT16 && !castSeen(src, g) {
					return false
				}
				t.Name = name
				src.chain = append(src.chain, i)
				src.dim = int(t.GetDims()[1])
				src.rows += t.GetDims()[0]
				src.parts = append(src.parts, t)
				return true
			}
			return false
		case "Identity":
			src.chain = append(src.chain, i)
			return walk(n.GetInput()[0], depth+1)
		case "Cast":
			if pb.TensorProto_DataType(attrInt(n, "to", 0)) != pb.TensorProto_FLOAT {
				return false
			}
			src.chain = append(src.chain, i)
			return walk(n.GetInput()[0], depth+1)
		case "DequantizeLinear":
			t, ok := g.Inits[n.GetInput()[0]]
			if !ok || len(t.GetDims()) != 2 || !quantElem(pb.TensorProto_DataType(t.GetDataType())) || (src.dim != 0 && src.dim != int(t.GetDims()[1])) {
				return false
			}
			d, why := dequantOf(g, n, t)
			if why != "" {
				return false
			}
			if src.deq == nil {
				src.deq = map[string]*dequant{}
			}
			src.deq[t.GetName()] = d
			src.chain = append(src.chain, i)
			src.dim = int(t.GetDims()[1])
			src.rows += t.GetDims()[0]
			src.parts = append(src.parts, t)
			return true
		case "Mul":
			// A row mask (rowmask.go): Paddle2ONNX's padding_idx,
			// Mul(W, mask) with the mask second; either order is taken.
			if len(n.GetInput()) != 2 {
				return false
			}
			for _, k := range []int{0, 1} {
				mask, at, ok := floatConst(g, n.GetInput()[1-k])
				if !ok {
					continue
				}
				sub := resolveTable(g, n.GetInput()[k])
				if sub == nil || len(sub.parts) != 1 || len(sub.scale) != 0 || (src.dim != 0 && src.dim != sub.dim) {
					continue
				}
				f, ok := g.maskRows(mask, sub.rows, sub.dim)
				if !ok {
					continue
				}
				part := sub.parts[0]
				src.chain = append(append(src.chain, sub.chain...), i)
				if at >= 0 {
					src.chain = append(src.chain, at)
				}
				if d := sub.deq[part.GetName()]; d != nil {
					if src.deq == nil {
						src.deq = map[string]*dequant{}
					}
					src.deq[part.GetName()] = d
				}
				if src.scale == nil {
					src.scale = map[string]rowFactors{}
				}
				src.scale[part.GetName()] = f
				src.dim = sub.dim
				src.rows += sub.rows
				src.parts = append(src.parts, part)
				return true
			}
			return false
		case "Concat":
			if attrInt(n, "axis", 0) != 0 {
				return false
			}
			src.chain = append(src.chain, i)
			for _, in := range n.GetInput() {
				if !walk(in, depth+1) {
					return false
				}
			}
			return true
		}
		return false
	}
	if !walk(name, 0) || len(src.parts) == 0 {
		return nil
	}
	// One initializer behind Identity nodes only is the table of that
	// initializer's name (the weight's, not an alias's).
	if len(src.parts) == 1 && g.Inits[src.parts[0].GetName()] == src.parts[0] && !slices.ContainsFunc(src.chain, func(c int) bool { return g.Nodes[c].GetOpType() != "Identity" }) {
		src.name = src.parts[0].GetName()
	}
	// One weight behind a row mask is the table of the weight's name
	// when nothing else reads the weight but Muls by equal masks
	// (Paddle2ONNX's padding_idx: W "embedding_0.w_0", a Constant node,
	// read by one Mul per lookup).
	if len(src.parts) == 1 && len(src.scale) == 1 && len(src.deq) == 0 && sameMasks(g, src.parts[0].GetName(), src.dim, src.rows, src.scale[src.parts[0].GetName()]) && !slices.ContainsFunc(src.chain, func(c int) bool {
		op := g.Nodes[c].GetOpType()
		return op != "Identity" && op != "Mul" && op != "Constant"
	}) {
		src.name = src.parts[0].GetName()
	}
	// One quantized initializer behind one DequantizeLinear is the table
	// of the weight it quantizes (W_quantized: W), when no other tensor
	// has that name and no other node reads the initializer (dequantized
	// by another DequantizeLinear too, it is two tables: tableKey).
	if len(src.parts) == 1 && len(src.deq) == 1 && len(g.Consumers[src.parts[0].GetName()]) == 1 && !slices.ContainsFunc(src.chain, func(c int) bool {
		op := g.Nodes[c].GetOpType()
		return op != "Identity" && op != "DequantizeLinear"
	}) {
		w, ok := strings.CutSuffix(src.parts[0].GetName(), "_quantized")
		if _, taken := g.Producer[w]; ok && !taken && g.Inits[w] == nil && !g.IsInput(w) {
			src.name = w
		}
	}
	return src
}

// castSeen: a float16 table is a lookup only when a Cast to float sits
// between it and the Gather (the rows then reach the store as float32).
func castSeen(src *tableSource, g *Graph) bool {
	for _, c := range src.chain {
		if g.Nodes[c].GetOpType() == "Cast" {
			return true
		}
	}
	return false
}

// matchPooling extends a multi-hot lookup with the reduction over its bag
// axis that follows it, and a per-sample weight Mul before that.
func matchPooling(g *Graph, types map[string]TensorType, l *lookup) {
	cur := l.output
	var extra []int
	var weights string
	next, ok := soleConsumer(g, cur)
	if !ok {
		return
	}
	if n := g.Nodes[next]; n.GetOpType() == "Mul" && len(n.GetInput()) == 2 {
		other := n.GetInput()[0]
		if other == cur {
			other = n.GetInput()[1]
		}
		w, wnodes := perSampleWeights(g, types, other, l.bag)
		if w == "" {
			return
		}
		weights = w
		extra = append(extra, next)
		extra = append(extra, wnodes...)
		cur = n.GetOutput()[0]
		if next, ok = soleConsumer(g, cur); !ok {
			return
		}
	}
	n := g.Nodes[next]
	var pool plan.Pooling
	switch n.GetOpType() {
	case "ReduceSum":
		pool = plan.PoolSum
	case "ReduceMean":
		pool = plan.PoolMean
	case "ReduceMax":
		pool = plan.PoolMax
	default:
		return
	}
	axes, ok := reduceAxes(g, n)
	if !ok || len(axes) != 1 || (axes[0] != 1 && axes[0] != -2) {
		return
	}
	if weights != "" && pool == plan.PoolMax {
		return // EmbeddingBag allows per-sample weights with sum only; keep it in the graph
	}
	out := n.GetOutput()[0]
	extra = append(extra, next)
	if attrInt(n, "keepdims", 1) != 0 {
		// keepdims=1 (the default: x.sum(1, keepdim=True)) leaves [batch,
		// 1, dim]; the pooled lookup is [batch, dim], so only a following
		// Squeeze, Flatten or Reshape to that is taken with it.
		sq, ok := soleConsumer(g, out)
		if !ok || !dropsBagAxis(g, types, g.Nodes[sq], l.table.dim) {
			return
		}
		extra = append(extra, sq)
		out = g.Nodes[sq].GetOutput()[0]
	}
	l.nodes = append(l.nodes, extra...)
	l.pooling = pool
	l.weights = weights
	l.output = out
}

// dropsBagAxis says whether n takes a pooled [batch, 1, dim] to [batch,
// dim]: Squeeze of axis 1 (or -2), Flatten at axis 1, or a Reshape whose
// output is [batch, dim].
func dropsBagAxis(g *Graph, types map[string]TensorType, n *pb.NodeProto, dim int) bool {
	switch n.GetOpType() {
	case "Squeeze":
		axes, ok := opAxes(g, n)
		return ok && len(axes) == 1 && (axes[0] == 1 || axes[0] == -2)
	case "Flatten":
		return attrInt(n, "axis", 1) == 1
	case "Reshape":
		t := types[n.GetOutput()[0]]
		return t.Known && slices.Equal(t.Dims, []int64{DimBatch, int64(dim)})
	}
	return false
}

// perSampleWeights recognises Unsqueeze(W, axes=[2] or [-1]) or a
// [batch, bag, 1] Reshape of a float graph input W [batch, bag].
func perSampleWeights(g *Graph, types map[string]TensorType, name string, bag int) (string, []int) {
	i, ok := g.Producer[name]
	if !ok {
		return "", nil
	}
	n := g.Nodes[i]
	if n.GetOpType() != "Unsqueeze" && n.GetOpType() != "Reshape" {
		return "", nil
	}
	w := n.GetInput()[0]
	wt := types[w]
	if !g.IsInput(w) || !wt.Known || wt.Elem != pb.TensorProto_FLOAT || len(wt.Dims) != 2 || wt.Dims[1] != int64(bag) {
		return "", nil
	}
	out := types[name]
	if !out.Known || len(out.Dims) != 3 || out.Dims[2] != 1 {
		return "", nil
	}
	if c, ok := soleConsumer(g, name); !ok || c < 0 {
		return "", nil
	}
	return w, []int{i}
}

func soleConsumer(g *Graph, name string) (int, bool) {
	cs := g.Consumers[name]
	if len(cs) != 1 {
		return 0, false
	}
	for _, o := range g.Outputs {
		if o.GetName() == name {
			return 0, false
		}
	}
	return cs[0], true
}

// nodeIndex is the index of the node called name (-1 if none).
func (g *Graph) nodeIndex(name string) int {
	for i, n := range g.Nodes {
		if n.GetName() == name {
			return i
		}
	}
	return -1
}

// bodyCandidates lists the Gathers on tables of the outer graph inside
// n's subgraphs (Loop, Scan, If bodies, nested too), each with why it is
// not a lookup. A Loop of the outer graph that is an EmbeddingBag with
// offsets (jagged.go, jagged_dynamo.go) is a lookup and never gets
// here; what does is a table read in a subgraph of another kind, or in
// such a loop nested inside another subgraph.
func bodyCandidates(g *Graph, n *pb.NodeProto) []TableCandidate {
	var out []TableCandidate
	for _, a := range n.GetAttribute() {
		for _, body := range attrBodies(a) {
			local, producer := bodyIndex(body)
			pooled := map[string]bool{}
			for _, bn := range body.GetNode() {
				switch bn.GetOpType() {
				case "ReduceSum", "ReduceMean", "ReduceMax":
					pooled[bn.GetInput()[0]] = true
				}
			}
			for _, bn := range body.GetNode() {
				if len(bn.GetAttribute()) > 0 {
					for _, a := range bn.GetAttribute() {
						if a.GetG() != nil || len(a.GetGraphs()) > 0 {
							out = append(out, bodyCandidates(g, bn)...)
							break
						}
					}
				}
				if bn.GetOpType() != "Gather" || len(bn.GetInput()) != 2 || local[bn.GetInput()[0]] {
					continue
				}
				src := resolveTable(g, bn.GetInput()[0])
				if src == nil {
					continue
				}
				c := TableCandidate{Table: src.name, Rows: src.rows, Dim: src.dim, Gather: bn.GetName()}
				ids := bn.GetInput()[1]
				sl := producer[ids]
				if sl != nil && sl.GetOpType() == "Slice" && !local[sl.GetInput()[0]] && pooled[bn.GetOutput()[0]] {
					c.Path = sl.GetInput()[0] + " -> Slice -> Gather (in the body of " + n.GetOpType() + ")"
					c.Reason = fmt.Sprintf("the table is read inside the body of %s %q, like an EmbeddingBag with offsets (a loop over the bags slicing %q by their offsets), but nested in another subgraph: only a Loop of the outer graph is taken as a jagged lookup", n.GetOpType(), n.GetName(), sl.GetInput()[0])
				} else {
					c.Reason = fmt.Sprintf("the table is read inside the body of %s %q, which is not an EmbeddingBag (no slice of the ids per bag pooled by a Reduce): a lookup inside a loop is not taken", n.GetOpType(), n.GetName())
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// bodyIndex indexes a Loop's body: the names defined in it (its inputs,
// initializers and node outputs; any other name is read from the outer
// graph) and the node that makes each output.
func bodyIndex(body *pb.GraphProto) (local map[string]bool, producer map[string]*pb.NodeProto) {
	local, producer = map[string]bool{}, map[string]*pb.NodeProto{}
	for _, in := range body.GetInput() {
		local[in.GetName()] = true
	}
	for _, t := range body.GetInitializer() {
		local[t.GetName()] = true
	}
	for _, bn := range body.GetNode() {
		for _, o := range bn.GetOutput() {
			local[o] = true
			producer[o] = bn
		}
	}
	return local, producer
}

// mixesSamples follows name, a lookup's output, forward through every
// node reading it and says why the lookup cannot leave the graph when
// one of them combines rows of different samples: a Concat, a Gather or
// Scatter on its data, a reduction or a sort along the batch axis. The
// embedding tier looks up and the router micro-batches one sample a
// row; a graph whose first dimension is something else is not served.
//
// tf.nn.embedding_lookup_sparse converted by tf2onnx is such a graph:
// the ids are a SparseTensor's values (every sample's ids
// concatenated, [nnz]), and SparseSegmentSum/Mean/SqrtN become a Gather
// of the table at them followed by a segment grid (the rows concatenated
// with an identity row along axis 0, gathered by a [segments, max
// count] grid built with TopK, Unique and ScatterND, ReduceSum over axis
// 1): onnx/tensorflow-onnx tf2onnx/onnx_opset/reduction.py (SegmentSum),
// tf2onnx/onnx_opset/tensor.py (GatherV2, Unique). Since TensorFlow
// 2.15 an unweighted lookup reads the table at the values directly (no
// Unique: tensorflow/python/ops/embedding_ops.py,
// embedding_lookup_sparse_impl), which would otherwise pass for a
// lookup of one id per sample.
func mixesSamples(g *Graph, types map[string]TensorType, name string) string {
	seen := map[string]bool{name: true}
	queue := []string{name}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		tt := types[t]
		b := slices.Index(tt.Dims, DimBatch)
		for _, ci := range g.Consumers[t] {
			c := g.Nodes[ci]
			if b >= 0 && tt.Known {
				if along := mixOp(g, c, t, b, len(tt.Dims)); along != "" {
					return fmt.Sprintf("its rows %q are combined across samples by %s %q (%s): the graph's first dimension is not one sample a row (as in tf.nn.embedding_lookup_sparse through tf2onnx, whose ids are a SparseTensor's values pooled by segment ids); the embedding tier serves ids of one sample a row: export the ids dense, [batch, bag] (tf.sparse.to_dense with a padding id, then a Gather and a reduce over axis 1)", name, c.GetOpType(), c.GetName(), along)
				}
			}
			for _, o := range c.GetOutput() {
				if o != "" && !seen[o] {
					seen[o] = true
					queue = append(queue, o)
				}
			}
		}
	}
	return ""
}

// mixOp says how node c combines the rows of its input t along the
// batch axis b of t (rank r), or "" when it does not.
func mixOp(g *Graph, c *pb.NodeProto, t string, b, r int) string {
	data := len(c.GetInput()) > 0 && c.GetInput()[0] == t
	switch op := c.GetOpType(); op {
	case "Concat":
		if normAxis(attrInt(c, "axis", 0), r) == b {
			return "a concatenation along the batch axis"
		}
	case "Gather", "GatherElements":
		if data && normAxis(attrInt(c, "axis", 0), r) == b {
			return "a gather of rows along the batch axis"
		}
	case "GatherND", "ScatterND":
		if data && int(attrInt(c, "batch_dims", 0)) <= b {
			return "indices into the batch axis"
		}
	case "ScatterElements":
		if data && normAxis(attrInt(c, "axis", 0), r) == b {
			return "a scatter along the batch axis"
		}
	case "TopK":
		if data && normAxis(attrInt(c, "axis", -1), r) == b {
			return "a sort along the batch axis"
		}
	case "Unique":
		if _, ok := attrInts(c, "axis"); !ok || normAxis(attrInt(c, "axis", 0), r) == b {
			return "unique values across the batch"
		}
	case "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp":
		if !data {
			return ""
		}
		axes, ok := reduceAxes(g, c)
		if !ok {
			return ""
		}
		if len(axes) == 0 && attrInt(c, "noop_with_empty_axes", 0) == 0 {
			return "a reduction over every axis, the batch's included"
		}
		for _, a := range axes {
			if normAxis(a, r) == b {
				return "a reduction over the batch axis"
			}
		}
	}
	return ""
}
