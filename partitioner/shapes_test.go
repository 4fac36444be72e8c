package partitioner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestInferShapesDataDriven runs testdata/shapes/*: one small graph per
// block, written in the text form below, and the type InferShapes gives
// every node output. Regenerate with
//
//	go test ./partitioner/ -run TestInferShapesDataDriven -rewrite
//
// but check each new value against the ONNX operator spec by hand: the
// files are the spec's answer, not a record of what the code does.
//
// A block is
//
//	infer [sample]
//	input  NAME TYPE [DIMS]        graph input; no [DIMS] = no declared shape
//	init   NAME TYPE [DIMS] [= V,V,...] [external]
//	node   OP IN,IN,... -> OUT,OUT,... [ATTR=VAL ...]
//	----
//	OUT: TYPE [DIMS]               one line per node output, in file order
//	OUT: TYPE unknown              (inference gave up)
//	unknown nodes: NAME (OP), ...  the InferShapes report, when not empty
//
// TYPE is an ONNX data type name in any case (float, int64, bool, ...).
// In an input's DIMS an integer is a dim_value and anything else a
// dim_param (symbol), so [N,13] declares a symbolic batch; an empty
// entry ([,4]) is a dimension with neither. In the output, B is the batch
// dimension (DimBatch) and ? a size inference could not fix (DimUnknown).
// Init values (int64 or int32 only) are what Reshape shapes and axes
// inputs are read from; other initializers hold no data. "external"
// marks the data as external (so not readable). A node's IN or OUT "_"
// is an omitted optional one, IN "-" no inputs at all; a node is named
// after its first output. A panic in inference shows as "panic: ...".
//
// ATTR=VAL: 3 is an int, 1.5 a float, [1,-2] ints, [1.5] floats,
// TYPE[DIMS] or TYPE[DIMS]{V,...} a tensor (Constant's value), and a bare
// type name (to=int64) the type's enum number.
//
// "infer sample" adds, per known output, SampleShape, PerSample and
// BytesPerSample (what plan.json is sized from).
func TestInferShapesDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/shapes", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "infer" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			m, err := parseGraph(d.Input)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			return inferText(m, d.HasArg("sample"))
		})
	})
}

func inferText(m *pb.ModelProto, sample bool) (out string) {
	defer func() {
		if r := recover(); r != nil {
			out += fmt.Sprintf("panic: %v\n", r)
		}
	}()
	g, err := NewGraph(m)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	types, unknownNodes := InferShapes(g)
	var b strings.Builder
	for _, n := range m.GetGraph().GetNode() { // file order, not g's topological order
		for _, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			tt := types[o]
			fmt.Fprintf(&b, "%s: %s %s", o, strings.ToLower(tt.Elem.String()), dimsText(tt))
			if sample {
				if tt.Known {
					fmt.Fprintf(&b, " sample=%s", intsText(tt.SampleShape()))
				}
				if n, ok := tt.PerSample(); ok {
					fmt.Fprintf(&b, " per-sample=%d", n)
				}
				if n, ok := tt.BytesPerSample(); ok {
					fmt.Fprintf(&b, " bytes=%d", n)
				}
			}
			b.WriteString("\n")
		}
	}
	if len(unknownNodes) > 0 {
		fmt.Fprintf(&b, "unknown nodes: %s\n", strings.Join(unknownNodes, ", "))
	}
	return b.String()
}

func intsText(v []int64) string {
	s := make([]string, len(v))
	for i, d := range v {
		s[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func dimsText(t TensorType) string {
	if !t.Known {
		return "unknown"
	}
	s := make([]string, len(t.Dims))
	for i, d := range t.Dims {
		switch d {
		case DimBatch:
			s[i] = "B"
		case DimUnknown:
			s[i] = "?"
		default:
			s[i] = strconv.FormatInt(d, 10)
		}
	}
	return "[" + strings.Join(s, ",") + "]"
}

// parseGraph reads the block form documented on TestInferShapesDataDriven.
func parseGraph(text string) (*pb.ModelProto, error) {
	gp := &pb.GraphProto{}
	// body holds the lines of a "body [ATTR]" ... "end" block (nested
	// blocks inside): the last node's subgraph attribute ATTR ("body").
	var body []string
	depth := 0
	// fn holds the lines of a "function DOMAIN NAME IN,... -> OUT,...
	// [ATTR,...]" ... "endfunction" block: a model-local function
	// (FunctionProto) whose nodes are written like the graph's.
	var fn []string
	var funcs []*pb.FunctionProto
	for ln, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if fn != nil {
			if f[0] != "endfunction" {
				fn = append(fn, line)
				continue
			}
			fp, err := parseFunction(fn)
			if err != nil {
				return nil, fmt.Errorf("function ending on line %d: %w", ln+1, err)
			}
			funcs = append(funcs, fp)
			fn = nil
			continue
		}
		if body != nil {
			switch f[0] {
			case "body":
				depth++
			case "end":
				depth--
			}
			if depth > 0 {
				body = append(body, line)
				continue
			}
			sub, err := parseGraph(strings.Join(body[1:], "\n"))
			if err != nil {
				return nil, fmt.Errorf("body ending on line %d: %w", ln+1, err)
			}
			attr := "body"
			if h := strings.Fields(body[0]); len(h) > 1 {
				attr = h[1]
			}
			last := gp.Node[len(gp.Node)-1]
			last.Attribute = append(last.Attribute, &pb.AttributeProto{Name: attr, Type: pb.AttributeProto_GRAPH, G: sub.Graph})
			body = nil
			continue
		}
		var err error
		switch f[0] {
		case "body":
			if len(gp.Node) == 0 {
				return nil, fmt.Errorf("line %d: body before any node", ln+1)
			}
			body, depth = []string{line}, 1
			continue
		case "function":
			fn = []string{line}
			continue
		case "input":
			err = parseInput(gp, f[1:])
		case "output":
			// Declared like an input (used by testdata/recognise).
			tmp := &pb.GraphProto{}
			if err = parseInput(tmp, f[1:]); err == nil {
				gp.Output = append(gp.Output, tmp.Input...)
			}
		case "init":
			err = parseInit(gp, f[1:])
		case "node":
			err = parseNode(gp, f[1:])
		default:
			err = fmt.Errorf("unknown line kind %q", f[0])
		}
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %w", ln+1, line, err)
		}
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: gp, Functions: funcs}
	for _, fp := range funcs {
		if !slices.ContainsFunc(m.OpsetImport, func(o *pb.OperatorSetIdProto) bool { return o.GetDomain() == fp.GetDomain() }) {
			m.OpsetImport = append(m.OpsetImport, &pb.OperatorSetIdProto{Domain: fp.GetDomain(), Version: 1})
		}
	}
	return m, nil
}

// parseFunction parses a "function DOMAIN NAME IN,... -> OUT,...
// [ATTR,...]" block (its header line first, "endfunction" left off):
// the function imports opset 18 of the default domain.
func parseFunction(lines []string) (*pb.FunctionProto, error) {
	h := strings.Fields(lines[0])
	if len(h) < 6 || len(h) > 7 || h[4] != "->" {
		return nil, fmt.Errorf("want function DOMAIN NAME IN,... -> OUT,... [ATTR,...]")
	}
	body, err := parseGraph(strings.Join(lines[1:], "\n"))
	if err != nil {
		return nil, err
	}
	fp := &pb.FunctionProto{
		Domain:      h[1],
		Name:        h[2],
		Input:       strings.Split(h[3], ","),
		Output:      strings.Split(h[5], ","),
		Node:        body.Graph.Node,
		OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}},
	}
	if len(h) == 7 {
		fp.Attribute = strings.Split(h[6], ",")
	}
	for _, n := range fp.Node {
		if d := n.GetDomain(); d != "" && !slices.ContainsFunc(fp.OpsetImport, func(o *pb.OperatorSetIdProto) bool { return o.GetDomain() == d }) {
			fp.OpsetImport = append(fp.OpsetImport, &pb.OperatorSetIdProto{Domain: d, Version: 1})
		}
	}
	for _, sub := range body.Functions {
		return nil, fmt.Errorf("function %s inside function %s", sub.GetName(), fp.Name)
	}
	return fp, nil
}

func parseType(s string) (pb.TensorProto_DataType, error) {
	v, ok := pb.TensorProto_DataType_value[strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("unknown data type %q", s)
	}
	return pb.TensorProto_DataType(v), nil
}

// bracketed splits "[a,b]" into its entries; "[]" is none.
func bracketed(s string) ([]string, error) {
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return nil, fmt.Errorf("want [...], got %q", s)
	}
	s = s[1 : len(s)-1]
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, ","), nil
}

func parseInts(ss []string) ([]int64, error) {
	out := make([]int64, len(ss))
	for i, s := range ss {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func parseInput(gp *pb.GraphProto, f []string) error {
	if len(f) < 2 || len(f) > 3 {
		return fmt.Errorf("want NAME TYPE [DIMS]")
	}
	if f[1] == "-" && len(f) == 2 {
		// No type given (a Loop's sequence state, which the proto
		// subset has no type for): ONNX Runtime infers it.
		gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: f[0]})
		return nil
	}
	elem, err := parseType(f[1])
	if err != nil {
		return err
	}
	tt := &pb.TypeProto_Tensor{ElemType: int32(elem)}
	if len(f) == 3 {
		dims, err := bracketed(f[2])
		if err != nil {
			return err
		}
		tt.Shape = &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{}}
		for _, d := range dims {
			dim := &pb.TensorShapeProto_Dimension{}
			if v, err := strconv.ParseInt(d, 10, 64); err == nil {
				dim.Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: v}
			} else if d != "" {
				dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: d}
			}
			tt.Shape.Dim = append(tt.Shape.Dim, dim)
		}
	}
	gp.Input = append(gp.Input, &pb.ValueInfoProto{Name: f[0], Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: tt}}})
	return nil
}

func parseInit(gp *pb.GraphProto, f []string) error {
	if len(f) < 3 {
		return fmt.Errorf("want NAME TYPE [DIMS] [= V,...] [external]")
	}
	t, err := parseTensor(f[1], f[2])
	if err != nil {
		return err
	}
	t.Name = f[0]
	rest := f[3:]
	if len(rest) >= 2 && rest[0] == "=" {
		if err := setInts(t, strings.Split(rest[1], ",")); err != nil {
			return err
		}
		rest = rest[2:]
	}
	if len(rest) == 1 && rest[0] == "external" {
		t.DataLocation = pb.TensorProto_EXTERNAL
		rest = nil
	}
	if len(rest) != 0 {
		return fmt.Errorf("unexpected %q", rest)
	}
	gp.Initializer = append(gp.Initializer, t)
	return nil
}

// parseTensor makes a data-less tensor of type typ and dims "[...]".
func parseTensor(typ, dims string) (*pb.TensorProto, error) {
	elem, err := parseType(typ)
	if err != nil {
		return nil, err
	}
	ds, err := bracketed(dims)
	if err != nil {
		return nil, err
	}
	d, err := parseInts(ds)
	if err != nil {
		return nil, err
	}
	return &pb.TensorProto{DataType: int32(elem), Dims: d}, nil
}

func setInts(t *pb.TensorProto, ss []string) error {
	v, err := parseInts(ss)
	if err != nil {
		return err
	}
	switch pb.TensorProto_DataType(t.GetDataType()) {
	case pb.TensorProto_INT64:
		t.Int64Data = v
	case pb.TensorProto_INT32, pb.TensorProto_BOOL:
		for _, x := range v {
			t.Int32Data = append(t.Int32Data, int32(x))
		}
	case pb.TensorProto_FLOAT:
		for _, x := range v {
			t.FloatData = append(t.FloatData, float32(x))
		}
	default:
		return fmt.Errorf("values only for int64, int32, bool and float tensors")
	}
	return nil
}

func parseNode(gp *pb.GraphProto, f []string) error {
	if len(f) < 4 || f[2] != "->" {
		return fmt.Errorf("want OP IN,... -> OUT,... [ATTR=VAL ...]")
	}
	names := func(s string) []string {
		out := strings.Split(s, ",")
		for i, n := range out {
			if n == "_" {
				out[i] = ""
			}
		}
		return out
	}
	n := &pb.NodeProto{OpType: f[0], Input: names(f[1]), Output: names(f[3])}
	// DOMAIN::OP: an op of another domain (a model-local function's).
	if d, op, ok := strings.Cut(f[0], "::"); ok {
		n.Domain, n.OpType = d, op
	}
	if f[1] == "-" {
		n.Input = nil
	}
	n.Name = n.Output[0]
	for _, a := range f[4:] {
		attr, err := parseAttr(a)
		if err != nil {
			return err
		}
		n.Attribute = append(n.Attribute, attr)
	}
	gp.Node = append(gp.Node, n)
	return nil
}

func parseAttr(s string) (*pb.AttributeProto, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok {
		return nil, fmt.Errorf("attribute %q: want NAME=VALUE", s)
	}
	a := &pb.AttributeProto{Name: name}
	// @REF:TYPE: a reference to the enclosing function's attribute REF.
	if ref, ok := strings.CutPrefix(val, "@"); ok {
		ref, typ, _ := strings.Cut(ref, ":")
		v, ok := pb.AttributeProto_AttributeType_value[strings.ToUpper(typ)]
		if !ok {
			return nil, fmt.Errorf("attribute %q: want @REF:TYPE (int, ints, float, string, ...)", s)
		}
		a.RefAttrName, a.Type = ref, pb.AttributeProto_AttributeType(v)
		return a, nil
	}
	if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
		a.Type, a.S = pb.AttributeProto_STRING, []byte(val[1:len(val)-1])
		return a, nil
	}
	if v, err := strconv.ParseInt(val, 10, 64); err == nil {
		a.Type, a.I = pb.AttributeProto_INT, v
		return a, nil
	}
	if v, err := strconv.ParseFloat(val, 32); err == nil {
		a.Type, a.F = pb.AttributeProto_FLOAT, float32(v)
		return a, nil
	}
	if elem, err := parseType(val); err == nil {
		a.Type, a.I = pb.AttributeProto_INT, int64(elem)
		return a, nil
	}
	if typ, rest, ok := strings.Cut(val, "["); ok && typ != "" {
		dims, data, _ := strings.Cut(rest, "]")
		t, err := parseTensor(typ, "["+dims+"]")
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", s, err)
		}
		if data != "" {
			if !strings.HasPrefix(data, "{") || !strings.HasSuffix(data, "}") {
				return nil, fmt.Errorf("attribute %q: want {V,...} after the dims", s)
			}
			if err := setInts(t, strings.Split(data[1:len(data)-1], ",")); err != nil {
				return nil, fmt.Errorf("attribute %q: %w", s, err)
			}
		}
		a.Type, a.T = pb.AttributeProto_TENSOR, t
		return a, nil
	}
	vals, err := bracketed(val)
	if err != nil {
		return nil, fmt.Errorf("attribute %q: %w", s, err)
	}
	if ints, err := parseInts(vals); err == nil {
		a.Type, a.Ints = pb.AttributeProto_INTS, ints
		return a, nil
	}
	a.Type = pb.AttributeProto_FLOATS
	for _, v := range vals {
		x, err := strconv.ParseFloat(v, 32)
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", s, err)
		}
		a.Floats = append(a.Floats, float32(x))
	}
	return a, nil
}
