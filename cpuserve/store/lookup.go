package store

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prism-serve/prism/cpuserve/store/hot"
	"github.com/prism-serve/prism/plan"
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
//
// Partial asks for this store's part of a row-wise sharded table
// (plan.json sharding; the store's part: rows r with r mod Mod == Rem,
// shard.go): every bag is pooled over only the ids whose rows the part
// holds (id after the unknown-id rule; every id for a store holding the
// whole table), as the dense side's combine rules want (plan.Combine):
// sum pools Σ w·row over them, mean pools that same sum, undivided, max
// the elementwise max of w·row over them; a bag with none of them gives
// zeros; PoolNone writes w·row for the ids held and zeros for the
// others. An id the unknown-id rule maps to the zero vector counts as
// held by the part with Rem 0 (the shard of row 0), so the parts' counts
// add up to the bag's size. Counts, if set (pooled lookups only,
// samples floats), receives per sample the number of ids held.
type TableLookup struct {
	Table   string
	IDs     []int64
	Offsets []int64
	Bag     int
	Weights []float32
	Pooling Pooling
	Out     []float32
	Partial bool
	Counts  []float32
}

// Lookup looks up and pools a batch, table by table, from model's active
// version. An error for one table stops the batch (Out is then partly
// written) and leaves the store serving.
//
// The batch goes in three phases: every table's hot rows are copied and
// its misses noted and sorted into key order; then the misses of all the
// tables are read from Pebble (missread.go: one sorted pass per table, or
// per key range of a table, several ranges at once); then each table
// offers its missed rows to the hot tier and is pooled.
func (s *Store) Lookup(model string, batch []TableLookup) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	mv, err := s.model(model)
	if err != nil {
		s.m.errors.Add(1)
		return err
	}
	sc := s.scratch.Get().(*scratch)
	if cap(sc.jobs) < len(batch) {
		sc.jobs = append(sc.jobs[:cap(sc.jobs)], make([]tableJob, len(batch)-cap(sc.jobs))...)
	}
	jobs := sc.jobs[:len(batch)]
	defer func() {
		for i := range jobs {
			jobs[i].release()
		}
		s.scratch.Put(sc)
	}()
	t0 := time.Now()
	nMiss := 0
	for i := range batch {
		tv := mv.tables[batch[i].Table]
		if tv == nil {
			s.m.errors.Add(1)
			return fmt.Errorf("model %q: table %q: %w", model, batch[i].Table, ErrUnknownTable)
		}
		if err := s.gatherHot(tv, &batch[i], &jobs[i], sc); err != nil {
			s.m.errors.Add(1)
			return fmt.Errorf("model %q: %w", model, err)
		}
		nMiss += jobs[i].nMiss()
	}
	// Rows read from Pebble are admitted only if no upsert was
	// acknowledged since the reads began.
	seq := s.updSeq.Load()
	t1 := time.Now()
	if nMiss > 0 {
		if err := s.readMisses(jobs, sc); err != nil {
			s.m.errors.Add(1)
			return fmt.Errorf("model %q: %w", model, explainCorrupt(err))
		}
	}
	t2 := time.Now()
	for i := range jobs {
		s.finish(&jobs[i], sc, seq)
	}
	t3 := time.Now()
	s.m.gatherNanos.Add(int64(t1.Sub(t0)))
	s.m.finishNanos.Add(int64(t3.Sub(t2)))
	s.m.lookupNanos.Add(int64(t3.Sub(t0)))
	s.m.lookups.Add(1)
	return nil
}

// scratch is one lookup's reusable memory.
type scratch struct {
	jobs  []tableJob
	slots []int32 // hot.Class.Gather's scratch
	phase int     // where the sketch sampling starts
	key   [keyLen]byte
	tasks []readTask
}

// tableJob is one table's part of a lookup between the phases.
type tableJob struct {
	tv      *tableView
	r       *TableLookup
	g       []float32 // the gathered rows: r.Out or gather
	samples int
	direct  bool
	big     bool    // too many ids to pack a position in posBits
	ids     []int64 // the ids after the unknown-id rule
	idBuf   []int64
	gather  []float32
	hashes  []uint64 // the sampled accesses to count
	miss    []int32  // positions of the ids not in the hot tier, in id order
	misses  []uint64 // id<<posBits | position, sorted into key order
	bigMiss []missRef
}

type missRef struct {
	id  int64
	pos int
}

const posBits = 24

// nMiss is the number of ids to read from Pebble.
func (j *tableJob) nMiss() int { return len(j.misses) + len(j.bigMiss) }

// at is the k-th miss in key order: its id and position.
func (j *tableJob) at(k int) (int64, int) {
	if j.big {
		return j.bigMiss[k].id, j.bigMiss[k].pos
	}
	m := j.misses[k]
	return int64(m >> posBits), int(m & (1<<posBits - 1))
}

