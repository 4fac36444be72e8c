package partitioner

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/prelookup"
	"github.com/prism-serve/prism/plan"
)

// TestPreOpsMatchORT runs id work the partitioner moves to the native
// pre-lookup ops both ways: traced (traceIDs), compiled and run by
// internal/prelookup, and the graph itself through ONNX Runtime, on ids
// real traffic has (negative, past the table, near the int32 and int64
// limits, empty batches, bags). The ids must be equal.
func TestPreOpsMatchORT(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	// ONNX Runtime 1.30's int64 Min, Max and Clip (vectorised) get ids
	// in [2^31, 2^32) wrong (Min(2147483648, 9) is 2147483648): the
	// clamps are checked on the other ids.
	clamp := []int64{0, 1, -1, 6, -6, 13, -13, 2147483647, -2147483648, -2147483649, 1 << 40, 9223372036854775807, -9223372036854775808, 10, 8, 9}
	big := []int64{0, 1, -1, 6, -6, 7, -7, 13, -13, 2147483647, -2147483648, 2147483648, -2147483649, 4294967295, 9223372036854775807, -9223372036854775808}
	for _, c := range []struct {
		name, graph string
		n           int
		i64         []int64
		f32         []float32
		// err: the native ops refuse the input (ONNX leaves its
		// result undefined).
		err string
	}{
		{"mod", `
input x int64 [N]
init m int64 [] = 7
node Mod x,m -> ids fmod=0`, len(big), big, nil, ""},
		{"mod-negative-divisor", `
input x int64 [N]
init m int64 [] = -7
node Mod x,m -> ids fmod=0`, len(big), big, nil, ""},
		{"mod-per-column", `
input x int64 [N,2]
init m int64 [2] = 7,-5
node Mod x,m -> ids fmod=0`, len(big) / 2, big, nil, ""},
		{"mod-int32", `
input x int64 [N]
init m int32 [] = 1000
node Cast x -> x32 to=int32
node Mod x32,m -> ids fmod=0`, len(big), big, nil, ""},
		{"add-sub-wrap", `
input x int64 [N]
init a int64 [] = 100
init s int64 [] = 3
node Add x,a -> y
node Sub y,s -> ids`, len(big), big, nil, ""},
		{"int32-add", `
input x int32 [N]
init a int32 [] = 1000
node Add a,x -> ids`, 4, []int64{0, -1, 2147483647, -2147483648}, nil, ""},
		{"clip", `
input x int64 [N]
init lo int64 [] = 0
init hi int64 [] = 9
node Clip x,lo,hi -> ids`, len(clamp), clamp, nil, ""},
		{"clip-max-only", `
input x int64 [N]
init hi int64 [] = 9
node Clip x,_,hi -> ids`, len(clamp), clamp, nil, ""},
		{"min-max", `
input x int64 [N]
init lo int64 [] = 0
init hi int64 [] = 9
node Min x,hi -> y
node Max lo,y -> ids`, len(clamp), clamp, nil, ""},
		{"where-equal", `
input x int64 [N]
init unk int64 [] = -1
init dflt int64 [] = 0
node Equal unk,x -> isunk
node Where isunk,dflt,x -> ids`, len(big), big, nil, ""},
		{"broadcast-offsets", `
input x int64 [N,3]
init off int64 [1,3] = 0,10,100
node Add x,off -> ids`, 2, []int64{1, 2, 3, -4, -5, -6}, nil, ""},
		{"broadcast-bags", `
input x int64 [N,2,3]
init off int64 [2,1] = 100,-100
init s int64 [3] = 1,2,3
node Add off,x -> y
node Sub y,s -> ids`, 2, []int64{1, 2, 3, 4, 5, 6, -7, -8, -9, 10, 11, 12}, nil, ""},
		{"int32-input-mod-where", `
input x int32 [N,3]
init m int32 [3] = 7,-7,1000
init unk int32 [] = 6
init dflt int32 [] = -5
node Mod x,m -> y fmod=0
node Equal y,unk -> e
node Where e,dflt,y -> ids`, 3, []int64{-1, -1, -1, 13, 13, 2147483647, -2147483648, 6, -2000}, nil, ""},
		{"split-gather-run", `
input x int64 [N,5]
init sp int64 [2] = 2,3
init k int64 [2] = 1,2
node Split x,sp -> a,b axis=1
node Gather b,k -> ids axis=-1`, 2, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, nil, ""},
		{"column-then-mod", `
input x int64 [N,4]
init k int64 [] = -2
init m int64 [] = 5
node Gather x,k -> c axis=1
node Mod c,m -> ids fmod=0`, 2, []int64{1, 2, -3, 4, 5, 6, 17, 8}, nil, ""},
		{"slice-bags", `
input x int64 [N,2,3]
init st int64 [1] = 1
init en int64 [1] = 9223372036854775807
init ax int64 [1] = 1
node Slice x,st,en,ax -> s
node Reshape s,shape -> ids
init shape int64 [2] = -1,3`, 2, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, nil, ""},
		{"empty-batch", `
input x int64 [N,3]
init m int64 [] = 7
init k int64 [] = 1
node Gather x,k -> c axis=1
node Mod c,m -> ids fmod=0`, 0, []int64{}, nil, ""},
		{"float-cast", `
input x float [N]
node Cast x -> ids to=int64`, 8, nil, []float32{0, 0.5, -0.5, 1.9, -1.9, 16777216, -2.5, 3e9}, ""},
		{"float-cast-int32", `
input x float [N]
node Cast x -> ids to=int32`, 6, nil, []float32{0, 1.9, -1.9, 2147483520, -2147483648, 1e6}, ""},
		{"float-cast-int32-range", `
input x float [N]
node Cast x -> ids to=int32`, 5, nil, []float32{2147483648, 3e9, -3e9, 5e9, 1e12}, "not an integer in range of int32"},
		{"int64-cast-int32-mod", `
input x int64 [N]
init m int32 [] = 1000
node Cast x -> x32 to=int32
node Mod x32,m -> ids fmod=0`, 4, []int64{4294967295, 2147483648, 3000000000, -9223372036854775808}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := parseGraph(c.graph)
			if err != nil {
				t.Fatal(err)
			}
			g, err := NewGraph(m)
			if err != nil {
				t.Fatal(err)
			}
			types, _ := InferShapes(g)
			ch, err := traceIDs(g, types, "ids")
			if err != nil {
				t.Fatalf("not native: %v", err)
			}
			in := m.Graph.Input[0]
			info := plan.TensorInfo{Name: in.Name, DType: elemName(types[in.Name].Elem), Shape: types[in.Name].SampleShape()}
			if info.DType == "float" {
				info.DType = "float32"
			}
			p, err := prelookup.Compile(info, ch.ops)
			if err != nil {
				t.Fatalf("compile %+v: %v", ch.ops, err)
			}
			native, nerr := p.Run(c.n, c.f32, c.i64)

			m.Graph.Output = []*pb.ValueInfoProto{{Name: "ids", Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(types["ids"].Elem)}}}}}
			path := filepath.Join(t.TempDir(), "ids.onnx")
			if err := pb.WriteModel(path, m, pb.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			s, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			shape := append([]int64{int64(c.n)}, info.Shape...)
			outs, err := s.RunInt64([]ort.Input{{Name: in.Name, Shape: shape, Int64: c.i64, Float32: c.f32}})
			if err != nil {
				t.Fatal(err)
			}
			if c.err != "" {
				if nerr == nil || !strings.Contains(nerr.Error(), c.err) {
					t.Fatalf("native ops %+v: %v (%v), want an error with %q; ONNX Runtime: %v", ch.ops, nerr, native, c.err, outs[0])
				}
				return
			}
			if nerr != nil {
				t.Fatalf("native ops %+v: %v; ONNX Runtime: %v", ch.ops, nerr, outs[0])
			}
			if !slices.Equal(native, outs[0]) && (len(native) != 0 || len(outs[0]) != 0) {
				t.Errorf("native ops %+v\n on %v%v\n give %v\n ONNX Runtime %v", ch.ops, c.i64, c.f32, native, outs[0])
			}
		})
	}
}
