package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// A warm restart (Options.WarmRestart): Close saves each hot tier class's
// resident keys and frequency sketch (hot.Snapshot) under the metadata
// table, and Open reads the rows of those keys back from Pebble into the
// tier in the background while lookups are served (restoreClass). A
// worker restarted in a rolling upgrade then misses what it missed before
// it stopped, instead of every row of a cold tier: its first minutes
// of lookups otherwise read most rows from the device. Only keys are
// saved, never rows, so a row updated since is read as it is now; keys
// of tables no longer active are skipped.

// hotSnapPrefix starts the keys of the hot tier's snapshots, one per row
// width, under the metadata table id 0. A width's snapshot is written in
// parts of at most snapPartBytes, keyed hotSnapKey(width) + the save's
// generation + the part's number, each part in a batch of its own: a
// large tier's snapshot (a 256 MiB sketch for 30M slots) never becomes
// one Pebble value and one batch the size of the memtable. A generation's
// parts read back in key order are the encoding, whose magic and CRC
// reject a save cut short; the older generation it was to replace is
// deleted only by the save's last batch, so it is read instead.
const hotSnapPrefix = "\x00\x00\x00\x00hot/"

func hotSnapKey(dim int) []byte {
	return binary.BigEndian.AppendUint32([]byte(hotSnapPrefix), uint32(dim))
}

// hotSnapGenKey starts the keys of generation gen of width dim's
// snapshot; hotSnapPartKey is the key of its part.
func hotSnapGenKey(dim int, gen uint64) []byte {
	return binary.BigEndian.AppendUint64(hotSnapKey(dim), gen)
}

func hotSnapPartKey(dim int, gen uint64, part int) []byte {
	return binary.BigEndian.AppendUint32(hotSnapGenKey(dim, gen), uint32(part))
}

// Key lengths past hotSnapKey(dim): a generation's part (8-byte
// generation, 4-byte part); a part saved before generations (4-byte
// part), and a snapshot saved as one value (nothing), both read as
// generation 0.
const (
	snapGenPartLen = 12
	snapOldPartLen = 4
)

// snapPartBytes is the most bytes of a snapshot in one part (a var for
// tests).
var snapPartBytes = 4 << 20

// warmChunk is how many keys (of one table) a restore reads per iterator
// and loads per class lock; warmReaders how many chunks are read at once.
// One: with four, a restore under 25 req/s took 17.5 s and its reads
// held the first 10 s of lookups to p99 3.8 s and 52 errors; with one,
// 15.3 s, p99 0.8 s and none (BENCHMARKS).
const (
	warmChunk   = 4096
	warmReaders = 1
)

// warmChunkHook, when set (tests), runs before each chunk a restore reads.
var warmChunkHook func()

// WarmReport says what a warm restart restored (Store.Warmed).
type WarmReport struct {
	// Keys is the keys the saved snapshots held for active tables; Rows
	// the rows read back into the tier (fewer when the tier filled first,
	// or a table's rows are gone).
	Keys, Rows int64
	// Sketches is the classes whose frequency sketch was restored (a tier
	// resized across the restart starts counting afresh).
	Sketches int
	Elapsed  time.Duration
	// Done: the restore finished (or there was nothing to restore); Err
	// is why it stopped early, if it did (a snapshot that does not decode
	// only costs the restart its warmth).
	Done bool
	Err  error
}

// warmState is the restore's progress, read by Warmed and Close.
type warmState struct {
	mu   sync.Mutex
	rep  WarmReport
	done chan struct{}
	rows atomic.Int64
	// saves counts the snapshots snapshotEvery wrote.
	saves atomic.Int64
	// gen is the generation of the last save (commitHotSnapshots).
	gen atomic.Uint64
}

// Warmed returns the warm restart's report so far, and a channel closed
// when it is done (closed at once when no restore runs).
func (s *Store) Warmed() (WarmReport, <-chan struct{}) {
	w := &s.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.rep
	r.Rows = w.rows.Load()
	if w.done == nil {
		c := make(chan struct{})
		close(c)
		return WarmReport{Done: true}, c
	}
	return r, w.done
}

