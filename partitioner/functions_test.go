package partitioner

import (
	"strconv"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestInlineFunctions inlines model-local functions written in the text
// form of the data-driven tests and checks the graph's nodes (OP
// inputs -> outputs attrs), or the error.
func TestInlineFunctions(t *testing.T) {
	for _, tc := range []struct {
		name, graph string
		// edit changes the parsed model (what the text form cannot say).
		edit func(m *pb.ModelProto)
		want string
	}{{
		name: "attribute reference given",
		graph: `input x float [N,4]
node f::F x -> y alpha=2.5
output y float [N,4]
function f F a -> b alpha
node LeakyRelu a -> b alpha=@alpha:float
endfunction`,
		want: "LeakyRelu x -> y alpha=2.5",
	}, {
		name: "attribute reference neither given nor defaulted is left off",
		graph: `input x float [N,4]
node f::F x -> y
output y float [N,4]
function f F a -> b alpha
node LeakyRelu a -> b alpha=@alpha:float
endfunction`,
		want: "LeakyRelu x -> y",
	}, {
		name: "attribute default",
		graph: `input x float [N,4]
node f::F x -> y
output y float [N,4]
function f F a -> b
node LeakyRelu a -> b alpha=@alpha:float
endfunction`,
		edit: func(m *pb.ModelProto) {
			m.Functions[0].AttributeProto = []*pb.AttributeProto{{Name: "alpha", Type: pb.AttributeProto_FLOAT, F: 0.5}}
		},
		want: "LeakyRelu x -> y alpha=0.5",
	}, {
		name: "nested calls, internal names prefixed, unused output",
		graph: `input x float [N,4]
node f::Outer x -> y,_
output y float [N,4]
function f Outer a -> b,c
node f::Inner a -> t
node Relu t -> b
node Neg t -> c
endfunction
function f Inner p -> q
node Abs p -> q
endfunction`,
		want: "Abs x -> y/Outer.1/t\nRelu y/Outer.1/t -> y\nNeg y/Outer.1/t -> y/Outer.1/c",
	}, {
		name: "a function returning its input",
		graph: `input x float [N,4]
node f::F x -> y,z
output y float [N,4]
output z float [N,4]
function f F a -> a,b
node Relu a -> b
endfunction`,
		want: "Identity x -> y\nRelu x -> z",
	}, {
		name: "a prefixed name the model has is not reused",
		graph: `input x float [N,4]
node Relu x -> y/F.1/t
node f::F y/F.1/t -> y
output y float [N,4]
function f F a -> b
node Abs a -> t
node Neg t -> b
endfunction`,
		want: "Relu x -> y/F.1/t\nAbs y/F.1/t -> y/F.2/t\nNeg y/F.2/t -> y",
	}, {
		name: "calls in a Loop body",
		graph: `input x float [N,4]
input n int64 []
init c bool [] = 1
node Loop n,c -> l
body
input i int64 []
input ci bool []
node Identity ci -> co
node f::F x -> r
output co bool []
output r float [N,4]
end
output l float [N,4]
function f F a -> b
node Relu a -> b
endfunction`,
		want: "Loop n,c -> l body{Identity ci -> co; Relu x -> r}",
	}, {
		name: "a function calling itself",
		graph: `input x float [N,4]
node f::F x -> y
output y float [N,4]
function f F a -> b
node f::F a -> b
endfunction`,
		want: `error: local function f::F is called more than 32 calls deep (a function calling itself, which ONNX does not allow?)`,
	}, {
		name: "an attribute the function does not take",
		graph: `input x float [N,4]
node f::F x -> y beta=1
output y float [N,4]
function f F a -> b
node Relu a -> b
endfunction`,
		want: `error: node "y" calls local function f::F with attribute "beta", which it does not take`,
	}, {
		name: "too many inputs",
		graph: `input x float [N,4]
node f::F x,x -> y
output y float [N,4]
function f F a -> b
node Relu a -> b
endfunction`,
		want: `error: node "y" calls local function f::F with 2 inputs; it takes 1`,
	}, {
		name: "another opset",
		graph: `input x float [N,4]
node f::F x -> y
output y float [N,4]
function f F a -> b
node Relu a -> b
endfunction`,
		edit: func(m *pb.ModelProto) { m.OpsetImport[0].Version = 13 },
		want: `error: local function f::F imports opset 18 of domain "" and the model opset 13: the partitioner inlines local functions and cannot run one under another opset; export with the function inlined (torch.onnx.export(..., dynamo=True) with optimize=True, or onnx.inliner.inline_local_functions)`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseGraph(tc.graph)
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				tc.edit(m)
			}
			var got string
			if err := inlineFunctions(m); err != nil {
				got = "error: " + err.Error()
			} else {
				got = nodesText(m.GetGraph().GetNode())
				if len(m.GetFunctions()) != 0 {
					t.Errorf("functions left: %d", len(m.GetFunctions()))
				}
				for _, o := range m.GetOpsetImport() {
					if o.GetDomain() == "f" {
						t.Errorf("opset import of the functions' domain left")
					}
				}
			}
			if got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// nodesText writes ns one a line: OP inputs -> outputs, the attributes
// that are not references, subgraphs in braces.
func nodesText(ns []*pb.NodeProto) string {
	var lines []string
	for _, n := range ns {
		s := n.GetOpType() + " " + strings.Join(n.GetInput(), ",") + " -> " + strings.Join(n.GetOutput(), ",")
		for _, a := range n.GetAttribute() {
			switch {
			case a.GetRefAttrName() != "":
				s += " " + a.GetName() + "=@" + a.GetRefAttrName()
			case a.GetType() == pb.AttributeProto_FLOAT:
				s += " " + a.GetName() + "=" + fmtG(a.GetF())
			case a.GetType() == pb.AttributeProto_GRAPH:
				s += " " + a.GetName() + "{" + strings.ReplaceAll(nodesText(a.GetG().GetNode()), "\n", "; ") + "}"
			}
		}
		lines = append(lines, s)
	}
	return strings.Join(lines, "\n")
}

func fmtG(f float32) string { return strconv.FormatFloat(float64(f), 'g', -1, 32) }

// TestFoldConstantIfKeepsGraphOutputs: an If whose condition Constants
// decide is replaced by its branch, and the condition's nodes are
// dropped only where nothing reads them: a graph's output (a Loop
// body's condition out, or the model's own) is read too. Dropped, the
// output was left with no node making it.
func TestFoldConstantIfKeepsGraphOutputs(t *testing.T) {
	for _, tc := range []struct {
		name, graph, want string
		edit              func(*pb.GraphProto)
	}{{
		name: "the model's output",
		graph: `input x float [N,4]
node Constant - -> k value_int=1
node Constant - -> one value_int=1
node Equal k,one -> c
node If c -> y
body then_branch
  node Relu x -> r
  output r float [N,4]
end
body else_branch
  node Neg x -> n
  output n float [N,4]
end
output y float [N,4]
output c bool []`,
		want: "Constant  -> k\nConstant  -> one\nEqual k,one -> c\nRelu x -> y",
	}, {
		name: "a Loop body's condition out",
		graph: `input x float [N,4]
input n int64 []
init c0 bool [] = 1
node Loop n,c0 -> l
body
input i int64 []
input ci bool []
node Constant - -> k value_int=1
node Constant - -> one value_int=1
node Equal k,one -> co
node If co -> r
body then_branch
  node Relu x -> rr
  output rr float [N,4]
end
body else_branch
  node Neg x -> rn
  output rn float [N,4]
end
output co bool []
output r float [N,4]
end
output l float [N,4]`,
		want: "Loop n,c0 -> l body{Constant  -> k; Constant  -> one; Equal k,one -> co; Relu x -> r}",
	}, {
		name: "a branch's output that decides an If within it",
		graph: `input x float [N,4]
node Constant - -> k value_int=1
node Constant - -> one value_int=1
node Equal k,one -> c
node If c -> y,b
body then_branch
  node Constant - -> k2 value_int=1
  node Equal k2,one -> c2
  node If c2 -> r
  body then_branch
    node Relu x -> rr
    output rr float [N,4]
  end
  body else_branch
    node Neg x -> rn
    output rn float [N,4]
  end
  output r float [N,4]
  output c2 bool []
end
body else_branch
  node Neg x -> n
  node Not c -> nb
  output n float [N,4]
  output nb bool []
end
node Not b -> nb2
output y float [N,4]
output nb2 bool []`,
		want: "Constant  -> one\nConstant  -> k2\nEqual k2,one -> b\nRelu x -> y\nNot b -> nb2",
	}, {
		name: "a condition nothing else reads goes",
		graph: `input x float [N,4]
node Constant - -> k value_int=1
node Constant - -> one value_int=1
node Equal k,one -> c
node If c -> y
body then_branch
  node Relu x -> r
  output r float [N,4]
end
body else_branch
  node Neg x -> n
  output n float [N,4]
end
output y float [N,4]`,
		want: "Relu x -> y",
	}, {
		name: "what only the branch not taken read goes",
		graph: `input x float [N,4]
node Constant - -> k value_int=1
node Constant - -> one value_int=1
node Equal k,one -> c
node Shape x -> s
node Shape x -> s2
node Size s2 -> z
node Identity s2 -> kept
node If c -> y
body then_branch
  node Relu x -> r
  output r float [N,4]
end
body else_branch
  node Reshape x,s -> n
  node Reshape x,z -> n2
  output n float [N,4]
end
output y float [N,4]
output kept int64 [2]`,
		want: "Shape x -> s2\nIdentity s2 -> kept\nRelu x -> y",
	}, {
		// -0.0 as float16 bits (0x8000) in int32_data: not a known
		// value (read as its bits it was 32768, true, and the wrong
		// branch was taken).
		name: "a float16 condition is not read as its bits",
		graph: `input x float [N,4]
node Constant - -> h value_int=0
node Cast h -> c to=9
node If c -> y
body then_branch
  node Relu x -> r
  output r float [N,4]
end
body else_branch
  node Neg x -> n
  output n float [N,4]
end
output y float [N,4]`,
		edit: func(g *pb.GraphProto) {
			g.Node[0].Attribute = []*pb.AttributeProto{{Name: "value", Type: pb.AttributeProto_TENSOR, T: &pb.TensorProto{DataType: int32(pb.TensorProto_FLOAT16), Int32Data: []int32{0x8000}}}}
		},
		want: "Constant  -> h\nCast h -> c\nIf c -> y then_branch{Relu x -> r} else_branch{Neg x -> n}",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseGraph(tc.graph)
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				tc.edit(m.GetGraph())
			}
			foldConstantIfs(m.GetGraph())
			if got := nodesText(m.GetGraph().GetNode()); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
