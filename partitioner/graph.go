package partitioner

import (
	"fmt"
	"slices"
	"strings"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Graph is an ONNX graph indexed for partitioning: who produces and who
// consumes every tensor, in a topological order.
type Graph struct {
	Model *pb.ModelProto
	// Nodes in topological order.
	Nodes []*pb.NodeProto
	// Inits are the initializers by name (external data not loaded).
	Inits map[string]*pb.TensorProto
	// Inputs are the graph inputs that are not initializers, in order.
	Inputs []*pb.ValueInfoProto
	// Outputs are the graph outputs.
	Outputs []*pb.ValueInfoProto
	// Producer maps a tensor to the index (in Nodes) of the node that
	// makes it.
	Producer map[string]int
	// Consumers maps a tensor to the indices of nodes that read it.
	Consumers map[string][]int
	// FixedBatch, when not 0, is the batch size a graph exported with
	// a fixed batch stays at (Debatch found nodes that keep it): shape
	// inference takes a dimension of that size meeting the batch in a
	// broadcast as the batch.
	FixedBatch int64
	// Implicit are, per node index, the outer names its subgraphs (If
	// branches, Loop and Scan bodies, nested too) read without declaring
	// them: inputs of the node as much as its own, for the order, the
	// consumers and the side that must provide them.
	Implicit map[int][]string
	inputSet map[string]bool
	// Dir is the model's folder, against which tensors stored as
	// external data resolve when the partitioner reads their values
	// (a row mask's, rowmask.go); "" reads none.
	Dir string
	// masks caches maskRows by mask tensor (nil: not a row mask).
	masks map[*pb.TensorProto]rowFactors
}

// NewGraph indexes m's graph and checks it: every node input must be a
// graph input, an initializer or another node's output (no dangling
// inputs), each tensor has one producer, and there is no cycle.
func NewGraph(m *pb.ModelProto) (*Graph, error) {
	gp := m.GetGraph()
	g := &Graph{
		Model:     m,
		Inits:     map[string]*pb.TensorProto{},
		Producer:  map[string]int{},
		Consumers: map[string][]int{},
		inputSet:  map[string]bool{},
		Outputs:   gp.GetOutput(),
	}
	for _, t := range gp.GetInitializer() {
		g.Inits[t.GetName()] = t
	}
	for _, in := range gp.GetInput() {
		if _, ok := g.Inits[in.GetName()]; ok {
			continue
		}
		g.Inputs = append(g.Inputs, in)
		g.inputSet[in.GetName()] = true
	}
	nodes := gp.GetNode()
	producer := map[string]int{}
	for i, n := range nodes {
		if n.GetDomain() != "" && n.GetDomain() != "ai.onnx" {
			return nil, fmt.Errorf("node %q: operator domain %q is not supported (standard ONNX ops only)%s%s", nodeName(n, i), n.GetDomain(), domainHint(n), localFunctionHint(n))
		}
		for _, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			if j, dup := producer[o]; dup {
				return nil, fmt.Errorf("tensor %q is produced by two nodes, %q and %q", o, nodeName(nodes[j], j), nodeName(n, i))
			}
			if g.inputSet[o] || g.Inits[o] != nil {
				return nil, fmt.Errorf("node %q overwrites graph input or initializer %q", nodeName(n, i), o)
			}
			producer[o] = i
		}
	}
	implicit := make([][]string, len(nodes))
	reads := func(i int) []string { return append(slices.Clone(nodes[i].GetInput()), implicit[i]...) }
	for i, n := range nodes {
		for _, in := range outerReads(n) {
			if !slices.Contains(n.GetInput(), in) {
				implicit[i] = append(implicit[i], in)
			}
		}
		for _, in := range reads(i) {
			if in == "" {
				continue // an omitted optional input
			}
			if _, ok := producer[in]; !ok && !g.inputSet[in] && g.Inits[in] == nil {
				return nil, fmt.Errorf("node %q reads %q, which no node, input or initializer provides (dangling input)", nodeName(n, i), in)
			}
		}
	}
	for _, o := range g.Outputs {
		if _, ok := producer[o.GetName()]; !ok && !g.inputSet[o.GetName()] {
			return nil, fmt.Errorf("graph output %q is not produced by any node", o.GetName())
		}
	}
	// Kahn's algorithm; a cycle leaves nodes unvisited.
	indeg := make([]int, len(nodes))
	for i := range nodes {
		for _, in := range reads(i) {
			if _, ok := producer[in]; ok {
				indeg[i]++
			}
		}
	}
	readers := map[string][]int{}
	for i := range nodes {
		for _, in := range reads(i) {
			readers[in] = append(readers[in], i)
		}
	}
	var queue, order []int
	for i := range nodes {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		order = append(order, i)
		for _, o := range nodes[i].GetOutput() {
			for _, j := range readers[o] {
				indeg[j]--
				if indeg[j] == 0 {
					queue = append(queue, j)
				}
			}
		}
	}
	if len(order) != len(nodes) {
		var stuck []string
		for i := range nodes {
			if indeg[i] > 0 {
				stuck = append(stuck, nodeName(nodes[i], i))
				if len(stuck) == 5 {
					break
				}
			}
		}
		return nil, fmt.Errorf("graph has a cycle through nodes %s", strings.Join(stuck, ", "))
	}
	g.Implicit = map[int][]string{}
	for k, i := range order {
		g.Nodes = append(g.Nodes, nodes[i])
		if len(implicit[i]) > 0 {
			g.Implicit[k] = implicit[i]
		}
	}
	for i, n := range g.Nodes {
		if n.GetName() == "" {
			n.Name = fmt.Sprintf("%s_%d", n.GetOpType(), i)
		}
		for _, o := range n.GetOutput() {
			if o != "" {
				g.Producer[o] = i
			}
		}
		for _, in := range g.Reads(i) {
			if in != "" {
				g.Consumers[in] = append(g.Consumers[in], i)
			}
		}
	}
	return g, nil
}

