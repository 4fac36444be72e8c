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
// share, and marks them mutated, atomically with the catalog that
// switches (in its batch, or under a marker, below): after a crash the
// store serves either the old version or the new one with every update,
// and AppliedSeq holds as it was. This is what replaying
// updates 1..AppliedSeq onto the new version would give (the last write
// of each row wins), except that a row that does not fit the new table
// (another dim, an id past its rows, no such table) is skipped where a
// replay would refuse that update whole. A switch to a version of
// another update sequence (another shard, another sharding or the whole
// model: AppliedSeq starts again at 0) carries nothing and empties the
// overlay, in the switching batch (activateOnce).

// carryBatchBytes bounds one Pebble batch of a carry (Store.carryBatchBytes
// by default): an overlay of any size is carried in batches of about this
// size, so none nears Pebble's 4 GiB batch limit and the rows held in
// memory at once stay bounded.
const carryBatchBytes = 64 << 20

// A carry larger than one batch is still atomic. Before its first
// bounded batch it commits a marker: the catalog with every table the
// carry writes marked Mutated (no later ingest shares it), the old
// version still active. The bounded batches then write rows only into
// tables of the version being activated, which no active version reads
// (a table the old version shares under the same name is skipped, and
// one read under another name is copied first), and the last batch
// holds the switching catalog. A crash before that last batch leaves the
// old version serving exactly as before, and the new version's tables
// holding some carried rows: harmless, as the next switch to it writes
// the whole overlay again (the overlay holds the last value of each row,
// so writing it twice is writing it once).

// activate switches model to version n, carrying its updates.
func (s *Store) activate(model string, n int) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.ops.Done()
	for range 8 {
		need, err := s.activateOnce(model, n)
		if err != nil || need == nil {
			return s.closedErr(err)
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
	phys  uint32
	dim   int
	width int // the hot tier's width code of the table (physTable.width)
	ids   []int64
	rows  []float32 // as stored (after the table's dtype)
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
	// First the tables the overlay has rows for, each checked for sharing
	// before anything is written.
	type target struct {
		name string
		t    *physTable // in next
	}
	var targets []target
	// A sharded model's update number counts one shard's sequence (the
	// router numbers each shard's updates apart): a version of another
	// shard, another sharding or the whole model holds none of that
	// sequence's updates, so the number starts again at 0, in the batch
	// that switches, and the router replays the shard's updates to it
	// (or leaves it out of serving when its log no longer reaches them).
	// Kept, the number would claim the new shard's first updates held.
	// A diverged mark (diverged.go) names an update of the sequence left
	// behind: it goes with the number. So does the overlay: its rows are
	// that sequence's updates, which the new number does not count.
	// Carried, they made this store's rows differ from those of a store
	// ingested afresh at the same number (a replica beside it), rows the
	// router replays nothing to mend (no update of the new sequence
	// names them), and a later switch within the new sequence carried
	// them again.
	resetSeq := old != nil && !sameShard(old.Shard, nm.Versions[n].Shard)
	for _, tn := range slices.Sorted(maps.Keys(nm.Versions[n].Tables)) {
		if resetSeq {
			break
		}
		vt := nm.Versions[n].Tables[tn]
		if old != nil && old.Tables[tn] != nil && old.Tables[tn].Phys == vt.Phys {
			continue // the same copy: it holds the updates already
		}
		t := next.Tables[vt.Phys]
		if t == nil || t.State != stateReady {
			continue
		}
		any, err := s.hasOverlay(model, tn)
		if err != nil {
			return nil, fmt.Errorf("activate %q version %d: table %q: %w", model, n, tn, err)
		}
		if !any {
			continue
		}
		if s.copySrc == t.ID || next.sharedBeyond(t.ID, model, tn) {
			return &sharedTable{table: tn, phys: t.ID}, nil
		}
		targets = append(targets, target{tn, t})
	}
	w := &carryWriter{s: s, b: s.db.NewBatch()}
	defer func() { w.b.Close() }()
	w.marker = func() error {
		mk := s.cat.clone()
		for _, tg := range targets {
			if t := mk.Tables[tg.t.ID]; t != nil {
				t.Mutated = true
			}
		}
		return s.commit(mk)
	}
	for _, tg := range targets {
		wrote, err := w.table(model, tg.name, tg.t)
		if err != nil {
			return nil, fmt.Errorf("activate %q version %d: table %q: %w", model, n, tg.name, err)
		}
		if wrote {
			// The table no longer holds its content hash's rows: a later
			// ingest of that content must not share it (as after an upsert).
			tg.t.Mutated = true
		}
	}
	if resetSeq {
		ovl := overlayModelPrefix(model)
		if err := w.b.DeleteRange(ovl, prefixEnd(ovl), nil); err != nil {
			return nil, fmt.Errorf("activate %q version %d: reset update overlay: %w", model, n, err)
		}
		if err := w.b.Delete(seqKey(model), nil); err != nil {
			return nil, fmt.Errorf("activate %q version %d: reset update seq: %w", model, n, err)
		}
		if err := w.b.Delete(divergedKey(model), nil); err != nil {
			return nil, fmt.Errorf("activate %q version %d: reset diverged mark: %w", model, n, err)
		}
	}
	buf, err := json.Marshal(next)
	if err != nil {
		return nil, fmt.Errorf("activate %q version %d: write catalog: %w", model, n, err)
	}
	if err := w.b.Set(catalogKey, buf, nil); err != nil {
		return nil, fmt.Errorf("activate %q version %d: write catalog: %w", model, n, err)
	}
	s.hook("activate-batch")
	if err := w.apply(pebble.Sync); err != nil {
		return nil, fmt.Errorf("activate %q version %d: %w", model, n, err)
	}
	if resetSeq {
		s.dropSeqLocked(model)
		s.unmarkDivergedLocked(model)
	}
	s.m.carriedRows.Add(w.rows)
	s.publish(next)
	return nil, nil
}

// sameShard says whether two versions hold the same shard of a model
// (both nil: the whole model). A fingerprint missing on either side
// (a store of an earlier release) is taken for the same sharding.
func sameShard(a, b *ShardRef) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Shard == b.Shard && a.Shards == b.Shards && (a.Sharding == b.Sharding || a.Sharding == "" || b.Sharding == "")
}

