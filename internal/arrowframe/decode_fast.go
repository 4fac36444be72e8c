package arrowframe

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	flatbuffers "github.com/google/flatbuffers/go"
)

// The fast decode path. A dense worker receives frames of one or a few
// layouts, each frame starting with the same schema message; arrow-go's
// reader re-parses that schema and builds arrays for every frame. Here a
// schema message arrow-go has read successfully is remembered (the
// message's exact bytes, with the column names and widths decoded from
// it), and a frame that starts with those bytes has its record batch
// message read by hand: the flatbuffer's batch length, field nodes and
// buffers, checked against the body, and the tensors are views of b, the
// same slices arrow-go's path returns.
//
// The fast path takes only the plain frame, as AppendEncode and arrow-go's
// writer produce it: one uncompressed V5 record batch whose nodes and
// buffers are exactly the layout's, no nulls, every buffer inside the
// body, each column's values long enough (and aligned where the CPU needs
// it, see unalignedFloats), then the end of the stream (or of the bytes).
// On anything else (including a panic while reading the flatbuffer) it
// declines and Decode goes through arrow-go, which accepts or refuses the
// frame as it always did: the fast path returns no error of its own.

// Limits of the schema cache: a few layouts, each schema message at most
// maxCachedSchema bytes, so hostile (but valid) frames churning through
// new schemas cost a bounded amount of memory.
const (
	schemaCacheCap  = 8
	maxCachedSchema = 256 << 10
)

// unalignedFloats says whether float32s may be read at any address here.
// arrow-go's path views a column's values in place at whatever address
// they have (it never copies to align), and so does the fast path on
// amd64 and arm64, whose loads need no alignment (Go's checkptr allows
// unaligned pointers to pointer-free types): a frame is not always
// 4-byte aligned, since the dense tier's ScoreRequest aliases the frame
// inside the received message, after the model name and the other small
// fields. Elsewhere the fast path takes only 4-byte aligned columns.
const unalignedFloats = runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"

// cachedSchema is a schema message arrow-go has decoded, and its columns.
type cachedSchema struct {
	msg    []byte // the framed message: continuation, length, metadata, body
	names  []string
	widths []int
	ctx    []bool // per column: a context column (context.go)
	dict   []bool // per column: dictionary-encoded with int32 indices (dict.go)
	// dictIDs are the dictionary columns' ids in column order, as the
	// schema gives them: a writer may number dictionaries as it likes,
	// and a DictionaryBatch belongs to the column of its id, not to the
	// column at its position.
	dictIDs []int64
}

// schemaCache holds the most recently learned schemas, newest first. Readers
// load the list without locking; writers copy it under mu.
var schemaCache struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*cachedSchema]
}

// lookupSchema returns the cached schema b starts with, or nil.
func lookupSchema(b []byte) *cachedSchema {
	l := schemaCache.list.Load()
	if l == nil {
		return nil
	}
	for _, s := range *l {
		if len(b) >= len(s.msg) && bytes.Equal(b[:len(s.msg)], s.msg) {
			return s
		}
	}
	return nil
}

// decodeCached is the fast path: ok is false where it declines, and Decode
// must then use arrow-go's reader.
func decodeCached(b []byte) (n int, ts []Tensor, ok bool) { return decodeCachedWith(b, nil) }

// decodeCachedWith is decodeCached with alloc for dictionary columns'
// expansions (nil: make).
func decodeCachedWith(b []byte, alloc func(int) []float32) (n int, ts []Tensor, ok bool) {
	return decodeCachedMode(b, alloc, false)
}

// decodeCachedMode is decodeCachedWith; indexed leaves dictionary
// columns unexpanded (DecodeIndexed).
func decodeCachedMode(b []byte, alloc func(int) []float32, indexed bool) (n int, ts []Tensor, ok bool) {
	s := cachedSchemaOf(b)
	if s == nil {
		return 0, nil, false
	}
	return s.decodeMode(b, alloc, indexed, 0)
}

// cachedSchemaOf is the cached schema b starts with, or nil where the
// fast path does not apply.
func cachedSchemaOf(b []byte) *cachedSchema {
	if endian.IsBigEndian {
		return nil // arrow-go would swap the little-endian frames
	}
	return lookupSchema(b)
}

