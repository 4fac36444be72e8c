package arrowframe

import (
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"
)

// checkMeta bounds every count in an IPC message's metadata by the bytes
// that could hold it, before arrow-go sees it: arrow-go allocates a
// schema's fields (and a field's children) from the declared count
// without checking it, so a few hostile bytes could ask for gigabytes and
// kill the process. Layouts follow Arrow's Message.fbs / Schema.fbs.
func checkMeta(meta []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: bad message metadata: %v", ErrMalformed, r)
		}
	}()
	if len(meta) < 8 {
		return fmt.Errorf("%w: message metadata of %d bytes", ErrMalformed, len(meta))
	}
	msg := root(meta)
	const (
		msgHeaderType = 6  // Message.header_type
		msgHeader     = 8  // Message.header
		msgBodyLength = 10 // Message.bodyLength
		schemaFields  = 6  // Schema.fields
		schemaMeta    = 8  // Schema.custom_metadata
	)
	const msgMeta = 12 // Message.custom_metadata
	if _, err := vector(msg, msgMeta, 4); err != nil {
		return err
	}
	var hdr flatbuffers.Table
	if !union(msg, msgHeader, &hdr) {
		return nil // no header: arrow-go rejects it itself
	}
	switch msg.GetUint8Slot(msgHeaderType, 0) {
	case 1: // Schema
		n, err := vector(&hdr, schemaFields, 4)
		if err != nil {
			return err
		}
		if _, err := vector(&hdr, schemaMeta, 4); err != nil {
			return err
		}
		for i := range n {
			f := tableAt(&hdr, schemaFields, i)
			if err := checkField(f, 0); err != nil {
				return err
			}
		}
	case 2: // DictionaryBatch: its rows are a record batch's
		const dictData = 6 // DictionaryBatch.data
		var rb flatbuffers.Table
		if !union(&hdr, dictData, &rb) {
			return nil // no data: arrow-go rejects it itself
		}
		return checkRecordBatch(&rb, msg.GetInt64Slot(msgBodyLength, 0))
	case 3: // RecordBatch
		return checkRecordBatch(&hdr, msg.GetInt64Slot(msgBodyLength, 0))
	}
	return nil
}

// checkRecordBatch bounds a RecordBatch (a message's, or a
// DictionaryBatch's rows) in a body of the given bytes.
func checkRecordBatch(rb *flatbuffers.Table, body int64) error {
	const (
		rbLength      = 4  // RecordBatch.length
		rbNodes       = 6  // RecordBatch.nodes (struct FieldNode, 16 bytes)
		rbBuffers     = 8  // RecordBatch.buffers (struct Buffer, 16 bytes)
		rbCompression = 10 // RecordBatch.compression
	)
	// A compressed body states its uncompressed size in its first bytes
	// and arrow-go allocates that much unchecked: Prism never compresses
	// frames, so none are accepted.
	if rb.Offset(rbCompression) != 0 {
		return fmt.Errorf("%w: compressed frames are not accepted", ErrMalformed)
	}
	// Every row of a FixedSizeList<float32> column takes at least 4 body
	// bytes, so a batch cannot have more rows than that allows; a frame
	// of context (or dictionary-encoded) columns only may hold up to
	// maxContextRows rows in any body.
	if l := rb.GetInt64Slot(rbLength, 0); l < 0 || l > max(body/4+1, maxContextRows) {
		return fmt.Errorf("%w: record batch of %d rows in a body of %d bytes", ErrMalformed, l, body)
	}
	if _, err := vector(rb, rbNodes, 16); err != nil {
		return err
	}
	if _, err := vector(rb, rbBuffers, 16); err != nil {
		return err
	}
	return nil
}

// checkField bounds a Field's children and metadata, recursively.
func checkField(f *flatbuffers.Table, depth int) error {
	const (
		fieldChildren = 14
		fieldMeta     = 16
	)
	if depth > 8 {
		return fmt.Errorf("%w: fields nested more than 8 deep", ErrMalformed)
	}
	if _, err := vector(f, fieldMeta, 4); err != nil {
		return err
	}
	n, err := vector(f, fieldChildren, 4)
	if err != nil {
		return err
	}
	for i := range n {
		if err := checkField(tableAt(f, fieldChildren, i), depth+1); err != nil {
			return err
		}
	}
	return nil
}

func root(b []byte) *flatbuffers.Table {
	n := flatbuffers.GetUOffsetT(b)
	return &flatbuffers.Table{Bytes: b, Pos: n}
}

func union(t *flatbuffers.Table, slot flatbuffers.VOffsetT, out *flatbuffers.Table) bool {
	o := flatbuffers.UOffsetT(t.Offset(slot))
	if o == 0 {
		return false
	}
	t.Union(out, o)
	return true
}

// vector returns the length of the vector in slot, checking that its
// elements fit in the buffer.
func vector(t *flatbuffers.Table, slot flatbuffers.VOffsetT, elem int) (int, error) {
	o := flatbuffers.UOffsetT(t.Offset(slot))
	if o == 0 {
		return 0, nil
	}
	n := t.VectorLen(o)
	start := int(t.Vector(o))
	if n < 0 || start < 0 || start+n*elem > len(t.Bytes) || n > len(t.Bytes)/elem {
		return 0, fmt.Errorf("%w: a vector of %d elements in %d bytes of metadata", ErrMalformed, n, len(t.Bytes))
	}
	return n, nil
}

// tableAt is element i of a vector of tables.
func tableAt(t *flatbuffers.Table, slot flatbuffers.VOffsetT, i int) *flatbuffers.Table {
	o := flatbuffers.UOffsetT(t.Offset(slot))
	x := t.Vector(o) + flatbuffers.UOffsetT(i*4)
	return &flatbuffers.Table{Bytes: t.Bytes, Pos: t.Indirect(x)}
}
