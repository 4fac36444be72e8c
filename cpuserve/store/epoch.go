package store

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/api/prismv1"
)

// The store keeps the highest election epoch of the router sequencing
// its updates that it has heard of (prismv1.ApplyUpdateRequest.epoch):
// one for the whole store, since one election picks the sequencer of
// every model. It is written durably with the update numbers (in the
// batch that writes an update's seq, or on its own when heard of
// otherwise), so a restarted worker still refuses the router that lost
// the Lease. A sequenced write of an earlier epoch (prismv1.EpochStale:
// lower, of any Lease for ordered epochs) fails with a *StaleEpochError
// before anything is written or any number taken; one of a later epoch
// (prismv1.EpochRaises) raises the kept one; epoch 0 is not checked.

// StaleEpochError says a sequenced write came from a router whose hold
// of the sequencing Lease ended: the store has heard of a later hold
// (Held). Nothing was written.
type StaleEpochError struct {
	Model string
	Seq   int64
	// Epoch is the write's, Held the store's.
	Epoch, Held uint64
}

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("model %q: update %d of epoch %s: the store has heard of the later epoch %s; nothing written", e.Model, e.Seq, prismv1.FormatEpoch(e.Epoch), prismv1.FormatEpoch(e.Held))
}

// Epoch is the highest election epoch the store has heard of (0: none).
func (s *Store) Epoch() (uint64, error) {
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return s.epochLocked()
}

// RaiseEpoch records that the router holding election epoch holds the
// Lease (the worker heard it in an answer to its announcement): from
// now on the store refuses the writes of earlier holds. An epoch that does not raise the kept one (prismv1.EpochRaises)
// changes nothing. It returns the epoch kept after, written durably
// (synced) when raised.
func (s *Store) RaiseEpoch(epoch uint64) (uint64, error) {
	if s.epochRead.Load() && !prismv1.EpochRaises(s.epoch.Load(), epoch) {
		// Every heartbeat's answer: no news, so no wait for an upsert
		// holding updMu through its sync.
		return s.epoch.Load(), nil
	}
	s.updMu.Lock()
	defer s.updMu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return 0, ErrClosed
	}
	held, err := s.epochLocked()
	if err != nil || !prismv1.EpochRaises(held, epoch) {
		return held, err
	}
	if s.opts.ReadOnly {
		return held, badRequestf("raise epoch: store opened read-only")
	}
	if err := s.db.Set(epochKey, binary.LittleEndian.AppendUint64(nil, epoch), s.writeOpts()); err != nil {
		return held, fmt.Errorf("record election epoch %d: %w", epoch, err)
	}
	s.epoch.Store(epoch)
	return epoch, nil
}

// fenceLocked checks a sequenced write of model's update seq by a
// router of epoch: a *StaleEpochError if the store has heard of a later
// hold, else whether epoch raises the kept one (the
// write then records it, setEpoch). updMu and mu held.
func (s *Store) fenceLocked(model string, seq int64, epoch uint64) (raise bool, err error) {
	if epoch == 0 {
		return false, nil
	}
	held, err := s.epochLocked()
	if err != nil {
		return false, err
	}
	if prismv1.EpochStale(held, epoch) {
		return false, &StaleEpochError{Model: model, Seq: seq, Epoch: epoch, Held: held}
	}
	return prismv1.EpochRaises(held, epoch), nil
}

// setEpoch adds the record of epoch to b; the caller stores it in s.epoch once
// b is applied.
func setEpoch(b *pebble.Batch, epoch uint64) error {
	return b.Set(epochKey, binary.LittleEndian.AppendUint64(nil, epoch), nil)
}

// epochLocked reads (once) and caches the kept epoch; updMu held.
func (s *Store) epochLocked() (uint64, error) {
	if s.epochRead.Load() {
		return s.epoch.Load(), nil
	}
	v, closer, err := s.db.Get(epochKey)
	switch {
	case err == pebble.ErrNotFound:
		s.epoch.Store(0)
	case err != nil:
		return 0, fmt.Errorf("read election epoch: %w", err)
	default:
		defer closer.Close()
		if len(v) != 8 {
			return 0, fmt.Errorf("election epoch of %d bytes: %w", len(v), ErrCorrupt)
		}
		s.epoch.Store(binary.LittleEndian.Uint64(v))
	}
	s.epochRead.Store(true)
	return s.epoch.Load(), nil
}

// writeOpts are the options of a write acknowledged as durable.
func (s *Store) writeOpts() *pebble.WriteOptions {
	if s.opts.NoSync {
		return pebble.NoSync
	}
	return pebble.Sync
}
