package ort

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/prism-serve/prism/internal/arrowframe"
	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// BenchmarkContextExpand: issue 18 lets the user context's pooled rows
// be expanded to every candidate either by the dense worker before
// ONNX Runtime runs (arrowframe.Repeat, what Prism does) or by ops at
// the head of dense.onnx. Both variants of one micro-batch of 270
// candidates with 13 context columns of 16 floats, one ONNX Runtime
// thread, the model ending in the columns' Concat (the first op of a
// DLRM's dense part):
//
//   - go: the worker repeats each context row into a [270,16] input,
//     and the model concatenates the 13 inputs;
//   - graph: the model takes the 13 rows [1,16] and an index [270]
//     (each candidate's request; a batch of several requests has
//     several rows) and gathers each column before the Concat.
//
// Run (ORT_LIB set, as for the other tests of this package):
//
//	go test -run '^$' -bench ContextExpand -benchtime 2000x -count 3 ./internal/ort/
func BenchmarkContextExpand(b *testing.B) {
	const n, w, cols = 270, 16, 13
	if err := Init(); err != nil {
		b.Skip(err)
	}
	dyn := func(name string, elem pb.TensorProto_DataType, param string, dims ...int64) *pb.ValueInfoProto {
		shape := []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: param}}}
		for _, d := range dims {
			shape = append(shape, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
		}
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: shape}}}}}
	}
	axis := func(v int64) *pb.AttributeProto {
		return &pb.AttributeProto{Name: "axis", Type: pb.AttributeProto_INT, I: v}
	}
	goG := &pb.GraphProto{Name: "go", Output: []*pb.ValueInfoProto{dyn("y", pb.TensorProto_FLOAT, "n", cols*w)}}
	graphG := &pb.GraphProto{Name: "graph", Input: []*pb.ValueInfoProto{dyn("idx", pb.TensorProto_INT64, "n")}, Output: []*pb.ValueInfoProto{dyn("y", pb.TensorProto_FLOAT, "n", cols*w)}}
	var goCat, graphCat []string
	for k := range cols {
		x := fmt.Sprintf("x%d", k)
		goG.Input = append(goG.Input, dyn(x, pb.TensorProto_FLOAT, "n", w))
		goCat = append(goCat, x)
		graphG.Input = append(graphG.Input, dyn(x, pb.TensorProto_FLOAT, "r", w))
		graphG.Node = append(graphG.Node, &pb.NodeProto{OpType: "Gather", Input: []string{x, "idx"}, Output: []string{"g" + x}, Attribute: []*pb.AttributeProto{axis(0)}})
		graphCat = append(graphCat, "g"+x)
	}
	goG.Node = append(goG.Node, &pb.NodeProto{OpType: "Concat", Input: goCat, Output: []string{"y"}, Attribute: []*pb.AttributeProto{axis(1)}})
	graphG.Node = append(graphG.Node, &pb.NodeProto{OpType: "Concat", Input: graphCat, Output: []string{"y"}, Attribute: []*pb.AttributeProto{axis(1)}})
	open := func(g *pb.GraphProto) *Session {
		path := filepath.Join(b.TempDir(), g.Name+".onnx")
		if err := os.WriteFile(path, marshalModel(g), 0o644); err != nil {
			b.Fatal(err)
		}
		s, err := NewSession(path, SessionOptions{IntraOpThreads: 1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	rows := make([][]float32, cols)
	for k := range rows {
		rows[k] = make([]float32, w)
		for i := range rows[k] {
			rows[k][i] = float32(k*w + i)
		}
	}
	b.Run("go", func(b *testing.B) {
		s := open(goG)
		bufs := make([][]float32, cols)
		for k := range bufs {
			bufs[k] = make([]float32, n*w)
		}
		in := make([]Input, cols)
		for b.Loop() {
			for k := range cols {
				arrowframe.Repeat(bufs[k], rows[k])
				in[k] = Input{Name: fmt.Sprintf("x%d", k), Shape: []int64{n, w}, Float32: bufs[k]}
			}
			if _, err := s.Run(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("graph", func(b *testing.B) {
		s := open(graphG)
		idx := make([]int64, n)
		in := make([]Input, cols+1)
		for b.Loop() {
			in[0] = Input{Name: "idx", Shape: []int64{n}, Int64: idx}
			for k := range cols {
				in[k+1] = Input{Name: fmt.Sprintf("x%d", k), Shape: []int64{1, w}, Float32: rows[k]}
			}
			if _, err := s.Run(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