// Slots of Arrow's Message.fbs tables (vtable offsets).
const (
	slotMsgVersion    = 4
	slotMsgHeaderType = 6
	slotMsgHeader     = 8
	slotMsgBodyLength = 10
	slotMsgMeta       = 12

	slotRBLength      = 4
	slotRBNodes       = 6 // [FieldNode]: struct {length, null_count int64}
	slotRBBuffers     = 8 // [Buffer]: struct {offset, length int64}
	slotRBCompression = 10
	slotRBVariadic    = 12

	slotSchemaEndianness = 4

	slotDictID      = 4
	slotDictData    = 6
	slotDictIsDelta = 8

	fbMetadataV5            = 4 // MetadataVersion.V5
	fbHeaderSchema          = 1 // MessageHeader.Schema
	fbHeaderDictionaryBatch = 2 // MessageHeader.DictionaryBatch
	fbHeaderRecordBatch     = 3 // MessageHeader.RecordBatch
)

// decode reads the record batch after the schema message s.msg at the
// start of b. It never fails: where the frame is not the plain one it
// declines (ok false), even on a panic.
func (s *cachedSchema) decode(b []byte) (n int, ts []Tensor, ok bool) { return s.decodeWith(b, nil) }

// decodeWith is decode with alloc for dictionary columns' expansions
// (nil: make).
func (s *cachedSchema) decodeWith(b []byte, alloc func(int) []float32) (n int, ts []Tensor, ok bool) {
	return s.decodeMode(b, alloc, false, 0)
}

