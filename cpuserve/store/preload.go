package store

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// PreloadReport sums the preloads a store has run (Options.Preload).
type PreloadReport struct {
	// Tables, Rows and Bytes (float32, as the hot tier holds them) loaded.
	Tables int
	Rows   int64
	Bytes  int64
	// Elapsed is the time the preloads took, summed.
	Elapsed time.Duration
	// Complete: the hot tier is sized to hold every row of the active
	// tables (hot.FullBytes); with Preload off they still enter by misses.
	Complete bool
}

// preloadChunk is how many rows a preload reads per iterator and copies
// per class lock: lookups wait at most one chunk's copy for the class (16
// MiB of dim-64 rows, a few milliseconds). Under DirectReads a longer
// iterator reads more of its table through the O_DIRECT windows of the
// sequential file Pebble switches to (window.go) and less through the
// page cache before the switch: with 16,384 rows a cold preload of
// dlrm-kaggle in an 8 GiB budget took 21-29 s with windows against 14 s
// without; with 65,536, 12-20 s against 14-18 s.
const preloadChunk = 1 << 16

// preloadChunkBytes bounds a chunk's scratch (every table loading at
// once holds one): wider rows read fewer per chunk.
const preloadChunkBytes = 16 << 20

// chunkRows is how many rows of tv a preload or restore chunk reads.
func chunkRows(tv *tableView) int {
	return int(max(1, min(preloadChunk, int64(preloadChunkBytes/(4*tv.dim)), tv.rows)))
}

// Preloaded returns the summed preload report.
func (s *Store) Preloaded() PreloadReport {
	s.preMu.Lock()
	defer s.preMu.Unlock()
	r := s.pre
	r.Complete = s.view.Load().tier.Complete()
	return r
}

