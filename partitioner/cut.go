package partitioner

import (
	"errors"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"slices"
	"sort"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Placement is the solved split of one graph.
type Placement struct {
	G       *Graph
	Types   map[string]TensorType
	Lookups []*lookup
	// OnCPU says, per node index, where a placed node runs. Nodes absorbed
	// into lookups and Constant nodes are not in it: lookups run in the
	// store, constants are copied to whichever side reads them.
	OnCPU    map[int]bool
	Absorbed map[int]*lookup
	// Pre are the id-chain nodes the embedding tier runs natively as
	// pre-lookup ops: out of the graph, like the lookups.
	Pre map[int]bool
	// Candidates are every Gather on a table, recognised or not.
	Candidates []TableCandidate
	Constants  map[int]bool
	Cut        []plan.CutTensor
	// Objective is the cost model's total, in picoseconds per sample.
	Objective     int64
	UnknownShapes []string
	Forced        []string
	// Dead are the nodes no graph output depends on: in neither part.
	Dead []string
	// Unsendable names the model inputs the dense side reads that the
	// tiers cannot send it (not float32 with the batch first): no plan
	// of this placement serves (Partition refuses it).
	Unsendable []string
}

// Place recognises the lookups of g, builds the placement problem and
// solves it.
func Place(g *Graph, cm CostModel, forceCPU, forceGPU []string) (*Placement, error) {
	return place(g, cm, forceCPU, forceGPU, false)
}

// place is Place; with lookupsDense every node reading a lookup's
// output is pinned to the dense side (Options.LookupsDense), so
// cpu.onnx reads no lookup output.
func place(g *Graph, cm CostModel, forceCPU, forceGPU []string, lookupsDense bool) (*Placement, error) {
	cm.EnsureDefaults()
	if err := cm.Validate(); err != nil {
		return nil, err
	}
	types, unknownNodes := InferShapes(g)
	pl := &Placement{G: g, Types: types, OnCPU: map[int]bool{}, Absorbed: map[int]*lookup{}, Constants: map[int]bool{}, UnknownShapes: unknownNodes}
	pl.Lookups, pl.Candidates, pl.Pre = findLookups(g, types)
	pl.UnknownShapes = reinferJagged(g, types, pl.Lookups, pl.UnknownShapes)
	for _, l := range pl.Lookups {
		for _, i := range l.nodes {
			pl.Absorbed[i] = l
		}
		for _, i := range l.table.chain {
			pl.Absorbed[i] = l
		}
	}
	byName := map[string]int{}
	for i, n := range g.Nodes {
		byName[n.GetName()] = i
		if n.GetOpType() == "Constant" {
			pl.Constants[i] = true
		}
	}

	p := &problem{}
	vertexOfInput := map[string]int{}
	for _, in := range g.Inputs {
		vertexOfInput[in.GetName()] = p.addVertex(0, 0, pinCPU)
	}
	vertexOfLookup := map[*lookup]int{}
	for _, l := range pl.Lookups {
		vertexOfLookup[l] = p.addVertex(0, 0, pinCPU)
	}
	vertexOfNode := map[int]int{}
	nodeOfVertex := map[int]int{}
	live := g.live()
	for i, n := range g.Nodes {
		if pl.Absorbed[i] != nil || pl.Constants[i] || pl.Pre[i] {
			continue
		}
		if !live[i] {
			// Dead: no graph output depends on it. Placed, it could end
			// up alone on the CPU side, and cpu.onnx would be a model
			// without outputs (ONNX Runtime's Go binding panics running
			// one); neither side runs it.
			pl.Dead = append(pl.Dead, n.GetName())
			continue
		}
		flops, ok := nodeFLOPs(g, n, types)
		if !ok {
			flops = cm.UnknownFLOPs
		}
		view := viewOps[n.GetOpType()]
		k := free
		if heavyOps[n.GetOpType()] {
			k = pinGPU
		}
		v := p.addVertex(cm.cpuCost(flops, view), cm.gpuCost(flops, view), k)
		vertexOfNode[i] = v
		nodeOfVertex[v] = i
	}
	force := func(names []string, k pin, side string) error {
		for _, name := range names {
			i, ok := byName[name]
			if !ok {
				return fmt.Errorf("%w: node %q (%s side): no node of that name", ErrForced, name, side)
			}
			if l := pl.Absorbed[i]; l != nil {
				return fmt.Errorf("%w: node %q (%s side): it is part of the lookup of table %q, which the embedding store runs", ErrForced, name, side, l.table.name)
			}
			if pl.Pre[i] {
				return fmt.Errorf("%w: node %q (%s side): it makes a lookup's ids, which the embedding tier computes before the lookup", ErrForced, name, side)
			}
			v, ok := vertexOfNode[i]
			if !ok {
				return fmt.Errorf("%w: node %q (%s side): a Constant goes wherever it is read", ErrForced, name, side)
			}
			p.pins[v] = k
			pl.Forced = append(pl.Forced, side+":"+name)
		}
		return nil
	}
	if err := force(forceCPU, pinCPU, "cpu"); err != nil {
		return nil, err
	}
	if err := force(forceGPU, pinGPU, "gpu"); err != nil {
		return nil, err
	}
	if lookupsDense {
		for _, l := range pl.Lookups {
			for _, c := range g.Consumers[l.output] {
				v, ok := vertexOfNode[c]
				if !ok || pl.Absorbed[c] != nil {
					continue
				}
				if p.pins[v] == pinCPU {
					return nil, fmt.Errorf("%w: node %q (cpu side) reads lookup output %q, which --lookups-dense keeps on the dense side", ErrForced, g.Nodes[c].GetName(), l.output)
				}
				p.pins[v] = pinGPU
			}
		}
	}
	for _, o := range g.Outputs {
		i, ok := g.Producer[o.GetName()]
		v, placed := vertexOfNode[i]
		if !ok || !placed {
			return nil, fmt.Errorf("graph output %q comes straight from an input or an embedding lookup: nothing is left for the dense side", o.GetName())
		}
		if p.pins[v] == pinCPU {
			return nil, fmt.Errorf("graph output %q is forced to the CPU side; outputs come from dense.onnx", o.GetName())
		}
		p.pins[v] = pinGPU
	}

	// Tensors: each producer vertex to the vertices that read it.
	type tensorRef struct {
		name string
		from int
		kind string
	}
	var refs []tensorRef
	for _, in := range g.Inputs {
		refs = append(refs, tensorRef{in.GetName(), vertexOfInput[in.GetName()], "input"})
	}
	for _, l := range pl.Lookups {
		refs = append(refs, tensorRef{l.output, vertexOfLookup[l], "lookup"})
	}
	for i, n := range g.Nodes {
		if v, ok := vertexOfNode[i]; ok {
			for _, o := range n.GetOutput() {
				if o != "" {
					refs = append(refs, tensorRef{o, v, "cpu"})
				}
			}
		}
	}
	readersOf := func(name string, from int) []int {
		seen := map[int]bool{}
		var out []int
		for _, c := range g.Consumers[name] {
			var v int
			if l := pl.Absorbed[c]; l != nil {
				v = vertexOfLookup[l]
			} else if w, ok := vertexOfNode[c]; ok {
				v = w
			} else {
				continue
			}
			if v != from && !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
		sort.Ints(out)
		return out
	}
	tensorBytes := func(name string) int64 {
		t := types[name]
		b, ok := t.BytesPerSample()
		if !ok {
			return cm.UnknownBytes
		}
		if !t.HasBatch() {
			// Sent with every batch, not every sample.
			b = (b + int64(cm.Batch) - 1) / int64(cm.Batch)
		}
		return b
	}
	type tensorIdx struct {
		ref     tensorRef
		readers []int
	}
	var tensors []tensorIdx
	for _, r := range refs {
		readers := readersOf(r.name, r.from)
		if len(readers) == 0 {
			continue
		}
		// A tensor a node makes crosses in the cut frames: float32, one
		// row per sample. Another stays on the side that reads it: the
		// dense side computes it itself. Such as a shape computed for a
		// dense Reshape from a lookup's rows (tf.reshape(h, [-1,
		// tf.reduce_prod(tf.shape(x)[1:])]) through tf2onnx: Shape, Cast
		// to int32, Slice, ReduceProd, Unsqueeze + Concat, Cast to int64;
		// onnx/tensorflow-onnx tf2onnx/onnx_opset/tensor.py), int64 and
		// without the batch, so cheap by its bytes that the cut sent it.
		// A model input crosses in the same frames: one of another type
		// (int64 ids a dense OneHot reads) leaves its readers on the
		// CPU side, where the embedding tier has it; sent in the cut,
		// neither tier would serve the plan (float32 cut tensors only).
		stays := (r.kind == "cpu" || r.kind == "input") && !framed(types[r.name])
		p.tensors = append(p.tensors, ptensor{from: r.from, to: readers, bytes: cm.bytesCost(tensorBytes(r.name)), stays: stays})
		tensors = append(tensors, tensorIdx{r, readers})
	}

	onCPU, obj, err := p.solve()
	if errors.Is(err, errInfeasible) {
		// Infeasible only because the dense side reads model inputs it
		// cannot be sent (int64 ids of a table left in the dense graph):
		// the placement that sends them, with the inputs named, so that
		// Partition says why no plan serves (after naming the tables it
		// did not take, the usual cause).
		relaxed := *p
		relaxed.tensors = slices.Clone(p.tensors)
		for k, t := range tensors {
			if t.ref.kind == "input" {
				relaxed.tensors[k].stays = false
			}
		}
		if on, robj, rerr := relaxed.solve(); rerr == nil {
			for _, t := range tensors {
				if t.ref.kind != "input" || framed(types[t.ref.name]) {
					continue
				}
				for _, w := range t.readers {
					if !on[w] {
						tt := types[t.ref.name]
						pl.Unsendable = append(pl.Unsendable, fmt.Sprintf("%q (%s %s, read by %s %q)", t.ref.name, dtypeName(tt.Elem), dimsString(tt), g.Nodes[nodeOfVertex[w]].GetOpType(), g.Nodes[nodeOfVertex[w]].GetName()))
						break
					}
				}
			}
			onCPU, obj, err = on, robj, nil
		}
	}
	if err != nil {
		if len(pl.Forced) > 0 {
			return nil, fmt.Errorf("%w: %w (forced: %v)", ErrForced, err, pl.Forced)
		}
		return nil, err
	}
	pl.Objective = obj
	for v, i := range nodeOfVertex {
		pl.OnCPU[i] = onCPU[v]
	}
	for _, t := range tensors {
		if !onCPU[t.ref.from] {
			continue
		}
		crosses := false
		for _, w := range t.readers {
			if !onCPU[w] {
				crosses = true
			}
		}
		if !crosses {
			continue
		}
		tt := types[t.ref.name]
		b, ok := tt.BytesPerSample()
		if !ok {
			b = -1
		}
		pl.Cut = append(pl.Cut, plan.CutTensor{
			TensorInfo:     plan.TensorInfo{Name: t.ref.name, DType: dtypeName(tt.Elem), Shape: tt.SampleShape()},
			BytesPerSample: b,
			From:           t.ref.kind,
		})
	}
	return pl, nil
}

// framed says whether a tensor the CPU side makes, or a model input, can
// cross to the dense side: the tiers send cut tensors as float32 rows,
// one per sample, of a known per-sample shape (the dense tier refuses a
// plan whose cut has another type or an unknown size). A tensor whose
// shape or type is not known, one of another type, without the batch,
// with the batch not first or with a size not known is not.
func framed(t TensorType) bool {
	if t.Elem != pb.TensorProto_FLOAT || !t.Known {
		return false
	}
	if len(t.Dims) == 0 || t.Dims[0] != DimBatch {
		return false
	}
	for _, d := range t.Dims[1:] {
		if d < 0 {
			return false
		}
	}
	return true
}

// dtypeName is the lower-case ONNX type name ("float32" for FLOAT).
func dtypeName(dt pb.TensorProto_DataType) string {
	switch dt {
	case pb.TensorProto_FLOAT:
		return "float32"
	case pb.TensorProto_DOUBLE:
		return "float64"
	case pb.TensorProto_FLOAT16:
		return "float16"
	case pb.TensorProto_INT64:
		return "int64"
	case pb.TensorProto_INT32:
		return "int32"
	case pb.TensorProto_BOOL:
		return "bool"
	}
	return pb.TensorProto_DataType_name[int32(dt)]
}

// live says, per node index, whether a graph output depends on the node.
func (g *Graph) live() map[int]bool {
	need := map[string]bool{}
	for _, o := range g.Outputs {
		need[o.GetName()] = true
	}
	live := map[int]bool{}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		if !slices.ContainsFunc(g.Nodes[i].GetOutput(), func(o string) bool { return need[o] }) {
			continue
		}
		live[i] = true
		for _, in := range g.Reads(i) {
			need[in] = true
		}
	}
	return live
}
