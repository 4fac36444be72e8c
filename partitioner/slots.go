package partitioner

import (
	"fmt"
	"slices"
	"strconv"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// splitSlots rewrites multi-slot lookups into one lookup per slot: a
// Gather on a table whose indices are [batch, slots, nnz] (a key tensor
// with several slots of up to nnz ids each, as NVIDIA HugeCTR's
// hugectr2onnx writes every sparse embedding layer), pooled over the
// nnz axis by a ReduceSum, ReduceMean or ReduceMax with keepdims 0 to
// [batch, slots, dim]. Each slot s becomes Gather(indices, s, axis 1)
// (a column pick: [batch, nnz]), the Gather on the table, the same
// reduction over axis 1 ([batch, dim]) and an Unsqueeze to
// [batch, 1, dim]; a Concat on axis 1 gives the reduction's output
// back. The lookups are then the plain bags the embedding tier pools,
// and only slots*dim floats per sample cross the cut. It reports
// whether it changed the graph (the caller indexes it again).
func splitSlots(g *Graph) (bool, error) {
	types, _ := InferShapes(g)
	opset := g.Opset()
	gp := g.Model.GetGraph()
	drop := map[int]bool{}
	insert := map[int][]*pb.NodeProto{}
	fresh := freshNames(gp)
	for gi, n := range g.Nodes {
		if n.GetOpType() != "Gather" || len(n.GetInput()) != 2 || attrInt(n, "axis", 0) != 0 || resolveTable(g, n.GetInput()[0]) == nil {
			continue
		}
		idx := n.GetInput()[1]
		it := types[idx]
		if !sampleKnown(it) || len(it.Dims) != 3 || !isInt(it.Elem) {
			continue
		}
		ri, ok := soleConsumer(g, n.GetOutput()[0])
		if !ok {
			continue
		}
		r := g.Nodes[ri]
		switch r.GetOpType() {
		case "ReduceSum", "ReduceMean", "ReduceMax":
		default:
			continue
		}
		axes, ok := reduceAxes(g, r)
		if !ok || len(axes) != 1 || normAxis(axes[0], 4) != 2 || attrInt(r, "keepdims", 1) != 0 {
			continue
		}
		slots := it.Dims[1]
		out := r.GetOutput()[0]
		var nodes []*pb.NodeProto
		var parts []string
		var inits []*pb.TensorProto
		constI := func(base string, dims []int64, v ...int64) string {
			name := fresh(base)
			inits = append(inits, &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_INT64), Dims: dims, Int64Data: v})
			return name
		}
		for s := range slots {
			base := fmt.Sprintf("%s/slot%d", out, s)
			ids := fresh(base + "/ids")
			nodes = append(nodes, &pb.NodeProto{Name: fresh(base + "/Gather_slot"), OpType: "Gather",
				Input: []string{idx, constI(base+"/index", nil, s)}, Output: []string{ids}, Attribute: []*pb.AttributeProto{intAttr("axis", 1)}})
			rows := fresh(base + "/rows")
			nodes = append(nodes, &pb.NodeProto{Name: fresh(base + "/Gather"), OpType: "Gather",
				Input: []string{n.GetInput()[0], ids}, Output: []string{rows}, Attribute: []*pb.AttributeProto{intAttr("axis", 0)}})
			pooled := fresh(base + "/pooled")
			red := &pb.NodeProto{Name: fresh(base + "/" + r.GetOpType()), OpType: r.GetOpType(), Input: []string{rows}, Output: []string{pooled},
				Attribute: []*pb.AttributeProto{intAttr("keepdims", 0)}}
			if len(r.GetInput()) > 1 && r.GetInput()[1] != "" {
				red.Input = append(red.Input, constI(base+"/axes", []int64{1}, 1))
			} else {
				red.Attribute = append(red.Attribute, intsAttr("axes", 1))
			}
			nodes = append(nodes, red)
			un := fresh(base + "/unsqueezed")
			if slots == 1 {
				un = out
			}
			u := &pb.NodeProto{Name: fresh(base + "/Unsqueeze"), OpType: "Unsqueeze", Input: []string{pooled}, Output: []string{un}}
			if opset >= 13 {
				u.Input = append(u.Input, constI(base+"/unsqueeze_axes", []int64{1}, 1))
			} else {
				u.Attribute = []*pb.AttributeProto{intsAttr("axes", 1)}
			}
			nodes = append(nodes, u)
			parts = append(parts, un)
		}
		if slots > 1 {
			nodes = append(nodes, &pb.NodeProto{Name: fresh(out + "/Concat_slots"), OpType: "Concat", Input: parts, Output: []string{out},
				Attribute: []*pb.AttributeProto{intAttr("axis", 1)}})
		}
		gp.Initializer = append(gp.Initializer, inits...)
		drop[gi], drop[ri] = true, true
		insert[ri] = nodes
	}
	if len(drop) == 0 {
		return false, nil
	}
	// g.Nodes is gp's nodes in topological order: the slots' nodes take
	// the reduction's place, after everything the Gather read.
	var out []*pb.NodeProto
	for i, n := range g.Nodes {
		if !drop[i] {
			out = append(out, n)
		}
		out = append(out, insert[i]...)
	}
	if len(out) < len(g.Nodes) || slices.Contains(out, nil) {
		return false, fmt.Errorf("splitting slots: %d nodes for %d", len(out), len(g.Nodes))
	}
	gp.Node = out
	return true, nil
}

func intAttr(name string, v int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INT, I: v}
}

func intsAttr(name string, v ...int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INTS, Ints: v}
}

// freshNames returns a namer of new nodes and tensors of gp: base, or
// base_1, base_2, ..., the first that no node, tensor, initializer or
// input of gp (nor an earlier answer) has.
func freshNames(gp *pb.GraphProto) func(base string) string {
	names := map[string]bool{}
	for _, n := range gp.GetNode() {
		names[n.GetName()] = true
		for _, o := range n.GetOutput() {
			names[o] = true
		}
	}
	for _, t := range gp.GetInitializer() {
		names[t.GetName()] = true
	}
	for _, in := range gp.GetInput() {
		names[in.GetName()] = true
	}
	return func(base string) string {
		for k := 0; ; k++ {
			s := base
			if k > 0 {
				s += "_" + strconv.Itoa(k)
			}
			if !names[s] {
				names[s] = true
				return s
			}
		}
	}
}
