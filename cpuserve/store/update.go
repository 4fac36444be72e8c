package store

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// Upsert writes rows (len(ids) x dim, row-major) of table in model's
// active version. When it returns nil the rows are durable (the WAL is
// synced, unless Options.NoSync) and every later lookup reads them: a
// resident hot-tier row is overwritten before the ack. Rows are stored in
// the table's dtype, so a quantized table returns the quantized value.
//
// The change is to the physical table: every model version sharing it
// sees it.
func (s *Store) Upsert(model, table string, ids []int64, rows []float32) error {
	start := time.Now()
	if s.opts.ReadOnly {
		return fmt.Errorf("upsert: store opened read-only: %w", ErrBadRequest)
	}
	mv, err := s.model(model)
	if err != nil {
		return err
	}
	tv := mv.tables[table]
	if tv == nil {
		return fmt.Errorf("upsert model %q: table %q: %w", model, table, ErrUnknownTable)
	}
	if len(rows) != len(ids)*tv.dim {
		return fmt.Errorf("upsert model %q table %q: %d floats for %d ids of dim %d: %w", model, table, len(rows), len(ids), tv.dim, ErrDimMismatch)
	}
	for i, id := range ids {
		if id < 0 {
			return fmt.Errorf("upsert model %q table %q: ids[%d]=%d: %w", model, table, i, id, ErrNegativeID)
		}
		if id >= tv.rows {
			return fmt.Errorf("upsert model %q table %q: ids[%d]=%d, table has %d rows: %w", model, table, i, id, tv.rows, ErrIDOutOfRange)
		}
	}
	if err := s.markMutated(tv.id); err != nil {
		return fmt.Errorf("upsert model %q table %q: %w", model, table, err)
	}

	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return ErrClosed
	}
	// Re-resolve under mu: the hot tier may have been swapped meanwhile.
	if mv, err = s.model(model); err != nil {
		return err
	}
	if tv = mv.tables[table]; tv == nil {
		return fmt.Errorf("upsert model %q: table %q: %w", model, table, ErrUnknownTable)
	}
	dim := tv.dim
	b := s.db.NewBatchWithSize(len(ids) * (keyLen + tv.dtype.RowBytes(dim) + 8))
	defer b.Close()
	var key [keyLen]byte
	var val []byte
	stored := make([]float32, len(rows))
	for i, id := range ids {
		val = tv.dtype.encode(val[:0], rows[i*dim:(i+1)*dim])
		tv.dtype.decode(stored[i*dim:(i+1)*dim], val)
		if err := b.Set(rowKey(key[:], tv.id, id), val, nil); err != nil {
			return fmt.Errorf("upsert model %q table %q: %w", model, table, err)
		}
	}
	wo := pebble.Sync
	if s.opts.NoSync {
		wo = pebble.NoSync
	}
	if err := s.db.Apply(b, wo); err != nil {
		return fmt.Errorf("upsert model %q table %q: %w", model, table, err)
	}
	// Durable. Now visible: lookups that read Pebble before this point
	// must not admit what they read (updSeq), and resident rows are
	// overwritten before the ack.
	s.updSeq.Add(1)
	if cls := tv.hot; cls != nil {
		cls.Lock()
		for i, id := range ids {
			k := hot.Key(tv.id, id)
			cls.Put(k, hot.Hash(k), stored[i*dim:(i+1)*dim])
		}
		cls.Unlock()
	}
	lag := time.Since(start).Nanoseconds()
	s.m.upserts.Add(1)
	s.m.upsertRows.Add(int64(len(ids)))
	s.m.upsertNanos.Add(lag)
	s.m.lastUpsertNanos.Store(lag)
	return nil
}

// markMutated records, before the first upsert of a table, that it no
// longer holds its content hash's rows.
func (s *Store) markMutated(id uint32) error {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	t := s.cat.Tables[id]
	if t == nil || t.Mutated {
		return nil
	}
	next := s.cat.clone()
	next.Tables[id].Mutated = true
	return s.commit(next)
}
