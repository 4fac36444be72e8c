package partitioner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Model-local functions (ModelProto.functions, FunctionProto) are what
// torch.onnx.export(..., dynamo=True, optimize=False) writes for the
// torchlib ops that are ONNX Script functions and not traced
// (pkg.onnxscript.torch_lib's aten_amax, _aten_embedding_bag_onnx, ...)
// and what the TorchScript exporter writes with
// export_modules_as_functions (a function per module class). ONNX
// Runtime runs them; the partitioner, which reads standard ops only,
// inlines every call of one first, as onnx.inliner.inline_local_functions
// does: the call is replaced by the function's nodes, its formal inputs
// and outputs renamed to the call's, every other name prefixed, every
// attribute reference (ref_attr_name) replaced by the call's attribute
// or the function's default (and left off when neither is given).

// maxInlineDepth bounds calls within calls (a function calling itself,
// which ONNX forbids, would not end).
const maxInlineDepth = 32

// funcKey names a function: its domain, name and overload.
type funcKey struct{ domain, name, overload string }

// inlineFunctions inlines every call of m's local functions, in its
// graph and in the subgraphs of its nodes, and drops the functions and
// the opset imports only they used. A model without functions is left
// as it is.
func inlineFunctions(m *pb.ModelProto) error {
	if len(m.GetFunctions()) == 0 {
		return nil
	}
	funcs := map[funcKey]*pb.FunctionProto{}
	modelOpsets := map[string]int64{}
	for _, o := range m.GetOpsetImport() {
		modelOpsets[normDomain(o.GetDomain())] = o.GetVersion()
	}
	for _, f := range m.GetFunctions() {
		k := funcKey{f.GetDomain(), f.GetName(), f.GetOverload()}
		if _, dup := funcs[k]; dup {
			return fmt.Errorf("local function %s is defined twice", funcName(f))
		}
		funcs[k] = f
		// Inlined, the function's nodes run under the model's opsets.
		for _, o := range f.GetOpsetImport() {
			d := normDomain(o.GetDomain())
			if v, ok := modelOpsets[d]; ok && v != o.GetVersion() {
				return fmt.Errorf("local function %s imports opset %d of domain %q and the model opset %d: the partitioner inlines local functions and cannot run one under another opset; export with the function inlined (torch.onnx.export(..., dynamo=True) with optimize=True, or onnx.inliner.inline_local_functions)", funcName(f), o.GetVersion(), o.GetDomain(), v)
			}
		}
	}
	in := &inliner{funcs: funcs, used: map[string]bool{}}
	in.collect(m.GetGraph())
	for _, f := range m.GetFunctions() {
		in.collectNodes(f.GetNode())
	}
	nodes, err := in.nodes(m.GetGraph().GetNode(), 0)
	if err != nil {
		return err
	}
	m.Graph.Node = nodes
	foldConstantIfs(m.Graph)
	fdomains := map[string]bool{}
	for k := range funcs {
		fdomains[k.domain] = true
	}
	m.Functions = nil
	for _, f := range funcs {
		for _, o := range f.GetOpsetImport() {
			d := normDomain(o.GetDomain())
			if _, ok := modelOpsets[d]; !ok {
				m.OpsetImport = append(m.OpsetImport, &pb.OperatorSetIdProto{Domain: o.GetDomain(), Version: o.GetVersion()})
				modelOpsets[d] = o.GetVersion()
			}
		}
	}
	// The functions' domains stay imported while a node still uses them
	// (a call of a function the model does not define: NewGraph names it).
	usedDomains := map[string]bool{}
	var walk func(ns []*pb.NodeProto)
	walk = func(ns []*pb.NodeProto) {
		for _, n := range ns {
			usedDomains[n.GetDomain()] = true
			for _, a := range n.GetAttribute() {
				for _, b := range attrBodies(a) {
					walk(b.GetNode())
				}
			}
		}
	}
	walk(m.GetGraph().GetNode())
	m.OpsetImport = slices.DeleteFunc(m.OpsetImport, func(o *pb.OperatorSetIdProto) bool {
		return fdomains[o.GetDomain()] && !usedDomains[o.GetDomain()]
	})
	return nil
}

// normDomain is the default domain's one name ("" and "ai.onnx").
func normDomain(d string) string {
	if d == "ai.onnx" {
		return ""
	}
	return d
}

