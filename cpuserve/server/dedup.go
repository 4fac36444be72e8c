package server

import (
	"sync"

	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// Dictionary-encoded frames (Options.DictionaryFrames). A cut column
// that is the pooled row of one id per sample repeats wherever the id
// does, and within a micro-batch of a recommendation request it does
// often: of 270 candidates' ids, about 43% are distinct per table, from
// 1% for the small tables to 74% for the largest (BENCHMARKS.md). Such a
// column goes into the frame dictionary-encoded (arrowframe's dict.go):
// each distinct id's row once, looked up once, and an int32 index per
// sample, so the frame, its TLS sealing and opening and its trip to the
// dense worker shrink with the repeats.

// minDictSamples: a micro-batch of fewer samples goes plain. Each
// dictionary costs a message of its own (about 250 bytes of metadata and
// padding), more than a few samples' repeats save.
const minDictSamples = 32

// dedupColumns marks, per frame column, the lookup (its index in
// m.lookups) whose output the column is and which could go
// dictionary-encoded: one id per sample straight from a model input (no
// pre-lookup ops, weights or offsets), the row itself as the output, and
// no CPU subgraph after the lookups (it would read every sample's row).
// -1 for the other columns. Nil when no column qualifies.
func dedupColumns(m *model) []int {
	if m.cols == nil || m.cpu != nil {
		return nil
	}
	byOutput := map[string]int{}
	for j, ls := range m.lookups {
		l := ls.l
		if ls.pre != nil || l.PreOutput != "" || l.Weights != "" || l.Offsets != "" || l.Bag != 1 {
			continue
		}
		switch l.Pooling {
		case plan.PoolNone, plan.PoolSum, plan.PoolMean, plan.PoolMax:
		default:
			continue
		}
		byOutput[l.Output] = j
	}
	out := make([]int, len(m.cols))
	any := false
	for i, c := range m.cols {
		out[i] = -1
		if j, ok := byOutput[c.Name]; ok && m.lookups[j].dim == c.Width {
			out[i], any = j, true
		}
	}
	if !any {
		return nil
	}
	return out
}

// dictColumns counts m's columns that may go dictionary-encoded.
func dictColumns(m *model) int {
	n := 0
	for _, j := range m.dedup {
		if j >= 0 {
			n++
		}
	}
	return n
}

// dedup is one micro-batch's dictionary-encoded columns: per frame
// column, its distinct ids (nil: the column goes plain) and each
// sample's index among them; byLookup holds the same ids per lookup
// (m.lookups' order), for Server.lookup.
//
// A dedup and its buffers are reused (the model's dedupPool): the
// caller releases it once the lookups and the frame are done with it.
type dedup struct {
	ids      [][]int64
	index    [][]int32
	byLookup [][]int64

	// idsBuf and indexBuf hold every column's distinct ids and indices.
	idsBuf   []int64
	indexBuf []int32
	// hash finds the distinct ids of the larger tables, direct (per
	// lookup, nil for those) of the small ones.
	hash   idTable
	direct []*directIndex
	pool   *sync.Pool
}

// release hands d back for another micro-batch; nil is a no-op.
func (d *dedup) release() {
	if d != nil {
		d.pool.Put(d)
	}
}

// dedupFor decides, for the request's values, which eligible columns go
// dictionary-encoded and sets their Rows in cols (a copy of the layout).
// ctx marks the columns going as context columns (never encoded). The
// caller releases what it returns.
func dedupFor(m *model, vals map[string]*value, n int, cols []arrowframe.Column, ctx []bool) *dedup {
	if m.dedup == nil || n < minDictSamples {
		return nil
	}
	d, _ := m.dedupPool.Get().(*dedup)
	if d == nil {
		d = &dedup{ids: make([][]int64, len(cols)), index: make([][]int32, len(cols)), byLookup: make([][]int64, len(m.lookups)),
			direct: make([]*directIndex, len(m.lookups)), pool: &m.dedupPool}
	}
	clear(d.ids)
	clear(d.index)
	clear(d.byLookup)
	if need := n * len(m.dedup); cap(d.idsBuf) < need {
		d.idsBuf, d.indexBuf = make([]int64, 0, need), make([]int32, 0, need)
	}
	// One buffer each for every column's distinct ids and indices.
	idsBuf, indexBuf := d.idsBuf[:0], d.indexBuf[:0]
	any := false
	for i, j := range m.dedup {
		if j < 0 || (ctx != nil && ctx[i]) {
			continue
		}
		v := vals[m.lookups[j].l.Input]
		if v == nil || v.ctx || len(v.i64) != n {
			continue
		}
		// Every eligible column goes dictionary-encoded, however distinct
		// its ids: deciding per micro-batch would vary the frame's layout
		// from one to the next, and each layout is a schema the encoder
		// builds and the dense worker's cache of eight must learn (a miss
		// is arrow-go's reader, 0.2 ms). An index costs 4 bytes a sample
		// against a row's 64 (dim 16).
		index := indexBuf[len(indexBuf) : len(indexBuf)+n]
		uniq := idsBuf[len(idsBuf) : len(idsBuf) : len(idsBuf)+n]
		var ids []int64
		ok := false
		if rows := m.lookups[j].rows; rows > 0 && rows <= directMaxRows {
			if d.direct[j] == nil {
				d.direct[j] = newDirectIndex(rows)
			}
			ids, ok = d.direct[j].distinct(v.i64, uniq, index)
		}
		if !ok { // a larger table, or an id outside the table's rows
			ids = d.hash.distinct(v.i64, uniq, index)
		}
		idsBuf, indexBuf = idsBuf[:len(idsBuf)+len(ids)], indexBuf[:len(indexBuf)+n]
		d.ids[i], d.index[i], d.byLookup[j] = ids, index, ids
		cols[i].Rows = len(ids)
		any = true
	}
	if !any {
		d.release()
		return nil
	}
	return d
}

// idTable finds distinct ids: open addressing over a power-of-two table
// at least twice the ids, each slot stamped with the pass that wrote it,
// so a pass clears nothing.
type idTable struct {
	slots []idSlot
	pass  uint32
}

type idSlot struct {
	key   int64
	pos   int32
	stamp uint32
}

// distinct appends ids' distinct values in first-seen order to uniq
// (which must have room for len(ids) more) and writes, per id, its
// position among them to index (len(ids) long).
func (t *idTable) distinct(ids []int64, uniq []int64, index []int32) []int64 {
	size, bits := 16, 4
	for size < 2*len(ids) {
		size, bits = size*2, bits+1
	}
	if len(t.slots) < size {
		t.slots, t.pass = make([]idSlot, size), 0
	}
	t.pass++
	if t.pass == 0 { // wrapped: every stamp is stale again
		clear(t.slots)
		t.pass = 1
	}
	slots := t.slots[:size]
	mask := uint64(size - 1)
	shift := 64 - bits
	base := len(uniq)
	for s, id := range ids {
		h := (uint64(id) * 0x9E3779B97F4A7C15) >> shift
		for {
			e := &slots[h&mask]
			if e.stamp != t.pass {
				*e = idSlot{key: id, pos: int32(len(uniq) - base), stamp: t.pass}
				index[s] = e.pos
				uniq = append(uniq, id)
				break
			}
			if e.key == id {
				index[s] = e.pos
				break
			}
			h++
		}
	}
	return uniq[base:]
}

// directMaxRows is the most rows a table may have for its distinct ids
// to be found by direct indexing (directIndex) rather than hashing
// (idTable). A table's slots are 4 bytes a row: up to 4 KiB of them they
// stay in cache; beyond, each distinct id of a Zipf draw costs a cache
// miss, where the one hash table that every column shares stays in
// cache. Measured (BenchmarkDistinctKaggle: dlrm-kaggle's 26 tables, 270
// samples, Zipf 1.05; thread CPU against hashing every column): 0.43-0.59
// with the 11 tables of at most 1,024 rows direct, 0.59-0.66 up to
// 4,096 rows, 0.65-0.75 up to 16,384, 0.65-0.83 up to 65,536; with the
// caches flushed before each micro-batch, 0.58-0.84, 0.56-0.72, 0.83-0.94
// and 0.86-0.88. A variable for tests, which run the hashing path on
// small tables too.
var directMaxRows int64 = 1 << 10

// directIndex finds the distinct ids of a table small enough to index by
// id: one slot per row holding the pass that wrote it (high 16 bits) and
// the id's position among the distinct ids (low 16: a table of at most
// directMaxRows rows has no more distinct ids), so a pass clears nothing
// and an id costs one load, not a hash and a probe.
type directIndex struct {
	slots []uint32
	pass  uint32
}

func newDirectIndex(rows int64) *directIndex {
	if rows > 1<<16 {
		panic("directIndex: more rows than 16-bit positions")
	}
	return &directIndex{slots: make([]uint32, rows)}
}

// distinct is idTable.distinct for ids of the table's rows; ok is false,
// uniq as given, where an id is outside them (the store decides what
// such an id means: the caller hashes the column instead).
func (d *directIndex) distinct(ids []int64, uniq []int64, index []int32) (_ []int64, ok bool) {
	d.pass++
	if d.pass == 1<<16 { // wrapped: every stamp is stale again
		clear(d.slots)
		d.pass = 1
	}
	stamp := d.pass << 16
	slots := d.slots
	base := len(uniq)
	for s, id := range ids {
		if uint64(id) >= uint64(len(slots)) {
			return uniq[:base], false
		}
		e := slots[id]
		if e&^0xFFFF == stamp {
			index[s] = int32(e & 0xFFFF)
			continue
		}
		pos := len(uniq) - base
		slots[id] = stamp | uint32(pos)
		index[s] = int32(pos)
		uniq = append(uniq, id)
	}
	return uniq[base:], true
}
