// Package tablefile reads and writes Prism's embedding table files: one
// Arrow IPC file per table (tables/NAME.arrow in a partition plan), one
// column "embedding" of FixedSizeList<float32>[dim], row order = row id,
// the table's facts in the schema metadata. The partitioner writes them;
// the embedding store ingests them; any Arrow reader (pyarrow, arrow-rs)
// opens them.
//
// The content hash is SHA-256 over the dim (8 bytes, little-endian) and
// the rows' little-endian float32 bytes in row order: two plans whose
// tables hash equal hold the same table, which is how the store shares
// one copy between models.
package tablefile

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/internal/leview"
	"hash"
	"os"
	"path/filepath"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Format version written in every file's metadata.
const Version = "1"

// Column is the name of the single column.
const Column = "embedding"

// Schema metadata keys.
const (
	KeyVersion = "prism.table.version"
	KeyName    = "prism.table.name"
	KeyRows    = "prism.table.rows"
	KeyDim     = "prism.table.dim"
	KeyDType   = "prism.table.dtype"
	KeySHA256  = "prism.table.sha256"
)

// BatchRows is the rows per record batch Write produces.
const BatchRows = 1 << 16

// Meta is what a table file says about its table.
type Meta struct {
	Name   string `json:"name"`
	Rows   int64  `json:"rows"`
	Dim    int    `json:"dim"`
	DType  string `json:"dtype"` // "float32"
	SHA256 string `json:"sha256"`
}

// Hasher computes a table's content hash incrementally.
type Hasher struct{ h hash.Hash }

// NewHasher starts the hash of a table of width dim.
func NewHasher(dim int) *Hasher {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(dim))
	h.Write(b[:])
	return &Hasher{h: h}
}

// Write adds rows, in row order.
func (h *Hasher) Write(rows []float32) { h.h.Write(leview.Bytes(rows)) }

// Sum is the hex digest.
func (h *Hasher) Sum() string { return hex.EncodeToString(h.h.Sum(nil)) }

// Hash is the content hash of a whole table.
func Hash(dim int, data []float32) string {
	h := NewHasher(dim)
	h.Write(data)
	return h.Sum()
}

// Write writes a rows x dim table (row-major data) to path, atomically
// (a temporary file renamed into place), and returns its Meta. progress,
// if set, is called with rows written so far.
func Write(path, name string, dim int, data []float32, progress func(done, total int64)) (Meta, error) {
	if dim <= 0 || len(data)%dim != 0 {
		return Meta{}, fmt.Errorf("write table %q: %d values do not make rows of %d", name, len(data), dim)
	}
	src := func(emit func([]float32) error) error { return emit(data) }
	return WriteStream(path, name, dim, int64(len(data)/dim), src, progress)
}

// Source streams a table's rows, in row order, to emit, in pieces of any
// whole number of rows. WriteStream calls it twice (the content hash goes
// in the schema, which Arrow writes first), so it must yield the same
// rows each time. The slices need only live until emit returns.
type Source func(emit func(rows []float32) error) error