func funcName(f *pb.FunctionProto) string {
	s := f.GetDomain() + "::" + f.GetName()
	if f.GetOverload() != "" {
		s += ":" + f.GetOverload()
	}
	return s
}

type inliner struct {
	funcs map[funcKey]*pb.FunctionProto
	// used is every name of the model, so prefixed names are new.
	used  map[string]bool
	calls int
}

func (in *inliner) collect(g *pb.GraphProto) {
	for _, v := range g.GetInput() {
		in.used[v.GetName()] = true
	}
	for _, v := range g.GetOutput() {
		in.used[v.GetName()] = true
	}
	for _, t := range g.GetInitializer() {
		in.used[t.GetName()] = true
	}
	in.collectNodes(g.GetNode())
}

func (in *inliner) collectNodes(ns []*pb.NodeProto) {
	for _, n := range ns {
		in.used[n.GetName()] = true
		for _, s := range n.GetInput() {
			in.used[s] = true
		}
		for _, s := range n.GetOutput() {
			in.used[s] = true
		}
		for _, a := range n.GetAttribute() {
			for _, b := range attrBodies(a) {
				in.collect(b)
			}
		}
	}
}

// nodes returns ns with every call of a local function inlined, in the
// subgraphs of ns too.
func (in *inliner) nodes(ns []*pb.NodeProto, depth int) ([]*pb.NodeProto, error) {
	var out []*pb.NodeProto
	for _, n := range ns {
		f, ok := in.funcs[funcKey{n.GetDomain(), n.GetOpType(), n.GetOverload()}]
		if !ok {
			for _, a := range n.GetAttribute() {
				for _, b := range attrBodies(a) {
					sub, err := in.nodes(b.GetNode(), depth)
					if err != nil {
						return nil, err
					}
					b.Node = sub
				}
			}
			out = append(out, n)
			continue
		}
		if depth >= maxInlineDepth {
			return nil, fmt.Errorf("local function %s is called more than %d calls deep (a function calling itself, which ONNX does not allow?)", funcName(f), maxInlineDepth)
		}
		body, err := in.expand(n, f)
		if err != nil {
			return nil, err
		}
		body, err = in.nodes(body, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, body...)
	}
	return out, nil
}

// expand returns the nodes of f for the call n: copies, renamed.
func (in *inliner) expand(n *pb.NodeProto, f *pb.FunctionProto) ([]*pb.NodeProto, error) {
	if len(n.GetInput()) > len(f.GetInput()) {
		return nil, fmt.Errorf("node %q calls local function %s with %d inputs; it takes %d", n.GetName(), funcName(f), len(n.GetInput()), len(f.GetInput()))
	}
	if len(n.GetOutput()) > len(f.GetOutput()) {
		return nil, fmt.Errorf("node %q calls local function %s for %d outputs; it has %d", n.GetName(), funcName(f), len(n.GetOutput()), len(f.GetOutput()))
	}
	prefix := ""
	for {
		in.calls++
		prefix = fmt.Sprintf("%s/%s.%d/", n.GetName(), f.GetName(), in.calls)
		if !slices.ContainsFunc(f.GetNode(), func(x *pb.NodeProto) bool { return in.clashes(prefix, x) }) {
			break
		}
	}
	rename := map[string]string{}
	for i, s := range f.GetInput() {
		rename[s] = ""
		if i < len(n.GetInput()) {
			rename[s] = n.GetInput()[i]
		}
	}
	var out []*pb.NodeProto
	for i, s := range f.GetOutput() {
		actual := ""
		if i < len(n.GetOutput()) {
			actual = n.GetOutput()[i]
		}
		if actual == "" {
			continue // unused: the body's name, prefixed
		}
		if src, isInput := rename[s]; isInput {
			// The function returns an input as it is.
			if src == "" {
				return nil, fmt.Errorf("node %q calls local function %s, which returns its input %q, without it", n.GetName(), funcName(f), s)
			}
			out = append(out, &pb.NodeProto{Name: prefix + "return_" + s, OpType: "Identity", Input: []string{src}, Output: []string{actual}})
			continue
		}
		rename[s] = actual
	}
	attrs := map[string]*pb.AttributeProto{}
	for _, a := range f.GetAttributeProto() {
		attrs[a.GetName()] = a
	}
	for _, a := range n.GetAttribute() {
		if !slices.Contains(f.GetAttribute(), a.GetName()) && attrs[a.GetName()] == nil {
			return nil, fmt.Errorf("node %q calls local function %s with attribute %q, which it does not take", n.GetName(), funcName(f), a.GetName())
		}
		attrs[a.GetName()] = a
	}
	name := func(s string) string {
		if s == "" {
			return ""
		}
		if r, ok := rename[s]; ok {
			return r
		}
		return prefix + s
	}
	for _, x := range f.GetNode() {
		c := proto.Clone(x).(*pb.NodeProto)
		renameNode(c, prefix, name, attrs)
		out = append(out, c)
	}
	return out, nil
}

