// Package arrowframe frames the tensors that cross from the embedding
// tier to the dense tier: one Arrow IPC stream holding one record batch,
// one FixedSizeList<float32>[width] column per tensor, one row per
// sample. The buffers are the tensors' raw little-endian floats; Encode
// wraps them without copying element by element. A context tensor (the
// same values for every sample: context.go) travels once, as a
// run-end encoded column of one run.
package arrowframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/internal/leview"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Tensor is one named tensor of n samples x Width floats.
type Tensor struct {
	Name  string
	Width int
	Data  []float32 // n*Width, sample-major; Width when Context
	// Context: every sample holds the same Width values, Data's only
	// row; the frame carries that row once (context.go).
	Context bool
	// Index, when set, dictionary-encodes the tensor for Encode (dict.go):
	// Data holds its distinct rows, and Index (n entries) each sample's
	// row among them. Decode never returns it (it expands such a
	// column); DecodeIndexed may.
	Index []int32
	// dict is how Decode read the column (dict.go): a dictionary
	// column's Data is an expansion of its own, not a view of the frame.
	dict int
}

// rows is how many rows of t's values the frame carries for n samples.
func (t Tensor) rows(n int) int {
	switch {
	case t.Context:
		return 1
	case t.Index != nil && t.Width > 0:
		return len(t.Data) / t.Width
	}
	return n
}

// check is Encode's check of a tensor of n samples.
func (t Tensor) check(n int) error {
	if t.Width <= 0 || len(t.Data) != t.rows(n)*t.Width {
		return fmt.Errorf("tensor %q: %d values for %d samples of width %d", t.Name, len(t.Data), t.rows(n), t.Width)
	}
	if t.Index == nil {
		return nil
	}
	if t.Context || len(t.Index) != n || len(t.Data) == 0 {
		return fmt.Errorf("tensor %q: a dictionary of %d rows with %d indices for %d samples", t.Name, t.rows(n), len(t.Index), n)
	}
	for s, k := range t.Index {
		if k < 0 || int(k) >= t.rows(n) {
			return fmt.Errorf("tensor %q: sample %d indexes row %d of %d", t.Name, s, k, t.rows(n))
		}
	}
	return nil
}

// Encode frames n samples of the tensors.
func Encode(n int, ts []Tensor) ([]byte, error) { return AppendEncode(nil, n, ts) }

