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

func FuzzDecode(f *testing.F) {
	buf, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	f.Add(buf)
	f.Add(dictFrame(f, arrow.PrimitiveTypes.Int16, 2, []float32{1, 2, 3, 4}, []int64{1, 0, 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		Decode(b) // must not panic
	})
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
