package arrowframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func TestRoundTrip(t *testing.T) {
	ts := []Tensor{{Name: "a", Width: 3, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "b", Width: 1, Data: []float32{-1, 0.5}}}
	buf, err := Encode(2, ts)
	if err != nil {
		t.Fatal(err)
	}
	n, got, err := Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || len(got) != 2 || got[0].Name != "a" || got[0].Width != 3 || got[1].Data[1] != 0.5 || got[0].Data[5] != 6 {
		t.Fatalf("n=%d %+v", n, got)
	}
}

func TestMalformed(t *testing.T) {
	buf, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not arrow at all, not at all"),
		"truncated": buf[:len(buf)/2],
	} {
		if _, _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := Encode(3, []Tensor{{Name: "a", Width: 2, Data: []float32{1}}}); err == nil {
		t.Error("short tensor encoded")
	}
}

// TestCompressedRefused: a compressed frame claiming a huge uncompressed
// size is refused before arrow-go allocates it (it used to kill the
// process with an out-of-memory fatal error).
func TestCompressedRefused(t *testing.T) {
	if _, _, err := Decode(compressedFrame(t)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "compressed") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzDecode: on any bytes Decode never panics and refuses with
// ErrMalformed; what it accepts holds what its numbers say (every
// tensor of a positive width, n rows of it or one for a context
// column), DecodeIndexed accepts the same frame with the same values
// once expanded, and Encode writes the tensors to a frame that decodes
// to them bit for bit.
func FuzzDecode(f *testing.F) {
	buf, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	f.Add(buf)
	f.Add(dictFrame(f, arrow.PrimitiveTypes.Int16, 2, []float32{1, 2, 3, 4}, []int64{1, 0, 1}))
	ctx, _ := Encode(3, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "c", Width: 3, Data: []float32{7, 8, 9}, Context: true}})
	f.Add(ctx)
	idx, _ := Encode(3, []Tensor{{Name: "d", Width: 2, Data: []float32{1, 2, 3, 4}, Index: []int32{1, 0, 1}}, {Name: "b", Width: 1, Data: []float32{-1, 0.5, 2}}})
	f.Add(idx)
	for _, kind := range []string{"plain", "context", "dictionary"} {
		f.Add(nullFloatFrame(f, kind))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, ts, err := Decode(bytes.Clone(b))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("%d samples", n)
		}
		for _, x := range ts {
			rows := n
			if x.Context {
				rows = 1
			}
			if x.Width <= 0 || x.Index != nil || len(x.Data) != rows*x.Width {
				t.Fatalf("n=%d: tensor %q of width %d holds %d values (context %v, index %d)", n, x.Name, x.Width, len(x.Data), x.Context, len(x.Index))
			}
		}
		in, its, err := DecodeIndexed(bytes.Clone(b))
		if err != nil || in != n || len(its) != len(ts) {
			t.Fatalf("Decode: n=%d %s; DecodeIndexed: n=%d %s, %v", n, describe(ts), in, describe(its), err)
		}
		for i, x := range its {
			if x.Name != ts[i].Name || x.Width != ts[i].Width || x.Context != ts[i].Context {
				t.Fatalf("tensor %d: Decode %s, DecodeIndexed %s", i, describe(ts), describe(its))
			}
			got := x.Data
			if x.Index != nil {
				if len(x.Index) != n {
					t.Fatalf("tensor %q: %d indices for %d samples", x.Name, len(x.Index), n)
				}
				for _, k := range x.Index {
					if k < 0 || int(k) >= len(x.Data)/x.Width {
						t.Fatalf("tensor %q: index %d of %d rows", x.Name, k, len(x.Data)/x.Width)
					}
				}
				got = make([]float32, n*x.Width)
				x.Expand(got, n)
			}
			if !sameFloats(got, ts[i].Data) {
				t.Fatalf("tensor %q: DecodeIndexed's values differ from Decode's", x.Name)
			}
		}
		out, err := Encode(n, ts)
		if err != nil {
			// Encode refuses what it would not write (a name twice,
			// a frame of no tensors...): nothing to compare.
			return
		}
		rn, rts, err := Decode(out)
		if err != nil || rn != n || len(rts) != len(ts) {
			t.Fatalf("re-encoded: n=%d %s, %v; want n=%d %s", rn, describe(rts), err, n, describe(ts))
		}
		for i := range rts {
			if rts[i].Name != ts[i].Name || rts[i].Width != ts[i].Width || rts[i].Context != ts[i].Context || !sameFloats(rts[i].Data, ts[i].Data) {
				t.Fatalf("re-encoded: %s; want %s", describe(rts), describe(ts))
			}
		}
	})
}