// encodeWithArrow frames with arrow-go's IPC writer: the reference the
// fast encoder (AppendEncode, fast.go) is tested against, and the source
// of the schema message it caches.
func encodeWithArrow(dst []byte, n int, ts []Tensor) ([]byte, error) {
	fields := make([]arrow.Field, len(ts))
	cols := make([]arrow.Array, len(ts))
	defer func() {
		for _, c := range cols {
			if c != nil {
				c.Release()
			}
		}
	}()
	for i, t := range ts {
		if err := t.check(n); err != nil {
			return nil, err
		}
		lt := arrow.FixedSizeListOfNonNullable(int32(t.Width), arrow.PrimitiveTypes.Float32)
		var raw []byte
		if len(t.Data) > 0 {
			raw = leview.Bytes(t.Data)
		}
		vals := array.NewData(arrow.PrimitiveTypes.Float32, len(t.Data), []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
		list := array.NewData(lt, t.rows(n), []*memory.Buffer{nil}, []arrow.ArrayData{vals}, 0, 0)
		vals.Release()
		if t.Index != nil {
			dt := dictType(t.Width)
			fields[i] = arrow.Field{Name: t.Name, Type: dt}
			idx := array.NewData(arrow.PrimitiveTypes.Int32, n, []*memory.Buffer{nil, memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(t.Index))}, nil, 0, 0)
			dict := array.NewFixedSizeListData(list)
			ind := array.MakeFromData(idx)
			cols[i] = array.NewDictionaryArray(dt, ind, dict)
			ind.Release()
			dict.Release()
			idx.Release()
			list.Release()
			continue
		}
		if !t.Context {
			fields[i] = arrow.Field{Name: t.Name, Type: lt}
			cols[i] = array.NewFixedSizeListData(list)
			list.Release()
			continue
		}
		rt := contextType(t.Width)
		fields[i] = arrow.Field{Name: t.Name, Type: rt}
		ends := array.NewData(arrow.PrimitiveTypes.Int32, 1, []*memory.Buffer{nil, memory.NewBufferBytes(binary.LittleEndian.AppendUint32(nil, uint32(n)))}, nil, 0, 0)
		ree := array.NewData(rt, n, []*memory.Buffer{nil}, []arrow.ArrayData{ends, list}, 0, 0)
		cols[i] = array.NewRunEndEncodedData(ree)
		ends.Release()
		list.Release()
		ree.Release()
	}
	schema := arrow.NewSchema(fields, nil)
	rec := array.NewRecordBatch(schema, cols, int64(n))
	defer rec.Release()
	// Room for the data, 64-byte padding of every buffer, and the schema
	// and batch messages, so the buffer grows at most once.
	need := n*rowBytes(ts) + 256*len(ts) + 8192
	if cap(dst) < need {
		dst = make([]byte, 0, need)
	}
	buf := bytes.NewBuffer(dst[:0])
	w := ipc.NewWriter(buf, ipc.WithSchema(schema))
	if err := w.Write(rec); err != nil {
		return nil, fmt.Errorf("encode tensors: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("encode tensors: %w", err)
	}
	return buf.Bytes(), nil
}

func rowBytes(ts []Tensor) int {
	b := 0
	for _, t := range ts {
		if !t.Context {
			b += 4 * t.Width
		}
	}
	return b
}

// goAlloc allocates with Go's heap: buffers outlive the reader's Release
// and are collected when the tensors are dropped.
var goAlloc = memory.NewGoAllocator()

// ErrMalformed wraps every decoding failure: the caller answers
// InvalidArgument.
var ErrMalformed = errors.New("malformed tensor frame")

// Decode reads a frame: the number of samples and the tensors, in column
// order. The data slices alias b (no copy): b must stay unchanged while
// they are in use.
//
// A frame whose schema message is byte for byte one that arrow-go has
// already read successfully (a small cache, decode_fast.go) has its record
// batch read here, without arrow-go; anything unusual about it, and every
// other frame, goes through arrow-go's IPC reader (decodeWithArrow). Both
// give the same result for every frame arrow-go's path accepts, and the
// fast path accepts no frame that path refuses.
func Decode(b []byte) (n int, ts []Tensor, err error) { return DecodeWith(b, nil) }

// DecodeWith is Decode with alloc (nil: make) giving the memory that
// dictionary-encoded columns expand into on the fast path: alloc(k)
// returns at least k floats, whose contents may be anything (every one
// of the first k is written); the caller may recycle what it handed out
// once it is done with the tensors.
func DecodeWith(b []byte, alloc func(int) []float32) (n int, ts []Tensor, err error) {
	return DecodeWant(b, Want{}, alloc)
}

// Want is what a caller knows a frame must hold. DecodeWant checks it
// against the frame's schema and record batch header, before expanding
// any dictionary column: a frame that could never be accepted costs its
// reader about its own bytes, not up to dictBudget's expansion.
type Want struct {
	// Rows, when above 0, is the number of samples the frame must hold;
	// a frame of another number is refused with a *RowsError.
	Rows int
	// Column, when set, is called for every column of the schema, in
	// order, with its name and width (floats per sample); an error it
	// returns refuses the frame and is DecodeWant's error, as is.
	Column func(name string, width int) error
}

// RowsError: a frame holds Got samples, where Want.Rows said Want.
type RowsError struct{ Got, Want int }

func (e *RowsError) Error() string {
	return fmt.Sprintf("tensors hold %d samples, want %d", e.Got, e.Want)
}

// DecodeWant is DecodeWith refusing, before any expansion, a frame that
// is not what want says.
func DecodeWant(b []byte, want Want, alloc func(int) []float32) (n int, ts []Tensor, err error) {
	return decodeWant(b, want, alloc, false)
}

// decodeWant is DecodeWant; indexed leaves the fast path's dictionary
// columns unexpanded (DecodeIndexedWant).
func decodeWant(b []byte, want Want, alloc func(int) []float32, indexed bool) (n int, ts []Tensor, err error) {
	if s := cachedSchemaOf(b); s != nil {
		// The schema is byte for byte one arrow-go read: its columns are
		// those arrow-go's path would check.
		if err := want.columns(s.names, s.widths); err != nil {
			return 0, nil, err
		}
		if n, ts, ok := s.decodeMode(b, alloc, indexed, want.Rows); ok {
			return n, ts, nil
		}
		want.Column = nil // checked: arrow-go reads the same schema
	}
	n, ts, err = decodeArrowWant(b, want)
	if err == nil {
		rememberSchema(b, n, ts)
	}
	return n, ts, err
}

// DecodeIndexed is Decode, except that a dictionary-encoded column
// comes back unexpanded where the fast path reads its frame (int32
// indices, as Prism's embedding tier writes them): Data holds its
// distinct rows and Index each sample's row among them (n entries, every
// one checked to be in range), both views of b. Every other column, and
// every column of a frame the fast path declines, comes back as Decode
// returns it (Index nil). For a consumer that copies the rows anyway
// (the dense tier's batcher gathering several requests into one batch),
// this saves expanding each frame first; Tensor.Expand writes either
// form out in full.
func DecodeIndexed(b []byte) (n int, ts []Tensor, err error) {
	return DecodeIndexedWant(b, Want{})
}

// DecodeIndexedWant is DecodeIndexed refusing, as DecodeWant does, a
// frame that is not what want says: its columns (names and widths, from
// the schema) and its number of samples (from the record batch's
// header) are checked before any column is expanded, on arrow-go's path
// too (which expands every dictionary column), so that a frame that
// could never be accepted costs its reader about its own bytes.
func DecodeIndexedWant(b []byte, want Want) (n int, ts []Tensor, err error) {
	return decodeWant(b, want, nil, true)
}

// columns calls w.Column for each column.
func (w Want) columns(names []string, widths []int) error {
	if w.Column == nil {
		return nil
	}
	for i, name := range names {
		if err := w.Column(name, widths[i]); err != nil {
			return err
		}
	}
	return nil
}

// rows checks a frame's number of samples against w.Rows.
func (w Want) rows(n int) error {
	if w.Rows > 0 && n != w.Rows {
		return &RowsError{Got: n, Want: w.Rows}
	}
	return nil
}

// decodeWithArrow is Decode through arrow-go's IPC reader: the reference
// for the fast path, and the path for every frame it does not take.
func decodeWithArrow(b []byte) (n int, ts []Tensor, err error) { return decodeArrowWant(b, Want{}) }

// decodeArrowWant is decodeWithArrow checking want before expanding any
// column.
func decodeArrowWant(b []byte, want Want) (n int, ts []Tensor, err error) {
	defer func() {
		// A hostile buffer can make the IPC reader panic; it is bad
		// input, not a crash.
		if r := recover(); r != nil {
			n, ts, err = 0, nil, fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	// arrow-go would byte-swap a big-endian frame's buffers in place,
	// that is inside b: the caller's bytes change under it, and a second
	// decode of b swaps them back into wrong numbers. The tensors are
	// views of little-endian floats, so such a frame is refused (Arrow's
	// format lets a reader refuse a byte order not its own).
	r, err := ipc.NewReaderFromMessageReader(&bytesMessages{b: b}, ipc.WithAllocator(goAlloc), ipc.WithEnsureNativeEndian(false))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	defer r.Release()
	if r.Schema().Endianness() != endian.LittleEndian {
		return 0, nil, fmt.Errorf("%w: big-endian frame (tensors travel little-endian)", ErrMalformed)
	}
	if !r.Next() {
		if err := r.Err(); err != nil {
			return 0, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return 0, nil, fmt.Errorf("%w: no record batch", ErrMalformed)
	}
	rec := r.RecordBatch()
	n = int(rec.NumRows())
	if want.Column != nil {
		var names []string
		var widths []int
		for _, f := range rec.Schema().Fields() {
			if w, ok := columnWidth(f.Type); ok {
				names, widths = append(names, f.Name), append(widths, w)
			}
		}
		if err := want.columns(names, widths); err != nil {
			return 0, nil, err
		}
	}
	if err := want.rows(n); err != nil {
		return 0, nil, err
	}
	budget := dictBudget(len(b))
	for i, f := range rec.Schema().Fields() {
		if dt, ok := f.Type.(*arrow.DictionaryType); ok {
			t, err := dictionaryColumn(f.Name, dt, rec.Column(i), n, &budget)
			if err != nil {
				return 0, nil, err
			}
			ts = append(ts, t)
			continue
		}
		if rt, ok := f.Type.(*arrow.RunEndEncodedType); ok {
			t, err := contextColumn(f.Name, rt, rec.Column(i), n)
			if err != nil {
				return 0, nil, err
			}
			ts = append(ts, t)
			continue
		}
		lt, ok := f.Type.(*arrow.FixedSizeListType)
		if !ok || lt.Elem().ID() != arrow.FLOAT32 {
			return 0, nil, fmt.Errorf("%w: column %q is %s, want fixed_size_list<float32> (or, for a context column, run_end_encoded<int32, fixed_size_list<float32>>; for repeated rows, dictionary<integer, fixed_size_list<float32>>)", ErrMalformed, f.Name, f.Type)
		}
		list := rec.Column(i).(*array.FixedSizeList)
		if hasNulls(list) {
			return 0, nil, fmt.Errorf("%w: column %q has nulls", ErrMalformed, f.Name)
		}
		vals := list.ListValues().(*array.Float32).Float32Values()
		w := int(lt.Len())
		off := list.Data().Offset() * w
		if off+n*w > len(vals) {
			return 0, nil, fmt.Errorf("%w: column %q is short", ErrMalformed, f.Name)
		}
		ts = append(ts, Tensor{Name: f.Name, Width: w, Data: vals[off : off+n*w : off+n*w]})
	}
	if r.Next() {
		return 0, nil, fmt.Errorf("%w: more than one record batch", ErrMalformed)
	}
	return n, ts, nil
}

// columnWidth is the floats per sample of a column of type dt, for the
// types Decode reads (plain, context and dictionary columns); ok is
// false for any other, which Decode refuses.
func columnWidth(dt arrow.DataType) (width int, ok bool) {
	switch t := dt.(type) {
	case *arrow.DictionaryType:
		dt = t.ValueType
	case *arrow.RunEndEncodedType:
		dt = t.Encoded()
	}
	lt, ok := dt.(*arrow.FixedSizeListType)
	if !ok || lt.Elem().ID() != arrow.FLOAT32 {
		return 0, false
	}
	return int(lt.Len()), true
}

// hasNulls reports whether a fixed_size_list<float32> array has a null
// list or a null float: the floats under a null are whatever bytes the
// writer left there, never a value to score with.
func hasNulls(list *array.FixedSizeList) bool {
	return list.NullN() > 0 || list.ListValues().NullN() > 0
}

// bytesMessages reads IPC messages straight out of a byte slice: each
// message body is a window on the slice, not a copy (arrow-go's own
// message reader copies every body into a new buffer).
type bytesMessages struct {
	b   []byte
	off int
	cur *ipc.Message
}

var _ ipc.MessageReader = (*bytesMessages)(nil)

const continuation = 0xFFFFFFFF

func (r *bytesMessages) next32() (uint32, error) {
	if r.off+4 > len(r.b) {
		return 0, fmt.Errorf("%w: truncated at byte %d", ErrMalformed, r.off)
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v, nil
}

func (r *bytesMessages) Message() (*ipc.Message, error) {
	if r.off == len(r.b) {
		return nil, io.EOF
	}
	v, err := r.next32()
	if err != nil {
		return nil, err
	}
	if v == continuation {
		if v, err = r.next32(); err != nil {
			return nil, err
		}
	}
	if v == 0 {
		return nil, io.EOF // end-of-stream marker
	}
	metaLen := int(v)
	if metaLen < 4 || r.off+metaLen > len(r.b) {
		return nil, fmt.Errorf("%w: message metadata of %d bytes at byte %d overruns the frame", ErrMalformed, metaLen, r.off)
	}
	if err := checkMeta(r.b[r.off : r.off+metaLen]); err != nil {
		return nil, err
	}
	meta := memory.NewBufferBytes(r.b[r.off : r.off+metaLen])
	r.off += metaLen
	probe := ipc.NewMessage(meta, memory.NewBufferBytes(nil))
	bodyLen := probe.BodyLen()
	probe.Release()
	if bodyLen < 0 || int64(r.off)+bodyLen > int64(len(r.b)) {
		return nil, fmt.Errorf("%w: message body of %d bytes at byte %d overruns the frame", ErrMalformed, bodyLen, r.off)
	}
	body := memory.NewBufferBytes(r.b[r.off : r.off+int(bodyLen)])
	r.off += int(bodyLen)
	if r.cur != nil {
		r.cur.Release()
	}
	r.cur = ipc.NewMessage(meta, body)
	return r.cur, nil
}

func (r *bytesMessages) Retain()  {}
func (r *bytesMessages) Release() {}
