package arrowframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/prism-serve/prism/internal/leview"
)

// dictFrame writes, with arrow-go's IPC writer (as another Arrow producer
// would), a frame of len(idx) samples: column "d" dictionary-encoded
// (indices of type it into the rows of dict, width w; a negative index is
// a null), column "p" plain (width 1, the sample's number).
func dictFrame(t testing.TB, it arrow.DataType, w int, dict []float32, idx []int64, opts ...ipc.Option) []byte {
	t.Helper()
	mem := memory.NewGoAllocator()
	lt := arrow.FixedSizeListOfNonNullable(int32(w), arrow.PrimitiveTypes.Float32)
	dt := &arrow.DictionaryType{IndexType: it, ValueType: lt}
	pt := arrow.FixedSizeListOfNonNullable(1, arrow.PrimitiveTypes.Float32)
	schema := arrow.NewSchema([]arrow.Field{{Name: "d", Type: dt}, {Name: "p", Type: pt}}, nil)

	lb := array.NewBuilder(mem, lt).(*array.FixedSizeListBuilder)
	vb := lb.ValueBuilder().(*array.Float32Builder)
	for r := range len(dict) / w {
		lb.Append(true)
		vb.AppendValues(dict[r*w:(r+1)*w], nil)
	}
	dictArr := lb.NewArray()
	ib := array.NewBuilder(mem, it)
	for _, k := range idx {
		if k < 0 {
			ib.AppendNull()
			continue
		}
		switch b := ib.(type) {
		case *array.Int8Builder:
			b.Append(int8(k))
		case *array.Int16Builder:
			b.Append(int16(k))
		case *array.Int32Builder:
			b.Append(int32(k))
		case *array.Uint16Builder:
			b.Append(uint16(k))
		default:
			t.Fatalf("index type %s", it)
		}
	}
	indices := ib.NewArray()
	col := array.NewDictionaryArray(dt, indices, dictArr)

	pb := array.NewBuilder(mem, pt).(*array.FixedSizeListBuilder)
	pvb := pb.ValueBuilder().(*array.Float32Builder)
	for s := range idx {
		pb.Append(true)
		pvb.Append(float32(s))
	}
	plain := pb.NewArray()
	rec := array.NewRecordBatch(schema, []arrow.Array{col, plain}, int64(len(idx)))
	var buf bytes.Buffer
	wr := ipc.NewWriter(&buf, append([]ipc.Option{ipc.WithSchema(schema), ipc.WithAllocator(mem)}, opts...)...)
	if err := wr.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := wr.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestDictionaryColumn: a dictionary-encoded column, as other Arrow
// writers produce it, decodes to the rows its indices pick, for each
// index type; decoding it again (the fast path's schema cache consulted)
// gives the same.
func TestDictionaryColumn(t *testing.T) {
	dict := []float32{1, 2, 3, 10, 20, 30, -1, -2, -3}
	idx := []int64{2, 0, 0, 1, 2, 2, 0}
	var want []float32
	for _, k := range idx {
		want = append(want, dict[3*k:3*k+3]...)
	}
	for _, it := range []arrow.DataType{arrow.PrimitiveTypes.Int8, arrow.PrimitiveTypes.Int32, arrow.PrimitiveTypes.Uint16} {
		frame := dictFrame(t, it, 3, dict, idx)
		for round := range 2 {
			n, ts, err := Decode(frame)
			if err != nil {
				t.Fatalf("%s, round %d: %v", it, round, err)
			}
			if n != len(idx) || len(ts) != 2 {
				t.Fatalf("%s: %d samples, %d tensors", it, n, len(ts))
			}
			if d := ts[0]; d.Name != "d" || d.Width != 3 || d.Context || !slices.Equal(d.Data, want) {
				t.Fatalf("%s: dictionary column decoded to %+v, want the rows %v", it, d, want)
			}
			if p := ts[1]; p.Width != 1 || p.Data[6] != 6 {
				t.Fatalf("%s: plain column %+v", it, p)
			}
		}
	}
}

func TestDictionaryColumnRefused(t *testing.T) {
	dict := []float32{1, 2, 3, 4}
	for _, c := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"index past the dictionary", dictFrame(t, arrow.PrimitiveTypes.Int32, 2, dict, []int64{0, 2, 1}), "indexes row 2 of 2"},
		{"null index", dictFrame(t, arrow.PrimitiveTypes.Int32, 2, dict, []int64{0, -1, 1}), "has nulls"},
		{"compressed", dictFrame(t, arrow.PrimitiveTypes.Int32, 2, dict, []int64{0, 1}, ipc.WithZstd()), "compressed"},
	} {
		_, _, err := Decode(c.frame)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrMalformed saying %q", c.name, err, c.want)
		}
	}
}

