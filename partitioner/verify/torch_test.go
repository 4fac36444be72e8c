package verify_test

import (
	"encoding/binary"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// torchGraph builds a model in the style of a PyTorch 2.x dynamo export:
// "/embeddings.N/Gather" nodes on "embeddings.N.weight", Gemm with transB,
// Concat, Relu, Sigmoid, a symbolic batch "s0", and every lookup pattern
// the partitioner knows plus one it must leave in the graph:
//
//	sparse_0 [s0]      one-hot Gather
//	sparse_1 [s0,4]    weighted bag: Mul(Gather, Unsqueeze(sparse_1_w)) + ReduceSum
//	sparse_2 [s0,3]    ReduceMean bag on table 2
//	sparse_3 [s0]      one-hot on table 2 again (a shared table)
//	sparse_4 [s0,2]    ReduceMax bag
//	sparse_5 [s0]      Gather on Concat(table 5a, table 5b) along rows
//	sparse_6 [s0]      Gather on Cast(float16 table) to float
//	sparse_7 [s0]      Gather on a 3-D initializer: not a lookup, stays in the graph
type gb struct {
	g   *pb.GraphProto
	r   *rand.Rand
	seq int
}

func (b *gb) name(s string) string { b.seq++; return fmt.Sprintf("%s_%d", s, b.seq) }

func (b *gb) init(name string, dims ...int64) string {
	n := int64(1)
	for _, d := range dims {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(b.r.NormFloat64() * 0.3)
	}
	b.g.Initializer = append(b.g.Initializer, pb.NewFloatTensor(name, dims, v))
	return name
}

func (b *gb) half(name string, rows, dim int64) string {
	raw := make([]byte, 2*rows*dim)
	for i := range rows * dim {
		// Small exact halves: k/1024 for k in [-512, 512).
		k := b.r.IntN(1024) - 512
		binary.LittleEndian.PutUint16(raw[2*i:], f32ToHalf(float32(k)/1024))
	}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: name, Dims: []int64{rows, dim}, DataType: int32(pb.TensorProto_FLOAT16), RawData: raw})
	return name
}

func f32ToHalf(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	if f == 0 {
		return sign
	}
	exp := int((bits>>23)&0xff) - 127 + 15
	mant := uint16((bits >> 13) & 0x3ff)
	return sign | uint16(exp)<<10 | mant
}

func (b *gb) ints(vals ...int64) string {
	n := b.name("/Constant_output")
	b.g.Initializer = append(b.g.Initializer, pb.NewInt64Tensor(n, []int64{int64(len(vals))}, vals))
	return n
}

func (b *gb) node(op, name string, ins []string, attrs ...*pb.AttributeProto) string {
	out := name + "_output_0"
	b.g.Node = append(b.g.Node, &pb.NodeProto{Name: name, OpType: op, Input: ins, Output: []string{out}, Attribute: attrs})
	return out
}

func intA(n string, v int64) *pb.AttributeProto {
	return &pb.AttributeProto{Name: n, Type: pb.AttributeProto_INT, I: v}
}

func input(name string, elem pb.TensorProto_DataType, dims ...any) *pb.ValueInfoProto {
	shape := &pb.TensorShapeProto{}
	for _, d := range dims {
		dim := &pb.TensorShapeProto_Dimension{}
		switch d := d.(type) {
		case string:
			dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: d}
		case int:
			dim.Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}
		}
		shape.Dim = append(shape.Dim, dim)
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: shape}}}}
}

