package partitioner

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/prism-serve/prism/internal/leview"
	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// Row masks: a table multiplied by a constant before its Gather, one
// factor per row. PaddlePaddle/Paddle2ONNX writes an embedding with
// padding_idx so (paddle2onnx/mapper/tensor/lookup_table.cc,
// LookupTableMapper, for lookup_table and lookup_table_v2 on a weight
// of static shape): Gather(Mul(W, mask), ids), mask a float Constant of
// W's shape, ones with the row padding_idx zero, so that the padding
// id reads a zero row whatever W holds there. The mask is as large as
// the table, and the Mul runs over the whole table on every request.
// The table is stored as those values instead (W's rows times their
// factor, computed once when the table is written, tableStream) and the
// Mul and its mask leave the graph with it: the padding id's row reads
// zero from the store.
//
// Only a mask whose values are the same along each row ([rows, dim] or
// [rows, 1]) is taken: it scales rows, which is what a lookup of a row
// can keep. Any other constant (per column, per element) is a
// computation on the table, not a table.

// rowFactors are the rows of a table a row mask scales by other than 1
// (a padding row: 0).
type rowFactors map[int64]float32

// key writes f for tableKey: two Gathers on one weight through equal
// masks (Paddle2ONNX writes a mask per lookup) read one table.
func (f rowFactors) key() string {
	rows := make([]int64, 0, len(f))
	for r := range f {
		rows = append(rows, r)
	}
	slices.Sort(rows)
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%d=%g;", r, f[r])
	}
	return b.String()
}

// floatConst returns the float32 tensor name holds when it is an
// initializer or a Constant node's output (with the node's index, -1
// for an initializer), its data inline or external.
func floatConst(g *Graph, name string) (*pb.TensorProto, int, bool) {
	var t *pb.TensorProto
	at := -1
	if init, ok := g.Inits[name]; ok {
		t = init
	} else if i, ok := g.Producer[name]; ok && g.Nodes[i].GetOpType() == "Constant" {
		for _, a := range g.Nodes[i].GetAttribute() {
			if a.GetName() == "value" && a.GetT() != nil {
				t, at = a.GetT(), i
			}
		}
	}
	if t == nil || pb.TensorProto_DataType(t.GetDataType()) != pb.TensorProto_FLOAT {
		return nil, -1, false
	}
	return t, at, true
}

// maskRows reads mask, a multiplier of a [rows, dim] table, as one
// factor per row: mask is [rows, dim] or [rows, 1], and each of its rows
// holds one value. It returns the rows whose factor is not 1.
func (g *Graph) maskRows(mask *pb.TensorProto, rows int64, dim int) (rowFactors, bool) {
	d := mask.GetDims()
	if len(d) != 2 || d[0] != rows || (d[1] != int64(dim) && d[1] != 1) {
		return nil, false
	}
	if f, ok := g.masks[mask]; ok {
		return f, f != nil
	}
	if g.masks == nil {
		g.masks = map[*pb.TensorProto]rowFactors{}
	}
	f, err := readRowFactors(mask, g.Dir, rows, int(d[1]))
	if err != nil {
		f = nil
	}
	g.masks[mask] = f
	return f, f != nil
}