// Preload loads the rows of the active tables not yet loaded into the hot
// tier, as Options.Preload says (Open, Ingest, Activate and DropVersion
// call it; the serving layer need not). It is safe beside lookups and
// upserts: a chunk read from Pebble is put in the tier only if no upsert
// was acknowledged since its iterator was opened, else it is read again.
func (s *Store) Preload(ctx context.Context) error {
	if s.opts.Preload == PreloadOff || s.closed.Load() {
		return nil
	}
	v := s.view.Load()
	if s.opts.Preload == PreloadAuto && !v.tier.Complete() {
		return nil
	}
	s.preMu.Lock() // one preload at a time; later ones find the work done
	defer s.preMu.Unlock()
	defer s.scanReadahead()()
	start := time.Now()
	var jobs []*tableView
	seen := map[uint32]bool{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range v.models {
			if !yield(n) {
				return
			}
		}
	}) {
		for _, tv := range v.models[name].tables {
			if tv.hot == nil || seen[tv.id] {
				continue
			}
			seen[tv.id] = true
			tv.hot.RLock()
			done := tv.hot.Preloaded(tv.id)
			tv.hot.RUnlock()
			if !done {
				jobs = append(jobs, tv)
			}
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	// Largest first so the workers finish together.
	slices.SortFunc(jobs, func(a, b *tableView) int { return int(b.rows*int64(b.dim) - a.rows*int64(a.dim)) })
	var (
		mu       sync.Mutex
		firstErr error
		next     int
		wg       sync.WaitGroup
	)
	workers := min(runtime.GOMAXPROCS(0), len(jobs))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next == len(jobs) || firstErr != nil {
					mu.Unlock()
					return
				}
				tv := jobs[next]
				next++
				mu.Unlock()
				rows, err := s.preloadTable(ctx, v.tier, tv)
				damaged := err != nil && pebble.IsCorruptionError(err)
				if damaged {
					// The rest of the table's rows enter on
					// their misses; those of the damaged block
					// are refused to the lookups that ask for
					// them, and the rest of the store serves.
					s.opts.Logger.Errorf("store %q: preload of table %q stopped after %d rows: %v", s.dir, tv.name, rows, explainCorrupt(err))
				}
				mu.Lock()
				if err != nil && !damaged && firstErr == nil {
					firstErr = err
				}
				s.pre.Rows += rows
				s.pre.Bytes += rows * int64(tv.dim) * 4
				if err == nil {
					s.pre.Tables++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.pre.Elapsed += time.Since(start)
	if firstErr != nil {
		return fmt.Errorf("preload: %w", firstErr)
	}
	return nil
}

// preloadTable scans tv's key range into its class and returns the rows
// loaded. It stops early, without error, when the tier was replaced (the
// caller that replaced it preloads the new one) or the class is full.
func (s *Store) preloadTable(ctx context.Context, tier *hot.Tier, tv *tableView) (int64, error) {
	cls, dim := tv.hot, tv.dim
	chunk := chunkRows(tv)
	buf := make([]float32, chunk*dim)
	ids := make([]int64, chunk)
	var key [keyLen]byte
	var loaded int64
	from := int64(0)
	for from < tv.rows {
		if err := ctx.Err(); err != nil {
			return loaded, err
		}
		n, last, full, err := s.preloadChunk(tier, tv, from, buf, ids, key[:])
		if err != nil {
			return loaded, err
		}
		if n < 0 { // tier replaced or table gone
			return loaded, nil
		}
		loaded += int64(n)
		if full || n == 0 {
			break
		}
		from = last + 1
	}
	cls.Lock()
	cls.MarkPreloaded(tv.id)
	cls.Unlock()
	return loaded, nil
}

// preloadChunk loads up to cap(ids) rows of tv from row from on; n is
// -1 when the tier was replaced, last the last row id loaded. Rows read
// while an upsert was acknowledged are read again (up to a few times,
// then under updMu). buf and ids are scratch of chunkRows(tv) rows.
func (s *Store) preloadChunk(tier *hot.Tier, tv *tableView, from int64, buf []float32, ids []int64, key []byte) (n int, last int64, full bool, err error) {
	dim, cls := tv.dim, tv.hot
	for attempt := 0; ; attempt++ {
		locked := attempt >= 3
		if locked {
			s.updMu.Lock()
		}
		s.mu.RLock()
		if s.closed.Load() || s.view.Load().tier != tier {
			s.mu.RUnlock()
			if locked {
				s.updMu.Unlock()
			}
			return -1, 0, false, nil
		}
		seq := s.updSeq.Load()
		ids = ids[:0]
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: rowKey(key, tv.id, from), UpperBound: tv.hi})
		if err == nil {
			for ok := it.First(); ok && len(ids) < cap(ids); ok = it.Next() {
				k := it.Key()
				if len(k) != keyLen {
					continue
				}
				v, verr := it.ValueAndErr()
				if verr != nil {
					err = verr
					break
				}
				id := keyRow(k)
				if id >= tv.rows || !tv.dtype.decode(buf[len(ids)*dim:(len(ids)+1)*dim], v) {
					err = fmt.Errorf("table %q: row %d holds %d bytes, want %d: %w", tv.name, id, len(v), tv.dtype.RowBytes(dim), ErrCorrupt)
					break
				}
				ids = append(ids, id)
			}
			if cerr := it.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			s.mu.RUnlock()
			if locked {
				s.updMu.Unlock()
			}
			return 0, 0, false, fmt.Errorf("table %q: %w", tv.name, err)
		}
		cls.Lock()
		if s.updSeq.Load() != seq {
			// An upsert was acknowledged meanwhile: its Put may have
			// missed a row this chunk would now load stale.
			cls.Unlock()
			s.mu.RUnlock()
			if locked {
				s.updMu.Unlock()
			}
			continue
		}
		for i, id := range ids {
			k := hot.Key(tv.id, id)
			if !cls.Load(k, hot.Hash(k), buf[i*dim:(i+1)*dim]) {
				n, full = i, true
				break
			}
			n = i + 1
		}
		cls.Unlock()
		s.mu.RUnlock()
		if locked {
			s.updMu.Unlock()
		}
		if n > 0 {
			last = ids[n-1]
		}
		return n, last, full, nil
	}
}

// scanReadahead turns Pebble's speculative readahead on for a preload's
// or a warm restart's sequential scans where DropBehind turned it off
// (lookups read at random), and returns what turns it off again once no
// scan needs it (the scans count themselves in raScans). Without it a
// scan reads each 4 KiB block with its own request to the device.
func (s *Store) scanReadahead() (restore func()) {
	rc := s.popts.Local.ReadaheadConfig
	if !s.opts.DropBehind || rc == nil {
		return func() {}
	}
	s.raMu.Lock()
	if s.raScans++; s.raScans == 1 {
		rc.Set(objstorageprovider.FadviseSequential, objstorageprovider.FadviseSequential)
	}
	s.raMu.Unlock()
	return func() {
		s.raMu.Lock()
		if s.raScans--; s.raScans == 0 {
			rc.Set(objstorageprovider.FadviseSequential, objstorageprovider.NoReadahead)
		}
		s.raMu.Unlock()
	}
}
