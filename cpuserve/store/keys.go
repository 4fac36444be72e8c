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

// epochKey holds the highest election epoch of the sequencing router
// the store has heard of (8 bytes, little-endian; epoch.go) under the
// metadata table id 0.
var epochKey = []byte("\x00\x00\x00\x00updepoch")

// divergedPrefix starts the keys that hold, per model, the update at
// which the sequencing router found the store's copy diverged from its
// peers' (8 bytes, little-endian; diverged.go), under the metadata
// table id 0.
const divergedPrefix = "\x00\x00\x00\x00upddiv/"

// divergedKey holds model's diverged mark.
func divergedKey(model string) []byte { return append([]byte(divergedPrefix), model...) }

// overlayPrefix starts the keys of the model's update overlay: the last
// value (float32 little-endian, as sent) of every row an upsert wrote,
// by model, table name and row, under the metadata table id 0. A version
// switch writes the overlay into the newly active tables (carry.go).
const overlayPrefix = "\x00\x00\x00\x00ovl/"

// overlayModelPrefix is the prefix of all of model's overlay keys.
func overlayModelPrefix(model string) []byte {
	k := append([]byte(nil), overlayPrefix...)
	k = binary.AppendUvarint(k, uint64(len(model)))
	return append(k, model...)
}

// overlayTablePrefix is the prefix of the overlay keys of model's table:
// both names length-prefixed, so no name is a prefix of another's keys.
func overlayTablePrefix(model, table string) []byte {
	k := overlayModelPrefix(model)
	k = binary.AppendUvarint(k, uint64(len(table)))
	return append(k, table...)
}

// overlayKey is the overlay key of row of model's table, appended to prefix
// (overlayTablePrefix's).
func overlayKey(prefix []byte, row int64) []byte {
	return binary.BigEndian.AppendUint64(prefix, uint64(row))
}

// prefixEnd is the first key past every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
