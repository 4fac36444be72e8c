package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// Carrying updates across versions. A model's updates belong to the
// model, not to one version: AppliedSeq counts them for the model, and
// the router trusts it. So every upsert also writes the row as sent to
// the model's overlay (keys.go), and a version switch (Activate,
// Rollback, an activating Ingest) writes the overlay's rows into the
// tables of the version it activates that the version it leaves does not
// share, in the same Pebble batch as the catalog that switches: after a
// crash the store serves either the old version or the new one with
// every update, and AppliedSeq holds as it was. This is what replaying
// updates 1..AppliedSeq onto the new version would give (the last write
// of each row wins), except that a row that does not fit the new table
// (another dim, an id past its rows, no such table) is skipped where a
// replay would refuse that update whole.

// activate switches model to version n, carrying its updates.
func (s *Store) activate(model string, n int) error {
	for range 8 {
		need, err := s.activateOnce(model, n)
		if err != nil || need == nil {
			return err
		}
		// A table the updates go to is read under another name too: copy
		// it first, then try again.
		if _, err := s.unshare(context.Background(), model, need.table, need.phys); err != nil {
			return fmt.Errorf("activate %q version %d: %w", model, n, err)
		}
	}
	return fmt.Errorf("activate %q version %d: its tables keep being shared anew", model, n)
}

// sharedTable names a table a carry must copy first.
type sharedTable struct {
	table string
	phys  uint32
}

type carried struct {
	phys uint32
	dim  int
	ids  []int64
	rows []float32 // as stored (after the table's dtype)
}

func (s *Store) activateOnce(model string, n int) (*sharedTable, error) {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	s.updMu.Lock() // no upsert between the overlay read and the switch
	defer s.updMu.Unlock()
	if s.closed.Load() {
		return nil, ErrClosed
	}
	m := s.cat.Models[model]
	if m == nil {
		return nil, fmt.Errorf("activate %q: %w", model, ErrUnknownModel)
	}
	if m.Versions[n] == nil {
		return nil, fmt.Errorf("activate %q version %d: %w", model, n, ErrUnknownVersion)
	}
	if m.Active == n {
		return nil, nil
	}
	next := s.cat.clone()
	nm := next.Models[model]
	old := nm.Versions[nm.Active]
	nm.Previous, nm.Active = nm.Active, n
	b := s.db.NewBatch()
	defer b.Close()
	var carry []carried
	for _, tn := range slices.Sorted(maps.Keys(nm.Versions[n].Tables)) {
		vt := nm.Versions[n].Tables[tn]
		if old != nil && old.Tables[tn] != nil && old.Tables[tn].Phys == vt.Phys {
			continue // the same copy: it holds the updates already
		}
		t := next.Tables[vt.Phys]
		if t == nil || t.State != stateReady {
			continue
		}
		c, any, err := s.carryTable(b, model, tn, t)
		if err != nil {
			return nil, fmt.Errorf("activate %q version %d: table %q: %w", model, n, tn, err)
		}
		if any && (s.copySrc == t.ID || next.sharedBeyond(t.ID, model, tn)) {
			return &sharedTable{table: tn, phys: t.ID}, nil
		}
		if len(c.ids) > 0 {
			carry = append(carry, c)
		}
	}
	buf, err := json.Marshal(next)
	if err != nil {
		return nil, fmt.Errorf("activate %q version %d: write catalog: %w", model, n, err)
	}
	if err := b.Set(catalogKey, buf, nil); err != nil {
		return nil, fmt.Errorf("activate %q version %d: write catalog: %w", model, n, err)
	}
	s.hook("activate-batch")
	if err := s.db.Apply(b, pebble.Sync); err != nil {
		return nil, fmt.Errorf("activate %q version %d: %w", model, n, err)
	}
	// The carried rows are durable; a lookup or preload that read one of
	// these tables from Pebble before must not admit it, and a resident
	// row (from a time the version was active before) is overwritten.
	s.updSeq.Add(1)
	s.mu.RLock()
	tier := s.view.Load().tier
	var rows int64
	for _, c := range carry {
		rows += int64(len(c.ids))
		cls := tier.Class(c.dim)
		if cls == nil {
			continue
		}
		cls.Lock()
		for i, id := range c.ids {
			k := hot.Key(c.phys, id)
			cls.Put(k, hot.Hash(k), c.rows[i*c.dim:(i+1)*c.dim])
		}
		cls.Unlock()
	}
	s.mu.RUnlock()
	s.m.carriedRows.Add(rows)
	s.publish(next)
	return nil, nil
}

// carryTable adds to b the overlay rows of model's table tn that fit t;
// any says whether the overlay has rows for tn at all.
func (s *Store) carryTable(b *pebble.Batch, model, tn string, t *physTable) (c carried, any bool, err error) {
	prefix := overlayTablePrefix(model, tn)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return c, false, err
	}
	defer it.Close()
	c = carried{phys: t.ID, dim: t.Dim}
	src := make([]float32, t.Dim)
	var key [keyLen]byte
	var val []byte
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+8 {
			continue
		}
		any = true
		id := int64(binary.BigEndian.Uint64(k[len(prefix):]))
		v, err := it.ValueAndErr()
		if err != nil {
			return c, any, err
		}
		if len(v) != 4*t.Dim || id < 0 || id >= t.Rows {
			continue // does not fit this version's table
		}
		Float32.decode(src, v)
		val = t.DType.encode(val[:0], src)
		if err := b.Set(rowKey(key[:], t.ID, id), val, nil); err != nil {
			return c, any, err
		}
		c.ids = append(c.ids, id)
		c.rows = slices.Grow(c.rows, t.Dim)[:len(c.rows)+t.Dim]
		t.DType.decode(c.rows[len(c.rows)-t.Dim:], val)
	}
	return c, any, it.Error()
}