// startWarm begins the background restore of the saved snapshots (Open
// calls it after Preload, or with preload set, to preload once the
// restore is done). Close cancels it and waits.
func (s *Store) startWarm(preload bool) {
	w := &s.warm
	w.mu.Lock()
	w.done = make(chan struct{})
	w.mu.Unlock()
	if !s.opts.WarmRestart || s.enter() != nil {
		s.finishWarm(nil)
		return
	}
	go func() {
		defer s.ops.Done()
		err := s.restoreHot(s.closeCtx)
		if preload {
			// The rest of the tier's free slots, by scan (Open's preload).
			if perr := s.Preload(s.closeCtx); perr != nil && s.closeCtx.Err() == nil {
				s.opts.Logger.Errorf("store %q: preloading the hot tier after the warm restart: %v", s.dir, perr)
			}
		}
		s.finishWarm(err)
	}()
	if d := s.opts.WarmSnapshotEvery; d > 0 && !s.opts.ReadOnly && s.enter() == nil {
		go func() {
			defer s.ops.Done()
			s.snapshotEvery(d)
		}()
	}
}

func (s *Store) finishWarm(err error) {
	w := &s.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	// Done unless Close cancelled it: a restore stopped by an error has
	// done what it will (and Close may save the tier over a bad snapshot).
	w.rep.Done = !errors.Is(err, context.Canceled)
	w.rep.Err = err
	w.rep.Rows = w.rows.Load()
	close(w.done)
}

// restoreHot reads the saved snapshot of each of the current tier's
// widths and loads its rows (restoreClass).
func (s *Store) restoreHot(ctx context.Context) error {
	start := time.Now()
	defer func() {
		s.warm.mu.Lock()
		s.warm.rep.Elapsed = time.Since(start)
		s.warm.mu.Unlock()
	}()
	v := s.view.Load()
	if v.tier.Complete() {
		return nil // a complete tier is preloaded
	}
	var errs []error
	for _, dim := range v.dims {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if s.view.Load().tier != v.tier {
			break // replaced: the new tier starts cold
		}
		cls := v.tier.Class(dim)
		if cls == nil {
			continue
		}
		snap, ok, err := s.readHotSnapshot(dim)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		if err := s.restoreClass(ctx, v, cls, &snap); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// readHotSnapshot reads the saved snapshot of width dim; ok is false when
// there is none. A save writes a new generation of parts and deletes the
// older ones only in its last batch, so after a save cut short (the
// process killed mid-way) the newest generation does not decode and the
// one before it, whole, is read instead (and the store's log says so);
// the error is the newest's when none decodes. One generation's bytes
// are held at a time.
func (s *Store) readHotSnapshot(dim int) (snap hot.Snapshot, ok bool, err error) {
	gens, err := s.hotSnapGens(dim)
	if err != nil || len(gens) == 0 {
		return snap, false, err
	}
	var first error
	for i, gen := range slices.Backward(gens) {
		val, err := s.hotSnapGen(dim, gen)
		if err == nil {
			err = snap.UnmarshalBinary(val)
		}
		if err == nil && snap.Dim != dim {
			err = fmt.Errorf("holds width %d: %w", snap.Dim, hot.ErrSnapshot)
		}
		if err == nil {
			if first != nil {
				s.opts.Logger.Infof("store %q: %v; restoring the snapshot saved before it (%d older)", s.dir, first, len(gens)-1-i)
			}
			return snap, true, nil
		}
		if first == nil {
			first = fmt.Errorf("hot tier snapshot of width %d: %w", dim, err)
		}
	}
	return hot.Snapshot{}, false, first
}

// snapGen is the generation of a snapshot key's suffix past
// hotSnapKey(dim) (a part saved before generations, or one value: 0);
// ok is false for a key this reader does not know.
func snapGen(rest []byte) (gen uint64, ok bool) {
	switch len(rest) {
	case snapGenPartLen:
		return binary.BigEndian.Uint64(rest), true
	case 0, snapOldPartLen:
		return 0, true
	}
	return 0, false
}

// hotSnapGens are the generations of width dim's snapshot in the store,
// ascending, read from the keys.
func (s *Store) hotSnapGens(dim int) ([]uint64, error) {
	key := hotSnapKey(dim)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: key, UpperBound: prefixEnd(key)})
	if err != nil {
		return nil, fmt.Errorf("hot tier snapshot of width %d: %w", dim, err)
	}
	// A generation's first key, then a seek past its parts: the parts,
	// megabytes each, are not read here.
	var gens []uint64
	for valid := it.First(); valid; {
		gen, ok := snapGen(it.Key()[len(key):])
		if ok && !slices.Contains(gens, gen) {
			gens = append(gens, gen)
		}
		if ok && gen != 0 {
			valid = it.SeekGE(prefixEnd(hotSnapGenKey(dim, gen)))
		} else {
			valid = it.Next()
		}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("hot tier snapshot of width %d: %w", dim, err)
	}
	slices.Sort(gens)
	return gens, nil
}