// hasOverlay says whether model's overlay has rows of table tn.
func (s *Store) hasOverlay(model, tn string) (bool, error) {
	prefix := overlayTablePrefix(model, tn)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return false, err
	}
	defer it.Close()
	any := it.First()
	return any, it.Error()
}

// carryWriter writes a carry's rows in batches of at most about
// s.carryBatchBytes; the caller adds the catalog to the last one.
type carryWriter struct {
	s       *Store
	b       *pebble.Batch
	pending []carried // rows in b, for the hot tier once b is applied
	rows    int64
	// marker is committed once, before the first batch short of the last.
	marker     func() error
	markerDone bool
}

// table adds the overlay rows of model's table tn that fit t; wrote says
// whether there were any.
func (w *carryWriter) table(model, tn string, t *physTable) (wrote bool, err error) {
	s := w.s
	prefix := overlayTablePrefix(model, tn)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return false, err
	}
	defer it.Close()
	width := t.width(s.view.Load().packed)
	c := carried{phys: t.ID, dim: t.Dim, width: width}
	src := make([]float32, t.Dim)
	var key [keyLen]byte
	var val []byte
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+8 {
			continue
		}
		id := int64(binary.BigEndian.Uint64(k[len(prefix):]))
		v, err := it.ValueAndErr()
		if err != nil {
			return wrote, err
		}
		if len(v) != 4*t.Dim || id < 0 || id >= t.Rows || !t.Part.holds(id) {
			continue // does not fit this version's table, or another shard holds the row
		}
		Float32.decode(src, v)
		val = t.DType.encode(val[:0], src)
		if err := w.b.Set(rowKey(key[:], t.ID, id), val, nil); err != nil {
			return wrote, err
		}
		wrote = true
		c.ids = append(c.ids, id)
		c.rows = slices.Grow(c.rows, t.Dim)[:len(c.rows)+t.Dim]
		t.DType.decode(c.rows[len(c.rows)-t.Dim:], val)
		if w.b.Len() >= s.carryBatchBytes {
			w.pending = append(w.pending, c)
			c = carried{phys: t.ID, dim: t.Dim, width: width}
			if err := w.flush(); err != nil {
				return wrote, err
			}
		}
	}
	if len(c.ids) > 0 {
		w.pending = append(w.pending, c)
	}
	return wrote, it.Error()
}

// flush applies a full batch that is not the last: after the marker,
// unsynced (the last batch's sync makes it durable, and a crash before
// that leaves the old version serving).
func (w *carryWriter) flush() error {
	if !w.markerDone {
		if err := w.marker(); err != nil {
			return err
		}
		w.markerDone = true
	}
	w.s.hook("carry-batch")
	if err := w.apply(pebble.NoSync); err != nil {
		return err
	}
	w.b.Reset()
	return nil
}

// apply applies the batch and then puts its rows into the hot tier.
func (w *carryWriter) apply(wo *pebble.WriteOptions) error {
	s := w.s
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.db.Apply(w.b, wo); err != nil {
		return err
	}
	// The carried rows are in Pebble; a lookup or preload that read one
	// of these tables from Pebble before must not admit it, and a
	// resident row (from a time the version was active before) is
	// overwritten.
	s.updSeq.Add(1)
	s.mu.RLock()
	tier := s.view.Load().tier
	for _, c := range w.pending {
		w.rows += int64(len(c.ids))
		cls := tier.Class(c.width)
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
	w.pending = w.pending[:0]
	return nil
}