// WriteStream writes a table of rows x dim from src, holding at most one
// record batch of it in memory, so tables larger than memory stream
// through. The file appears at path only when complete.
func WriteStream(path, name string, dim int, rows int64, src Source, progress func(done, total int64)) (Meta, error) {
	if dim <= 0 || rows < 0 {
		return Meta{}, fmt.Errorf("write table %q: bad shape %d x %d", name, rows, dim)
	}
	h := NewHasher(dim)
	var seen int64
	if err := src(func(r []float32) error {
		if len(r)%dim != 0 {
			return fmt.Errorf("%d values are not whole rows of %d", len(r), dim)
		}
		h.Write(r)
		seen += int64(len(r) / dim)
		return nil
	}); err != nil {
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	if seen != rows {
		return Meta{}, fmt.Errorf("write table %q: source has %d rows, want %d", name, seen, rows)
	}
	meta := Meta{Name: name, Rows: rows, Dim: dim, DType: "float32", SHA256: h.Sum()}
	md := arrow.NewMetadata(
		[]string{KeyVersion, KeyName, KeyRows, KeyDim, KeyDType, KeySHA256},
		[]string{Version, name, strconv.FormatInt(rows, 10), strconv.Itoa(dim), meta.DType, meta.SHA256},
	)
	listType := arrow.FixedSizeListOfNonNullable(int32(dim), arrow.PrimitiveTypes.Float32)
	schema := arrow.NewSchema([]arrow.Field{{Name: Column, Type: listType}}, &md)

	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	defer os.Remove(tmp)
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(schema), ipc.WithAllocator(memory.DefaultAllocator))
	if err != nil {
		f.Close()
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	fail := func(err error) (Meta, error) {
		w.Close()
		f.Close()
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	// Re-chunk whatever the source yields into batches of BatchRows.
	batch := make([]float32, 0, BatchRows*dim)
	var done int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		n := int64(len(batch) / dim)
		rec := record(schema, listType, dim, batch, n)
		err := w.Write(rec)
		rec.Release()
		batch = batch[:0]
		done += n
		if progress != nil {
			progress(done, rows)
		}
		return err
	}
	if err := src(func(r []float32) error {
		for len(r) > 0 {
			take := min(len(r), cap(batch)-len(batch))
			batch = append(batch, r[:take]...)
			r = r[take:]
			if len(batch) == cap(batch) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := flush(); err != nil {
		return fail(err)
	}
	if rows == 0 {
		rec := record(schema, listType, dim, nil, 0)
		err := w.Write(rec)
		rec.Release()
		if err != nil {
			return fail(err)
		}
	}
	if err := w.Close(); err != nil {
		f.Close()
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return Meta{}, fmt.Errorf("write table %q: %w", name, err)
	}
	return meta, nil
}

// record wraps rows (no copy) as a one-column record batch.
func record(schema *arrow.Schema, listType arrow.DataType, dim int, rows []float32, n int64) arrow.RecordBatch {
	var raw []byte
	if len(rows) > 0 {
		raw = leview.Bytes(rows)
	}
	values := array.NewData(arrow.PrimitiveTypes.Float32, len(rows), []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
	defer values.Release()
	list := array.NewData(listType, int(n), []*memory.Buffer{nil}, []arrow.ArrayData{values}, 0, 0)
	defer list.Release()
	arr := array.NewFixedSizeListData(list)
	defer arr.Release()
	return array.NewRecordBatch(schema, []arrow.Array{arr}, n)
}

// Table is an open table file. Its row slices alias the file's memory
// mapping and stay valid until Close.
type Table struct {
	Meta
	path    string
	mapping []byte
	fr      *ipc.FileReader
	starts  []int64 // first row of each batch
}

// Open maps a table file and checks its schema and metadata against its
// contents (row count, width); Verify also checks the content hash.
func Open(path string) (*Table, error) {
	mapping, err := mmapFile(path)
	if err != nil {
		return nil, fmt.Errorf("open table %q: %w", path, err)
	}
	t := &Table{path: path, mapping: mapping}
	if err := t.init(); err != nil {
		t.Close()
		return nil, fmt.Errorf("open table %q: %w", path, err)
	}
	return t, nil
}

func (t *Table) init() (err error) {
	defer func() {
		// The IPC reader panics on some malformed inputs; a bad file is
		// an error, not a crash.
		if r := recover(); r != nil {
			err = fmt.Errorf("not a readable Arrow IPC file: %v", r)
		}
	}()
	if len(t.mapping) == 0 {
		return errors.New("empty file")
	}
	if err := precheck(t.mapping); err != nil {
		return fmt.Errorf("not a readable Arrow IPC file: %w", err)
	}
	// The mapping is read-only: arrow-go byte-swaps a big-endian file's
	// buffers in place, a write that faults and ends the process (not a
	// panic). The rows are little-endian floats, so such a file is
	// refused instead (Arrow's format lets a reader refuse a byte order).
	t.fr, err = ipc.NewMappedFileReader(t.mapping, ipc.WithEnsureNativeEndian(false))
	if err != nil {
		return fmt.Errorf("not an Arrow IPC file: %w", err)
	}
	s := t.fr.Schema()
	if s.Endianness() != endian.LittleEndian {
		return errors.New("big-endian table file, want little-endian float32 rows")
	}
	if s.NumFields() != 1 || s.Field(0).Name != Column {
		return fmt.Errorf("want one column %q, schema is %s", Column, s)
	}
	lt, ok := s.Field(0).Type.(*arrow.FixedSizeListType)
	if !ok || lt.Elem().ID() != arrow.FLOAT32 {
		return fmt.Errorf("column %q is %s, want fixed_size_list<float32>", Column, s.Field(0).Type)
	}
	md := s.Metadata()
	get := func(k string) string {
		if i := md.FindKey(k); i >= 0 {
			return md.Values()[i]
		}
		return ""
	}
	if v := get(KeyVersion); v != Version {
		return fmt.Errorf("table format version %q, this build reads %q", v, Version)
	}
	t.Name, t.DType, t.SHA256 = get(KeyName), get(KeyDType), get(KeySHA256)
	t.Rows, err = strconv.ParseInt(get(KeyRows), 10, 64)
	if err != nil {
		return fmt.Errorf("metadata %s=%q: %w", KeyRows, get(KeyRows), err)
	}
	t.Dim, err = strconv.Atoi(get(KeyDim))
	if err != nil || t.Dim != int(lt.Len()) || t.Dim <= 0 {
		return fmt.Errorf("metadata %s=%q does not match the column width %d", KeyDim, get(KeyDim), lt.Len())
	}
	if t.DType != "float32" {
		return fmt.Errorf("dtype %q, want float32", t.DType)
	}
	var rows int64
	for i := range t.fr.NumRecords() {
		t.starts = append(t.starts, rows)
		vals, err := t.rows(i)
		if err != nil {
			return err
		}
		rows += int64(len(vals) / t.Dim)
	}
	if rows != t.Rows {
		return fmt.Errorf("metadata says %d rows, the file holds %d (truncated?)", t.Rows, rows)
	}
	return nil
}

// NumBatches is the number of record batches.
func (t *Table) NumBatches() int { return len(t.starts) }

// Batch returns batch i: its first row id and its rows, row-major, aliasing
// the mapping (do not modify; valid until Close).
func (t *Table) Batch(i int) (int64, []float32, error) {
	if i < 0 || i >= len(t.starts) {
		return 0, nil, fmt.Errorf("table %q: record batch %d of %d", t.path, i, len(t.starts))
	}
	vals, err := t.rows(i)
	if err != nil {
		return 0, nil, fmt.Errorf("table %q: %w", t.path, err)
	}
	return t.starts[i], vals, nil
}

// rows returns batch i's values, after checking that the batch is what
// the schema says and that its buffers hold every row it claims: a file
// whose row count, offsets or buffers disagree is an error, never a
// slice past the values (or a panic in the Arrow reader).
func (t *Table) rows(i int) (vals []float32, err error) {
	defer func() {
		if r := recover(); r != nil {
			vals, err = nil, fmt.Errorf("record batch %d: not readable: %v", i, r)
		}
	}()
	rec, err := t.fr.RecordBatch(i)
	if err != nil {
		return nil, fmt.Errorf("record batch %d: %w", i, err)
	}
	if rec.NumCols() != 1 {
		return nil, fmt.Errorf("record batch %d: %d columns, want 1", i, rec.NumCols())
	}
	list, ok := rec.Column(0).(*array.FixedSizeList)
	if !ok {
		return nil, fmt.Errorf("record batch %d: column is %s, want fixed_size_list<float32>", i, rec.Column(0).DataType())
	}
	fv, ok := list.ListValues().(*array.Float32)
	if !ok {
		return nil, fmt.Errorf("record batch %d: list values are %s, want float32", i, list.ListValues().DataType())
	}
	n, off := list.Len(), list.Data().Offset()
	if int64(n) != rec.NumRows() || list.NullN() != 0 || fv.NullN() != 0 {
		return nil, fmt.Errorf("record batch %d: %d rows, a column of %d with %d null rows and %d null values", i, rec.NumRows(), n, list.NullN(), fv.NullN())
	}
	all := fv.Float32Values()
	if n < 0 || off < 0 || int64(off)+int64(n) > int64(len(all))/int64(t.Dim) {
		return nil, fmt.Errorf("record batch %d: %d rows of %d from row %d, its values buffer holds %d values (truncated or corrupt)", i, n, t.Dim, off, len(all))
	}
	return all[off*t.Dim : (off+n)*t.Dim], nil
}

// Verify recomputes the content hash and compares it with the metadata.
func (t *Table) Verify() error {
	h := NewHasher(t.Dim)
	for i := range t.NumBatches() {
		_, rows, err := t.Batch(i)
		if err != nil {
			return err
		}
		h.Write(rows)
	}
	if got := h.Sum(); got != t.SHA256 {
		return fmt.Errorf("table %q: content hash %s, metadata says %s (corrupt file)", t.path, got, t.SHA256)
	}
	return nil
}

// ReadAll copies the whole table into memory, row-major.
func (t *Table) ReadAll() ([]float32, error) {
	out := make([]float32, 0, t.Rows*int64(t.Dim))
	for i := range t.NumBatches() {
		_, rows, err := t.Batch(i)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// Close unmaps the file.
func (t *Table) Close() error {
	if t.fr != nil {
		t.fr.Close()
		t.fr = nil
	}
	if t.mapping != nil {
		err := munmap(t.mapping)
		t.mapping = nil
		return err
	}
	return nil
}

// Path is the file the table was opened from.
func (t *Table) Path() string { return t.path }

// FileName is the conventional file name of a table in a plan's tables/.
func FileName(name string) string {
	return filepath.Join("tables", SafeName(name)+".arrow")
}

// SafeName maps a table (initializer) name to a file-name-safe one.
func SafeName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
