package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// Upsert writes rows (len(ids) x dim, row-major, finite values, as at
// ingest) of table in model's active version. When it returns nil the
// rows are durable (the WAL is synced, unless Options.NoSync) and every
// later lookup reads them: a resident hot-tier row is overwritten before
// the ack. Rows are stored in the table's dtype, so a quantized table
// returns the quantized value.
//
// The change is to the physical table: every model version sharing it
// sees it.
func (s *Store) Upsert(model, table string, ids []int64, rows []float32) error {
	_, err := s.upsert(model, table, ids, rows, 0, 0)
	return err
}

// SeqGapError says a sequenced upsert came before the ones it follows.
type SeqGapError struct {
	Model string
	// Applied is the last update seq the store holds; Applied+1 is next.
	Applied, Got int64
}

func (e *SeqGapError) Error() string {
	return fmt.Sprintf("model %q: update %d arrived, but the store holds updates up to %d: it needs %d first", e.Model, e.Got, e.Applied, e.Applied+1)
}

// UpsertSeq is Upsert as update number seq (> 0) of model, in the order
// one writer (the router) gives model's updates: applied only right after
// seq-1, and seq is stored with the rows in the same synced batch, so
// AppliedSeq says exactly which updates the store holds, crash or not.
// An older seq is acknowledged without writing (applied false: a replay);
// a newer one fails with a *SeqGapError and writes nothing. An update
// that is bad input (unknown table, id out of range ...) still takes its
// place in the sequence, rows unwritten, and its error is returned: every
// replica of the model rejects it alike, and the updates after it are not
// held up.
func (s *Store) UpsertSeq(model, table string, ids []int64, rows []float32, seq int64) (applied bool, err error) {
	return s.UpsertSeqAt(model, table, ids, rows, seq, 0)
}

// UpsertSeqAt is UpsertSeq sent by the router holding election epoch
// (epoch.go; 0: not checked): a *StaleEpochError, nothing written and
// seq not taken, when the store has heard of a later hold; else a later
// epoch than the store's is recorded with seq.
func (s *Store) UpsertSeqAt(model, table string, ids []int64, rows []float32, seq int64, epoch uint64) (applied bool, err error) {
	if seq <= 0 {
		return false, badRequestf("upsert model %q: update seq %d: want > 0", model, seq)
	}
	applied, err = s.upsert(model, table, ids, rows, seq, epoch)
	if err != nil && IsInputError(err) && !errors.Is(err, ErrUnknownModel) {
		if serr := s.SkipSeqsAt(model, seq, seq, epoch); serr != nil {
			return false, serr
		}
	}
	return applied, err
}

// SkipSeq records update seq of model as taken without rows: for an
// update rejected as bad input before it reached UpsertSeq. Like
// UpsertSeq it is a no-op for a seq the store holds and a *SeqGapError
// for one that comes too early.
func (s *Store) SkipSeq(model string, seq int64) error {
	return s.SkipSeqs(model, seq, seq)
}

// SkipSeqs records updates from .. to of model as taken without rows,
// in one write: the updates of other shards' tables a lagging worker
// is caught up on. Numbers the store holds already are no-ops; from
// must be at most one past the last it holds (else a *SeqGapError).
func (s *Store) SkipSeqs(model string, from, seq int64) error {
	return s.SkipSeqsAt(model, from, seq, 0)
}

