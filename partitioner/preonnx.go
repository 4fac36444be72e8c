package partitioner

import (
	"fmt"
	"slices"
	"strings"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// PreFile is the pre-lookup subgraph's file name in a partition folder.
const PreFile = "pre.onnx"

// preChain is integer work between graph inputs and a lookup's ids that
// the native pre-lookup ops do not cover (hashing by multiply and
// shift, bit masks, floor division, ids concatenated from several
// columns ...): its nodes are cut into pre.onnx, which the embedding
// tier runs through ONNX Runtime before the lookups, and whose output
// out is the ids.
type preChain struct {
	inputs []string // graph inputs, in the order the walk reached them
	nodes  []int    // node indices, in graph order
	out    string
	shape  []int64
	elem   pb.TensorProto_DataType
}

// preElementwise are the ops pre.onnx takes that work value by value
// (numpy broadcasting against constants or other id tensors): integer
// arithmetic, bitwise ops, comparisons and selections.
var preElementwise = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Mod": true, "Min": true, "Max": true,
	"Abs": true, "Neg": true, "Sign": true, "Clip": true, "Identity": true,
	"BitShift": true, "BitwiseAnd": true, "BitwiseOr": true, "BitwiseXor": true, "BitwiseNot": true,
	"Equal": true, "Less": true, "Greater": true, "LessOrEqual": true, "GreaterOrEqual": true,
	"Not": true, "And": true, "Or": true, "Xor": true, "Where": true,
}

// preMovement are the ops pre.onnx takes that move values within a
// sample (never across the batch axis), on ids or on the float input
// values a Cast turns into ids.
var preMovement = map[string]bool{
	"Squeeze": true, "Unsqueeze": true, "Reshape": true, "Flatten": true,
	"Gather": true, "Slice": true, "Split": true, "Concat": true, "Transpose": true,
}

// tracePre follows a lookup's indices back to the graph inputs through
// integer work the native ops do not cover. It takes only work that
// keeps every sample to itself ([batch, known sizes...] tensors all the
// way, no op along the batch axis) on graph inputs and constants: no
// float arithmetic (a float input is only moved and cast), no table
// read. The error names the first op on the way from the inputs that
// does not fit.
func tracePre(g *Graph, types map[string]TensorType, name string) (*preChain, error) {
	c := &preChain{out: name}
	seen := map[int]bool{}
	var walk func(name string, depth int) error
	walk = func(name string, depth int) error {
		t := types[name]
		if g.IsInput(name) {
			switch {
			case !sampleKnown(t):
				return &notIDs{node: name, reason: fmt.Sprintf("indices come from input %q whose shape %s is not [batch, known sizes...]", name, dimsString(t))}
			case !isInt(t.Elem) && t.Elem != pb.TensorProto_FLOAT && t.Elem != pb.TensorProto_BOOL:
				return &notIDs{node: name, reason: fmt.Sprintf("indices come from input %q of type %s (the embedding tier takes int64 or int32 ids, or float32 values)", name, elemName(t.Elem))}
			}
			if !slices.Contains(c.inputs, name) {
				c.inputs = append(c.inputs, name)
			}
			return nil
		}
		if depth > 64 {
			return &notIDs{node: name, reason: "indices come from a chain of more than 64 ops"}
		}
		i, ok := g.Producer[name]
		if !ok || g.Nodes[i].GetOpType() == "Constant" {
			return &notIDs{node: name, reason: fmt.Sprintf("indices come from the constant %q, not from the inputs", name)}
		}
		if seen[i] {
			return nil
		}
		seen[i] = true
		n := g.Nodes[i]
		op := n.GetOpType()
		fail := func(format string, args ...any) error {
			return &notIDs{node: n.GetName(), reason: fmt.Sprintf("indices come from %s %s (node %q): ", article(elemName(t.Elem)), elemName(t.Elem)+" "+op, n.GetName()) + fmt.Sprintf(format, args...)}
		}
		// Operands: constants stay constants (checked below), the rest is
		// walked first, so the first cause from the inputs is named.
		var data []string
		for _, in := range n.GetInput() {
			if in == "" || g.isConst(in) {
				continue
			}
			data = append(data, in)
			if err := walk(in, depth+1); err != nil {
				return err
			}
		}
		if len(data) == 0 {
			return fail("no input comes from the model's inputs")
		}
		switch {
		case preElementwise[op]:
			if t.Elem == pb.TensorProto_FLOAT || types[data[0]].Elem == pb.TensorProto_FLOAT {
				return fail("not integer work the embedding tier runs")
			}
			if op == "Mod" && attrInt(n, "fmod", 0) != 0 {
				return fail("fmod=1 on integers")
			}
			if err := preOperandsOK(g, n); err != "" {
				return fail("%s", err)
			}
		case op == "Cast":
			if to := pb.TensorProto_DataType(attrInt(n, "to", 0)); !isInt(to) && to != pb.TensorProto_BOOL {
				return fail("a cast to %s", elemName(to))
			}
		case preMovement[op]:
			if err := preMovementOK(g, n, types); err != "" {
				return fail("%s", err)
			}
		default:
			return fail("not integer work the embedding tier runs")
		}
		for _, in := range n.GetInput() {
			if in == "" || !g.isConst(in) {
				continue
			}
			ct := types[in]
			if ct.Elem == pb.TensorProto_FLOAT && preElementwise[op] {
				return fail("a float constant %q in integer work", in)
			}
			// A constant as wide as the ids along the batch axis would
			// tie the ids to the exported batch.
			if ct.Known && len(ct.Dims) == len(t.Dims) && len(ct.Dims) > 0 && ct.Dims[0] != 1 && preElementwise[op] {
				if vals, cdims, ok := g.constTensor(in); ok && len(data) > 0 && sampleKnown(types[data[0]]) {
					if _, err := broadcastConst(vals, cdims, types[data[0]]); err != nil {
						return fail("%v", err)
					}
				}
				return fail("the constant %q of shape %v varies along the batch axis", in, ct.Dims)
			}
		}
		if !sampleKnown(t) {
			// A constant that does not broadcast is the likeliest cause.
			for _, in := range n.GetInput() {
				if vals, cdims, ok := g.constTensor(in); ok && sampleKnown(types[data[0]]) && preElementwise[op] {
					if _, err := broadcastConst(vals, cdims, types[data[0]]); err != nil {
						return fail("%v", err)
					}
				}
			}
			return fail("its output shape %s is not [batch, known sizes...]", dimsString(t))
		}
		for _, o := range n.GetOutput() {
			if o != "" && o != name && !sampleKnown(types[o]) && len(g.Consumers[o]) > 0 {
				return fail("its output %q of shape %s is not [batch, known sizes...]", o, dimsString(types[o]))
			}
		}
		if t.Elem == pb.TensorProto_FLOAT && op != "Cast" && !preMovement[op] {
			return fail("not integer work the embedding tier runs")
		}
		c.nodes = append(c.nodes, i)
		return nil
	}
	if err := walk(name, 0); err != nil {
		return nil, err
	}
	slices.Sort(c.nodes)
	t := types[name]
	c.shape, c.elem = t.SampleShape(), t.Elem
	if len(c.inputs) == 0 {
		return nil, &notIDs{node: name, reason: fmt.Sprintf("indices %q do not come from the model's inputs", name)}
	}
	return c, nil
}

