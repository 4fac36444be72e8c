package store

import (
	"encoding/binary"
	"fmt"
	"maps"

	"github.com/cockroachdb/pebble/v2"
)

// The store keeps, per model, a diverged mark: the update at which the
// router sequencing its updates found this copy diverged from its
// peers' (it refused as bad input an update they applied, applied one
// they refused, or holds another sequencer's update under a number;
// prismv1.AnnounceResponse.diverged). The update number still counts
// that update, so without the mark a router that did not see it happen
// (restarted, another one, the worker back after its registration
// lapsed) would take the copy for an up-to-date one. The worker
// announces the marks (prismv1.WorkerInfo.diverged) and the routers
// keep it out of the model's lookups and updates.
//
// A mark ends with what it describes: the store (a copy of an
// up-to-date worker's store carries none), or the model's update
// number (reset when a version of another shard or sharding is
// activated, or when the model's last version is dropped: the router
// then replays its updates to the store from its log, or leaves it out
// as behind).

// Diverged is every model's diverged mark: model -> the update at which
// its copy diverged. Nil when none.
func (s *Store) Diverged() (map[string]int64, error) {
	if d := s.diverged.Load(); d != nil {
		return cloneMarks(*d), nil
	}
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return nil, ErrClosed
	}
	d, err := s.divergedLocked()
	return cloneMarks(d), err
}

func cloneMarks(d map[string]int64) map[string]int64 {
	if len(d) == 0 {
		return nil
	}
	return maps.Clone(d)
}

// MarkDiverged records, durably (synced), that the store's copy of
// model diverged from its peers' at update seq. A model already marked
// keeps its mark, and a mark past the update the store holds
// (AppliedSeq: the answer came after the number was reset) is not
// taken: marked reports whether the mark was written.
func (s *Store) MarkDiverged(model string, seq int64) (marked bool, err error) {
	if d := s.diverged.Load(); d != nil {
		if _, ok := (*d)[model]; ok {
			// Every heartbeat's answer repeats it: no wait for an upsert
			// holding updMu through its sync.
			return false, nil
		}
	}
	if seq <= 0 {
		return false, badRequestf("mark model %q diverged at update %d: not an update number", model, seq)
	}
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return false, ErrClosed
	}
	d, err := s.divergedLocked()
	if err != nil {
		return false, err
	}
	if _, ok := d[model]; ok {
		return false, nil
	}
	held, err := s.appliedSeqLocked(model)
	if err != nil || held < seq {
		return false, err
	}
	if s.opts.ReadOnly {
		return false, badRequestf("mark model %q diverged: store opened read-only", model)
	}
	if err := s.db.Set(divergedKey(model), binary.LittleEndian.AppendUint64(nil, uint64(seq)), s.writeOpts()); err != nil {
		return false, fmt.Errorf("model %q: record diverged mark: %w", model, err)
	}
	next := maps.Clone(d)
	if next == nil {
		next = map[string]int64{}
	}
	next[model] = seq
	s.diverged.Store(&next)
	return true, nil
}

// divergedLocked reads (once) and caches the marks; updMu held.
func (s *Store) divergedLocked() (map[string]int64, error) {
	if d := s.diverged.Load(); d != nil {
		return *d, nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte(divergedPrefix), UpperBound: prefixEnd([]byte(divergedPrefix))})
	if err != nil {
		return nil, fmt.Errorf("read diverged marks: %w", err)
	}
	defer it.Close()
	d := map[string]int64{}
	for it.First(); it.Valid(); it.Next() {
		v := it.Value()
		model := string(it.Key()[len(divergedPrefix):])
		if len(v) != 8 {
			return nil, fmt.Errorf("model %q: diverged mark of %d bytes: %w", model, len(v), ErrCorrupt)
		}
		d[model] = int64(binary.LittleEndian.Uint64(v))
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("read diverged marks: %w", err)
	}
	s.diverged.Store(&d)
	return d, nil
}

// unmarkDivergedLocked drops model's mark from the cache once a batch
// deleting its key (with its update number) is applied; updMu held.
func (s *Store) unmarkDivergedLocked(model string) {
	d := s.diverged.Load()
	if d == nil {
		return
	}
	if _, ok := (*d)[model]; !ok {
		return
	}
	next := maps.Clone(*d)
	delete(next, model)
	s.diverged.Store(&next)
}