// clashes says whether a name of x (its subgraphs' included) prefixed
// is a name the model has.
func (in *inliner) clashes(prefix string, x *pb.NodeProto) bool {
	if in.used[prefix+x.GetName()] {
		return true
	}
	for _, s := range append(slices.Clone(x.GetInput()), x.GetOutput()...) {
		if s != "" && in.used[prefix+s] {
			return true
		}
	}
	for _, a := range x.GetAttribute() {
		for _, b := range attrBodies(a) {
			if slices.ContainsFunc(b.GetNode(), func(y *pb.NodeProto) bool { return in.clashes(prefix, y) }) {
				return true
			}
		}
	}
	return false
}

// renameNode renames c's values (its subgraphs' too) by name, prefixes
// node names, and replaces its attribute references by attrs, dropping
// those attrs lacks.
func renameNode(c *pb.NodeProto, prefix string, name func(string) string, attrs map[string]*pb.AttributeProto) {
	if c.Name != "" {
		c.Name = prefix + c.Name
	}
	for i, s := range c.Input {
		c.Input[i] = name(s)
	}
	for i, s := range c.Output {
		c.Output[i] = name(s)
	}
	kept := c.Attribute[:0]
	for _, a := range c.Attribute {
		if ref := a.GetRefAttrName(); ref != "" {
			v, ok := attrs[ref]
			if !ok {
				continue // neither given nor defaulted: the op's default
			}
			// The call's value: a graph the call gives is in the
			// caller's scope, and keeps its names.
			r := proto.Clone(v).(*pb.AttributeProto)
			r.Name, r.RefAttrName = a.GetName(), ""
			if c.GetOpType() == "Constant" && c.GetDomain() == "" {
				r = constantValue(r)
			}
			kept = append(kept, r)
			continue
		}
		for _, b := range attrBodies(a) {
			renameGraph(b, prefix, name, attrs)
		}
		kept = append(kept, a)
	}
	c.Attribute = kept
}

func renameGraph(g *pb.GraphProto, prefix string, name func(string) string, attrs map[string]*pb.AttributeProto) {
	for _, v := range g.GetInput() {
		v.Name = name(v.GetName())
	}
	for _, v := range g.GetOutput() {
		v.Name = name(v.GetName())
	}
	for _, v := range g.GetValueInfo() {
		v.Name = name(v.GetName())
	}
	for _, t := range g.GetInitializer() {
		t.Name = name(t.GetName())
	}
	for _, n := range g.GetNode() {
		renameNode(n, prefix, name, attrs)
	}
}

// localFunctionHint says, for a node of a domain the model imports but
// does not define as a function, that it looks like a torch exporter's
// function.
func localFunctionHint(n *pb.NodeProto) string {
	if strings.HasPrefix(n.GetDomain(), "pkg.") {
		return " (a call of a local function the model does not define: export again with torch.onnx.export(..., dynamo=True) and optimize=True, which inlines functions)"
	}
	return ""
}

// foldConstantIfs replaces every If whose condition is known from
// Constant nodes (an inlined ONNX Script function's Python if on an
// attribute: If(Equal(Constant(@mode), Constant(0)))) by the nodes of the
// branch it takes, in g and in the subgraphs of its nodes, and drops the
// Constants and comparisons that computed only conditions. What the
// model computes is unchanged: it is what ONNX Runtime runs.
func foldConstantIfs(g *pb.GraphProto) {
	g.Node = foldIfs(g.GetNode(), map[string]int64{}, graphOutputSet(g))
}