// preMovementOK says why a data movement op would mix samples or read a
// table ("" when it does not): it must leave the batch axis first and
// whole.
func preMovementOK(g *Graph, n *pb.NodeProto, types map[string]TensorType) string {
	in := types[n.GetInput()[0]]
	rank := len(in.Dims)
	axisNot0 := func(a int64, r int) string {
		if normAxis(a, r) <= 0 {
			return fmt.Sprintf("axis %d is the batch axis", a)
		}
		return ""
	}
	switch n.GetOpType() {
	case "Gather":
		if len(n.GetInput()) != 2 {
			return fmt.Sprintf("%d inputs, want 2", len(n.GetInput()))
		}
		data, idx := n.GetInput()[0], n.GetInput()[1]
		if g.isConst(data) {
			// A remap of the ids through an integer constant (a
			// vocabulary): a read of integers, not of a table's rows.
			if !isInt(types[data].Elem) || len(types[data].Dims) != 1 || attrInt(n, "axis", 0) != 0 {
				return fmt.Sprintf("it reads the constant %q (only a 1-D integer constant remaps ids)", data)
			}
			return ""
		}
		if !g.isConst(idx) {
			return "its indices are not a constant"
		}
		return axisNot0(attrInt(n, "axis", 0), rank)
	case "Concat", "Split":
		return axisNot0(attrInt(n, "axis", 0), rank)
	case "Slice":
		var axes []int64
		if len(n.GetInput()) > 3 && n.GetInput()[3] != "" {
			v, ok := g.constInts(n.GetInput()[3])
			if !ok {
				return "its axes are not a constant"
			}
			axes = v
		} else if v, ok := attrInts(n, "axes"); ok && len(n.GetInput()) < 3 {
			axes = v
		} else {
			return "it slices the batch axis (no axes given)"
		}
		for _, a := range axes {
			if s := axisNot0(a, rank); s != "" {
				return s
			}
		}
		return ""
	case "Transpose":
		perm, ok := attrInts(n, "perm")
		if !ok || len(perm) == 0 || perm[0] != 0 {
			return "it moves the batch axis"
		}
		return ""
	}
	// Squeeze, Unsqueeze, Reshape, Flatten: the batch axis stays first
	// with every sample's values in their own row.
	out := types[n.GetOutput()[0]]
	if !sampleKnown(in) || !sampleKnown(out) || numElements(in.SampleShape()) != numElements(out.SampleShape()) {
		return fmt.Sprintf("it reshapes %s to %s, across samples", dimsString(in), dimsString(out))
	}
	return ""
}

