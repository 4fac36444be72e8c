package arrowframe

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// A dictionary-encoded column carries each distinct row once (the
// dictionary, a DictionaryBatch message before the record batch) and an
// integer index per sample:
//
//	dictionary<indices: int8..int64 or uint8..uint64, values: fixed_size_list<float32>[width]>
//
// It is Arrow's standard form for repeated values, which other Arrow
// writers produce too (tested with arrow-go's NewDictionaryArray and IPC
// writer), and the one that fits a cut tensor whose rows
// repeat within a micro-batch: a pooled embedding of one id per sample
// repeats wherever the id does, and within a 270-candidate request about
// 57% of the (sample, table) ids do (BENCHMARKS.md). Decode reads such a
// column (through arrow-go's reader) and expands it into n rows, so the
// dense tier's consumers see the same tensor as from a plain column.
//
// Expanding multiplies bytes: a dictionary of one row and n one-byte
// indices become n rows. A frame's expanded dictionary columns may take
// at most maxDictExpansion times the frame's own bytes, or
// minDictExpansionBudget if that is larger, so a small hostile frame
// cannot ask for gigabytes.
const (
	maxDictExpansion       = 64
	minDictExpansionBudget = 64 << 20
)

// A dictionary column in a record batch message takes one field node
// (its indices: n rows) and two buffers (their validity and values); its
// rows are in its DictionaryBatch message.
const (
	dictNodes   = 1
	dictBuffers = 2
)

// Tensor.dict: how Decode read a column.
const (
	dictNone  = iota // a plain or context column
	dictInt32        // dictionary-encoded with int32 indices (the fast path takes these)
	dictOther        // dictionary-encoded with other indices (arrow-go's path only)
)

// dictType is the Arrow type of the dictionary-encoded columns Prism
// writes: int32 indices into fixed_size_list<float32>[width] rows.
func dictType(width int) *arrow.DictionaryType {
	return &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: arrow.FixedSizeListOfNonNullable(int32(width), arrow.PrimitiveTypes.Float32)}
}

// dictBudget is the bytes a frame of frameBytes may expand its
// dictionary columns into.
func dictBudget(frameBytes int) int64 {
	return max(int64(frameBytes)*maxDictExpansion, minDictExpansionBudget)
}

// dictionaryColumn reads a dictionary-encoded column of a frame of n
// rows, as arrow-go's reader decoded it, into a plain tensor of n rows;
// budget is what the frame may still expand into (bytes), reduced by
// this column's.
func dictionaryColumn(name string, dt *arrow.DictionaryType, col arrow.Array, n int, budget *int64) (Tensor, error) {
	lt, ok := dt.ValueType.(*arrow.FixedSizeListType)
	if !ok || lt.Elem().ID() != arrow.FLOAT32 || !arrow.IsInteger(dt.IndexType.ID()) {
		return Tensor{}, fmt.Errorf("%w: column %q is %s, want dictionary<integer, fixed_size_list<float32>>", ErrMalformed, name, dt)
	}
	d, ok := col.(*array.Dictionary)
	if !ok || d.Len() != n {
		return Tensor{}, fmt.Errorf("%w: dictionary column %q is not %d rows", ErrMalformed, name, n)
	}
	if d.NullN() > 0 {
		return Tensor{}, fmt.Errorf("%w: column %q has nulls", ErrMalformed, name)
	}
	list, ok := d.Dictionary().(*array.FixedSizeList)
	if !ok || hasNulls(list) {
		return Tensor{}, fmt.Errorf("%w: dictionary of column %q: want fixed_size_list<float32> rows without nulls", ErrMalformed, name)
	}
	w := int(lt.Len())
	rows := list.Len()
	vals := list.ListValues().(*array.Float32).Float32Values()
	off := list.Data().Offset() * w
	if w <= 0 || rows < 0 || off+rows*w > len(vals) {
		return Tensor{}, fmt.Errorf("%w: dictionary of column %q is short", ErrMalformed, name)
	}
	dict := vals[off : off+rows*w]
	need := int64(n) * int64(w) * 4
	if need > *budget {
		return Tensor{}, fmt.Errorf("%w: dictionary column %q expands to %d bytes, past what a frame of its size may (%d left)", ErrMalformed, name, need, *budget)
	}
	*budget -= need
	out := make([]float32, n*w)
	for s := range n {
		k := d.GetValueIndex(s)
		if k < 0 || k >= rows {
			return Tensor{}, fmt.Errorf("%w: dictionary column %q: sample %d indexes row %d of %d", ErrMalformed, name, s, k, rows)
		}
		copy(out[s*w:(s+1)*w], dict[k*w:(k+1)*w])
	}
	how := dictOther
	if dt.IndexType.ID() == arrow.INT32 {
		how = dictInt32
	}
	return Tensor{Name: name, Width: w, Data: out, dict: how}, nil
}
