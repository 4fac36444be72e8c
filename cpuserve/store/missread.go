package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// MissReads is how a lookup reads the rows the hot tier does not hold
// (Options.MissReads).
type MissReads string

const (
	// MissSorted reads each table's misses, deduplicated and sorted into
	// key order, through one iterator: a SeekGE per row, or a Next when
	// the row follows the one just read. A large miss set is cut into key
	// ranges read at once by up to Options.MissParallel readers, so the
	// device sees several reads in flight. The default.
	MissSorted MissReads = "sorted"
	// MissPoint reads every missed id with its own point Get, in batch
	// order, one at a time: the path before MissSorted, kept as the
	// baseline it is measured and tested against.
	MissPoint MissReads = "point"
)

// DefaultMissParallel is the default Options.MissParallel: enough reads
// in flight to keep an SSD busy, few enough not to crowd the lookups of
// other batches on a small machine.
const DefaultMissParallel = 4

// missTaskRows is the fewest distinct rows a reader is given: below it a
// goroutine and an iterator cost more than the reads they overlap.
const missTaskRows = 16

// readTask is a key range of one table's sorted misses: k in [lo, hi).
type readTask struct {
	job    *tableJob
	lo, hi int
}

// readStats is what one reader measured.
type readStats struct {
	reads, bytes                int64
	blockNanos, blockBytes, hit int64
}

// SetMissReads changes how lookups read misses from now on (benchmarks
// compare the modes on one open store; Options sets them at Open).
func (s *Store) SetMissReads(mode MissReads, parallel int) error {
	o := Options{MissReads: mode, MissParallel: parallel}
	if err := o.validateMiss(); err != nil {
		return err
	}
	o.ensureMiss()
	s.missPoint.Store(o.MissReads == MissPoint)
	s.missParallel.Store(int32(o.MissParallel))
	return nil
}

// readMisses reads the misses of every table of a lookup into the jobs'
// gather buffers (phase 2 of Lookup).
func (s *Store) readMisses(jobs []tableJob, sc *scratch) error {
	t0 := time.Now()
	var st readStats
	var err error
	if s.missPoint.Load() {
		st, err = s.readPoint(jobs, sc)
	} else {
		st, err = s.readSorted(jobs, sc)
	}
	s.m.missNanos.Add(int64(time.Since(t0)))
	s.m.pebbleReads.Add(st.reads)
	s.m.pebbleBytes.Add(st.bytes)
	s.m.blockReadNanos.Add(st.blockNanos)
	s.m.blockReadBytes.Add(st.blockBytes - st.hit)
	return err
}

// readPoint is MissPoint: a Get per missed id, duplicates included.
func (s *Store) readPoint(jobs []tableJob, sc *scratch) (readStats, error) {
	var st readStats
	for i := range jobs {
		j := &jobs[i]
		tv, dim := j.tv, j.tv.dim
		for _, p := range j.miss {
			id := j.ids[p]
			v, closer, err := s.db.Get(rowKey(sc.key[:], tv.id, id))
			if errors.Is(err, pebble.ErrNotFound) {
				return st, fmt.Errorf("table %q: row %d missing from the store: %w", tv.name, id, ErrCorrupt)
			}
			if err != nil {
				return st, fmt.Errorf("table %q: row %d: %w", tv.name, id, err)
			}
			ok := tv.dtype.decode(j.g[int(p)*dim:(int(p)+1)*dim], v)
			n := len(v)
			closer.Close()
			if !ok {
				return st, fmt.Errorf("table %q: row %d holds %d bytes, want %d: %w", tv.name, id, n, tv.dtype.RowBytes(dim), ErrCorrupt)
			}
			st.reads++
			st.bytes += int64(n)
		}
	}
	return st, nil
}

