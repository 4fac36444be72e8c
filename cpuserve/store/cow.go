package store

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Copy-on-write. The store keeps one copy of identical content (a
// physical table), which may be read under several names: two models,
// two tables of one model, a model's versions. Versions of one model are
// one name (they carry the same updates, see carry.go); any other pair
// must not see each other's updates, so the first update of a table read
// under another name too copies it, and the updated (model, table) reads
// the copy from then on while every other name keeps the original.
//
// While a table is shared nobody writes it (every write checks sharing
// under catMu, and the copy's source is marked in copySrc until the copy
// is committed or dropped), so the copy reads a still table with no lock
// and lookups of either name read the original meanwhile. A crash leaves
// either the catalog before the copy (the copy, in state copying, is
// deleted by Open) or after it (the copy complete, ingested durably). A
// copy an error path leaves in state copying (its drop or its commit
// failed) is deleted by the next gc, which spares only the copy in
// progress (copyDst).

// copySSTBytes is the target size of one SST of a copy.
const copySSTBytes = 64 << 20

// unshare gives model's table its own copy of physical table src if src
// is read under another name too; copied says whether it made one.
func (s *Store) unshare(ctx context.Context, model, table string, src uint32) (copied bool, err error) {
	// Close cancels the copy (ctx) and waits for it to stop.
	if err := s.enter(); err != nil {
		return false, err
	}
	defer s.ops.Done()
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	defer func() { err = s.closedErr(err) }()
	s.cowMu.Lock()
	defer s.cowMu.Unlock()
	s.catMu.Lock()
	t := s.cat.Tables[src]
	if t == nil || t.State != stateReady || !s.cat.sharedBeyond(src, model, table) {
		s.catMu.Unlock()
		return false, nil
	}
	next := s.cat.clone()
	id := next.NextTable
	next.NextTable++
	next.Tables[id] = &physTable{ID: id, SHA256: t.SHA256, Rows: t.Rows, Dim: t.Dim, DType: t.DType,
		State: stateCopying, Mutated: true, Loss: t.Loss, Source: t.Source, Part: t.Part}
	if err := s.commit(next); err != nil {
		s.catMu.Unlock()
		return false, fmt.Errorf("copy table %d: %w", src, err)
	}
	s.copySrc, s.copyDst = src, id
	s.catMu.Unlock()
	defer func() {
		s.catMu.Lock()
		s.copySrc, s.copyDst = 0, 0
		s.catMu.Unlock()
	}()
	s.hook("cow-registered")

	if err := s.copyRows(ctx, src, id, t.held()); err != nil {
		if derr := s.dropCopy(id); derr != nil {
			return false, fmt.Errorf("copy table %d: %w (and dropping the copy: %w)", src, err, derr)
		}
		return false, fmt.Errorf("copy table %d: %w", src, err)
	}
	s.hook("cow-copied")

	s.catMu.Lock()
	defer s.catMu.Unlock()
	next = s.cat.clone()
	nt := next.Tables[id]
	if nt == nil {
		return false, fmt.Errorf("copy table %d: its copy %d left the catalog", src, id)
	}
	nt.State, nt.NextRow = stateReady, nt.Rows
	if m := next.Models[model]; m != nil {
		for _, v := range m.Versions {
			if vt := v.Tables[table]; vt != nil && vt.Phys == src {
				vt.Phys = id
			}
		}
	}
	// The original may be read by nobody now (its other names were
	// dropped during the copy): gc deletes it then.
	if err := s.gc(ctx, next, nil); err != nil {
		return false, fmt.Errorf("copy table %d: %w", src, err)
	}
	s.m.copies.Add(1)
	s.m.copiedRows.Add(t.held())
	return true, nil
}

// copyRows copies the rows of physical table src (rows rows) to table
// dst, as SSTs ingested into Pebble (durable when Ingest returns).
func (s *Store) copyRows(ctx context.Context, src, dst uint32, rows int64) error {
	sink, err := s.newSSTSink(fmt.Sprintf("%06d-copy", dst))
	if err != nil {
		return err
	}
	defer sink.discard()
	lo, hi := tableBounds(src)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	var (
		n   int64
		key [keyLen]byte
	)
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != keyLen {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if err := sink.set(rowKey(key[:], dst, keyRow(k)), v); err != nil {
			return err
		}
		n++
		if sink.Bytes >= copySSTBytes {
			if err := sink.flush(ctx); err != nil {
				return err
			}
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if err := sink.flush(ctx); err != nil {
		return err
	}
	if n != rows {
		return fmt.Errorf("table %d holds %d rows, the catalog says %d: %w", src, n, rows, ErrCorrupt)
	}
	return nil
}

// dropCopy deletes a copy's rows, then forgets it (a crash in between
// leaves it in state copying, which Open deletes again; an error, which
// the next gc or Open deletes).
func (s *Store) dropCopy(id uint32) error {
	lo, hi := tableBounds(id)
	if err := s.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
		return fmt.Errorf("delete table %d: %w", id, err)
	}
	s.catMu.Lock()
	defer s.catMu.Unlock()
	if s.cat.Tables[id] == nil {
		return nil
	}
	next := s.cat.clone()
	delete(next.Tables, id)
	return s.commit(next)
}

// dropCopies deletes the copies a crash left unfinished (Open).
func (s *Store) dropCopies() error {
	var ids []uint32
	for id, t := range s.cat.Tables {
		if t.State == stateCopying {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		if err := s.dropCopy(id); err != nil {
			return err
		}
	}
	return nil
}

// hook calls the test hook at a named point of a multi-step change.
func (s *Store) hook(point string) {
	if s.testHook != nil {
		s.testHook(point)
	}
}
