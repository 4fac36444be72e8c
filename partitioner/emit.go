package partitioner

import (
	"bufio"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"io"
	"math"
	"path/filepath"
	"strings"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/tablefile"
)

// Subgraph file names in a partition folder.
const (
	CPUFile   = "cpu.onnx"
	DenseFile = "dense.onnx"
)

// subModel builds the model of one side: its nodes in topological order,
// the Constant nodes and initializers they read, the given inputs and
// outputs. Initializers are loaded from external data (resolved against
// dir) as they are added: only the non-table weights ever are.
func (pl *Placement) subModel(name string, cpuSide bool, inputs, outputs []string, outputTypes map[string]*pb.ValueInfoProto, dir string) (*pb.ModelProto, error) {
	g := pl.G
	sub := &pb.GraphProto{Name: g.Model.GetGraph().GetName() + "_" + name}
	needConst := map[int]bool{}
	needInit := map[string]bool{}
	for i := range g.Nodes {
		on, placed := pl.OnCPU[i]
		if !placed || on != cpuSide {
			continue
		}
		for _, in := range g.Reads(i) {
			if j, ok := g.Producer[in]; ok && pl.Constants[j] {
				needConst[j] = true
			}
			if _, ok := g.Inits[in]; ok {
				needInit[in] = true
			}
		}
	}
	for i, n := range g.Nodes {
		on, placed := pl.OnCPU[i]
		if needConst[i] || (placed && on == cpuSide) {
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
	for _, in := range inputs {
		sub.Input = append(sub.Input, valueInfo(in, pl.Types[in]))
	}
	for _, o := range outputs {
		if vi, ok := outputTypes[o]; ok {
			sub.Output = append(sub.Output, vi)
		} else {
			sub.Output = append(sub.Output, valueInfo(o, pl.Types[o]))
		}
	}
	return &pb.ModelProto{
		IrVersion:       g.Model.GetIrVersion(),
		OpsetImport:     g.Model.GetOpsetImport(),
		ProducerName:    "prism-partition",
		ProducerVersion: fmt.Sprint(plan.Version),
		Graph:           sub,
	}, nil
}

// loadNodeData loads the external data of the tensors n holds: a
// Constant's value, and the initializers and nodes of its subgraphs.
// onnx.save with save_as_external_data (what torch.onnx.export does past
// 2 GB) moves every tensor of 1 KB or more out, those included; the
// partition folder must not point back at the model's data file.
func loadNodeData(n *pb.NodeProto, dir string) error {
	for _, a := range n.GetAttribute() {
		ts := a.GetTensors()
		if a.GetT() != nil {
			ts = append(ts, a.GetT())
		}
		for _, t := range ts {
			if err := pb.LoadData(t, dir); err != nil {
				return fmt.Errorf("node %q: %w", n.GetName(), err)
			}
		}
		for _, b := range attrBodies(a) {
			for _, t := range b.GetInitializer() {
				if err := pb.LoadData(t, dir); err != nil {
					return fmt.Errorf("node %q: %w", n.GetName(), err)
				}
			}
			for _, bn := range b.GetNode() {
				if err := loadNodeData(bn, dir); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// valueInfo declares a tensor with the batch dimension as "batch".
func valueInfo(name string, t TensorType) *pb.ValueInfoProto {
	tt := &pb.TypeProto_Tensor{ElemType: int32(t.Elem)}
	if t.Known {
		shape := &pb.TensorShapeProto{}
		for i, d := range t.Dims {
			dim := &pb.TensorShapeProto_Dimension{}
			switch {
			case d == DimBatch:
				dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}
			case d < 0:
				dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: fmt.Sprintf("%s_dim%d", name, i)}
			default:
				dim.Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}
			}
			shape.Dim = append(shape.Dim, dim)
		}
		tt.Shape = shape
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: tt}}}
}

// tableStream reads a table's rows from its initializers (inline or
// external), converting float16 to float32, dequantizing 8-bit parts and
// scaling rows by their row mask (rowmask.go), in pieces of whole rows.
func tableStream(src *tableSource, dir string) tablefile.Source {
	return func(emit func([]float32) error) error {
		const chunkRows = 1 << 14
		buf := make([]float32, chunkRows*src.dim)
		for _, part := range src.parts {
			d := src.deq[part.GetName()]
			var scale []float32
			var zp []int32
			if d != nil {
				var err error
				if scale, zp, err = d.params(dir); err != nil {
					return fmt.Errorf("table part %q: %w", part.GetName(), err)
				}
			}
			r, n, err := pb.DataReader(part, dir)
			if err != nil {
				return err
			}
			dt := pb.TensorProto_DataType(part.GetDataType())
			es := int64(pb.ElemSize(dt))
			if want := part.GetDims()[0] * part.GetDims()[1] * es; n != want {
				r.Close()
				return fmt.Errorf("table part %q has %d bytes, its shape needs %d", part.GetName(), n, want)
			}
			br := bufio.NewReaderSize(r, 1<<20)
			raw := make([]byte, chunkRows*src.dim*int(es))
			for left := part.GetDims()[0]; left > 0; {
				rows := min(left, chunkRows)
				b := raw[:rows*int64(src.dim)*es]
				if _, err := io.ReadFull(br, b); err != nil {
					r.Close()
					return fmt.Errorf("table part %q: %w", part.GetName(), err)
				}
				out := buf[:rows*int64(src.dim)]
				convertRows(out, b, dt, d, scale, zp, int(part.GetDims()[0]-left), src.dim)
				src.scale[part.GetName()].scaleRows(out, part.GetDims()[0]-left, src.dim)
				if err := emit(out); err != nil {
					r.Close()
					return err
				}
				left -= rows
			}
			r.Close()
		}
		return nil
	}
}

// halfToFloat converts IEEE 754 binary16 to float32.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		for mant&0x400 == 0 {
			mant <<= 1
			exp--
		}
		exp++
		mant &= 0x3ff
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// tableFile is where a table goes in the partition folder.
func tableFile(name string) string { return filepath.ToSlash(tablefile.FileName(name)) }

// uniqueTableFile is tableFile, numbered when another table of the plan
// (in used, which it extends) already has that file: names that differ
// only in characters the file name replaces ("t/a", "t_a"), or only in
// case (one file on a case-insensitive file system).
func uniqueTableFile(name string, used map[string]bool) string {
	f := tableFile(name)
	for k := 2; used[strings.ToLower(f)]; k++ {
		f = strings.TrimSuffix(tableFile(name), ".arrow") + fmt.Sprintf("-%d.arrow", k)
	}
	used[strings.ToLower(f)] = true
	return f
}