// decodeMode is decodeWith; indexed leaves each dictionary column
// unexpanded: its distinct rows and its indices, views of b, every index
// checked (DecodeIndexed). With wantRows above 0 it declines, before
// expanding any column, a batch of another number of rows (arrow-go's
// path then refuses it, also before expanding).
func (s *cachedSchema) decodeMode(b []byte, alloc func(int) []float32, indexed bool, wantRows int) (n int, ts []Tensor, ok bool) {
	defer func() {
		if recover() != nil {
			n, ts, ok = 0, nil, false
		}
	}()
	// The dictionaries first, one DictionaryBatch per dictionary column
	// in column order (ids 0, 1, ...), each one record batch of rows.
	off := len(s.msg)
	var dicts [][]float32
	for i, w := range s.widths {
		if !s.dict[i] {
			continue
		}
		d, end, ok := s.dictionary(b, off, s.dictIDs[len(dicts)], w)
		if !ok {
			return 0, nil, false
		}
		dicts, off = append(dicts, d), end
	}
	meta, body, end, ok := messageAt(b, off)
	if !ok {
		return 0, nil, false
	}
	// After the batch, arrow-go's reader must see the end of the stream:
	// the end of b, or an end-of-stream marker (what follows it is never
	// read). Anything else, arrow-go decides.
	switch rest := b[end:]; {
	case len(rest) == 0:
	case len(rest) >= 4 && binary.LittleEndian.Uint32(rest) == 0:
	case len(rest) >= 8 && binary.LittleEndian.Uint32(rest) == continuation && binary.LittleEndian.Uint32(rest[4:]) == 0:
	default:
		return 0, nil, false
	}

	msg := root(meta)
	if msg.GetInt16Slot(slotMsgVersion, 0) != fbMetadataV5 ||
		msg.GetUint8Slot(slotMsgHeaderType, 0) != fbHeaderRecordBatch ||
		msg.Offset(slotMsgMeta) != 0 {
		return 0, nil, false
	}
	var rb flatbuffers.Table
	if !union(msg, slotMsgHeader, &rb) {
		return 0, nil, false
	}
	if rb.Offset(slotRBCompression) != 0 || rb.Offset(slotRBVariadic) != 0 {
		return 0, nil, false
	}
	rows := rb.GetInt64Slot(slotRBLength, 0)
	bodyLen := int64(end - body)
	// Every row of a plain column takes at least 4 bytes of body (checked
	// per column below, which keeps rows*width below overflow); a frame
	// of context columns only may hold up to maxContextRows rows in any
	// body (guard.go).
	if rows <= 0 || rows > max(bodyLen/4, maxContextRows) || (wantRows > 0 && rows != int64(wantRows)) {
		return 0, nil, false
	}
	cols := len(s.widths)
	wantNodes, wantBufs := 0, 0
	for i, c := range s.ctx {
		switch {
		case s.dict[i]:
			wantNodes, wantBufs = wantNodes+dictNodes, wantBufs+dictBuffers
		case c:
			wantNodes, wantBufs = wantNodes+contextNodes, wantBufs+contextBuffers
		default:
			wantNodes, wantBufs = wantNodes+plainNodes, wantBufs+plainBuffers
		}
	}
	nodes, nNodes := vectorAt(&rb, slotRBNodes, 16)
	bufs, nBufs := vectorAt(&rb, slotRBBuffers, 16)
	if nNodes != wantNodes || nBufs != wantBufs {
		return 0, nil, false
	}
	i64 := func(pos int) int64 { return int64(binary.LittleEndian.Uint64(meta[pos:])) }
	// inBody reports whether buffer j lies inside the body.
	inBody := func(j int) (off, length int64, ok bool) {
		off, length = i64(bufs+16*j), i64(bufs+16*j+8)
		return off, length, off >= 0 && length >= 0 && off <= bodyLen && length <= bodyLen-off
	}
	// node returns field node j: its length and null count.
	node := func(j int) (length, nulls int64) { return i64(nodes + 16*j), i64(nodes + 16*j + 8) }
	ts = make([]Tensor, cols)
	nj, bj := 0, 0 // the column's first field node and buffer
	budget := dictBudget(len(b))
	for i, w := range s.widths {
		if s.dict[i] {
			// The indices' node, then their validity (arrow-go reads it
			// only for a non-zero null count) and int32 values; every
			// index is checked as the rows are gathered.
			d := dicts[0]
			dicts = dicts[1:]
			idxLen, idxNulls := node(nj)
			if idxLen != rows || idxNulls != 0 {
				return 0, nil, false
			}
			if _, _, ok := inBody(bj); !ok {
				return 0, nil, false
			}
			off, length, ok := inBody(bj + 1)
			if !ok || length < 4*rows {
				return 0, nil, false
			}
			need := rows * int64(w) * 4
			if need > budget {
				return 0, nil, false
			}
			budget -= need
			idx := b[body+int(off) : body+int(off)+4*int(rows)]
			if indexed {
				index, ok := indexView(idx, len(d)/w)
				if !ok {
					return 0, nil, false
				}
				ts[i] = Tensor{Name: s.names[i], Width: w, Data: d, Index: index, dict: dictInt32}
				nj, bj = nj+dictNodes, bj+dictBuffers
				continue
			}
			out, ok := gather(idx, d, w, alloc)
			if !ok {
				return 0, nil, false
			}
			ts[i] = Tensor{Name: s.names[i], Width: w, Data: out, dict: dictInt32}
			nj, bj = nj+dictNodes, bj+dictBuffers
			continue
		}
		listRows := rows
		if s.ctx[i] {
			// The run-end encoded array's node (no buffer of its own),
			// then its int32 run ends': validity, and values holding
			// exactly [rows]; then one row of the list below.
			reeLen, reeNulls := node(nj)
			endsLen, endsNulls := node(nj + 1)
			if reeLen != rows || reeNulls != 0 || endsLen != 1 || endsNulls != 0 {
				return 0, nil, false
			}
			if _, _, ok := inBody(bj); !ok {
				return 0, nil, false
			}
			off, length, ok := inBody(bj + 1)
			if !ok || length < 4 || int64(int32(binary.LittleEndian.Uint32(b[body+int(off):]))) != rows {
				return 0, nil, false
			}
			nj, bj = nj+2, bj+2
			listRows = 1
		}
		// The list's node, then its float32 child's: arrow-go reads a
		// validity buffer only for a non-zero null count, and Decode
		// refuses a list with nulls.
		listLen, listNulls := node(nj)
		valLen, valNulls := node(nj + 1)
		if listLen != listRows || listNulls != 0 || valNulls != 0 {
			return 0, nil, false
		}
		if int64(w) > bodyLen/4/listRows { // more floats than the body holds
			return 0, nil, false
		}
		nw := listRows * int64(w)
		if valLen != nw {
			return 0, nil, false
		}
		// Buffers: the list's validity, the child's validity, the child's
		// values.
		if _, _, ok := inBody(bj); !ok {
			return 0, nil, false
		}
		if _, _, ok := inBody(bj + 1); !ok {
			return 0, nil, false
		}
		off, length, ok := inBody(bj + 2)
		if !ok || length < 4*nw {
			return 0, nil, false
		}
		p := unsafe.Pointer(&b[body+int(off)])
		if !unalignedFloats && uintptr(p)%4 != 0 {
			return 0, nil, false
		}
		ts[i] = Tensor{Name: s.names[i], Width: w, Data: unsafe.Slice((*float32)(p), int(nw)), Context: s.ctx[i]}
		nj, bj = nj+plainNodes, bj+plainBuffers
	}
	return int(rows), ts, true
}