// graphOutputSet is the set of g's output names.
func graphOutputSet(g *pb.GraphProto) map[string]bool {
	out := map[string]bool{}
	for _, o := range g.GetOutput() {
		out[o.GetName()] = true
	}
	return out
}

// foldIfs folds the Ifs of ns (outer: the values known from enclosing
// scopes); keep is what is read beside ns's nodes (the graph's outputs),
// so a condition's node making one stays.
func foldIfs(ns []*pb.NodeProto, outer map[string]int64, keep map[string]bool) []*pb.NodeProto {
	known := maps.Clone(outer)
	producer := map[string]*pb.NodeProto{}
	var out []*pb.NodeProto
	conds := map[*pb.NodeProto]bool{}
	for _, n := range ns {
		if n.GetOpType() == "If" && n.GetDomain() == "" && len(n.GetInput()) == 1 {
			if v, ok := known[n.GetInput()[0]]; ok {
				branch := "else_branch"
				if v != 0 {
					branch = "then_branch"
				}
				var b *pb.GraphProto
				for _, a := range n.GetAttribute() {
					if a.GetName() == branch {
						b = a.GetG()
					}
				}
				if b != nil && len(b.GetOutput()) == len(n.GetOutput()) && len(b.GetInitializer()) == 0 {
					if p := producer[n.GetInput()[0]]; p != nil {
						conds[p] = true
					}
					// What only the branch not taken read goes too (the
					// Shape of the ids torchlib's embedding bag
					// concatenates to its offsets unless
					// include_last_offset).
					for _, a := range n.GetAttribute() {
						if a.GetName() != branch && a.GetG() != nil {
							for _, name := range freeNames(a.GetG()) {
								if p := producer[name]; p != nil {
									conds[p] = true
								}
							}
						}
					}
					out = append(out, takeBranch(n, b, known)...)
					continue
				}
			}
		}
		for _, a := range n.GetAttribute() {
			for _, b := range attrBodies(a) {
				b.Node = foldIfs(b.GetNode(), known, graphOutputSet(b))
			}
		}
		if v, ok := constScalar(n, known); ok {
			known[n.GetOutput()[0]] = v
		}
		for _, o := range n.GetOutput() {
			producer[o] = n
		}
		out = append(out, n)
	}
	// The conditions' nodes (and those the branches not taken read)
	// nothing else reads, and what only they read.
	for len(conds) > 0 {
		read := maps.Clone(keep)
		for _, n := range out {
			for _, s := range n.GetInput() {
				read[s] = true
			}
			for _, s := range outerReads(n) {
				read[s] = true
			}
		}
		next := map[*pb.NodeProto]bool{}
		out = slices.DeleteFunc(out, func(n *pb.NodeProto) bool {
			if !conds[n] || slices.ContainsFunc(n.GetOutput(), func(o string) bool { return o != "" && read[o] }) {
				return false
			}
			for _, s := range append(slices.Clone(n.GetInput()), outerReads(n)...) {
				if p := producer[s]; p != nil {
					next[p] = true
				}
			}
			return true
		})
		conds = next
	}
	return out
}

// constOps are the ops constScalar computes.
var constOps = map[string]bool{"Equal": true, "Not": true, "Cast": true, "Identity": true}

// takeBranch is the nodes of branch b of If n: its outputs renamed to
// n's (an Identity for one the branch passes through from outside).
func takeBranch(n *pb.NodeProto, b *pb.GraphProto, known map[string]int64) []*pb.NodeProto {
	rename := map[string]string{}
	produced := map[string]bool{}
	for _, x := range b.GetNode() {
		for _, o := range x.GetOutput() {
			produced[o] = true
		}
	}
	var tail []*pb.NodeProto
	for i, o := range b.GetOutput() {
		want := n.GetOutput()[i]
		if want == "" {
			continue
		}
		if _, twice := rename[o.GetName()]; produced[o.GetName()] && !twice {
			rename[o.GetName()] = want
			continue
		}
		tail = append(tail, &pb.NodeProto{Name: n.GetName() + "/" + want, OpType: "Identity", Input: []string{o.GetName()}, Output: []string{want}})
	}
	nodes := slices.Clone(b.GetNode())
	renameValues(nodes, rename)
	for _, t := range tail {
		if r, ok := rename[t.Input[0]]; ok {
			t.Input[0] = r
		}
	}
	// What the enclosing scope reads of the branch's nodes is the If's
	// outputs (renamed above) and what the tail passes on.
	keep := map[string]bool{}
	for _, o := range n.GetOutput() {
		keep[o] = true
	}
	for _, t := range tail {
		keep[t.Input[0]] = true
	}
	return append(foldIfs(nodes, known, keep), tail...)
}