// hotSnapGen is generation gen of width dim's snapshot: its parts
// joined in key order.
func (s *Store) hotSnapGen(dim int, gen uint64) ([]byte, error) {
	key := hotSnapKey(dim)
	lower, upper := key, prefixEnd(key)
	if gen != 0 {
		lower = hotSnapGenKey(dim, gen)
		upper = prefixEnd(lower)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var val []byte
	for valid := it.First(); valid; valid = it.Next() {
		if g, ok := snapGen(it.Key()[len(key):]); !ok || g != gen {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return nil, err
		}
		val = append(val, v...)
	}
	return val, it.Close()
}

// restoreClass restores one class: its sketch, then its keys' rows. When
// the class has fewer free slots than the snapshot has keys (a smaller
// tier, or lookups filled it meanwhile) the hottest keys are the ones
// read. They are read in key order, table by table, in chunks of
// warmChunk keys spread over warmReaders readers, with Pebble's
// readahead on (as a preload's scan): a tier's keys cover much of a
// table's blocks, and reading those in order is a sequential read of the
// device, many times faster than the same blocks read at random.
func (s *Store) restoreClass(ctx context.Context, v *view, cls *hot.Class, snap *hot.Snapshot) error {
	tables := map[uint32]*tableView{}
	for _, mv := range v.models {
		for _, tv := range mv.tables {
			if tv.hot == cls {
				tables[tv.id] = tv
			}
		}
	}
	cls.Lock()
	sketched := cls.RestoreSketch(snap)
	free := cls.Slots() - cls.Used()
	cls.Unlock()
	keep := func(k uint64) bool {
		tv := tables[uint32(k>>40)]
		return tv != nil && int64(k&(hot.MaxRows-1)) < tv.rows
	}
	keys := slices.DeleteFunc(slices.Clone(snap.Keys), func(k uint64) bool { return !keep(k) })
	if len(keys) > free {
		keys = slices.DeleteFunc(snap.Hottest(), func(k uint64) bool { return !keep(k) })
		keys = keys[:free]
		slices.Sort(keys)
	}
	s.warm.mu.Lock()
	s.warm.rep.Keys += int64(len(keys))
	if sketched {
		s.warm.rep.Sketches++
	}
	s.warm.mu.Unlock()
	// Chunks never span two tables: each is one iterator's range.
	var chunks [][]uint64
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && j-i < warmChunk && keys[j]>>40 == keys[i]>>40 {
			j++
		}
		chunks = append(chunks, keys[i:j])
		i = j
	}
	defer s.scanReadahead()()
	var (
		next     atomic.Int64
		stop     atomic.Bool
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(warmReaders, len(chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, warmChunk*cls.Dim())
			for !stop.Load() {
				c := int(next.Add(1)) - 1
				if c >= len(chunks) {
					return
				}
				err := ctx.Err()
				full := false
				if err == nil {
					full, err = s.warmChunk(v.tier, tables[uint32(chunks[c][0]>>40)], cls, chunks[c], buf)
				}
				if err != nil || full {
					stop.Store(true)
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && firstErr == nil {
		firstErr = err // stopped by Close, whatever stopped the readers first
	}
	return firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// warmChunk reads the rows of keys (ascending, all of table tv) and loads
// them into cls,
// as preloadChunk does: rows read while an upsert was acknowledged are
// read again (a few times, then under updMu). full: the class has no
// free slot left (or the tier was replaced), so the restore stops.
func (s *Store) warmChunk(tier *hot.Tier, tv *tableView, cls *hot.Class, keys []uint64, buf []float32) (full bool, err error) {
	if warmChunkHook != nil {
		warmChunkHook()
	}
	dim := cls.Dim()
	var kb [keyLen]byte
	found := make([]uint64, 0, len(keys))
	for attempt := 0; ; attempt++ {
		locked := attempt >= 3
		if locked {
			s.updMu.Lock()
		}
		unlock := func() {
			s.mu.RUnlock()
			if locked {
				s.updMu.Unlock()
			}
		}
		s.mu.RLock()
		if s.closed.Load() {
			unlock()
			return false, context.Canceled // Close keeps the snapshot
		}
		if s.view.Load().tier != tier {
			unlock()
			return true, nil // the tier was replaced: nothing to restore into
		}
		seq := s.updSeq.Load()
		found = found[:0]
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: rowKey(kb[:], tv.id, int64(keys[0]&(hot.MaxRows-1))), UpperBound: tv.hi})
		if err != nil {
			unlock()
			return false, err
		}
		for _, k := range keys {
			id := int64(k & (hot.MaxRows - 1))
			if !it.SeekGE(rowKey(kb[:], tv.id, id)) {
				// Past the table's last row, or a failed read: the next
				// seek would clear the error, so it is taken now.
				if err = it.Error(); err != nil {
					break
				}
				continue
			}
			if len(it.Key()) != keyLen || keyRow(it.Key()) != id {
				continue // the row is not held (a row-wise shard's part)
			}
			val, verr := it.ValueAndErr()
			if verr == nil && !tv.dtype.decode(buf[len(found)*dim:(len(found)+1)*dim], val) {
				verr = fmt.Errorf("table %q: row %d holds %d bytes, want %d: %w", tv.name, id, len(val), tv.dtype.RowBytes(dim), ErrCorrupt)
			}
			if verr != nil {
				err = verr
				break
			}
			found = append(found, k)
		}
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			unlock()
			return false, err
		}
		cls.Lock()
		if s.updSeq.Load() != seq {
			cls.Unlock()
			unlock()
			continue
		}
		loaded := 0
		for i, k := range found {
			if !cls.Load(k, hot.Hash(k), buf[i*dim:(i+1)*dim]) {
				// Full, or (a direct class) the table was dropped since
				// the restore began, or a row the class's packed form
				// does not hold: only fullness ends the chunk.
				if full = cls.Full(); full {
					break
				}
				continue
			}
			loaded++
		}
		cls.Unlock()
		unlock()
		s.warm.rows.Add(int64(loaded))
		return full, nil
	}
}

// saveHot writes the hot tier's snapshots for the next Open, and deletes
// those of widths the tier no longer caches; without WarmRestart it
// deletes them all (a snapshot kept would be stale when a later Open
// restores it). Close calls it with mu held exclusively (no lookup runs).
// A restore that had not finished keeps the snapshots it was restoring:
// the tier holds less than they do.
func (s *Store) saveHot() error {
	if s.opts.ReadOnly {
		return nil
	}
	s.warm.mu.Lock()
	started := s.warm.done != nil
	s.warm.mu.Unlock()
	if !started {
		return nil // an Open that failed: leave the snapshots as they were
	}
	if rep, _ := s.Warmed(); s.opts.WarmRestart && !rep.Done {
		return nil
	}
	if !s.opts.WarmRestart && s.opts.HotBytes < 0 {
		// A tool's store (prism ingest, prism store versions): no tier,
		// so the worker's snapshot is still the picture of its tier
		// (keys of tables a switch or a drop made inactive are skipped
		// at the restore). Dropped, the worker's next start was cold.
		return nil
	}
	return s.commitHotSnapshots(context.Background(), s.hotClasses(s.opts.WarmRestart))
}

// hotClasses lists the tier's classes whose snapshots a save writes:
// none when save is false or the tier is complete. The caller holds mu
// (shared or exclusive), so the tier is not replaced meanwhile.
func (s *Store) hotClasses(save bool) []*hot.Class {
	v := s.view.Load()
	if !save || v.tier.Complete() {
		return nil
	}
	var classes []*hot.Class
	for _, dim := range v.dims {
		if cls := v.tier.Class(dim); cls != nil {
			classes = append(classes, cls)
		}
	}
	return classes
}

// commitHotSnapshots replaces the saved snapshots with those of classes:
// each class's snapshot (hot.Class.WriteSnapshot) as a new generation of
// parts of at most snapPartBytes, a batch of one part each (parts small
// enough share one), and in the last batch, synced, the deletion of
// every other snapshot key (older generations, widths no longer saved).
// A class holding no row is not saved. It writes nothing when there is
// nothing to drop or save. A save cut short (an error, ctx done between
// parts, the process killed) leaves the snapshots saved before it whole
// beside the new generation's parts, which do not decode: the next Open
// restores the older ones (readHotSnapshot). Besides Pebble's own, it
// holds the keys of one class (8 bytes a row) and a part at a time.
func (s *Store) commitHotSnapshots(ctx context.Context, classes []*hot.Class) error {
	saved, last, err := s.savedHotSnapshots()
	if err != nil {
		return err
	}
	// The generation: above every saved one (they are all deleted by the
	// end), and the clock's where that is higher, so a newer save is read
	// first even across stores copied from one another.
	gen := max(uint64(time.Now().UnixNano()), last+1, s.warm.gen.Load()+1)
	s.warm.gen.Store(gen)
	b := s.db.NewBatch()
	defer func() { b.Close() }()
	var kept [][2][]byte // the new generation's key ranges
	for _, cls := range classes {
		part := 0
		dim := cls.Width()
		n, err := cls.WriteSnapshot(snapPartBytes, func(p []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if !b.Empty() && int(b.Len())+len(p) > snapPartBytes {
				if err := s.room(int(b.Len())); err != nil {
					return err
				}
				if err := b.Commit(pebble.NoSync); err != nil {
					return err
				}
				b.Close()
				b = s.db.NewBatch()
			}
			part++
			return b.Set(hotSnapPartKey(dim, gen, part-1), p, nil) // Set copies p
		})
		if err != nil {
			return err
		}
		if n > 0 {
			k := hotSnapGenKey(dim, gen)
			kept = append(kept, [2][]byte{k, prefixEnd(k)})
		}
	}
	if !saved && b.Empty() {
		return nil // most Closes (ingests, tools) have nothing to drop or save
	}
	// Everything under the prefix but the new generation's ranges.
	slices.SortFunc(kept, func(x, y [2][]byte) int { return bytes.Compare(x[0], y[0]) })
	from := []byte(hotSnapPrefix)
	for _, r := range append(kept, [2][]byte{prefixEnd([]byte(hotSnapPrefix)), nil}) {
		if bytes.Compare(from, r[0]) < 0 {
			if err := b.DeleteRange(from, r[0], nil); err != nil {
				return err
			}
		}
		from = r[1]
	}
	if err := s.room(int(b.Len())); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// snapshotEvery saves the hot tier's snapshots every d once the restore
// is done (Options.WarmSnapshotEvery), so a worker that dies without a
// Close (killed, out of memory) also restarts warm, from at most d ago.
// Close stops it.
func (s *Store) snapshotEvery(d time.Duration) {
	_, restored := s.Warmed()
	select {
	case <-restored:
	case <-s.closeCtx.Done():
		return
	}
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.closeCtx.Done():
			return
		case <-t.C:
		}
		s.mu.RLock() // no tier swap while listing; a class swapped out meanwhile saves its last keys, and the next save the new tier's
		classes := s.hotClasses(true)
		s.mu.RUnlock()
		err := s.commitHotSnapshots(s.closeCtx, classes)
		if errors.Is(err, context.Canceled) {
			return // Close began: it saves the tier itself
		}
		if err != nil {
			s.opts.Logger.Errorf("store %q: saving the hot tier's snapshot: %v", s.dir, err)
		} else {
			s.warm.saves.Add(1)
		}
	}
}

// savedHotSnapshots reports whether the store holds any hot tier
// snapshot key, and the highest generation among them.
func (s *Store) savedHotSnapshots() (saved bool, last uint64, err error) {
	prefix := []byte(hotSnapPrefix)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return false, 0, err
	}
	// Width by width, only the last key of each (its highest
	// generation's last part): the parts, megabytes each, are not read.
	for valid := it.First(); valid; {
		saved = true
		k := it.Key()
		if len(k) < len(prefix)+4 {
			valid = it.Next()
			continue
		}
		end := prefixEnd(k[:len(prefix)+4]) // a copy
		if it.SeekLT(end) {
			if k := it.Key(); len(k) == len(prefix)+4+snapGenPartLen {
				last = max(last, binary.BigEndian.Uint64(k[len(prefix)+4:]))
			}
		}
		valid = it.SeekGE(end)
	}
	return saved, last, it.Close()
}
