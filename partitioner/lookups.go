package partitioner

import (
	"github.com/prism-serve/prism/plan"
	"slices"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// lookup is one recognised embedding lookup: a Gather on a table, with
// its pooling, that leaves the graph for the embedding store.
type lookup struct {
	table   *tableSource
	gather  int   // node index of the Gather
	nodes   []int // every node index it absorbs (Gather, Mul, Unsqueeze, Reduce)
	ids     string
	rank1   bool
	bag     int
	pooling plan.Pooling
	weights string
	output  string
}

// tableSource is where a table's rows come from: one 2-D initializer, or
// several concatenated along the row axis, possibly behind a Cast.
type tableSource struct {
	name  string
	parts []*pb.TensorProto
	rows  int64
	dim   int
	chain []int // Identity/Cast/Concat node indices between the parts and the Gathers
}

// findLookups recognises embedding lookups (see the package comment for
// the patterns). A Gather that almost matches stays in the graph and is
// placed by the cut like any other node.
func findLookups(g *Graph, types map[string]TensorType) []*lookup {
	var out []*lookup
	tables := map[string]*tableSource{}
	absorbed := map[int]bool{}
	for gi, n := range g.Nodes {
		if n.GetOpType() != "Gather" || attrInt(n, "axis", 0) != 0 || len(n.GetInput()) != 2 {
			continue
		}
		ids := n.GetInput()[1]
		if !g.IsInput(ids) {
			continue
		}
		it := types[ids]
		if !it.Known || (it.Elem != pb.TensorProto_INT64 && it.Elem != pb.TensorProto_INT32) || len(it.Dims) < 1 || len(it.Dims) > 2 || it.Dims[0] != DimBatch {
			continue
		}
		if len(it.Dims) == 2 && it.Dims[1] <= 0 {
			continue
		}
		src := resolveTable(g, n.GetInput()[0])
		if src == nil {
			continue
		}
		if prev, ok := tables[src.name]; ok {
			src = prev
		}
		l := &lookup{table: src, gather: gi, nodes: []int{gi}, ids: ids, rank1: len(it.Dims) == 1, bag: 1, pooling: plan.PoolNone, output: n.GetOutput()[0]}
		if !l.rank1 {
			l.bag = int(it.Dims[1])
			matchPooling(g, types, l)
		}
		tables[src.name] = src
		out = append(out, l)
		for _, i := range l.nodes {
			absorbed[i] = true
		}
	}
	// A table's chain (Cast, Identity, Concat) and its initializers must
	// serve only recognised lookups; otherwise the table stays in the graph
	// and so do its Gathers.
	var keep []*lookup
	for _, l := range out {
		ok := true
		for _, c := range l.table.chain {
			absorbed[c] = true
		}
		for _, c := range l.table.chain {
			for _, o := range g.Nodes[c].GetOutput() {
				for _, r := range g.Consumers[o] {
					if !absorbed[r] {
						ok = false
					}
				}
			}
		}
		for _, p := range l.table.parts {
			for _, r := range g.Consumers[p.GetName()] {
				if !absorbed[r] {
					ok = false
				}
			}
			if slices.ContainsFunc(g.Outputs, func(o *pb.ValueInfoProto) bool { return o.GetName() == p.GetName() }) {
				ok = false
			}
		}
		if ok {
			keep = append(keep, l)
		}
	}
	return keep
}

// resolveTable follows Identity/Cast(to float) and Concat(axis 0) back to
// 2-D float or float16 initializers.
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
		case "Identity":
			src.chain = append(src.chain, i)
			return walk(n.GetInput()[0], depth+1)
		case "Cast":
			if pb.TensorProto_DataType(attrInt(n, "to", 0)) != pb.TensorProto_FLOAT {
				return false
			}
			src.chain = append(src.chain, i)
			return walk(n.GetInput()[0], depth+1)
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
	if !ok || len(axes) != 1 || (axes[0] != 1 && axes[0] != -2) || attrInt(n, "keepdims", 1) != 0 {
		return
	}
	if weights != "" && pool == plan.PoolMax {
		return // EmbeddingBag allows per-sample weights with sum only; keep it in the graph
	}
	l.nodes = append(append(l.nodes, extra...), next)
	l.pooling = pool
	l.weights = weights
	l.output = n.GetOutput()[0]
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