// TestDictionaryExpansionBounded: a small frame whose one-row
// dictionary is wide and indexed by many one-byte indices would expand
// to far more than the frame: refused past the budget.
func TestDictionaryExpansionBounded(t *testing.T) {
	const w, n = 1 << 16, 2048 // one 256 KiB row, 2,048 samples: 512 MiB expanded
	idx := make([]int64, n)
	frame := dictFrame(t, arrow.PrimitiveTypes.Int8, w, make([]float32, w), idx)
	if int64(n)*w*4 <= dictBudget(len(frame)) {
		t.Fatalf("test frame of %d bytes expands to %d, within its budget %d", len(frame), int64(n)*w*4, dictBudget(len(frame)))
	}
	if _, _, err := Decode(frame); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "expands to") {
		t.Fatalf("Decode: %v, want ErrMalformed for the expansion", err)
	}
	// The same at a size within the budget decodes.
	small := dictFrame(t, arrow.PrimitiveTypes.Int8, 16, make([]float32, 16), idx)
	if _, ts, err := Decode(small); err != nil || len(ts[0].Data) != n*16 {
		t.Fatalf("within the budget: %v", err)
	}
}

// expanded reports whether some tensor's data lies outside the frame b:
// a dictionary column, which each decode expands into memory of its own.
func expanded(b []byte, ts []Tensor) bool {
	lo, hi := uintptrOf(b), uintptrOf(b)+uintptr(len(b))
	for _, t := range ts {
		if len(t.Data) == 0 {
			continue
		}
		if p := uintptrOf(leviewBytes(t.Data)); p < lo || p >= hi {
			return true
		}
	}
	return false
}

// sameValues reports whether two decodes hold the same samples, names,
// widths and values (wherever they lie).
func sameValues(n1 int, ts1 []Tensor, n2 int, ts2 []Tensor) bool {
	if n1 != n2 || len(ts1) != len(ts2) {
		return false
	}
	for i := range ts1 {
		a, b := ts1[i], ts2[i]
		if a.Name != b.Name || a.Width != b.Width || a.Context != b.Context || !slices.Equal(a.Data, b.Data) {
			return false
		}
	}
	return true
}

func leviewBytes(f []float32) []byte { return leview.Bytes(f) }

// TestEncodeDictionary: tensors given with an Index are written
// dictionary-encoded by both encoders (the fast one and arrow-go's, the
// reference), every Arrow reader's view of them is the expanded rows,
// and the frame is smaller than the plain one by the repeated rows.
func TestEncodeDictionary(t *testing.T) {
	const n, w = 270, 16
	r := rand.New(rand.NewPCG(5, 6))
	rows := 100
	dict := make([]float32, rows*w)
	for i := range dict {
		dict[i] = r.Float32()
	}
	idx := make([]int32, n)
	var want []float32
	for s := range idx {
		idx[s] = int32(r.IntN(rows))
		want = append(want, dict[int(idx[s])*w:int(idx[s]+1)*w]...)
	}
	dense := make([]float32, n*13)
	for i := range dense {
		dense[i] = float32(i)
	}
	ctx := []float32{7, 8, 9}
	ts := []Tensor{{Name: "d", Width: w, Data: dict, Index: idx}, {Name: "x", Width: 13, Data: dense}, {Name: "c", Width: 3, Data: ctx, Context: true}}
	plainTs := []Tensor{{Name: "d", Width: w, Data: want}, ts[1], ts[2]}
	fast, err := AppendEncode(nil, n, ts)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := encodeWithArrow(nil, n, ts)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := AppendEncode(nil, n, plainTs)
	if err != nil {
		t.Fatal(err)
	}
	// Saved: the repeated rows; spent: the indices and the dictionary's
	// message (metadata and padding, a few hundred bytes).
	if len(fast) > len(plain)-(n-rows)*w*4+n*4+512 {
		t.Errorf("dictionary frame %d bytes, plain %d: want the %d repeated rows' bytes less the indices' and a message's saved", len(fast), len(plain), n-rows)
	}
	for name, frame := range map[string][]byte{"fast": fast, "arrow-go": ref} {
		for _, dec := range []struct {
			name string
			f    func([]byte) (int, []Tensor, error)
		}{{"Decode", Decode}, {"arrow-go", decodeWithArrow}} {
			gn, got, err := dec.f(frame)
			if err != nil {
				t.Fatalf("%s frame, %s: %v", name, dec.name, err)
			}
			if gn != n || len(got) != 3 || !slices.Equal(got[0].Data, want) || !slices.Equal(got[1].Data, dense) || !got[2].Context || !slices.Equal(got[2].Data, ctx) {
				t.Fatalf("%s frame, %s: decoded to n=%d %s", name, dec.name, gn, describe(got))
			}
		}
	}
}

func TestEncodeDictionaryRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		t    Tensor
	}{
		{"index past the rows", Tensor{Name: "d", Width: 2, Data: []float32{1, 2}, Index: []int32{0, 1}}},
		{"negative index", Tensor{Name: "d", Width: 2, Data: []float32{1, 2}, Index: []int32{0, -1}}},
		{"indices for other samples", Tensor{Name: "d", Width: 2, Data: []float32{1, 2}, Index: []int32{0}}},
		{"context and dictionary", Tensor{Name: "d", Width: 2, Data: []float32{1, 2}, Index: []int32{0, 0}, Context: true}},
		{"empty dictionary", Tensor{Name: "d", Width: 2, Data: []float32{}, Index: []int32{0, 0}}},
	} {
		if _, err := AppendEncode(nil, 2, []Tensor{c.t}); err == nil {
			t.Errorf("%s: encoded", c.name)
		}
	}
	if _, _, _, err := AppendFrameIndexed(nil, 2, []Column{{Name: "d", Width: 2, Rows: 3}}); err == nil {
		t.Error("a dictionary of more rows than samples laid out")
	}
}

// renumberedDictFrame is a frame of 2 samples of three dictionary columns
// "a", "b", "c" of width 1, each a dictionary of one row (rows[i]), whose
// schema numbers the dictionaries of "b" and "c" 2 and 1 (a writer may
// number them as it likes), while the DictionaryBatch messages come in the
// order arrow-go wrote them: ids 0, 1, 2, that is rows 0, 1, 2. So per the
// schema, "b" holds rows[2] and "c" rows[1].
func renumberedDictFrame(t testing.TB, rows [3]float32) []byte {
	t.Helper()
	ts := make([]Tensor, 3)
	for i := range ts {
		ts[i] = Tensor{Name: string(rune('a' + i)), Width: 1, Data: []float32{rows[i]}, Index: []int32{0, 0}}
	}
	b, err := encodeWithArrow(nil, 2, ts)
	if err != nil {
		t.Fatal(err)
	}
	meta, _, _, ok := messageAt(b, 0)
	if !ok {
		t.Fatal("no schema message")
	}
	var schema flatbuffers.Table
	if !union(root(meta), slotMsgHeader, &schema) {
		t.Fatal("no schema")
	}
	idAt := func(i int) int { // where field i's dictionary id lies in b
		f := tableAt(&schema, 6, i)             // Schema.fields
		o := flatbuffers.UOffsetT(f.Offset(12)) // Field.dictionary
		d := flatbuffers.Table{Bytes: f.Bytes, Pos: f.Indirect(f.Pos + o)}
		p := d.Offset(4) // DictionaryEncoding.id
		if o == 0 || p == 0 {
			t.Fatalf("field %d: no dictionary id written", i)
		}
		return 8 + int(d.Pos) + int(p)
	}
	b1, b2 := idAt(1), idAt(2)
	if binary.LittleEndian.Uint64(b[b1:]) != 1 || binary.LittleEndian.Uint64(b[b2:]) != 2 {
		t.Fatal("arrow-go numbered the dictionaries otherwise")
	}
	binary.LittleEndian.PutUint64(b[b1:], 2)
	binary.LittleEndian.PutUint64(b[b2:], 1)
	return b
}

// TestDictionaryIDsFollowSchema: a column's dictionary is the
// DictionaryBatch of the id its schema field gives, not the one at its
// position, also on the fast path once it knows the schema (learnt here
// from a frame whose two dictionaries happen to be the same, so that
// reading them by position gives the same result).
func TestDictionaryIDsFollowSchema(t *testing.T) {
	if _, _, err := Decode(renumberedDictFrame(t, [3]float32{1, 5, 5})); err != nil {
		t.Fatal(err)
	}
	b := renumberedDictFrame(t, [3]float32{1, 2, 3})
	want := [][]float32{{1, 1}, {3, 3}, {2, 2}}
	for round := range 2 {
		n, ts, err := Decode(b)
		if err != nil || n != 2 || len(ts) != 3 {
			t.Fatalf("round %d: n=%d %s, %v", round, n, describe(ts), err)
		}
		for i, w := range want {
			if !slices.Equal(ts[i].Data, w) {
				t.Errorf("round %d: column %q decoded to %v, want %v (its dictionary by id)", round, ts[i].Name, ts[i].Data, w)
			}
		}
	}
	checkFastAgainstSlow(t, b)
}

