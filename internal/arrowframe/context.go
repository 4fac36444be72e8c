package arrowframe

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// A context tensor is one whose every sample holds the same values: a cut
// tensor computed from a request's context features alone (looked up and
// pooled once per micro-batch). It crosses in the frame once, not once per
// sample, as a standard Arrow run-end encoded column of one run:
//
//	run_end_encoded<run_ends: int32, values: fixed_size_list<float32>[width]>
//
// with the run ends [n] and one row of values: n logical rows, width
// floats on the wire. The column's type is the mark (Tensor.Context,
// Column.Context); any Arrow reader sees n rows. The dense worker expands
// the row into its batch as it copies samples into ONNX Runtime's input
// (gpuserve/batcher.go).
//
// In the record batch message such a column takes four field nodes (the
// run-end encoded array, n rows; its run ends, 1; its values list, 1; the
// list's floats, width) and five buffers (the run ends' validity and
// values, the list's validity, the floats' validity and values; a
// run-end encoded array has no buffer of its own).
const (
	// maxContextRows bounds the rows of a frame whatever its body: a
	// frame of context columns only carries many rows in few bytes.
	maxContextRows = 1 << 16

	contextNodes   = 4
	contextBuffers = 5
	plainNodes     = 2
	plainBuffers   = 3
)

// contextType is the Arrow type of a context column of width floats.
func contextType(width int) *arrow.RunEndEncodedType {
	return arrow.RunEndEncodedOf(arrow.PrimitiveTypes.Int32, arrow.FixedSizeListOfNonNullable(int32(width), arrow.PrimitiveTypes.Float32))
}

// contextColumn reads a run-end encoded column of a frame of n rows, as
// arrow-go's reader decoded it: int32 run ends [n] over one row of
// fixed_size_list<float32>, without nulls.
func contextColumn(name string, rt *arrow.RunEndEncodedType, col arrow.Array, n int) (Tensor, error) {
	lt, ok := rt.Encoded().(*arrow.FixedSizeListType)
	if !ok || rt.RunEnds().ID() != arrow.INT32 || lt.Elem().ID() != arrow.FLOAT32 {
		return Tensor{}, fmt.Errorf("%w: column %q is %s, want run_end_encoded<int32, fixed_size_list<float32>>", ErrMalformed, name, rt)
	}
	ree, ok := col.(*array.RunEndEncoded)
	if !ok || ree.Len() != n || ree.Data().Offset() != 0 {
		return Tensor{}, fmt.Errorf("%w: context column %q is not %d rows", ErrMalformed, name, n)
	}
	ends, ok := ree.RunEndsArr().(*array.Int32)
	if !ok || ends.Len() != 1 || ends.NullN() > 0 || ends.Value(0) != int32(n) {
		return Tensor{}, fmt.Errorf("%w: context column %q: want one run of %d rows", ErrMalformed, name, n)
	}
	list, ok := ree.Values().(*array.FixedSizeList)
	if !ok || list.Len() != 1 || hasNulls(list) {
		return Tensor{}, fmt.Errorf("%w: context column %q: want one row of values without nulls", ErrMalformed, name)
	}
	vals := list.ListValues().(*array.Float32).Float32Values()
	w := int(lt.Len())
	off := list.Data().Offset() * w
	if w <= 0 || off+w > len(vals) {
		return Tensor{}, fmt.Errorf("%w: context column %q is short", ErrMalformed, name)
	}
	return Tensor{Name: name, Width: w, Data: vals[off : off+w : off+w], Context: true}, nil
}

// Repeat fills dst with row over and over (len(dst) a multiple of
// len(row)): a context tensor's row expanded into samples. It copies in
// doubling blocks, so a narrow row costs a few large copies, not one
// small copy per sample.
func Repeat(dst, row []float32) {
	if len(row) == 0 {
		return
	}
	k := copy(dst, row)
	for k < len(dst) {
		k += copy(dst[k:], dst[:k])
	}
}

// Expand writes t's n samples into dst (n*Width floats): a context
// tensor's row n times, a dictionary-encoded one's (DecodeIndexed) the
// rows its indices pick, another tensor's data as it is.
func (t Tensor) Expand(dst []float32, n int) {
	switch {
	case t.Context:
		Repeat(dst[:n*t.Width], t.Data)
	case t.Index != nil:
		Gather(dst[:n*t.Width], t.Data, t.Index[:n], t.Width)
	default:
		copy(dst, t.Data[:n*t.Width])
	}
}

// Gather writes into dst, for each index, the row of w floats it picks
// from rows: dst holds len(index)*w floats, and every index is a row of
// rows (DecodeIndexed checked them; an index outside panics).
func Gather(dst, rows []float32, index []int32, w int) {
	dst = dst[:len(index)*w]
	if w == 16 { // the common embedding width: a row is one fixed-size move, not a memmove call
		for s, k := range index {
			*(*[16]float32)(dst[s*16:]) = *(*[16]float32)(rows[int(k)*16:])
		}
		return
	}
	for s, k := range index {
		copy(dst[s*w:(s+1)*w], rows[int(k)*w:(int(k)+1)*w])
	}
}