// dictionary reads the DictionaryBatch message at b[off:] as the
// dictionary of id (its rows of width w floats), as arrow-go's reader
// would: a V5 message, not a delta, one uncompressed record batch of at
// least one row without nulls, every buffer inside the body. ok is false
// on anything else.
func (s *cachedSchema) dictionary(b []byte, off int, id int64, w int) (rows []float32, end int, ok bool) {
	meta, body, end, ok := messageAt(b, off)
	if !ok {
		return nil, 0, false
	}
	msg := root(meta)
	if msg.GetInt16Slot(slotMsgVersion, 0) != fbMetadataV5 ||
		msg.GetUint8Slot(slotMsgHeaderType, 0) != fbHeaderDictionaryBatch ||
		msg.Offset(slotMsgMeta) != 0 {
		return nil, 0, false
	}
	var db, rb flatbuffers.Table
	if !union(msg, slotMsgHeader, &db) || db.GetInt64Slot(slotDictID, 0) != id ||
		db.GetBoolSlot(slotDictIsDelta, false) || !union(&db, slotDictData, &rb) {
		return nil, 0, false
	}
	if rb.Offset(slotRBCompression) != 0 || rb.Offset(slotRBVariadic) != 0 {
		return nil, 0, false
	}
	bodyLen := int64(end - body)
	n := rb.GetInt64Slot(slotRBLength, 0)
	if n <= 0 || int64(w) > bodyLen/4/n { // more floats than the body holds
		return nil, 0, false
	}
	nodes, nNodes := vectorAt(&rb, slotRBNodes, 16)
	bufs, nBufs := vectorAt(&rb, slotRBBuffers, 16)
	if nNodes != plainNodes || nBufs != plainBuffers {
		return nil, 0, false
	}
	i64 := func(pos int) int64 { return int64(binary.LittleEndian.Uint64(meta[pos:])) }
	nw := n * int64(w)
	if i64(nodes) != n || i64(nodes+8) != 0 || i64(nodes+16) != nw || i64(nodes+24) != 0 {
		return nil, 0, false
	}
	for j := range plainBuffers {
		o, l := i64(bufs+16*j), i64(bufs+16*j+8)
		if o < 0 || l < 0 || o > bodyLen || l > bodyLen-o || (j == 2 && l < 4*nw) {
			return nil, 0, false
		}
	}
	p := unsafe.Pointer(&b[body+int(i64(bufs+32))])
	if !unalignedFloats && uintptr(p)%4 != 0 {
		return nil, 0, false
	}
	return unsafe.Slice((*float32)(p), int(nw)), end, true
}

// gather expands a dictionary column: for each little-endian int32 index
// in idx, the row of w floats it picks from dict. ok is false if an
// index is outside dict.
func gather(idx []byte, dict []float32, w int, alloc func(int) []float32) (out []float32, ok bool) {
	rows := len(dict) / w
	n := len(idx) / 4
	if alloc != nil {
		out = alloc(n * w)[:n*w]
	} else {
		out = make([]float32, n*w)
	}
	for s := range n {
		k := int(int32(binary.LittleEndian.Uint32(idx[4*s:])))
		if k < 0 || k >= rows {
			return nil, false
		}
		copy(out[s*w:(s+1)*w], dict[k*w:(k+1)*w])
	}
	return out, true
}

