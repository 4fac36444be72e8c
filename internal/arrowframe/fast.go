package arrowframe

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	flatbuffers "github.com/google/flatbuffers/go"
)

// AppendEncode frames n samples of the tensors into dst[:0]'s storage
// (grown if needed) and returns the frame: callers that send many frames
// reuse one buffer. The frame is a standard Arrow IPC stream (arrow-go and
// pyarrow read it), but the record batch message is written here: the
// schema message is cached per layout (names and widths) and the batch's
// metadata is a few dozen bytes of flatbuffer, so the cost is one copy of
// the floats. arrow-go's writer spent most of the embedding tier's encode
// stage (0.4 ms per 270-sample DLRM frame) rebuilding the same schema and
// walking arrays.
func AppendEncode(dst []byte, n int, ts []Tensor) ([]byte, error) {
	cols := make([]Column, len(ts))
	for i, t := range ts {
		if t.Width <= 0 || len(t.Data) != t.rows(n)*t.Width {
			return nil, fmt.Errorf("tensor %q: %d values for %d samples of width %d", t.Name, len(t.Data), t.rows(n), t.Width)
		}
		cols[i] = Column{Name: t.Name, Width: t.Width, Context: t.Context}
	}
	out, views, err := AppendFrame(dst, n, cols)
	if err != nil {
		return nil, err
	}
	for i, t := range ts {
		copy(views[i], t.Data)
	}
	return out, nil
}

// Column is one tensor's place in a frame: its name and the floats per
// sample.
type Column struct {
	Name  string
	Width int
	// Context: the column holds one row shared by every sample, its view
	// Width floats (context.go).
	Context bool
}