// checkShape validates a request against its table and returns the
// number of samples and whether the gathered rows can go straight into Out.
func checkShape(tv *tableView, r *TableLookup) (samples int, direct bool, err error) {
	n := len(r.IDs)
	switch r.Pooling {
	case "", PoolNone, PoolSum, PoolMean, PoolMax:
	default:
		return 0, false, badRequestf("table %q: pooling %q", tv.name, r.Pooling)
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
			return 0, false, badRequestf("table %q: %d ids do not make bags of %d", tv.name, n, r.Bag)
		}
		samples = n / bag
		direct = bag == 1
	}
	if r.Weights != nil && len(r.Weights) != n {
		return 0, false, badRequestf("table %q: %d weights for %d ids", tv.name, len(r.Weights), n)
	}
	want := samples * tv.dim
	if r.Pooling == PoolNone {
		want, direct = n*tv.dim, true
	}
	if len(r.Out) != want {
		return 0, false, fmt.Errorf("table %q: out holds %d floats, want %d (dim %d): %w", tv.name, len(r.Out), want, tv.dim, ErrDimMismatch)
	}
	if r.Counts != nil {
		switch {
		case !r.Partial:
			return 0, false, badRequestf("table %q: counts are for partial lookups", tv.name)
		case r.Pooling == PoolNone || r.Pooling == "":
			return 0, false, badRequestf("table %q: counts for an unpooled lookup", tv.name)
		case len(r.Counts) != samples:
			return 0, false, badRequestf("table %q: counts hold %d floats for %d samples", tv.name, len(r.Counts), samples)
		}
	}
	return samples, direct, nil
}

// lookupRecordEvery is the lookup path's sampling of the frequency
// sketch in a table's batch that the hot tier answered in full: one id
// in lookupRecordEvery is counted (every id alike, so the estimates'
// ratios, which admission compares, hold). Counting is a random cache
// miss into the sketch per counted id; at 1 in 4 it cost about a sixth
// of an all-hit batch. A batch with misses counts every id: its misses
// cost a device read each, far more than the counting, and the rows at
// the edge of what the tier can hold are seen too rarely for a sample to
// tell them apart. Sampled 1 in 16 everywhere, a 320 MiB tier over
// dlrm-terabyte's tables capped at 1.9M rows (Zipf 1.05) stayed at a hit
// ratio of 0.945 for 15,000 requests; counting batches with misses in
// full, it climbed to 0.957 (the bound for its 1.03M rows is 0.963;
// BenchmarkAdmissionZipf, scripts/hit-bound.py).
const lookupRecordEvery = 16

// recordStride is which ids of a table's batch are counted in the
// frequency sketch: from the from-th, every every-th (all of them when
// the batch missed); phase turns the sampled start from batch to batch.
func recordStride(phase *int, missed bool) (from, every int) {
	*phase = (*phase + 1) % lookupRecordEvery
	if missed {
		return 0, 1
	}
	return *phase, lookupRecordEvery
}

// resolveIDs applies the table's unknown-id rule to a batch with ids
// outside the table: into sc.ids, hashed ids folded, zero-vector ids as
// -1 with their rows of g cleared.
func resolveIDs(tv *tableView, ids []int64, g []float32, j *tableJob) ([]int64, error) {
	dim := tv.dim
	j.idBuf = append(j.idBuf[:0], ids...)
	for i, id := range j.idBuf {
		if id >= 0 && id < tv.rows {
			continue
		}
		if id < 0 {
			return nil, &IDError{Table: tv.name, Index: i, ID: id, Err: ErrNegativeID}
		}
		switch tv.unknown {
		case plan.UnknownHash:
			j.idBuf[i] = id % tv.rows
		case plan.UnknownZero:
			clear(g[i*dim : (i+1)*dim])
			j.idBuf[i] = -1
		default:
			return nil, &IDError{Table: tv.name, Index: i, ID: id, Rows: tv.rows, Err: ErrIDOutOfRange}
		}
	}
	return j.idBuf, nil
}

// notHeld marks, in a partial lookup's resolved ids, an id whose row
// another shard holds (its row of the gather buffer cleared).
const notHeld = -2

// markHeld marks the ids of a partial lookup whose rows the table's part
// does not hold (resolved: ids is already j.idBuf, else a copy is made).
// The unknown-id rule's zero vector (-1) belongs to the part with Rem 0.
func markHeld(tv *tableView, ids []int64, resolved bool, g []float32, j *tableJob) []int64 {
	p := tv.part
	if p == nil {
		return ids
	}
	if !resolved {
		j.idBuf = append(j.idBuf[:0], ids...)
		ids = j.idBuf
	}
	dim := tv.dim
	for i, id := range ids {
		held := p.holds(id)
		if id < 0 {
			held = p.Rem == 0
		}
		if !held {
			ids[i] = notHeld
			clear(g[i*dim : (i+1)*dim])
		}
	}
	return ids
}