// readSorted is MissSorted: the jobs' sorted misses cut into tasks of at
// least missTaskRows distinct rows (a run of one id never split), read by
// up to MissParallel readers, the caller one of them.
func (s *Store) readSorted(jobs []tableJob, sc *scratch) (readStats, error) {
	distinct := 0
	for i := range jobs {
		distinct += jobs[i].distinctMisses()
	}
	par := int(s.missParallel.Load())
	if distinct < 2*missTaskRows {
		par = 1
	}
	chunk := max(missTaskRows, (distinct+par-1)/par)
	if par == 1 {
		chunk = distinct + 1 // one task per table
	}
	sc.tasks = sc.tasks[:0]
	for i := range jobs {
		sc.tasks = jobs[i].cut(sc.tasks, chunk)
	}
	tasks := sc.tasks
	defer clear(sc.tasks) // no references to the jobs past the lookup
	par = min(par, len(tasks))
	if par <= 1 {
		var st readStats
		for _, t := range tasks {
			if err := s.readRange(t, &st); err != nil {
				return st, err
			}
		}
		return st, nil
	}
	var (
		next     atomic.Int64
		failed   atomic.Bool
		mu       sync.Mutex
		firstErr error
		total    readStats
		wg       sync.WaitGroup
	)
	work := func() {
		var st readStats
		for !failed.Load() {
			k := int(next.Add(1)) - 1
			if k >= len(tasks) {
				break
			}
			if err := s.readRange(tasks[k], &st); err != nil {
				failed.Store(true)
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}
		mu.Lock()
		total.add(st)
		mu.Unlock()
	}
	wg.Add(par - 1)
	for range par - 1 {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
	return total, firstErr
}

func (a *readStats) add(b readStats) {
	a.reads += b.reads
	a.bytes += b.bytes
	a.blockNanos += b.blockNanos
	a.blockBytes += b.blockBytes
	a.hit += b.hit
}

// distinctMisses counts the distinct ids among the job's sorted misses.
func (j *tableJob) distinctMisses() int {
	n, prev := 0, int64(-1)
	for k := range j.nMiss() {
		if id, _ := j.at(k); id != prev {
			n++
			prev = id
		}
	}
	return n
}

// cut appends the job's misses as tasks of about chunk distinct rows.
func (j *tableJob) cut(tasks []readTask, chunk int) []readTask {
	n := j.nMiss()
	lo, rows := 0, 0
	prev := int64(-1)
	for k := range n {
		id, _ := j.at(k)
		if id == prev {
			continue
		}
		if rows == chunk {
			tasks = append(tasks, readTask{job: j, lo: lo, hi: k})
			lo, rows = k, 0
		}
		rows++
		prev = id
	}
	if n > lo {
		tasks = append(tasks, readTask{job: j, lo: lo, hi: n})
	}
	return tasks
}

// readRange reads one task's rows through one iterator, in key order.
func (s *Store) readRange(t readTask, st *readStats) error {
	j := t.job
	tv, dim := j.tv, j.tv.dim
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tv.lo, UpperBound: tv.hi})
	if err != nil {
		return fmt.Errorf("table %q: %w", tv.name, err)
	}
	var key [keyLen]byte
	prevID, prevPos := int64(-1), -1
	valid := false
	for k := t.lo; k < t.hi; k++ {
		id, pos := j.at(k)
		dst := j.g[pos*dim : (pos+1)*dim]
		if id == prevID {
			copy(dst, j.g[prevPos*dim:(prevPos+1)*dim])
			continue
		}
		// The next row of the table is usually in the block at hand: a
		// Next is cheaper than a seek through the index.
		if valid && id == prevID+1 {
			valid = it.Next()
		} else {
			valid = it.SeekGE(rowKey(key[:], tv.id, id))
		}
		if !valid || len(it.Key()) != keyLen || keyRow(it.Key()) != id {
			err := it.Error() // a failed read, not a missing row
			it.Close()
			if err != nil {
				return fmt.Errorf("table %q: row %d: %w", tv.name, id, err)
			}
			return fmt.Errorf("table %q: row %d missing from the store: %w", tv.name, id, ErrCorrupt)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("table %q: row %d: %w", tv.name, id, err)
		}
		if !tv.dtype.decode(dst, v) {
			it.Close()
			return fmt.Errorf("table %q: row %d holds %d bytes, want %d: %w", tv.name, id, len(v), tv.dtype.RowBytes(dim), ErrCorrupt)
		}
		st.reads++
		st.bytes += int64(len(v))
		prevID, prevPos = id, pos
	}
	is := it.Stats().InternalStats
	st.blockNanos += int64(is.BlockReadDuration)
	st.blockBytes += int64(is.BlockBytes)
	st.hit += int64(is.BlockBytesInCache)
	if err := it.Close(); err != nil {
		return fmt.Errorf("table %q: %w", tv.name, err)
	}
	return nil
}

// IndexBytes sums the index and filter blocks of the store's SSTs (their
// properties): what Options.CacheBytes should hold, with room to spare,
// for a lookup's miss to cost one data block read.
func (s *Store) IndexBytes() (index, filter int64, err error) {
	// Close closes Pebble under mu held exclusively: held shared, Pebble
	// stays open while the tables' properties are read (SSTables on a
	// closed DB panics).
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed.Load() {
		return 0, 0, ErrClosed
	}
	levels, err := s.db.SSTables(pebble.WithProperties())
	if err != nil {
		return 0, 0, fmt.Errorf("sstable properties: %w", err)
	}
	for _, l := range levels {
		for _, t := range l {
			if p := t.Properties; p != nil {
				index += int64(p.IndexSize + p.TopLevelIndexSize)
				filter += int64(p.FilterSize)
			}
		}
	}
	return index, filter, nil
}