// sameFloats reports whether a and b hold the same floats bit for bit
// (NaNs included).
func sameFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// nullFloatFrame is a frame from arrow-go's builders and writer of 3
// samples of one column of width 2 whose lists are all valid but one of
// whose floats is null (a nullable child, as pyarrow's default
// fixed_size_list<float32> has): a plain column, a context column, or a
// dictionary-encoded column whose dictionary row 1 holds the null.
func nullFloatFrame(t testing.TB, kind string) []byte {
	t.Helper()
	mem := memory.NewGoAllocator()
	lt := arrow.FixedSizeListOf(2, arrow.PrimitiveTypes.Float32)
	rows := 3
	if kind == "context" {
		rows = 1
	}
	lb := array.NewFixedSizeListBuilder(mem, 2, arrow.PrimitiveTypes.Float32)
	vb := lb.ValueBuilder().(*array.Float32Builder)
	for r := range rows {
		lb.Append(true)
		vb.AppendValues([]float32{float32(r), 7}, []bool{true, r != rows/2})
	}
	list := lb.NewArray()
	var col arrow.Array
	switch kind {
	case "plain":
		col = list
	case "context":
		ends := array.NewInt32Builder(mem)
		ends.Append(3)
		col = array.NewRunEndEncodedArray(ends.NewArray(), list, 3, 0)
	case "dictionary":
		idx := array.NewInt32Builder(mem)
		idx.AppendValues([]int32{0, 1, 2}, nil)
		col = array.NewDictionaryArray(&arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: lt}, idx.NewArray(), list)
	}
	schema := arrow.NewSchema([]arrow.Field{{Name: "a", Type: col.DataType(), Nullable: true}}, nil)
	rec := array.NewRecordBatch(schema, []arrow.Array{col}, 3)
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema))
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return buf.Bytes()
}

// TestNullFloatRefused: a null float inside a valid list is refused, not
// read as whatever bytes lie under it (arrow-go leaves zeros there).
func TestNullFloatRefused(t *testing.T) {
	for _, kind := range []string{"plain", "context", "dictionary"} {
		b := nullFloatFrame(t, kind)
		for round := range 2 { // the second time, with the schema cache consulted
			if n, ts, err := Decode(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "null") {
				t.Errorf("%s, round %d: n=%d %s, err %v; want ErrMalformed for the null", kind, round, n, describe(ts), err)
			}
		}
		checkFastAgainstSlow(t, b)
	}
}

// TestBigEndianRefused: a frame whose schema says big-endian is refused,
// and its bytes are left as they were (arrow-go's reader byte-swaps the
// buffers it reads in place, so that a second decode of the same bytes
// read garbage).
func TestBigEndianRefused(t *testing.T) {
	lt := arrow.FixedSizeListOfNonNullable(2, arrow.PrimitiveTypes.Float32)
	var raw []byte
	for _, v := range []float32{1, 2, 3, 4} {
		raw = binary.BigEndian.AppendUint32(raw, math.Float32bits(v))
	}
	vals := array.NewData(arrow.PrimitiveTypes.Float32, 4, []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
	list := array.NewData(lt, 2, []*memory.Buffer{nil}, []arrow.ArrayData{vals}, 0, 0)
	schema := arrow.NewSchemaWithEndian([]arrow.Field{{Name: "a", Type: lt}}, nil, endian.BigEndian)
	rec := array.NewRecordBatch(schema, []arrow.Array{array.NewFixedSizeListData(list)}, 2)
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema))
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b := buf.Bytes()
	sent := bytes.Clone(b)
	for round := range 2 {
		if n, ts, err := Decode(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "big-endian") {
			t.Errorf("round %d: n=%d %s, err %v; want ErrMalformed for the byte order", round, n, describe(ts), err)
		}
		if !bytes.Equal(b, sent) {
			t.Fatalf("round %d: Decode changed the frame's bytes", round)
		}
	}
}