// domainHint says, for a com.microsoft op ONNX Runtime's quantization
// tools write, how to write the model with standard ops instead.
func domainHint(n *pb.NodeProto) string {
	if n.GetDomain() != "com.microsoft" {
		return ""
	}
	switch op := n.GetOpType(); {
	case strings.HasPrefix(op, "QLinear"), strings.HasPrefix(op, "QGemm"), strings.HasPrefix(op, "QAttention"), strings.HasPrefix(op, "QEmbedLayerNormalization"),
		op == "DynamicQuantizeMatMul", op == "MatMulIntegerToFloat", op == "QuantizeLinear", op == "DequantizeLinear":
		return fmt.Sprintf(": %s is ONNX Runtime's quantized operator (onnxruntime.quantization's QOperator format, or an optimized model ONNX Runtime saved): quantize with quant_format=QuantFormat.QDQ (standard QuantizeLinear/DequantizeLinear around float ops) and serve the model it writes, not one saved after ONNX Runtime's graph optimizations", op)
	}
	return ""
}

// Reads is every name node i reads: its inputs, then the outer names
// its subgraphs read (Implicit).
func (g *Graph) Reads(i int) []string {
	if len(g.Implicit[i]) == 0 {
		return g.Nodes[i].GetInput()
	}
	return append(slices.Clone(g.Nodes[i].GetInput()), g.Implicit[i]...)
}