// indexView is idx (little-endian int32s, as this platform reads them:
// the fast path runs only on little-endian hosts) as []int32, without a
// copy; ok is false if an index is outside [0, rows) or idx is not
// aligned where this platform needs it.
func indexView(idx []byte, rows int) (index []int32, ok bool) {
	n := len(idx) / 4
	if n == 0 {
		return []int32{}, true
	}
	p := unsafe.Pointer(&idx[0])
	if !unalignedFloats && uintptr(p)%4 != 0 {
		return nil, false
	}
	index = unsafe.Slice((*int32)(p), n)
	for _, k := range index {
		if uint32(k) >= uint32(rows) {
			return nil, false
		}
	}
	return index, true
}

// messageAt frames the message at b[off:] as bytesMessages.Message does,
// with the same checks: its metadata and its body's bounds in b. ok is
// false at the end of the stream and wherever bytesMessages would fail.
func messageAt(b []byte, off int) (meta []byte, body, end int, ok bool) {
	if off < 0 || len(b)-off < 4 {
		return nil, 0, 0, false
	}
	v := binary.LittleEndian.Uint32(b[off:])
	off += 4
	if v == continuation {
		if len(b)-off < 4 {
			return nil, 0, 0, false
		}
		v = binary.LittleEndian.Uint32(b[off:])
		off += 4
	}
	if v < 8 || uint64(v) > uint64(len(b)-off) { // checkMeta wants 8 bytes
		return nil, 0, 0, false
	}
	meta = b[off : off+int(v) : off+int(v)]
	off += int(v)
	if checkMeta(meta) != nil {
		return nil, 0, 0, false
	}
	bodyLen := root(meta).GetInt64Slot(slotMsgBodyLength, 0)
	if bodyLen < 0 || bodyLen > int64(len(b)-off) {
		return nil, 0, 0, false
	}
	return meta, off, off + int(bodyLen), true
}

// vectorAt returns where the elements of the vector in slot start in
// t.Bytes and how many there are; -1 elements where the slot is absent or
// the vector overruns the buffer.
func vectorAt(t *flatbuffers.Table, slot flatbuffers.VOffsetT, elem int) (start, n int) {
	o := flatbuffers.UOffsetT(t.Offset(slot))
	if o == 0 {
		return 0, -1
	}
	start, n = int(t.Vector(o)), t.VectorLen(o)
	if start < 0 || n < 0 || n > (len(t.Bytes)-start)/elem {
		return 0, -1
	}
	return start, n
}

// rememberSchema caches the schema of b, a frame arrow-go's path decoded
// to n samples of ts, if the fast path can serve its layout: at least one
// column, every width and n positive, a little-endian schema. The entry is
// cached only if the fast path reads b itself to exactly what arrow-go's
// path did.
func rememberSchema(b []byte, n int, ts []Tensor) {
	// arrow-go read these bytes without panicking, but a failure here is
	// at worst a schema not cached: never let it crash the caller.
	defer func() { _ = recover() }()
	if endian.IsBigEndian || n <= 0 || len(ts) == 0 {
		return
	}
	for _, t := range ts {
		if t.Width <= 0 || t.dict == dictOther {
			return
		}
	}
	if lookupSchema(b) != nil {
		return // already known: this frame was just unusual
	}
	r := &bytesMessages{b: b}
	m, err := r.Message()
	if err != nil || m.Type() != ipc.MessageSchema || r.off > maxCachedSchema {
		return
	}
	meta, _, end, ok := messageAt(b, 0)
	if !ok || end != r.off || !littleEndianSchema(meta) {
		return
	}
	ids, ok := dictionaryIDs(meta, len(ts))
	if !ok {
		return
	}
	s := &cachedSchema{msg: bytes.Clone(b[:end]), names: make([]string, len(ts)), widths: make([]int, len(ts)), ctx: make([]bool, len(ts)), dict: make([]bool, len(ts))}
	for i, t := range ts {
		s.names[i], s.widths[i], s.ctx[i], s.dict[i] = t.Name, t.Width, t.Context, t.dict == dictInt32
		if s.dict[i] {
			// Two columns of one id share a dictionary: a second
			// DictionaryBatch of the id replaces the first for both in
			// arrow-go's reader, where the fast path would give each
			// column the batch at its position.
			if ids[i] < 0 || slices.Contains(s.dictIDs, ids[i]) {
				return
			}
			s.dictIDs = append(s.dictIDs, ids[i])
		}
	}
	if fn, fts, ok := s.decode(b); !ok || !sameDecode(fn, fts, n, ts) {
		return
	}
	schemaCache.mu.Lock()
	defer schemaCache.mu.Unlock()
	var old []*cachedSchema
	if l := schemaCache.list.Load(); l != nil {
		old = *l
	}
	for _, c := range old {
		if bytes.Equal(c.msg, s.msg) {
			return // another goroutine got there first
		}
	}
	l := make([]*cachedSchema, 0, schemaCacheCap)
	l = append(l, s)
	l = append(l, old[:min(len(old), schemaCacheCap-1)]...)
	schemaCache.list.Store(&l)
}