// readRowFactors reads mask ([rows, w] float32, inline or external
// data against dir) a piece of whole rows at a time (Paddle2ONNX's mask
// is as large as the table): its factors, nil when a row holds two
// values.
func readRowFactors(mask *pb.TensorProto, dir string, rows int64, w int) (rowFactors, error) {
	f := rowFactors{}
	scan := func(v []float32, first int64) bool {
		for r := range len(v) / w {
			row := v[r*w : (r+1)*w]
			for _, x := range row[1:] {
				if x != row[0] {
					return false
				}
			}
			if row[0] != 1 {
				f[first+int64(r)] = row[0]
			}
		}
		return true
	}
	if mask.GetDataLocation() != pb.TensorProto_EXTERNAL {
		v, err := pb.Float32s(mask)
		if err != nil || int64(len(v)) != rows*int64(w) {
			return nil, fmt.Errorf("mask %q: %d values for [%d, %d]", mask.GetName(), len(v), rows, w)
		}
		if !scan(v, 0) {
			return nil, nil
		}
		return f, nil
	}
	if dir == "" {
		return nil, fmt.Errorf("mask %q: external data, no folder to read it from", mask.GetName())
	}
	r, n, err := pb.DataReader(mask, dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if n != rows*int64(w)*4 {
		return nil, fmt.Errorf("mask %q has %d bytes, its shape needs %d", mask.GetName(), n, rows*int64(w)*4)
	}
	const chunkRows = 1 << 14
	raw := make([]byte, chunkRows*w*4)
	br := bufio.NewReaderSize(r, 1<<20)
	for first := int64(0); first < rows; first += chunkRows {
		k := min(rows-first, chunkRows)
		b := raw[:k*int64(w)*4]
		if _, err := io.ReadFull(br, b); err != nil {
			return nil, fmt.Errorf("mask %q: %w", mask.GetName(), err)
		}
		if !scan(leview.Float32s(b), first) {
			return nil, nil
		}
	}
	return f, nil
}

// scaleRows multiplies the rows of out (the table's rows from first on,
// dim values each) by their factors.
func (f rowFactors) scaleRows(out []float32, first int64, dim int) {
	if len(f) == 0 {
		return
	}
	n := int64(len(out) / dim)
	for r, x := range f {
		if r < first || r >= first+n {
			continue
		}
		row := out[(r-first)*int64(dim) : (r-first+1)*int64(dim)]
		for j := range row {
			row[j] *= x
		}
	}
}

// sameMasks says whether every reader of part (a table's weight) is a
// Mul by a row mask of factors f: the weight then makes one table, which
// takes the weight's name.
func sameMasks(g *Graph, part string, dim int, rows int64, f rowFactors) bool {
	for _, c := range g.Consumers[part] {
		n := g.Nodes[c]
		if n.GetOpType() != "Mul" || len(n.GetInput()) != 2 {
			return false
		}
		other := n.GetInput()[1]
		if other == part {
			other = n.GetInput()[0]
		}
		mask, _, ok := floatConst(g, other)
		if !ok {
			return false
		}
		m, ok := g.maskRows(mask, rows, dim)
		if !ok || m.key() != f.key() {
			return false
		}
	}
	return true
}

// maskedTable is, for the data of a Gather that resolveTable does not
// take, a table multiplied by something other than a row mask: the
// table, and why it is not a lookup (never a table quietly left in the
// graph).
func maskedTable(g *Graph, name string) (*tableSource, string) {
	i, ok := g.Producer[name]
	if !ok || g.Nodes[i].GetOpType() != "Mul" || len(g.Nodes[i].GetInput()) != 2 {
		return nil, ""
	}
	in := g.Nodes[i].GetInput()
	for _, k := range []int{0, 1} {
		src := resolveTable(g, in[k])
		if src == nil {
			continue
		}
		if c, _, ok := floatConst(g, in[1-k]); ok {
			if c.GetDataLocation() == pb.TensorProto_EXTERNAL && g.Dir == "" {
				return src, fmt.Sprintf("the Gather reads the table multiplied by the constant %q %v by Mul %q, whose values are external data this reader was given no folder for", in[1-k], c.GetDims(), g.Nodes[i].GetName())
			}
			return src, fmt.Sprintf("the Gather reads the table multiplied by the constant %q %v by Mul %q, which is not one factor per row (a [rows, dim] or [rows, 1] mask whose rows each hold one value, as Paddle2ONNX writes padding_idx)", in[1-k], c.GetDims(), g.Nodes[i].GetName())
		}
		return src, fmt.Sprintf("the Gather reads the table multiplied by %q, which is not a constant, by Mul %q", in[1-k], g.Nodes[i].GetName())
	}
	return nil, ""
}

// rowFactors are the table's rows a row mask scales (plan.Table's
// RowFactors, by row of the whole table: parts in order), nil for none.
func (src *tableSource) rowFactors() map[int64]float32 {
	var out map[int64]float32
	first := int64(0)
	for _, part := range src.parts {
		for r, f := range src.scale[part.GetName()] {
			if out == nil {
				out = map[int64]float32{}
			}
			out[first+r] = f
		}
		first += part.GetDims()[0]
	}
	return out
}