func torchModel(seed uint64) *pb.ModelProto {
	b := &gb{g: &pb.GraphProto{Name: "main_graph"}, r: rand.New(rand.NewPCG(seed, 1))}
	const d = 8
	i64, f32 := pb.TensorProto_INT64, pb.TensorProto_FLOAT
	b.g.Input = []*pb.ValueInfoProto{
		input("dense_features", f32, "s0", 13),
		input("sparse_0", i64, "s0"),
		input("sparse_1", i64, "s0", 4), input("sparse_1_w", f32, "s0", 4),
		input("sparse_2", i64, "s0", 3),
		input("sparse_3", i64, "s0"),
		input("sparse_4", i64, "s0", 2),
		input("sparse_5", i64, "s0"),
		input("sparse_6", i64, "s0"),
		input("sparse_7", i64, "s0"),
	}
	x := b.node("Gemm", "/dense_arch/Gemm", []string{"dense_features", b.init("dense_arch.weight", d, 13), b.init("dense_arch.bias", d)}, intA("transB", 1))
	x = b.node("Relu", "/dense_arch/Relu", []string{x})
	parts := []string{x}
	gather := func(k int, table, ids string) string {
		return b.node("Gather", fmt.Sprintf("/embeddings.%d/Gather", k), []string{table, ids})
	}
	parts = append(parts, gather(0, b.init("embeddings.0.weight", 50, d), "sparse_0"))
	w := b.node("Unsqueeze", "/embeddings.1/Unsqueeze", []string{"sparse_1_w", b.ints(2)})
	g1 := b.node("Mul", "/embeddings.1/Mul", []string{gather(1, b.init("embeddings.1.weight", 60, d), "sparse_1"), w})
	parts = append(parts, b.node("ReduceSum", "/embeddings.1/ReduceSum", []string{g1, b.ints(1)}, intA("keepdims", 0)))
	t2 := b.init("embeddings.2.weight", 70, d)
	parts = append(parts, b.node("ReduceMean", "/embeddings.2/ReduceMean", []string{gather(2, t2, "sparse_2"), b.ints(1)}, intA("keepdims", 0)))
	parts = append(parts, gather(3, t2, "sparse_3"))
	parts = append(parts, b.node("ReduceMax", "/embeddings.4/ReduceMax", []string{gather(4, b.init("embeddings.4.weight", 40, d), "sparse_4"), b.ints(-2)}, intA("keepdims", 0)))
	cat := b.node("Concat", "/embeddings.5/Concat", []string{b.init("embeddings.5a.weight", 30, d), b.init("embeddings.5b.weight", 20, d)}, intA("axis", 0))
	parts = append(parts, gather(5, cat, "sparse_5"))
	cast := b.node("Cast", "/embeddings.6/Cast", []string{b.half("embeddings.6.weight", 25, d)}, intA("to", int64(pb.TensorProto_FLOAT)))
	parts = append(parts, gather(6, cast, "sparse_6"))
	g7 := gather(7, b.init("embeddings.7.weight", 15, 2, 4), "sparse_7")
	parts = append(parts, b.node("Reshape", "/embeddings.7/Reshape", []string{g7, b.ints(-1, d)}))
	z := b.node("Concat", "/Concat", parts, intA("axis", 1))
	width := int64(len(parts) * d)
	z = b.node("Gemm", "/over_arch/Gemm", []string{z, b.init("over_arch.0.weight", 16, width), b.init("over_arch.0.bias", 16)}, intA("transB", 1))
	z = b.node("Relu", "/over_arch/Relu", []string{z})
	z = b.node("Gemm", "/over_arch/Gemm_1", []string{z, b.init("over_arch.1.weight", 1, 16), b.init("over_arch.1.bias", 1)}, intA("transB", 1))
	out := b.node("Sigmoid", "/Sigmoid", []string{z})
	b.g.Node[len(b.g.Node)-1].Output[0] = "output"
	_ = out
	b.g.Output = []*pb.ValueInfoProto{input("output", f32, "s0", 1)}
	return &pb.ModelProto{IrVersion: 8, ProducerName: "pytorch", ProducerVersion: "2.5.0", OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: b.g}
}

func TestTorchStyleExport(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, torchModel(3), pb.WriteOptions{External: pb.ExternalAlways, MinExternalBytes: 256}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(model + ".data"); err != nil {
		t.Fatal("the test model should have external data")
	}
	out := filepath.Join(dir, "out")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Plan
	byName := map[string]plan.Table{}
	for _, tab := range p.Tables {
		byName[tab.Name] = tab
	}
	want := map[string]struct {
		rows    int64
		lookups int
		pool    plan.Pooling
	}{
		"embeddings.0.weight":           {50, 1, plan.PoolNone},
		"embeddings.1.weight":           {60, 1, plan.PoolSum},
		"embeddings.2.weight":           {70, 2, plan.PoolMean},
		"embeddings.4.weight":           {40, 1, plan.PoolMax},
		"/embeddings.5/Concat_output_0": {50, 1, plan.PoolNone},
		"/embeddings.6/Cast_output_0":   {25, 1, plan.PoolNone},
	}
	if len(p.Tables) != len(want) {
		t.Errorf("%d tables, want %d: %v", len(p.Tables), len(want), byName)
	}
	for name, w := range want {
		tab, ok := byName[name]
		if !ok {
			t.Errorf("table %q not found", name)
			continue
		}
		if tab.Rows != w.rows || len(tab.Lookups) != w.lookups || tab.Lookups[0].Pooling != w.pool {
			t.Errorf("table %q: %d rows, %d lookups, pooling %s; want %+v", name, tab.Rows, len(tab.Lookups), tab.Lookups[0].Pooling, w)
		}
	}
	if l := byName["embeddings.1.weight"].Lookups[0]; l.Weights != "sparse_1_w" || l.Bag != 4 {
		t.Errorf("weighted lookup: %+v", l)
	}
	if _, ok := byName["embeddings.7.weight"]; ok {
		t.Error("a Gather on a 3-D initializer was taken as a lookup")
	}
	// The unrecognised Gather and its table stayed in one of the subgraphs.
	found := false
	for _, f := range []string{p.CPUModel, p.DenseModel} {
		if f == "" {
			continue
		}
		m, err := pb.ReadModel(filepath.Join(out, f), pb.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range m.Graph.Node {
			if n.Name == "/embeddings.7/Gather" {
				found = true
			}
		}
	}
	if !found {
		t.Error("the unrecognised Gather was dropped")
	}
	rep, err := verify.Verify(model, out, 300, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\nverified: %+v", res.Report(), rep)
	if !strings.Contains(res.Report(), "cut:") {
		t.Error("report lacks the cut")
	}
}
