package tablefile

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// precheck checks the Arrow IPC file structure a table file needs before
// the Arrow reader sees it. The reader trusts the lengths written in the
// file's flatbuffers: a vector length of 2^32 makes it allocate that many
// schema fields, which ends the process (out of memory, not a panic that
// can be recovered), and deep nesting overflows the stack. So: the
// footer, the schema (one column with one child, no dictionaries) and
// every record batch's message are walked here, every offset and vector
// checked to lie inside the file, and uncompressed batches required
// (Write never compresses; decompression allocates what the file says).
func precheck(file []byte) error {
	const magic = "ARROW1"
	n := len(file)
	if n < 8+10 || string(file[:6]) != magic || string(file[n-6:]) != magic {
		return errors.New("not an Arrow IPC file (no ARROW1 magic at both ends)")
	}
	flen := int64(int32(binary.LittleEndian.Uint32(file[n-10:])))
	if flen <= 0 || flen > int64(n-10-8) {
		return fmt.Errorf("footer length %d does not fit a %d-byte file", flen, n)
	}
	footer := fb(file[int64(n-10)-flen : n-10])
	root, err := footer.root()
	if err != nil {
		return fmt.Errorf("footer: %w", err)
	}
	schema, ok, err := footer.table(root, 1)
	if err != nil || !ok {
		return fmt.Errorf("footer: schema: %w", orMissing(err))
	}
	if err := footer.checkSchema(schema); err != nil {
		return fmt.Errorf("footer: schema: %w", err)
	}
	if _, nd, err := footer.vector(root, 2, 24); err != nil {
		return fmt.Errorf("footer: dictionaries: %w", err)
	} else if nd != 0 {
		return fmt.Errorf("footer: %d dictionaries, a table file has none", nd)
	}
	if err := footer.checkKeyValues(root, 4); err != nil {
		return fmt.Errorf("footer: metadata: %w", err)
	}
	start, nb, err := footer.vector(root, 3, 24)
	if err != nil {
		return fmt.Errorf("footer: record batches: %w", err)
	}
	for i := 0; i < nb; i++ {
		b := footer[start+24*i:]
		off := int64(binary.LittleEndian.Uint64(b))
		meta := int64(int32(binary.LittleEndian.Uint32(b[8:])))
		body := int64(binary.LittleEndian.Uint64(b[16:]))
		if off < 8 || meta < 8 || body < 0 || off > int64(n) || meta > int64(n)-off || body > int64(n)-off-meta {
			return fmt.Errorf("record batch %d: block at %d (%d + %d bytes) does not fit a %d-byte file", i, off, meta, body, n)
		}
		if err := checkMessage(file[off : off+meta]); err != nil {
			return fmt.Errorf("record batch %d: %w", i, err)
		}
	}
	return nil
}

// checkMessage checks one record batch's message (its metadata block:
// continuation marker, length, flatbuffer Message).
func checkMessage(b []byte) error {
	if binary.LittleEndian.Uint32(b) == 0xFFFFFFFF {
		b = b[4:]
	}
	if len(b) < 4 {
		return errors.New("message: truncated")
	}
	ml := int64(int32(binary.LittleEndian.Uint32(b)))
	if ml <= 0 || ml > int64(len(b)-4) {
		return fmt.Errorf("message length %d does not fit its %d-byte block", ml, len(b))
	}
	m := fb(b[4 : 4+ml])
	root, err := m.root()
	if err != nil {
		return fmt.Errorf("message: %w", err)
	}
	const recordBatch = 3 // MessageHeader.RecordBatch
	if ht, ok := m.scalar(root, 1, 1); !ok || ht[0] != recordBatch {
		return errors.New("message is not a record batch")
	}
	rb, ok, err := m.table(root, 2)
	if err != nil || !ok {
		return fmt.Errorf("message: header: %w", orMissing(err))
	}
	if _, _, err := m.vector(rb, 1, 16); err != nil {
		return fmt.Errorf("record batch nodes: %w", err)
	}
	if _, _, err := m.vector(rb, 2, 16); err != nil {
		return fmt.Errorf("record batch buffers: %w", err)
	}
	if _, ok, err := m.table(rb, 3); err != nil || ok {
		return errors.New("compressed record batch: table files are written uncompressed")
	}
	if _, _, err := m.vector(rb, 4, 8); err != nil {
		return fmt.Errorf("record batch variadic counts: %w", err)
	}
	return m.checkKeyValues(root, 4)
}

func orMissing(err error) error {
	if err == nil {
		return errors.New("missing")
	}
	return err
}

// fb is a flatbuffer, read with every position checked against its end.
type fb []byte

func (b fb) u32(pos int) (int, error) {
	if pos < 0 || pos > len(b)-4 {
		return 0, fmt.Errorf("offset %d outside the %d-byte buffer", pos, len(b))
	}
	return int(binary.LittleEndian.Uint32(b[pos:])), nil
}

func (b fb) root() (int, error) {
	off, err := b.u32(0)
	if err != nil {
		return 0, err
	}
	return off, b.checkTable(off)
}