// gatherHot checks a table's request, copies its resident rows into the
// gather buffer and notes its misses in key order (phase 1 of Lookup).
func (s *Store) gatherHot(tv *tableView, r *TableLookup, j *tableJob, sc *scratch) error {
	samples, direct, err := checkShape(tv, r)
	if err != nil {
		return err
	}
	dim := tv.dim
	n := len(r.IDs)
	*j = tableJob{tv: tv, r: r, samples: samples, direct: direct, big: n >= 1<<posBits,
		idBuf: j.idBuf[:0], gather: j.gather, hashes: j.hashes[:0], miss: j.miss[:0], misses: j.misses[:0], bigMiss: j.bigMiss[:0]}
	j.g = r.Out
	if !direct {
		if cap(j.gather) < n*dim {
			j.gather = make([]float32, n*dim)
		}
		j.g = j.gather[:n*dim]
	}
	ids, resolved := r.IDs, false
	for _, id := range ids {
		if uint64(id) >= uint64(tv.rows) {
			if ids, err = resolveIDs(tv, r.IDs, j.g, j); err != nil {
				return err
			}
			resolved = true
			break
		}
	}
	if r.Partial {
		ids = markHeld(tv, ids, resolved, j.g, j)
		resolved = true
	} else if p := tv.part; p != nil {
		// A whole lookup of a part: another shard's row is bad input,
		// not a row missing from the store.
		for i, id := range ids {
			if id >= 0 && !p.holds(id) {
				return &IDError{Table: tv.name, Index: i, ID: r.IDs[i], Rows: tv.rows, Part: p, Err: ErrIDOutOfRange}
			}
		}
	}
	j.ids = ids
	cls := tv.hot
	if cls != nil {
		if cap(sc.slots) < n {
			sc.slots = make([]int32, n)
		}
		cls.RLock()
		j.miss = cls.Gather(tv.id, ids, j.g, sc.slots, j.miss)
		cls.RUnlock()
	} else {
		for i, id := range ids {
			if id >= 0 {
				j.miss = append(j.miss, int32(i))
			}
		}
	}
	for _, p := range j.miss {
		if j.big {
			j.bigMiss = append(j.bigMiss, missRef{id: ids[p], pos: int(p)})
		} else {
			j.misses = append(j.misses, uint64(ids[p])<<posBits|uint64(p))
		}
	}
	if j.big {
		slices.SortFunc(j.bigMiss, func(a, b missRef) int { return cmp.Compare(a.id, b.id) })
	} else {
		slices.Sort(j.misses)
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
		hits = int64(valid - len(j.miss))
		from, every := recordStride(&sc.phase, len(j.miss) > 0)
		for i := from; i < n; i += every {
			if id := ids[i]; id >= 0 {
				j.hashes = append(j.hashes, hot.Hash(hot.Key(tv.id, id)))
			}
		}
	}
	s.m.rows.Add(int64(n))
	s.m.hotHits.Add(hits)
	s.m.hotMisses.Add(int64(j.nMiss()))
	return nil
}

// finish counts a table's accesses, offers its missed rows to the hot
// tier and pools (phase 3 of Lookup). Without misses a busy class skips
// the counting of this batch (a lossy read buffer); rows read from Pebble
// are admitted only if no upsert was acknowledged since seq.
func (s *Store) finish(j *tableJob, sc *scratch, seq uint64) {
	nMiss := j.nMiss()
	if cls := j.tv.hot; cls != nil && (len(j.hashes) > 0 || nMiss > 0) {
		locked := false
		if nMiss > 0 {
			cls.Lock()
			locked = true
		} else {
			locked = cls.TryLock()
		}
		if locked {
			cls.Count(j.hashes)
			if nMiss > 0 && s.updSeq.Load() == seq {
				s.admit(j, cls)
			}
			cls.Unlock()
		}
	}
	if j.r.Partial {
		poolPartial(j.r, j.g, j.ids, j.tv.dim, j.samples, j.direct)
		return
	}
	pool(j.r, j.g, j.tv.dim, j.samples, j.direct)
}

// release drops the job's references to the caller's memory and the
// table (the scratch outlives the lookup in a pool).
func (j *tableJob) release() { j.tv, j.r, j.g, j.ids = nil, nil, nil, nil }

// admit offers each distinct missed row to the class. Caller holds its Lock.
func (s *Store) admit(j *tableJob, cls *hot.Class) {
	dim := j.tv.dim
	prev := int64(-1)
	for k := range j.nMiss() {
		id, pos := j.at(k)
		if id == prev {
			continue
		}
		prev = id
		key := hot.Key(j.tv.id, id)
		cls.Admit(key, hot.Hash(key), j.g[pos*dim:(pos+1)*dim])
	}
}