// SkipSeqsAt is SkipSeqs sent by the router holding election epoch, as
// UpsertSeqAt: a *StaleEpochError, no number taken, from an earlier hold
// than the store has heard of; a later epoch is
// recorded in the same write as seq.
func (s *Store) SkipSeqsAt(model string, from, seq int64, epoch uint64) error {
	if from < 1 || from > seq {
		return badRequestf("model %q: skip updates %d .. %d", model, from, seq)
	}
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return ErrClosed
	}
	raise, err := s.fenceLocked(model, seq, epoch)
	if err != nil {
		return err
	}
	cur, err := s.appliedSeqLocked(model)
	if err != nil {
		return err
	}
	if seq <= cur || from > cur+1 {
		// Nothing to take; the epoch is still news.
		if err := s.raiseAloneLocked(raise, epoch); err != nil {
			return err
		}
		if seq <= cur {
			return nil
		}
		return &SeqGapError{Model: model, Applied: cur, Got: from}
	}
	if err := s.room(64); err != nil {
		return fmt.Errorf("model %q: record update seq %d: %w", model, seq, err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.Set(seqKey(model), binary.LittleEndian.AppendUint64(nil, uint64(seq)), nil); err != nil {
		return fmt.Errorf("model %q: record update seq %d: %w", model, seq, err)
	}
	if raise {
		if err := setEpoch(b, epoch); err != nil {
			return fmt.Errorf("model %q: record update seq %d: %w", model, seq, err)
		}
	}
	if err := s.db.Apply(b, s.writeOpts()); err != nil {
		return fmt.Errorf("model %q: record update seq %d: %w", model, seq, err)
	}
	s.setSeqLocked(model, seq)
	if raise {
		s.epoch.Store(epoch)
	}
	return nil
}

// raiseAloneLocked records epoch on its own when raise says it is news
// and no write of a seq carries it; updMu and mu held.
func (s *Store) raiseAloneLocked(raise bool, epoch uint64) error {
	if !raise {
		return nil
	}
	if err := s.room(64); err != nil {
		return fmt.Errorf("record election epoch %d: %w", epoch, err)
	}
	if err := s.db.Set(epochKey, binary.LittleEndian.AppendUint64(nil, epoch), s.writeOpts()); err != nil {
		return fmt.Errorf("record election epoch %d: %w", epoch, err)
	}
	s.epoch.Store(epoch)
	return nil
}

// AppliedSeq is the last sequenced update of model the store holds (0:
// none). Once read, it is answered from seqView: an upsert under way (a
// large one, or a slow sync) does not hold up the worker's heartbeat,
// which announces it; the upsert's number counts once it is durable.
func (s *Store) AppliedSeq(model string) (int64, error) {
	if v := s.seqView.Load(); v != nil {
		if seq, ok := (*v)[model]; ok {
			if s.closed.Load() {
				return 0, ErrClosed
			}
			return seq, nil
		}
	}
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return s.appliedSeqLocked(model)
}

// appliedSeqLocked reads (once) and caches model's applied seq; updMu held.
func (s *Store) appliedSeqLocked(model string) (int64, error) {
	if v, ok := s.seqs[model]; ok {
		return v, nil
	}
	v, closer, err := s.db.Get(seqKey(model))
	var seq int64
	switch {
	case err == pebble.ErrNotFound:
	case err != nil:
		return 0, fmt.Errorf("model %q: read update seq: %w", model, err)
	default:
		if len(v) != 8 {
			closer.Close()
			return 0, fmt.Errorf("model %q: update seq of %d bytes: %w", model, len(v), ErrCorrupt)
		}
		seq = int64(binary.LittleEndian.Uint64(v))
		closer.Close()
	}
	s.setSeqLocked(model, seq)
	return seq, nil
}

// setSeqLocked caches seq as model's applied update seq; updMu held.
func (s *Store) setSeqLocked(model string, seq int64) {
	if s.seqs == nil {
		s.seqs = map[string]int64{}
	}
	s.seqs[model] = seq
	view := maps.Clone(s.seqs)
	s.seqView.Store(&view)
}

// dropSeqLocked forgets model's cached seq (the next read takes it from
// the store); updMu held.
func (s *Store) dropSeqLocked(model string) {
	delete(s.seqs, model)
	view := maps.Clone(s.seqs)
	s.seqView.Store(&view)
}

func (s *Store) upsert(model, table string, ids []int64, rows []float32, seq int64, epoch uint64) (bool, error) {
	start := time.Now()
	if s.opts.ReadOnly {
		return false, badRequestf("upsert: store opened read-only")
	}
	if err := s.enter(); err != nil {
		return false, err
	}
	defer s.ops.Done()
	copied := false
	for range 8 {
		applied, shared, err := s.upsertOnce(model, table, ids, rows, seq, epoch)
		if err != nil {
			return false, err
		}
		if shared == 0 {
			if copied {
				// The copy is new to the hot tier (or a complete tier was
				// rebuilt around it): fill it as after an Activate.
				if err := s.Preload(context.Background()); err != nil {
					return applied, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
				}
			}
			lag := time.Since(start).Nanoseconds()
			if applied {
				s.m.upserts.Add(1)
				s.m.upsertRows.Add(int64(len(ids)))
				s.m.upsertNanos.Add(lag)
				s.m.lastUpsertNanos.Store(lag)
			}
			return applied, nil
		}
		c, err := s.unshare(context.Background(), model, table, shared)
		if err != nil {
			return false, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
		copied = copied || c
	}
	return false, fmt.Errorf("upsert model %q table %q: its table keeps being shared anew", model, table)
}

// upsertOnce checks and writes an upsert, unless model's table reads a
// physical table shared with another name: then it writes nothing and
// returns that table's id for the caller to copy (cow.go).
func (s *Store) upsertOnce(model, table string, ids []int64, rows []float32, seq int64, epoch uint64) (applied bool, shared uint32, err error) {
	// catMu keeps the catalog, the view and the tables' sharing as they
	// are from the checks to the write; updMu orders upserts.
	s.catMu.Lock()
	defer s.catMu.Unlock()
	s.updMu.Lock()
	defer s.updMu.Unlock()
	mv, err := s.model(model)
	if err != nil {
		return false, 0, err
	}
	tv := mv.tables[table]
	if tv == nil {
		return false, 0, fmt.Errorf("upsert model %q: table %q: %w", model, table, ErrUnknownTable)
	}
	if len(rows) != len(ids)*tv.dim {
		return false, 0, fmt.Errorf("upsert model %q table %q: %d floats for %d ids of dim %d: %w", model, table, len(rows), len(ids), tv.dim, ErrDimMismatch)
	}
	for i := range ids {
		// As at ingest: a NaN or an infinity would poison every pool of
		// the row, and a quantized table stores it as a row of NaNs.
		if c := nonFinite(rows[i*tv.dim : (i+1)*tv.dim]); c >= 0 {
			return false, 0, badRequestf("upsert model %q table %q: ids[%d]=%d: value %v in column %d is not a finite number: an embedding row must be", model, table, i, ids[i], rows[i*tv.dim+c], c)
		}
	}
	for i, id := range ids {
		if id < 0 {
			return false, 0, fmt.Errorf("upsert model %q table %q: ids[%d]=%d: %w", model, table, i, id, ErrNegativeID)
		}
		if id >= tv.rows {
			return false, 0, fmt.Errorf("upsert model %q table %q: ids[%d]=%d, table has %d rows: %w", model, table, i, id, tv.rows, ErrIDOutOfRange)
		}
		if !tv.part.holds(id) {
			// Another shard's row: written here, no lookup would read it
			// and a preload would stop at it (the tier holds the part).
			return false, 0, fmt.Errorf("upsert model %q table %q: ids[%d]=%d, this store holds rows %s of the table: %w", model, table, i, id, tv.part, ErrIDOutOfRange)
		}
	}
	raise := false
	if seq > 0 {
		// A router that lost the sequencing Lease writes nothing, not
		// even a replay's acknowledgement.
		if raise, err = s.fenceLocked(model, seq, epoch); err != nil {
			return false, 0, err
		}
		cur, err := s.appliedSeqLocked(model)
		if err != nil {
			return false, 0, err
		}
		if seq <= cur || seq > cur+1 {
			// No rows written: the epoch, if news, on its own.
			s.mu.RLock()
			if s.closed.Load() {
				s.mu.RUnlock()
				return false, 0, ErrClosed
			}
			err := s.raiseAloneLocked(raise, epoch)
			s.mu.RUnlock()
			switch {
			case err != nil:
				return false, 0, err
			case seq <= cur:
				return false, 0, nil // a replay of an update the store holds
			}
			return false, 0, &SeqGapError{Model: model, Applied: cur, Got: seq}
		}
	}
	if s.copySrc == tv.id || s.cat.sharedBeyond(tv.id, model, table) {
		return false, tv.id, nil
	}
	// Before any write, the catalog's included: refused, the update
	// takes no number and writes nothing.
	if err := s.room(len(ids) * (2*keyLen + tv.dtype.RowBytes(tv.dim) + 4*tv.dim + 64)); err != nil {
		return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
	}
	// Before the first upsert of a table, record that it no longer holds
	// its content hash's rows (no later ingest shares it).
	if t := s.cat.Tables[tv.id]; t != nil && !t.Mutated {
		next := s.cat.clone()
		next.Tables[tv.id].Mutated = true
		if err := s.commit(next); err != nil {
			return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
		if mv, err = s.model(model); err != nil {
			return false, 0, err
		}
		if tv = mv.tables[table]; tv == nil {
			return false, 0, fmt.Errorf("upsert model %q: table %q: %w", model, table, ErrUnknownTable)
		}
	}

	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return false, 0, ErrClosed
	}
	dim := tv.dim
	ovl := overlayTablePrefix(model, table)
	b := s.db.NewBatchWithSize(len(ids)*(2*keyLen+len(ovl)+tv.dtype.RowBytes(dim)+4*dim+16) + 64)
	defer b.Close()
	if seq > 0 {
		if err := b.Set(seqKey(model), binary.LittleEndian.AppendUint64(nil, uint64(seq)), nil); err != nil {
			return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
	}
	if raise {
		// With the seq: a restart keeps refusing the earlier holds.
		if err := setEpoch(b, epoch); err != nil {
			return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
	}
	var key [keyLen]byte
	var val []byte
	stored := make([]float32, len(rows))
	for i, id := range ids {
		row := rows[i*dim : (i+1)*dim]
		val = tv.dtype.encode(val[:0], row)
		tv.dtype.decode(stored[i*dim:(i+1)*dim], val)
		if err := b.Set(rowKey(key[:], tv.id, id), val, nil); err != nil {
			return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
		// The overlay keeps the row as sent, for a later version switch.
		val = Float32.encode(val[:0], row)
		if err := b.Set(overlayKey(ovl, id), val, nil); err != nil {
			return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
	}
	if err := s.db.Apply(b, s.writeOpts()); err != nil {
		return false, 0, fmt.Errorf("upsert model %q table %q: %w", model, table, err)
	}
	// Durable. Now visible: lookups that read Pebble before this point
	// must not admit what they read (updSeq), and resident rows are
	// overwritten before the ack.
	s.updSeq.Add(1)
	if seq > 0 {
		s.setSeqLocked(model, seq)
	}
	if raise {
		s.epoch.Store(epoch)
	}
	if cls := tv.hot; cls != nil {
		cls.Lock()
		for i, id := range ids {
			k := hot.Key(tv.id, id)
			cls.Put(k, hot.Hash(k), stored[i*dim:(i+1)*dim])
		}
		cls.Unlock()
	}
	return true, 0, nil
}