// sharedDictFrame is a frame of 2 samples of three dictionary columns
// "a", "b", "c" of width 1, each a dictionary of one row (rows[i]) as
// arrow-go wrote it (ids 0, 1, 2), with "c" renumbered to share "b"'s
// dictionary id 1 and its DictionaryBatch renumbered to 1 as well: per
// Arrow's stream format that second batch of id 1 replaces the first, and
// arrow-go's reader gives "b" and "c" both rows[2].
func sharedDictFrame(t testing.TB, rows [3]float32) []byte {
	t.Helper()
	ts := make([]Tensor, 3)
	for i := range ts {
		ts[i] = Tensor{Name: string(rune('a' + i)), Width: 1, Data: []float32{rows[i]}, Index: []int32{0, 0}}
	}
	b, err := encodeWithArrow(nil, 2, ts)
	if err != nil {
		t.Fatal(err)
	}
	meta, body, end, ok := messageAt(b, 0)
	if !ok {
		t.Fatal("no schema message")
	}
	var schema flatbuffers.Table
	if !union(root(meta), slotMsgHeader, &schema) {
		t.Fatal("no schema")
	}
	f := tableAt(&schema, 6, 2)             // Schema.fields[2]
	o := flatbuffers.UOffsetT(f.Offset(12)) // Field.dictionary
	d := flatbuffers.Table{Bytes: f.Bytes, Pos: f.Indirect(f.Pos + o)}
	p := d.Offset(4) // DictionaryEncoding.id
	if o == 0 || p == 0 {
		t.Fatal("field 2: no dictionary id written")
	}
	at := body - len(meta) + int(d.Pos) + int(p)
	if binary.LittleEndian.Uint64(b[at:]) != 2 {
		t.Fatal("arrow-go numbered the dictionaries otherwise")
	}
	binary.LittleEndian.PutUint64(b[at:], 1)
	// The third DictionaryBatch message: id 2 becomes 1.
	for range 2 {
		_, _, end, ok = messageAt(b, end)
		if !ok {
			t.Fatal("no dictionary message")
		}
	}
	meta, body, _, ok = messageAt(b, end)
	var db flatbuffers.Table
	if !ok || !union(root(meta), slotMsgHeader, &db) || db.GetInt64Slot(slotDictID, -1) != 2 {
		t.Fatal("no third dictionary message of id 2")
	}
	at = body - len(meta) + int(db.Pos) + int(db.Offset(slotDictID))
	binary.LittleEndian.PutUint64(b[at:], 1)
	return b
}

// TestSharedDictionaryIDNotFastPath: a schema whose two columns share a
// dictionary id, learnt from a frame whose dictionaries of that id happen
// to be equal, must not let the fast path read a later frame's
// dictionaries by position: arrow-go's reader gives both columns the last
// DictionaryBatch of the id, and so must Decode.
func TestSharedDictionaryIDNotFastPath(t *testing.T) {
	if _, _, err := Decode(sharedDictFrame(t, [3]float32{1, 5, 5})); err != nil {
		t.Fatal(err)
	}
	b := sharedDictFrame(t, [3]float32{1, 2, 3})
	want := [][]float32{{1, 1}, {3, 3}, {3, 3}}
	for round := range 2 {
		n, ts, err := Decode(b)
		if err != nil || n != 2 || len(ts) != 3 {
			t.Fatalf("round %d: n=%d %s, %v", round, n, describe(ts), err)
		}
		for i, w := range want {
			if !slices.Equal(ts[i].Data, w) {
				t.Errorf("round %d: column %q decoded to %v, want %v (the last dictionary of its id, as arrow-go reads it)", round, ts[i].Name, ts[i].Data, w)
			}
		}
		_, its, err := DecodeIndexed(b)
		if err != nil {
			t.Fatal(err)
		}
		if got := expandAll(2, its); !sameBits(got, want) {
			t.Errorf("round %d: DecodeIndexed expands to %v, want %v", round, got, want)
		}
	}
	checkFastAgainstSlow(t, b)
}
