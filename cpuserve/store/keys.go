package store

import "encoding/binary"

// keyLen is the length of a row key: table id and row id, big-endian.
const keyLen = 12

// rowKey writes the key of (table, row) into dst (len >= keyLen).
func rowKey(dst []byte, table uint32, row int64) []byte {
	binary.BigEndian.PutUint32(dst[0:4], table)
	binary.BigEndian.PutUint64(dst[4:12], uint64(row))
	return dst[:keyLen]
}

// tableBounds are the first key of table and the first key past it.
func tableBounds(table uint32) (lo, hi []byte) {
	lo = make([]byte, 4)
	hi = make([]byte, 4)
	binary.BigEndian.PutUint32(lo, table)
	binary.BigEndian.PutUint32(hi, table+1)
	return lo, hi
}

// keyRow decodes the row id of a row key.
func keyRow(k []byte) int64 { return int64(binary.BigEndian.Uint64(k[4:12])) }

// catalogKey holds the catalog (JSON) under the metadata table id 0.
var catalogKey = []byte("\x00\x00\x00\x00catalog")

// seqKey holds a model's last applied update seq (8 bytes, little-endian)
// under the metadata table id 0.
func seqKey(model string) []byte { return append([]byte("\x00\x00\x00\x00updseq/"), model...) }