// AppendFrame lays out a frame of n samples of the columns in dst[:0]'s
// storage (grown if needed) and returns it with one view per column: the
// column's n*Width floats inside the frame, for the caller to fill before
// sending (their contents are undefined until then; a Context column's
// view is its one row). Filling the views in
// place is what lets the embedding tier gather rows straight into the
// frame it sends, with no copy between its lookup and the wire.
func AppendFrame(dst []byte, n int, cols []Column) (frame []byte, views [][]float32, err error) {
	if n <= 0 {
		return nil, nil, fmt.Errorf("frame of %d samples", n)
	}
	for _, c := range cols {
		if c.Width <= 0 {
			return nil, nil, fmt.Errorf("column %q: width %d", c.Name, c.Width)
		}
	}
	schema, err := schemaMessage(cols)
	if err != nil {
		return nil, nil, err
	}
	// Body layout: per column, the list's validity (empty), the child's
	// validity (empty), the child's values padded to 64 bytes; a context
	// column has its run ends' validity (empty) and values (one int32,
	// padded) first, and one row of values.
	const align = 64
	type buf struct{ off, len int64 }
	bufs := make([]buf, 0, contextBuffers*len(cols))
	nodes := make([]int64, 0, contextNodes*len(cols)) // field node lengths, in order
	vals := make([]int, len(cols))                    // per column, its values' buffer
	runEnds := make([]int, len(cols))                 // per context column, its run ends' buffer
	var body int64
	for i, c := range cols {
		rows := int64(n)
		if c.Context {
			rows = 1
			nodes = append(nodes, int64(n), 1)
			runEnds[i] = len(bufs) + 1
			bufs = append(bufs, buf{body, 0}, buf{body, 4})
			body += align
		}
		l := 4 * rows * int64(c.Width)
		nodes = append(nodes, rows, rows*int64(c.Width))
		vals[i] = len(bufs) + 2
		bufs = append(bufs, buf{body, 0}, buf{body, 0}, buf{body, l})
		body += (l + align - 1) / align * align
	}
	b := flatbuffers.NewBuilder(128 + 16*len(bufs) + 16*len(nodes))
	b.StartVector(16, len(bufs), 8)
	for i := len(bufs) - 1; i >= 0; i-- {
		b.Prep(8, 16)
		b.PrependInt64(bufs[i].len)
		b.PrependInt64(bufs[i].off)
	}
	buffers := b.EndVector(len(bufs))
	b.StartVector(16, len(nodes), 8)
	for i := len(nodes) - 1; i >= 0; i-- { // built backwards
		b.Prep(8, 16)
		b.PrependInt64(0) // null_count
		b.PrependInt64(nodes[i])
	}
	nodeVec := b.EndVector(len(nodes))
	b.StartObject(5) // RecordBatch
	b.PrependInt64Slot(0, int64(n), 0)
	b.PrependUOffsetTSlot(1, nodeVec, 0)
	b.PrependUOffsetTSlot(2, buffers, 0)
	rb := b.EndObject()
	b.StartObject(5) // Message
	b.PrependInt16Slot(0, metadataV5, 0)
	b.PrependByteSlot(1, headerRecordBatch, 0)
	b.PrependUOffsetTSlot(2, rb, 0)
	b.PrependInt64Slot(3, body, 0)
	b.Finish(b.EndObject())
	meta := b.FinishedBytes()

	metaLen := (len(meta) + 7) / 8 * 8 // the body starts on an 8-byte boundary
	need := len(schema) + 8 + metaLen + int(body) + 8
	if cap(dst) < need || uintptr(unsafe.Pointer(unsafe.SliceData(dst[:1])))%8 != 0 {
		dst = make([]byte, 0, need) // Go's allocator aligns it to 8
	}
	out := append(dst[:0], schema...)
	out = binary.LittleEndian.AppendUint32(out, continuation)
	out = binary.LittleEndian.AppendUint32(out, uint32(metaLen))
	out = append(out, meta...)
	out = append(out, zeros[:metaLen-len(meta)]...)
	// The schema message and the metadata are multiples of 8 bytes, and
	// the buffer's start is 8-aligned (Go's allocator), so every column
	// starts 4-aligned for its float32 view.
	start := len(out)
	out = out[:start+int(body)]
	views = make([][]float32, len(cols))
	for i, c := range cols {
		if c.Context {
			off := start + int(bufs[runEnds[i]].off)
			binary.LittleEndian.PutUint32(out[off:], uint32(n))
			clear(out[off+4 : off+align])
		}
		off := start + int(bufs[vals[i]].off)
		l := int(bufs[vals[i]].len)
		views[i] = bytesAsFloat32(out[off : off+l : off+l])
		clear(out[off+l : off+l+pad(l, align)]) // padding bytes are zero, as Arrow asks
	}
	out = binary.LittleEndian.AppendUint32(out, continuation)
	out = binary.LittleEndian.AppendUint32(out, 0)
	return out, views, nil
}

// bytesAsFloat32 views b (4-aligned, a multiple of 4 bytes) as floats.
func bytesAsFloat32(b []byte) []float32 {
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		panic("arrowframe: float32 view of an unaligned buffer")
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

const (
	metadataV5        = 4 // MetadataVersion.V5
	headerRecordBatch = 3 // MessageHeader.RecordBatch
)

var zeros [64]byte

func pad(n, align int) int { return (align - n%align) % align }

// schemas caches the schema message (framed) per layout.
var schemas sync.Map

func schemaMessage(ts []Column) ([]byte, error) {
	var key strings.Builder
	for _, t := range ts {
		key.WriteString(t.Name)
		key.WriteByte(0)
		key.WriteString(strconv.Itoa(t.Width))
		if t.Context {
			key.WriteByte('c')
		}
		key.WriteByte(0)
	}
	if v, ok := schemas.Load(key.String()); ok {
		return v.([]byte), nil
	}
	// Let arrow-go write a one-row frame of this layout and keep its
	// first message, the schema.
	probe := make([]Tensor, len(ts))
	for i, t := range ts {
		probe[i] = Tensor{Name: t.Name, Width: t.Width, Data: make([]float32, t.Width), Context: t.Context}
	}
	frame, err := encodeWithArrow(nil, 1, probe)
	if err != nil {
		return nil, err
	}
	r := &bytesMessages{b: frame}
	if _, err := r.Message(); err != nil {
		return nil, fmt.Errorf("schema message: %w", err)
	}
	schema := append([]byte(nil), frame[:r.off]...)
	schemas.Store(key.String(), schema)
	return schema, nil
}