// dictionaryIDs returns, per field of the schema message's metadata
// (cols of them), its dictionary id, or -1 for a field that is not
// dictionary-encoded. ok is false where the schema is not so read.
func dictionaryIDs(meta []byte, cols int) (ids []int64, ok bool) {
	defer func() {
		if recover() != nil {
			ids, ok = nil, false
		}
	}()
	const (
		slotSchemaFields = 6  // Schema.fields
		slotFieldDict    = 12 // Field.dictionary
		slotDictEncID    = 4  // DictionaryEncoding.id
	)
	var sc flatbuffers.Table
	msg := root(meta)
	if msg.GetUint8Slot(slotMsgHeaderType, 0) != fbHeaderSchema || !union(msg, slotMsgHeader, &sc) {
		return nil, false
	}
	if n, err := vector(&sc, slotSchemaFields, 4); err != nil || n != cols {
		return nil, false
	}
	ids = make([]int64, cols)
	for i := range cols {
		f := tableAt(&sc, slotSchemaFields, i)
		o := flatbuffers.UOffsetT(f.Offset(slotFieldDict))
		if o == 0 {
			ids[i] = -1
			continue
		}
		d := flatbuffers.Table{Bytes: f.Bytes, Pos: f.Indirect(f.Pos + o)}
		ids[i] = d.GetInt64Slot(slotDictEncID, 0)
	}
	return ids, true
}

// littleEndianSchema reports whether the schema message's metadata says
// little-endian (arrow-go swaps the bytes of other frames in place).
func littleEndianSchema(meta []byte) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	var s flatbuffers.Table
	msg := root(meta)
	return msg.GetUint8Slot(slotMsgHeaderType, 0) == fbHeaderSchema &&
		union(msg, slotMsgHeader, &s) &&
		s.GetInt16Slot(slotSchemaEndianness, 0) == 0 // Endianness.Little
}

// sameDecode reports whether two decodes are the same: samples, names,
// widths, and data slices (same memory, length and capacity).
func sameDecode(n1 int, ts1 []Tensor, n2 int, ts2 []Tensor) bool {
	if n1 != n2 || len(ts1) != len(ts2) {
		return false
	}
	for i := range ts1 {
		a, b := ts1[i], ts2[i]
		if a.Name != b.Name || a.Width != b.Width || a.Context != b.Context || a.dict != b.dict || len(a.Data) != len(b.Data) || cap(a.Data) != cap(b.Data) {
			return false
		}
		if a.dict != dictNone {
			// Expanded by each decode into memory of its own: the
			// same values (bit for bit) are the same decode.
			for j := range a.Data {
				if math.Float32bits(a.Data[j]) != math.Float32bits(b.Data[j]) {
					return false
				}
			}
			continue
		}
		if len(a.Data) > 0 && &a.Data[0] != &b.Data[0] {
			return false
		}
	}
	return true
}