// isConst says whether name is an initializer or a Constant node's
// output.
func (g *Graph) isConst(name string) bool {
	if _, ok := g.Inits[name]; ok {
		return true
	}
	i, ok := g.Producer[name]
	return ok && g.Nodes[i].GetOpType() == "Constant"
}

// preModel builds pre.onnx: the nodes of every lookup's pre-chain, the
// Constant nodes and initializers they read, the graph inputs they
// start from and the ids they end in as outputs. Initializers are
// loaded from external data resolved against dir.
func (pl *Placement) preModel(dir string) (*pb.ModelProto, error) {
	g := pl.G
	nodes := map[int]bool{}
	var ins, outs []string
	for _, l := range pl.Lookups {
		if l.preOut == "" {
			continue
		}
		for _, i := range l.preNodes {
			nodes[i] = true
		}
		for _, in := range l.preInputs {
			if !slices.Contains(ins, in) {
				ins = append(ins, in)
			}
		}
		if !slices.Contains(outs, l.preOut) {
			outs = append(outs, l.preOut)
		}
	}
	sub := &pb.GraphProto{Name: g.Model.GetGraph().GetName() + "_pre"}
	needInit := map[string]bool{}
	for i, n := range g.Nodes {
		if !nodes[i] {
			continue
		}
		for _, in := range n.GetInput() {
			if j, ok := g.Producer[in]; ok && g.Nodes[j].GetOpType() == "Constant" {
				nodes[j] = true
			}
			if _, ok := g.Inits[in]; ok {
				needInit[in] = true
			}
		}
	}
	for i, n := range g.Nodes {
		if nodes[i] {
			if err := loadNodeData(n, dir); err != nil {
				return nil, err
			}
			sub.Node = append(sub.Node, n)
		}
	}
	for _, t := range g.Model.GetGraph().GetInitializer() {
		if needInit[t.GetName()] {
			if err := pb.LoadData(t, dir); err != nil {
				return nil, err
			}
			sub.Initializer = append(sub.Initializer, t)
		}
	}
	for _, in := range ins {
		sub.Input = append(sub.Input, valueInfo(in, pl.Types[in]))
	}
	for _, o := range outs {
		sub.Output = append(sub.Output, valueInfo(o, pl.Types[o]))
	}
	return &pb.ModelProto{
		IrVersion:       g.Model.GetIrVersion(),
		OpsetImport:     g.Model.GetOpsetImport(),
		ProducerName:    "prism-partition",
		ProducerVersion: fmt.Sprint(plan.Version),
		Graph:           sub,
	}, nil
}

// preFallback is the id chain of indices name when it is integer work
// for pre.onnx (tracePre); the error says why it is not.
func preFallback(g *Graph, types map[string]TensorType, name string) (*idChain, error) {
	c, err := tracePre(g, types, name)
	if err != nil {
		return nil, err
	}
	return &idChain{input: c.inputs[0], nodes: c.nodes, shape: c.shape, elem: c.elem, preOut: c.out, preInputs: c.inputs}, nil
}

// preSummary says what pre.onnx runs: its nodes by op and the ids it
// makes.
func (pl *Placement) preSummary() string {
	ops := map[string]int{}
	nodes := map[int]bool{}
	var outs []string
	for _, l := range pl.Lookups {
		if l.preOut == "" {
			continue
		}
		for _, i := range l.preNodes {
			if !nodes[i] {
				nodes[i] = true
				ops[pl.G.Nodes[i].GetOpType()]++
			}
		}
		if !slices.Contains(outs, l.preOut) {
			outs = append(outs, l.preOut)
		}
	}
	var s []string
	for op, k := range ops {
		s = append(s, fmt.Sprintf("%s x%d", op, k))
	}
	slices.Sort(s)
	return fmt.Sprintf("%d nodes (%s), %d id tensor(s) out", len(nodes), strings.Join(s, ", "), len(outs))
}

// preOperandsOK says why an integer op could fail on some ids ("" when
// it cannot): a division by a value a request chooses (an integer
// division by zero stops the process, it is no error ONNX Runtime
// returns), or a shift by one not known to be within 0..63.
func preOperandsOK(g *Graph, n *pb.NodeProto) string {
	op := n.GetOpType()
	if (op != "Div" && op != "Mod" && op != "BitShift") || len(n.GetInput()) != 2 {
		return ""
	}
	what := "divisor"
	if op == "BitShift" {
		what = "shift"
	}
	v, _, ok := g.constTensor(n.GetInput()[1])
	if !ok {
		return fmt.Sprintf("its %s %q is not a constant", what, n.GetInput()[1])
	}
	for _, x := range v {
		if op != "BitShift" && x == 0 {
			return "divisor 0"
		}
		if op == "BitShift" && (x < 0 || x > 63) {
			return fmt.Sprintf("shift %d outside 0..63", x)
		}
	}
	return ""
}
