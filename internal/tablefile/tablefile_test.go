package tablefile_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/prism-serve/prism/internal/tablefile"
)

func table(rows, dim int) []float32 {
	d := make([]float32, rows*dim)
	for i := range d {
		d[i] = float32(i%977) * 0.5
	}
	return d
}

func TestRoundTrip(t *testing.T) {
	for _, rows := range []int{0, 1, 1000, tablefile.BatchRows + 3} {
		dir := t.TempDir()
		path := filepath.Join(dir, "t.arrow")
		data := table(rows, 8)
		var last int64
		meta, err := tablefile.Write(path, "emb_l.0.weight", 8, data, func(done, _ int64) { last = done })
		if err != nil {
			t.Fatal(err)
		}
		if last != int64(rows) {
			t.Errorf("progress ended at %d, want %d", last, rows)
		}
		tab, err := tablefile.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if tab.Meta != meta || tab.Rows != int64(rows) || tab.Dim != 8 || tab.Name != "emb_l.0.weight" {
			t.Fatalf("meta %+v, wrote %+v", tab.Meta, meta)
		}
		if err := tab.Verify(); err != nil {
			t.Fatal(err)
		}
		got, err := tab.ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		for i := range data {
			if got[i] != data[i] {
				t.Fatalf("rows=%d: value %d = %v, want %v", rows, i, got[i], data[i])
			}
		}
		if rows > tablefile.BatchRows {
			first, b1, _ := tab.Batch(1)
			if first != tablefile.BatchRows || len(b1) != 3*8 {
				t.Errorf("batch 1 starts at %d with %d values", first, len(b1))
			}
		}
		tab.Close()
	}
}

func TestHashIdentifiesContent(t *testing.T) {
	a := table(10, 4)
	if tablefile.Hash(4, a) != tablefile.Hash(4, table(10, 4)) {
		t.Fatal("same content, different hash")
	}
	if tablefile.Hash(4, a) == tablefile.Hash(8, a) {
		t.Fatal("same bytes, different shape, same hash")
	}
}

func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.arrow")
	if _, err := tablefile.Write(good, "t", 4, table(5000, 4), nil); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(good)
	cases := map[string][]byte{
		"empty.arrow":     {},
		"text.arrow":      []byte("not arrow at all"),
		"truncated.arrow": raw[:len(raw)/2],
	}
	for name, b := range cases {
		p := filepath.Join(dir, name)
		os.WriteFile(p, b, 0o644)
		if _, err := tablefile.Open(p); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	// A flipped value inside the data is caught by Verify.
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)/2] ^= 0x40
	p := filepath.Join(dir, "flipped.arrow")
	os.WriteFile(p, flipped, 0o644)
	tab, err := tablefile.Open(p)
	if err == nil {
		defer tab.Close()
		if err := tab.Verify(); err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("flipped byte: verify err = %v", err)
		}
	}
	if _, err := tablefile.Open(filepath.Join(dir, "missing.arrow")); err == nil {
		t.Error("missing file: no error")
	}
}

func TestSafeName(t *testing.T) {
	if got := tablefile.SafeName("emb_l.3.weight"); got != "emb_l.3.weight" {
		t.Error(got)
	}
	if got := tablefile.SafeName("model/emb:0 x"); got != "model_emb_0_x" {
		t.Error(got)
	}
}

// TestWriteStreamRechunks: a source yielding odd pieces writes the same
// file as Write of the whole table.
func TestWriteStreamRechunks(t *testing.T) {
	dir := t.TempDir()
	data := table(tablefile.BatchRows*2+17, 4)
	a, err := tablefile.Write(filepath.Join(dir, "a.arrow"), "t", 4, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := func(emit func([]float32) error) error {
		for i := 0; i < len(data); i += 4 * 1001 {
			if err := emit(data[i:min(i+4*1001, len(data))]); err != nil {
				return err
			}
		}
		return nil
	}
	b, err := tablefile.WriteStream(filepath.Join(dir, "b.arrow"), "t", 4, int64(len(data)/4), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("meta %+v vs %+v", a, b)
	}
	x, _ := os.ReadFile(filepath.Join(dir, "a.arrow"))
	y, _ := os.ReadFile(filepath.Join(dir, "b.arrow"))
	if string(x) != string(y) {
		t.Fatal("streamed file differs")
	}
	// A source with fewer rows than declared is an error, and no file appears.
	if _, err := tablefile.WriteStream(filepath.Join(dir, "c.arrow"), "t", 4, 5, src, nil); err == nil {
		t.Fatal("row count mismatch accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "c.arrow")); err == nil {
		t.Fatal("a failed write left a file")
	}
}

// TestBigEndianRefused: a table file whose schema says big-endian (as an
// Arrow writer on a big-endian machine writes it) is an error. arrow-go's
// reader used to byte-swap its rows in place, inside the read-only
// mapping: a fault that ended the process.
func TestBigEndianRefused(t *testing.T) {
	const dim, rows = 2, 3
	vals := table(rows, dim)
	var raw []byte
	for _, v := range vals {
		raw = binary.BigEndian.AppendUint32(raw, math.Float32bits(v))
	}
	md := arrow.NewMetadata(
		[]string{tablefile.KeyVersion, tablefile.KeyName, tablefile.KeyRows, tablefile.KeyDim, tablefile.KeyDType, tablefile.KeySHA256},
		[]string{tablefile.Version, "t", strconv.Itoa(rows), strconv.Itoa(dim), "float32", tablefile.Hash(dim, vals)},
	)
	lt := arrow.FixedSizeListOfNonNullable(dim, arrow.PrimitiveTypes.Float32)
	schema := arrow.NewSchemaWithEndian([]arrow.Field{{Name: tablefile.Column, Type: lt}}, &md, endian.BigEndian)
	values := array.NewData(arrow.PrimitiveTypes.Float32, len(vals), []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
	list := array.NewData(lt, rows, []*memory.Buffer{nil}, []arrow.ArrayData{values}, 0, 0)
	rec := array.NewRecordBatch(schema, []arrow.Array{array.NewFixedSizeListData(list)}, rows)
	path := filepath.Join(t.TempDir(), "be.arrow")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tab, err := tablefile.Open(path)
	if err == nil {
		tab.Close()
		t.Fatal("big-endian table file opened")
	}
	if !strings.Contains(err.Error(), "big-endian") {
		t.Fatalf("err = %v, want one about the byte order", err)
	}
}