// outerReads are the names n's subgraphs read from the scope around n,
// in the order first read.
func outerReads(n *pb.NodeProto) []string {
	var out []string
	seen := map[string]bool{}
	for _, a := range n.GetAttribute() {
		for _, b := range attrBodies(a) {
			for _, name := range freeNames(b) {
				if !seen[name] {
					seen[name] = true
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// attrBodies are the subgraphs an attribute holds (an If branch, a
// Loop or Scan body; GRAPHS lists), in a slice of their own.
func attrBodies(a *pb.AttributeProto) []*pb.GraphProto {
	bodies := slices.Clone(a.GetGraphs())
	if a.GetG() != nil {
		bodies = append(bodies, a.GetG())
	}
	return bodies
}

// freeNames are the names read in body (by its nodes, their own
// subgraphs, or as its outputs) that body does not define.
func freeNames(body *pb.GraphProto) []string {
	local, _ := bodyIndex(body)
	local[""] = true
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		if !local[name] && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	for _, bn := range body.GetNode() {
		for _, in := range bn.GetInput() {
			add(in)
		}
		for _, in := range outerReads(bn) {
			add(in)
		}
	}
	for _, o := range body.GetOutput() {
		add(o.GetName())
	}
	return out
}

// minInputs is how many inputs (an omitted optional one counting, as
// "") the ONNX spec requires of an op at every opset version the
// partitioner reads; the recognisers index them without checking.
// Ops not listed need one, but for those in noInputs.
var minInputs = map[string]int{
	"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Mod": 2, "Pow": 2, "PRelu": 2,
	"Equal": 2, "Greater": 2, "GreaterOrEqual": 2, "Less": 2, "LessOrEqual": 2,
	"And": 2, "Or": 2, "Xor": 2, "BitShift": 2, "BitwiseAnd": 2, "BitwiseOr": 2, "BitwiseXor": 2,
	"CastLike": 2, "Gather": 2, "GatherElements": 2, "GatherND": 2, "Expand": 2,
	"MatMul": 2, "MatMulInteger": 2, "Gemm": 2, "SequenceInsert": 2,
	"Where": 3, "Range": 3, "ScatterElements": 3, "ScatterND": 3,
}

// noInputs are the standard ops that may have no input at all.
var noInputs = map[string]bool{
	"Constant": true, "SequenceEmpty": true, "RandomNormal": true, "RandomUniform": true, "Optional": true, "Loop": true,
}

// modelOpset is the default-domain opset m imports (0 if none).
func modelOpset(m *pb.ModelProto) int64 {
	for _, o := range m.GetOpsetImport() {
		if o.GetDomain() == "" || o.GetDomain() == "ai.onnx" {
			return o.GetVersion()
		}
	}
	return 0
}

// checkArity refuses a node, in gp or any subgraph of it, with fewer
// inputs than its op requires or no output: every recogniser reads a
// node's first output and its required inputs by position.
func checkArity(gp *pb.GraphProto, opset int64, in string) error {
	for i, n := range gp.GetNode() {
		want, ok := minInputs[n.GetOpType()]
		switch d := n.GetDomain(); {
		case d != "" && d != "ai.onnx":
			want = 0 // another domain's op: its arity is its own
		case n.GetOpType() == "Reshape" && opset >= 5:
			want = 2 // the shape is an input from opset 5 on
		case !ok && !noInputs[n.GetOpType()]:
			want = 1
		}
		if len(n.GetInput()) < want {
			return fmt.Errorf("node %q%s: %s takes at least %d inputs, it has %d", nodeName(n, i), in, n.GetOpType(), want, len(n.GetInput()))
		}
		if len(n.GetOutput()) == 0 {
			return fmt.Errorf("node %q%s: %s has no output", nodeName(n, i), in, n.GetOpType())
		}
		for _, a := range n.GetAttribute() {
			for _, b := range attrBodies(a) {
				if err := checkArity(b, opset, fmt.Sprintf(" in the %s of %s %q%s", a.GetName(), n.GetOpType(), nodeName(n, i), in)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func nodeName(n *pb.NodeProto, i int) string {
	if n.GetName() != "" {
		return n.GetName()
	}
	return fmt.Sprintf("#%d (%s)", i, n.GetOpType())
}

// IsInput says whether name is a graph input (not an initializer).
func (g *Graph) IsInput(name string) bool { return g.inputSet[name] }

// Opset is the default-domain opset the model imports.
func (g *Graph) Opset() int64 {
	for _, o := range g.Model.GetOpsetImport() {
		if o.GetDomain() == "" || o.GetDomain() == "ai.onnx" {
			return o.GetVersion()
		}
	}
	return 0
}

// attrInt returns integer attribute name of n, or def.
func attrInt(n *pb.NodeProto, name string, def int64) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetI()
		}
	}
	return def
}

func attrInts(n *pb.NodeProto, name string) ([]int64, bool) {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetInts(), true
		}
	}
	return nil, false
}

// constInts returns the values of an int64 initializer or Constant node
// output (small constants such as axes and shapes).
func (g *Graph) constInts(name string) ([]int64, bool) {
	if t, ok := g.Inits[name]; ok {
		if t.GetDataLocation() == pb.TensorProto_EXTERNAL {
			return nil, false
		}
		v, err := pb.Int64s(t)
		return v, err == nil
	}
	if i, ok := g.Producer[name]; ok && g.Nodes[i].GetOpType() == "Constant" {
		for _, a := range g.Nodes[i].GetAttribute() {
			switch a.GetName() {
			case "value":
				v, err := pb.Int64s(a.GetT())
				return v, err == nil
			case "value_ints":
				return a.GetInts(), true
			case "value_int":
				return []int64{a.GetI()}, true
			}
		}
	}
	return nil, false
}
