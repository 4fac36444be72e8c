package store

import (
	"fmt"
	"github.com/prism-serve/prism/plan"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// Pooling is how a lookup reduces the rows of a bag (partitioner's type:
// a plan's lookups pass through unchanged).
type Pooling = plan.Pooling

const (
	PoolNone = plan.PoolNone
	PoolSum  = plan.PoolSum
	PoolMean = plan.PoolMean
	PoolMax  = plan.PoolMax
)

// TableLookup is one table's part of a batch.
//
// The bags: Offsets (len samples+1, Offsets[0] = 0, non-decreasing, last
// = len(IDs)) gives sample s the ids IDs[Offsets[s]:Offsets[s+1]];
// without Offsets every sample has Bag ids (0 means 1).
//
// Pooling, per sample, with w the id's weight (1 without Weights):
// sum = Σ w·row; mean = sum / bag size; max = elementwise max of w·row;
// an empty bag gives zeros. PoolNone writes every w·row, one per id.
//
// Out is the caller's: samples x dim floats pooled, len(IDs) x dim for
// PoolNone. Lookup writes every float of it and keeps no reference.
type TableLookup struct {
	Table   string
	IDs     []int64
	Offsets []int64
	Bag     int
	Weights []float32
	Pooling Pooling
	Out     []float32
}

// Lookup looks up and pools a batch, table by table, from model's active
// version. An error for one table stops the batch (Out is then partly
// written) and leaves the store serving.
func (s *Store) Lookup(model string, batch []TableLookup) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	mv, err := s.model(model)
	if err != nil {
		s.m.errors.Add(1)
		return err
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	for i := range batch {
		tv := mv.tables[batch[i].Table]
		if tv == nil {
			s.m.errors.Add(1)
			return fmt.Errorf("model %q: table %q: %w", model, batch[i].Table, ErrUnknownTable)
		}
		if err := s.lookupTable(tv, &batch[i], sc); err != nil {
			s.m.errors.Add(1)
			return fmt.Errorf("model %q: %w", model, err)
		}
	}
	s.m.lookups.Add(1)
	return nil
}

// scratch is one lookup's reusable memory.
type scratch struct {
	hashes  []uint64 // the sampled accesses to count
	ids     []int64  // a batch's ids after the unknown-id rule
	slots   []int32  // hot.Class.Gather's scratch
	miss    []int32  // positions of the ids not in the hot tier
	phase   int      // where the sketch sampling starts
	misses  []uint64 // id<<24 | position, sorted into key order
	bigMiss []missRef
	gather  []float32
	key     [keyLen]byte
}

type missRef struct {
	id  int64
	pos int
}

const posBits = 24

// checkShape validates a request against its table and returns the
// number of samples and whether the gathered rows can go straight into Out.
func checkShape(tv *tableView, r *TableLookup) (samples int, direct bool, err error) {
	n := len(r.IDs)
	switch r.Pooling {
	case "", PoolNone, PoolSum, PoolMean, PoolMax:
	default:
		return 0, false, fmt.Errorf("table %q: pooling %q: %w", tv.name, r.Pooling, ErrBadRequest)
	}
	if r.Offsets != nil {
		if len(r.Offsets) == 0 || r.Offsets[0] != 0 || r.Offsets[len(r.Offsets)-1] != int64(n) {
			return 0, false, fmt.Errorf("table %q: offsets must run from 0 to %d ids: %w", tv.name, n, ErrBadOffsets)
		}
		for i := 1; i < len(r.Offsets); i++ {
			if r.Offsets[i] < r.Offsets[i-1] {
				return 0, false, fmt.Errorf("table %q: offsets[%d]=%d < offsets[%d]=%d: %w", tv.name, i, r.Offsets[i], i-1, r.Offsets[i-1], ErrBadOffsets)
			}
		}
		samples = len(r.Offsets) - 1
	} else {
		bag := max(r.Bag, 1)
		if r.Bag < 0 || n%bag != 0 {
			return 0, false, fmt.Errorf("table %q: %d ids do not make bags of %d: %w", tv.name, n, r.Bag, ErrBadRequest)
		}
		samples = n / bag
		direct = bag == 1
	}
	if r.Weights != nil && len(r.Weights) != n {
		return 0, false, fmt.Errorf("table %q: %d weights for %d ids: %w", tv.name, len(r.Weights), n, ErrBadRequest)
	}
	want := samples * tv.dim
	if r.Pooling == PoolNone {
		want, direct = n*tv.dim, true
	}
	if len(r.Out) != want {
		return 0, false, fmt.Errorf("table %q: out holds %d floats, want %d (dim %d): %w", tv.name, len(r.Out), want, tv.dim, ErrDimMismatch)
	}
	return samples, direct, nil
}

// lookupRecordEvery is the lookup path's sampling of the frequency
// sketch: one id in lookupRecordEvery is counted (every id alike, so the
// estimates' ratios, which admission compares, hold). Counting is a
// random cache miss into the sketch per counted id; at 1 in 4 it cost
// about a sixth of an all-hit batch.
const lookupRecordEvery = 16

// resolveIDs applies the table's unknown-id rule to a batch with ids
// outside the table: into sc.ids, hashed ids folded, zero-vector ids as
// -1 with their rows of g cleared.
func resolveIDs(tv *tableView, ids []int64, g []float32, sc *scratch) ([]int64, error) {
	dim := tv.dim
	sc.ids = append(sc.ids[:0], ids...)
	for i, id := range sc.ids {
		if id >= 0 && id < tv.rows {
			continue
		}
		if id < 0 {
			return nil, fmt.Errorf("table %q: ids[%d]=%d: %w", tv.name, i, id, ErrNegativeID)
		}
		switch tv.unknown {
		case plan.UnknownHash:
			sc.ids[i] = id % tv.rows
		case plan.UnknownZero:
			clear(g[i*dim : (i+1)*dim])
			sc.ids[i] = -1
		default:
			return nil, fmt.Errorf("table %q: ids[%d]=%d, table has %d rows: %w", tv.name, i, id, tv.rows, ErrIDOutOfRange)
		}
	}
	return sc.ids, nil
}

func (s *Store) lookupTable(tv *tableView, r *TableLookup, sc *scratch) error {
	samples, direct, err := checkShape(tv, r)
	if err != nil {
		return err
	}
	dim := tv.dim
	n := len(r.IDs)
	g := r.Out
	if !direct {
		if cap(sc.gather) < n*dim {
			sc.gather = make([]float32, n*dim)
		}
		g = sc.gather[:n*dim]
	}
	ids, resolved := r.IDs, false
	for _, id := range ids {
		if uint64(id) >= uint64(tv.rows) {
			if ids, err = resolveIDs(tv, r.IDs, g, sc); err != nil {
				return err
			}
			resolved = true
			break
		}
	}
	sc.hashes = sc.hashes[:0]
	sc.misses = sc.misses[:0]
	sc.bigMiss = sc.bigMiss[:0]
	sc.miss = sc.miss[:0]
	big := n >= 1<<posBits
	cls := tv.hot
	// Pass 1: copy the hot rows, note the misses.
	if cls != nil {
		if cap(sc.slots) < n {
			sc.slots = make([]int32, n)
		}
		cls.RLock()
		sc.miss = cls.Gather(tv.id, ids, g, sc.slots, sc.miss)
		cls.RUnlock()
	} else {
		for i, id := range ids {
			if id >= 0 {
				sc.miss = append(sc.miss, int32(i))
			}
		}
	}
	for _, p := range sc.miss {
		if big {
			sc.bigMiss = append(sc.bigMiss, missRef{id: ids[p], pos: int(p)})
		} else {
			sc.misses = append(sc.misses, uint64(ids[p])<<posBits|uint64(p))
		}
	}
	var hits int64
	if cls != nil {
		valid := n
		if resolved {
			for _, id := range ids {
				if id < 0 {
					valid--
				}
			}
		}
		hits = int64(valid - len(sc.miss))
		sc.phase = (sc.phase + 1) % lookupRecordEvery
		for i := sc.phase; i < n; i += lookupRecordEvery {
			if id := ids[i]; id >= 0 {
				sc.hashes = append(sc.hashes, hot.Hash(hot.Key(tv.id, id)))
			}
		}
	}
	nMiss := len(sc.misses) + len(sc.bigMiss)
	s.m.rows.Add(int64(n))
	s.m.hotHits.Add(hits)
	s.m.hotMisses.Add(int64(nMiss))

	// Pass 2: the misses, in key order, through one iterator.
	seq := s.updSeq.Load()
	if nMiss > 0 {
		if err := s.readMisses(tv, g, sc, big); err != nil {
			return err
		}
	}
	// Pass 3: count the accesses and offer the missed rows to the tier.
	// Without misses a busy class skips the counting of this batch (a
	// lossy read buffer); rows read from Pebble are admitted only if no
	// upsert was acknowledged since the read began.
	if cls != nil && (len(sc.hashes) > 0 || nMiss > 0) {
		locked := false
		if nMiss > 0 {
			cls.Lock()
			locked = true
		} else {
			locked = cls.TryLock()
		}
		if locked {
			cls.Count(sc.hashes)
			if nMiss > 0 && s.updSeq.Load() == seq {
				s.admit(tv, cls, g, sc, big)
			}
			cls.Unlock()
		}
	}
	// Pass 4: pool.
	pool(r, g, dim, samples, direct)
	return nil
}

func (s *Store) readMisses(tv *tableView, g []float32, sc *scratch, big bool) error {
	dim := tv.dim
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tv.lo, UpperBound: tv.hi})
	if err != nil {
		return fmt.Errorf("table %q: %w", tv.name, err)
	}
	var reads, bytes int64
	prevID, prevPos := int64(-1), -1
	visit := func(id int64, pos int) error {
		dst := g[pos*dim : (pos+1)*dim]
		if id == prevID {
			copy(dst, g[prevPos*dim:(prevPos+1)*dim])
			return nil
		}
		k := rowKey(sc.key[:], tv.id, id)
		if !it.SeekGE(k) || keyRow(it.Key()) != id || len(it.Key()) != keyLen {
			return fmt.Errorf("table %q: row %d missing from the store: %w", tv.name, id, ErrCorrupt)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("table %q: row %d: %w", tv.name, id, err)
		}
		if !tv.dtype.decode(dst, v) {
			return fmt.Errorf("table %q: row %d holds %d bytes, want %d: %w", tv.name, id, len(v), tv.dtype.RowBytes(dim), ErrCorrupt)
		}
		reads++
		bytes += int64(len(v))
		prevID, prevPos = id, pos
		return nil
	}
	if big {
		slices.SortFunc(sc.bigMiss, func(a, b missRef) int { return int(a.id - b.id) })
		for _, m := range sc.bigMiss {
			if err := visit(m.id, m.pos); err != nil {
				it.Close()
				return err
			}
		}
	} else {
		slices.Sort(sc.misses)
		for _, m := range sc.misses {
			if err := visit(int64(m>>posBits), int(m&(1<<posBits-1))); err != nil {
				it.Close()
				return err
			}
		}
	}
	s.m.pebbleReads.Add(reads)
	s.m.pebbleBytes.Add(bytes)
	if err := it.Close(); err != nil {
		return fmt.Errorf("table %q: %w", tv.name, err)
	}
	return nil
}

// admit offers each distinct missed row to the class. Caller holds its Lock.
func (s *Store) admit(tv *tableView, cls *hot.Class, g []float32, sc *scratch, big bool) {
	dim := tv.dim
	prev := int64(-1)
	offer := func(id int64, pos int) {
		if id == prev {
			return
		}
		prev = id
		k := hot.Key(tv.id, id)
		cls.Admit(k, hot.Hash(k), g[pos*dim:(pos+1)*dim])
	}
	if big {
		for _, m := range sc.bigMiss {
			offer(m.id, m.pos)
		}
		return
	}
	for _, m := range sc.misses {
		offer(int64(m>>posBits), int(m&(1<<posBits-1)))
	}
}