func (b fb) checkTable(pos int) error {
	if pos < 0 || pos > len(b)-4 {
		return fmt.Errorf("table at %d outside the %d-byte buffer", pos, len(b))
	}
	vt := pos - int(int32(binary.LittleEndian.Uint32(b[pos:])))
	if vt < 0 || vt > len(b)-4 {
		return fmt.Errorf("vtable at %d outside the %d-byte buffer", vt, len(b))
	}
	vsize := int(binary.LittleEndian.Uint16(b[vt:]))
	tsize := int(binary.LittleEndian.Uint16(b[vt+2:]))
	if vsize < 4 || vsize%2 != 0 || vt+vsize > len(b) || pos+tsize > len(b) {
		return fmt.Errorf("vtable at %d (%d bytes, table %d bytes) outside the %d-byte buffer", vt, vsize, tsize, len(b))
	}
	return nil
}

// field is the position of field i of the table at pos (checked by
// checkTable), ok false when absent.
func (b fb) field(pos, i int) (int, bool) {
	vt := pos - int(int32(binary.LittleEndian.Uint32(b[pos:])))
	vsize := int(binary.LittleEndian.Uint16(b[vt:]))
	if 4+2*i+2 > vsize {
		return 0, false
	}
	off := int(binary.LittleEndian.Uint16(b[vt+4+2*i:]))
	return pos + off, off != 0
}

func (b fb) scalar(pos, i, size int) ([]byte, bool) {
	p, ok := b.field(pos, i)
	if !ok || p+size > len(b) {
		return nil, false
	}
	return b[p : p+size], true
}

// table follows field i (an offset) to a table and checks it.
func (b fb) table(pos, i int) (int, bool, error) {
	p, ok := b.field(pos, i)
	if !ok {
		return 0, false, nil
	}
	off, err := b.u32(p)
	if err != nil {
		return 0, true, err
	}
	return p + off, true, b.checkTable(p + off)
}

// vector follows field i to a vector of n elements of size bytes and
// returns where its elements start; an absent field is an empty vector.
func (b fb) vector(pos, i, size int) (start, n int, err error) {
	p, ok := b.field(pos, i)
	if !ok {
		return 0, 0, nil
	}
	off, err := b.u32(p)
	if err != nil {
		return 0, 0, err
	}
	if n, err = b.u32(p + off); err != nil {
		return 0, 0, err
	}
	start = p + off + 4
	if n > (len(b)-start)/size {
		return 0, 0, fmt.Errorf("vector of %d elements of %d bytes at %d outside the %d-byte buffer", n, size, start, len(b))
	}
	return start, n, nil
}

// tables checks field i as a vector of tables and returns their positions.
func (b fb) tables(pos, i int) ([]int, error) {
	start, n, err := b.vector(pos, i, 4)
	if err != nil {
		return nil, err
	}
	out := make([]int, n)
	for k := range out {
		p := start + 4*k
		off, _ := b.u32(p)
		if out[k] = p + off; b.checkTable(out[k]) != nil {
			return nil, fmt.Errorf("element %d: %w", k, b.checkTable(out[k]))
		}
	}
	return out, nil
}

func (b fb) checkString(pos, i int) error {
	_, _, err := b.vector(pos, i, 1)
	return err
}

func (b fb) checkKeyValues(pos, i int) error {
	kvs, err := b.tables(pos, i)
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		if err := b.checkString(kv, 0); err != nil {
			return err
		}
		if err := b.checkString(kv, 1); err != nil {
			return err
		}
	}
	return nil
}

// checkSchema: one field with one child (a fixed-size list of float32),
// no grandchildren, no dictionary encoding, metadata inside the buffer.
func (b fb) checkSchema(s int) error {
	if _, _, err := b.vector(s, 3, 8); err != nil { // features
		return err
	}
	if err := b.checkKeyValues(s, 2); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	fields, err := b.tables(s, 1)
	if err != nil {
		return fmt.Errorf("fields: %w", err)
	}
	if len(fields) != 1 {
		return fmt.Errorf("%d fields, a table file has one", len(fields))
	}
	for depth, f := 0, fields[0]; ; depth++ {
		if err := b.checkString(f, 0); err != nil {
			return fmt.Errorf("field name: %w", err)
		}
		if _, ok, err := b.table(f, 3); err != nil {
			return fmt.Errorf("field type: %w", err)
		} else if !ok {
			return errors.New("field without a type")
		}
		if _, ok, _ := b.table(f, 4); ok {
			return errors.New("dictionary-encoded field: a table file has none")
		}
		if err := b.checkKeyValues(f, 6); err != nil {
			return fmt.Errorf("field metadata: %w", err)
		}
		children, err := b.tables(f, 5)
		if err != nil {
			return fmt.Errorf("field children: %w", err)
		}
		switch {
		case depth == 0 && len(children) != 1:
			return fmt.Errorf("column has %d children, a fixed-size list has one", len(children))
		case depth == 1 && len(children) != 0:
			return fmt.Errorf("list values have %d children, float32 has none", len(children))
		case depth == 1:
			return nil
		}
		f = children[0]
	}
}
