package arrowframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// contextShapes are mixed layouts: widths, and which columns are context.
var contextShapes = []struct {
	n      int
	widths []int
	ctx    []bool
}{
	{1, []int{3}, []bool{true}},
	{2, []int{3, 1}, []bool{false, true}},
	{7, []int{13, 16, 16}, []bool{true, false, true}},
	{270, []int{13, 16, 16, 16}, []bool{false, true, true, false}},
	{270, []int{16, 16}, []bool{true, true}}, // context only: 270 rows in a small body
	{4096, []int{1}, []bool{true}},
}

// contextTensors are random tensors of a mixed layout.
func contextTensors(r *rand.Rand, n int, widths []int, ctx []bool) []Tensor {
	ts := make([]Tensor, len(widths))
	for i, w := range widths {
		rows := n
		if ctx[i] {
			rows = 1
		}
		d := make([]float32, rows*w)
		for j := range d {
			d[j] = r.Float32()
		}
		ts[i] = Tensor{Name: fmt.Sprintf("c%d/x", i), Width: w, Data: d, Context: ctx[i]}
	}
	return ts
}

// sameTensors fails unless got decodes to want: names, widths, context
// marks and values.
func sameTensors(t *testing.T, what string, n int, want []Tensor, gotN int, got []Tensor) {
	t.Helper()
	if gotN != n || len(got) != len(want) {
		t.Fatalf("%s: %d samples, %d tensors; want %d, %d", what, gotN, len(got), n, len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.Width != w.Width || g.Context != w.Context || !slices.Equal(g.Data, w.Data) {
			t.Fatalf("%s: tensor %d: %q/%d context %v, %d values; want %q/%d context %v, %d values",
				what, i, g.Name, g.Width, g.Context, len(g.Data), w.Name, w.Width, w.Context, len(w.Data))
		}
	}
}

// TestContextRoundTrip: frames with context columns, from AppendEncode and
// from arrow-go's writer, decode to the tensors encoded, a context column
// to its one row; AppendFrame filled in place is AppendEncode's frame, its
// context views one row wide; a context column costs its row, not n rows.
func TestContextRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, s := range contextShapes {
		name := fmt.Sprintf("n=%d widths=%v ctx=%v", s.n, s.widths, s.ctx)
		ts := contextTensors(r, s.n, s.widths, s.ctx)
		fast, err := AppendEncode(nil, s.n, ts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for range 2 { // arrow-go's path, then the fast path
			n, got, err := Decode(fast)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sameTensors(t, name+" append", s.n, ts, n, got)
		}
		if _, _, ok := decodeCached(fast); !ok {
			t.Errorf("%s: fast path not taken", name)
		}
		ref, err := encodeWithArrow(nil, s.n, ts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, got, err := Decode(ref)
		if err != nil {
			t.Fatalf("%s: arrow-go's frame: %v", name, err)
		}
		sameTensors(t, name+" arrow-go", s.n, ts, n, got)

		cols := make([]Column, len(ts))
		for i, c := range ts {
			cols[i] = Column{Name: c.Name, Width: c.Width, Context: c.Context}
		}
		dirty := bytes.Repeat([]byte{0xAB}, len(fast)+16)
		inPlace, views, err := AppendFrame(dirty[:0], s.n, cols)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ts {
			if len(views[i]) != len(ts[i].Data) {
				t.Fatalf("%s: view %d holds %d floats, want %d", name, i, len(views[i]), len(ts[i].Data))
			}
			copy(views[i], ts[i].Data)
		}
		if !bytes.Equal(inPlace, fast) {
			t.Fatalf("%s: in-place frame differs from AppendEncode's", name)
		}

		// The same tensors expanded: the context frame is smaller by the
		// expanded rows' bytes, less a few hundred bytes per context
		// column (its schema, nodes, buffers and padded run end).
		full := make([]Tensor, len(ts))
		for i, c := range ts {
			full[i] = Tensor{Name: c.Name, Width: c.Width, Data: make([]float32, s.n*c.Width)}
			c.Expand(full[i].Data, s.n)
		}
		plain, err := AppendEncode(nil, s.n, full)
		if err != nil {
			t.Fatal(err)
		}
		saved, overhead := 0, 0
		for i, c := range ts {
			if c.Context {
				saved += 4 * (s.n - 1) * s.widths[i]
				overhead += 384
			}
		}
		if d := len(plain) - len(fast); d < saved-overhead {
			t.Errorf("%s: context frame %d bytes, expanded %d: saves %d, want about %d", name, len(fast), len(plain), d, saved)
		}
	}
}

// TestContextMalformed: a run-end encoded column other than one int32 run
// of the frame's rows over one row of floats is refused.
func TestContextMalformed(t *testing.T) {
	lt := arrow.FixedSizeListOfNonNullable(2, arrow.PrimitiveTypes.Float32)
	frame := func(runEnds arrow.DataType, ends []int64, rows, n int) []byte {
		t.Helper()
		vals := array.NewData(arrow.PrimitiveTypes.Float32, 2*rows, []*memory.Buffer{nil, memory.NewBufferBytes(make([]byte, 8*rows))}, nil, 0, 0)
		list := array.NewData(lt, rows, []*memory.Buffer{nil}, []arrow.ArrayData{vals}, 0, 0)
		var raw []byte
		for _, e := range ends {
			switch runEnds.ID() {
			case arrow.INT16:
				raw = binary.LittleEndian.AppendUint16(raw, uint16(e))
			case arrow.INT32:
				raw = binary.LittleEndian.AppendUint32(raw, uint32(e))
			default:
				raw = binary.LittleEndian.AppendUint64(raw, uint64(e))
			}
		}
		endsData := array.NewData(runEnds, len(ends), []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
		rt := arrow.RunEndEncodedOf(runEnds, lt)
		ree := array.NewData(rt, n, []*memory.Buffer{nil}, []arrow.ArrayData{endsData, list}, 0, 0)
		schema := arrow.NewSchema([]arrow.Field{{Name: "a", Type: rt}}, nil)
		rec := array.NewRecordBatch(schema, []arrow.Array{array.NewRunEndEncodedData(ree)}, int64(n))
		var buf bytes.Buffer
		w := ipc.NewWriter(&buf, ipc.WithSchema(schema))
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		w.Close()
		return buf.Bytes()
	}
	good := frame(arrow.PrimitiveTypes.Int32, []int64{5}, 1, 5)
	if n, ts, err := Decode(good); err != nil || n != 5 || len(ts) != 1 || !ts[0].Context || len(ts[0].Data) != 2 {
		t.Fatalf("one run: n=%d %v %v", n, describe(ts), err)
	}
	for name, b := range map[string][]byte{
		"int64 run ends": frame(arrow.PrimitiveTypes.Int64, []int64{5}, 1, 5),
		"int16 run ends": frame(arrow.PrimitiveTypes.Int16, []int64{5}, 1, 5),
		"two runs":       frame(arrow.PrimitiveTypes.Int32, []int64{2, 5}, 2, 5),
		"run past rows":  frame(arrow.PrimitiveTypes.Int32, []int64{6}, 1, 5),
	} {
		if _, _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
		checkFastAgainstSlow(t, b)
	}
}

// contextVariants are broken and odd versions of a frame with context
// columns: every node and buffer number changed, the run end changed.
func contextVariants(t testing.TB, name string, b []byte) []frameCase {
	t.Helper()
	at := locateBatch(t, b)
	var cs []frameCase
	n := int64(binary.LittleEndian.Uint64(b[at.rows:]))
	for i := range at.nNodes {
		p := at.nodes + 16*i
		v := int64(binary.LittleEndian.Uint64(b[p:]))
		for _, d := range []int64{-1, 1, n} {
			cs = append(cs, frameCase{fmt.Sprintf("%s node %d length%+d", name, i, d), put64(b, p, v+d), 0})
		}
		cs = append(cs, frameCase{fmt.Sprintf("%s node %d nulls=1", name, i), put64(b, p+8, 1), -1})
	}
	for i := range at.nBufs {
		p := at.bufs + 16*i
		cs = append(cs,
			frameCase{fmt.Sprintf("%s buffer %d offset past the body", name, i), put64(b, p, int64(at.bodyLenV)+8), 0},
			frameCase{fmt.Sprintf("%s buffer %d length huge", name, i), put64(b, p+8, 1<<62), 0},
			frameCase{fmt.Sprintf("%s buffer %d offset +4", name, i), put64(b, p, int64(binary.LittleEndian.Uint64(b[p:]))+4), -1},
			frameCase{fmt.Sprintf("%s buffer %d length 0", name, i), put64(b, p+8, 0), -1},
		)
	}
	for _, v := range []int64{n - 1, n + 1, 1 << 20} {
		cs = append(cs, frameCase{fmt.Sprintf("%s rows=%d", name, v), put64(b, at.rows, v), 0})
	}
	return cs
}

// contextFrameCases are frames with context columns for
// TestDecodeFastMatchesSlow: both encoders' and variants.
func contextFrameCases(t testing.TB) []frameCase {
	r := rand.New(rand.NewPCG(23, 24))
	var cs []frameCase
	for _, s := range contextShapes {
		name := fmt.Sprintf("context n=%d widths=%v ctx=%v", s.n, s.widths, s.ctx)
		ts := contextTensors(r, s.n, s.widths, s.ctx)
		fast, err := AppendEncode(nil, s.n, ts)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := encodeWithArrow(nil, s.n, ts)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, frameCase{"append " + name, fast, 1}, frameCase{"arrow-go " + name, ref, 1})
		cs = append(cs, contextVariants(t, name, fast)...)
	}
	return cs
}

func TestRepeat(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 7, 270} {
		row := []float32{1, 2, 3}
		dst := make([]float32, n*len(row))
		Repeat(dst, row)
		for i := range n {
			if !slices.Equal(dst[3*i:3*i+3], row) {
				t.Fatalf("n=%d: sample %d is %v", n, i, dst[3*i:3*i+3])
			}
		}
	}
}

// BenchmarkExpandContext270: the dense worker's cost of a context frame
// over a plain one, per 270-sample micro-batch of dlrm-kaggle with 13 of
// its 26 pooled embeddings (16 floats) in the context: the 13 rows
// expanded into the batch input (the copy a plain frame's rows get when
// batched with others).
func BenchmarkExpandContext270(b *testing.B) {
	const n, w, cols = 270, 16, 13
	row := make([]float32, w)
	dst := make([]float32, n*w)
	b.SetBytes(int64(4 * n * w * cols))
	for b.Loop() {
		for range cols {
			Repeat(dst, row)
		}
	}
}