// renameValues renames the values ns (and their subgraphs) read and
// write by rename.
func renameValues(ns []*pb.NodeProto, rename map[string]string) {
	for _, x := range ns {
		for i, s := range x.Input {
			if r, ok := rename[s]; ok {
				x.Input[i] = r
			}
		}
		for i, s := range x.Output {
			if r, ok := rename[s]; ok {
				x.Output[i] = r
			}
		}
		for _, a := range x.GetAttribute() {
			for _, b := range attrBodies(a) {
				renameValues(b.GetNode(), rename)
				for _, o := range b.GetOutput() {
					if r, ok := rename[o.GetName()]; ok {
						o.Name = r
					}
				}
			}
		}
	}
}

// constScalar is the value of n's one output when it is a scalar (or
// one-element) integer or bool Constant, or a comparison, Not, Cast or
// Identity of known ones.
func constScalar(n *pb.NodeProto, known map[string]int64) (int64, bool) {
	if n.GetDomain() != "" || len(n.GetOutput()) != 1 {
		return 0, false
	}
	arg := func(i int) (int64, bool) {
		if i >= len(n.GetInput()) {
			return 0, false
		}
		v, ok := known[n.GetInput()[i]]
		return v, ok
	}
	switch n.GetOpType() {
	case "Constant":
		if len(n.GetAttribute()) != 1 {
			return 0, false
		}
		a := n.GetAttribute()[0]
		switch a.GetName() {
		case "value_int":
			return a.GetI(), true
		case "value_ints":
			if len(a.GetInts()) == 1 {
				return a.GetInts()[0], true
			}
		case "value":
			t := a.GetT()
			if t.GetDataLocation() == pb.TensorProto_EXTERNAL || len(t.GetRawData()) > 0 {
				return 0, false
			}
			// int32_data also holds float16, bfloat16 and float8 values
			// as their bits: only the integer and bool types are read.
			switch pb.TensorProto_DataType(t.GetDataType()) {
			case pb.TensorProto_INT64:
				if len(t.GetInt64Data()) == 1 {
					return t.GetInt64Data()[0], true
				}
			case pb.TensorProto_INT32, pb.TensorProto_INT16, pb.TensorProto_INT8, pb.TensorProto_UINT16, pb.TensorProto_UINT8, pb.TensorProto_BOOL:
				if len(t.GetInt32Data()) == 1 {
					return int64(t.GetInt32Data()[0]), true
				}
			}
		}
	case "Equal":
		a, ok1 := arg(0)
		b, ok2 := arg(1)
		if ok1 && ok2 && len(n.GetInput()) == 2 {
			if a == b {
				return 1, true
			}
			return 0, true
		}
	case "Not":
		if a, ok := arg(0); ok {
			if a == 0 {
				return 1, true
			}
			return 0, true
		}
	case "Cast":
		a, ok := arg(0)
		switch pb.TensorProto_DataType(attrInt(n, "to", 0)) {
		case pb.TensorProto_BOOL:
			if ok && a != 0 {
				return 1, true
			}
			return 0, ok
		case pb.TensorProto_INT64, pb.TensorProto_INT32:
			return a, ok
		}
	case "Identity":
		return arg(0)
	}
	return 0, false
}

// constantValue is a Constant's value_int or value_float attribute as
// its value tensor: the proto3 subset writes no zero scalar, and ONNX
// Runtime refuses a value_int without its value ("Attribute 'value_int'
// expect an integer"), which mode=0 (sum) of torchlib's EmbeddingBag
// would be once inlined.
func constantValue(a *pb.AttributeProto) *pb.AttributeProto {
	switch a.GetName() {
	case "value_int":
		return &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: &pb.TensorProto{DataType: int32(pb.TensorProto_INT64), Int64Data: []int64{a.GetI()}}}
	case "value_float":
		return &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: &pb.TensorProto{DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{a.GetF()}}}
	}
	return a
}
