package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"

	"github.com/prism-serve/prism/cpuserve/store/hot"
	"github.com/prism-serve/prism/internal/diskfull"
	"github.com/prism-serve/prism/internal/inuse"
	"github.com/prism-serve/prism/internal/pebblecheck"
	"github.com/prism-serve/prism/plan"
)

// Store is an open embedding store. Lookups, upserts and version changes
// may run concurrently from any number of goroutines.
type Store struct {
	opts Options
	dir  string
	db   *pebble.DB
	// damaged is the first file of the store a read found damaged in
	// this process (nil: none; Damaged).
	damaged *atomic.Pointer[string]
	// reportDamage reports a damaged file as Pebble's reads do (Scrub's
	// finds).
	reportDamage func(pebble.DataCorruptionInfo)
	// scrubbed counts the bytes Scrub has checked; lastScrub is when the
	// last whole one ended (unix nanoseconds, 0: none).
	scrubbed, lastScrub atomic.Int64
	// lock is the folder's lock when Open took it (to swap a staged
	// copy in first); Pebble does not release it, Close does.
	lock  *pebble.Lock
	popts *pebble.Options

	// mu: lookups and upserts hold it shared; swapping the hot tier and
	// deleting a table's rows take it exclusively, so no reader is inside
	// a table that goes away or a tier that is replaced.
	mu sync.RWMutex
	// catMu serialises catalog changes; ingestMu serialises ingests;
	// seqs caches each model's applied update seq (under updMu), and
	// seqView is a copy of it, replaced (never changed in place) under
	// updMu after each change (setSeqLocked, dropSeqLocked), read without
	// it by AppliedSeq: a heartbeat does not wait for an upsert holding
	// updMu through its sync.
	seqs    map[string]int64
	seqView atomic.Pointer[map[string]int64]
	// epoch caches the highest election epoch heard of (epoch.go), read
	// once epochRead; written under updMu, read without it by
	// RaiseEpoch's check for news.
	epoch     atomic.Uint64
	epochRead atomic.Bool
	// diverged caches the models' diverged marks (diverged.go), read
	// once: replaced (never changed in place) under updMu, read without
	// it by MarkDiverged's check for news.
	diverged atomic.Pointer[map[string]int64]
	// updMu serialises upserts (Pebble order = hot tier order); cowMu
	// serialises table copies (cow.go), and copySrc (under catMu) is the
	// table being copied, which nobody writes meanwhile. Lock order:
	// cowMu, catMu, updMu, mu.
	catMu, ingestMu, updMu, cowMu sync.Mutex
	copySrc                       uint32
	// copyDst (under catMu) is the copy being written, in state copying;
	// gc drops every other copying table (one an error path left).
	copyDst uint32
	// claimed (under catMu) is the tables the ingest under way claimed:
	// named by no version until its last step, which gc must not take
	// for unreferenced.
	claimed map[uint32]bool
	// carryBatchBytes bounds one Pebble batch of a version switch's carry
	// (carry.go); tests lower it.
	carryBatchBytes int
	// opsMu and ops track the multi-step changes under way (ingests,
	// upserts, copies, switches, drops): Close cancels closeCtx, which
	// they run under, and waits for them before it closes Pebble, and
	// none starts once closed is set (enter).
	opsMu       sync.Mutex
	ops         sync.WaitGroup
	closeCtx    context.Context
	closeCancel context.CancelFunc
	// testHook, if set, is called at named points of multi-step changes
	// (the crash tests stop the world there).
	testHook func(point string)
	cat      *catalog
	view     atomic.Pointer[view]
	// updSeq counts acknowledged upserts: a lookup admits rows it read
	// from Pebble only if none was acknowledged since it began reading.
	updSeq atomic.Uint64
	// missPoint and missParallel are Options.MissReads and MissParallel,
	// changeable while serving (SetMissReads).
	missPoint    atomic.Bool
	missParallel atomic.Int32
	m            counters
	scratch      sync.Pool
	// preMu serialises preloads and guards pre, their summed report.
	// raMu guards raScans, the scans that want readahead on
	// (scanReadahead).
	preMu   sync.Mutex
	raMu    sync.Mutex
	raScans int
	pre     PreloadReport
	warm    warmState
	closed  atomic.Bool
	// checkpointing is set while a Checkpoint is open (one at a time);
	// checkpointN numbers their folders. swapped is what Open's swap of
	// a staged copy did (snapshot.go).
	checkpointing atomic.Bool
	checkpointN   int
	swapped       SwapReport
}

// view is what readers see: an immutable snapshot of the active versions.
type view struct {
	models map[string]*modelView
	tier   *hot.Tier
	// dims is the tier's width codes (hot.Class.Width), ascending;
	// packed: float16 and int8 tables' rows are held in their stored
	// form (hot.HalfWidth, hot.Int8Width).
	dims   []int
	packed bool
	// active is the physical tables of the active versions.
	active map[uint32]bool
}

type modelView struct {
	name    string
	version int
	tables  map[string]*tableView
}

type tableView struct {
	name    string
	id      uint32
	rows    int64
	dim     int
	dtype   DType
	unknown plan.UnknownIDs
	hot     *hot.Class
	lo, hi  []byte
	// part is the rows held of a row-wise sharded table (nil: all).
	part *RowPart
	// sha256 is the content hash of the rows ingested (physTable.SHA256).
	sha256 string
}

// pebbleOptionsHook, when set (tests), adjusts the Pebble options Open
// opens with.
var pebbleOptionsHook func(*pebble.Options)

// Open opens (creating if needed) the store in dir.
func Open(dir string, o *Options) (*Store, error) {
	var opts Options
	if o != nil {
		opts = *o
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("open store %q: %w", dir, err)
	}
	// Pebble reserves its memtables' size against the block cache's (the
	// active one and the one it keeps to recycle): with a 64 MiB memtable
	// grown full (a burst of upserts, a warm restart's snapshot) a 32 MiB
	// cache caches nothing, and every seek reads its SST's index block
	// from the device again (BENCHMARKS: a larger-than-memory worker read
	// two blocks per missed row). Sized CacheBytes + 2 x MemTableBytes,
	// the cache keeps CacheBytes for blocks with both reserved; the
	// memory budget counts both memtables (Budget.MemTable).
	cache := pebble.NewCache(opts.CacheBytes + 2*int64(opts.MemTableBytes))
	defer cache.Unref()
	po := &pebble.Options{
		FS:                 diskfull.Wait(opts.FS, dir, "store", opts.MemTableBytes, opts.Logger.Errorf),
		Cache:              cache,
		MemTableSize:       opts.MemTableBytes,
		Logger:             fatalExits{opts.Logger},
		ReadOnly:           opts.ReadOnly,
		FormatMajorVersion: pebble.FormatNewest,
	}
	// A read that finds a damaged block (bit rot, a torn or truncated
	// table file) fails with the error, which names the file
	// (explainCorrupt), and the rest of the store goes on serving.
	// Pebble's default for it is the Logger's Fatalf, which fatalExits
	// makes the end of the process: every restart read the damaged block
	// again (Open's scan, the preload) and the worker never served.
	corruptions, damaged := new(atomic.Int64), new(atomic.Pointer[string])
	// The served tables a damaged file holds rows of, by name, from the
	// published view (no lock: the report comes on a reading goroutine);
	// none before the store's first view.
	var opened atomic.Pointer[Store]
	names := func(lo, hi uint32) string {
		if s := opened.Load(); s != nil {
			return s.servedTables(lo, hi)
		}
		return ""
	}
	reportDamage := reportCorruption(dir, opts.Logger, corruptions, damaged, opts.OnDamage, names)
	po.EventListener = &pebble.EventListener{DataCorruption: reportDamage}
	directReads := new(atomic.Int64)
	if opts.DropBehind {
		po.FS = dropBehindFS{FS: po.FS, direct: opts.DirectReads, reads: directReads}
		// Speculative readahead (Pebble's, when an iterator reads
		// consecutive blocks, as a sorted miss pass can) would bring in
		// pages no lookup asked for, which drop-behind never sees.
		// Preload's sequential scans turn it back on while they run
		// (scanReadahead).
		po.Local.ReadaheadConfig = objstorageprovider.NewReadaheadConfig()
		po.Local.ReadaheadConfig.Set(objstorageprovider.FadviseSequential, objstorageprovider.NoReadahead)
	}
	po.EnsureDefaults()
	for i := range po.Levels {
		// Embedding values are dense floats: compression costs CPU and
		// saves next to nothing.
		po.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
		po.Levels[i].BlockSize = 4 << 10
	}
	if pebbleOptionsHook != nil {
		pebbleOptionsHook(po)
	}
	var swapped SwapReport
	var lock *pebble.Lock
	if _, err := opts.FS.Stat(dir); err == nil && !opts.ReadOnly {
		// The folder's lock is taken here and handed to Pebble, so a
		// copy prism store copy staged while the store was in use is
		// swapped in (before the check for a store: a swap cut short
		// leaves none) with no other process between the swap and
		// this open.
		if lock, err = pebble.LockDirectory(dir, opts.FS); err != nil {
			return nil, fmt.Errorf("open store %q: %w", dir, inuse.Explain(err))
		}
		if swapped, err = swapStaged(opts.FS, dir, swapStamp()); err != nil {
			lock.Close()
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
		if err := pebblecheck.Check(opts.FS, dir); err != nil {
			lock.Close()
			return nil, damagedFiles(dir, err)
		}
		po.Lock = lock
	} else if err == nil {
		// Read-only (prism store copy's look at a received copy, which
		// decides whether it is taken): Pebble deletes nothing then, but
		// it would open a store missing its marker as none and one with
		// a damaged MANIFEST as of the damage, its later tables, models
		// and updates missing, nothing said.
		if err := pebblecheck.Check(opts.FS, dir); err != nil {
			return nil, damagedFiles(dir, err)
		}
	}
	if opts.MustExist {
		// Before Open, which would make the folder and its LOCK file
		// whatever it then finds.
		desc, err := pebble.Peek(dir, po.FS)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			if lock != nil {
				lock.Close()
			}
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
		if err != nil || !desc.Exists {
			if lock != nil {
				lock.Close()
			}
			return nil, fmt.Errorf("open store %q: no store there (prism ingest makes one)", dir)
		}
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, fmt.Errorf("open store %q: %w%s", dir, inuse.Explain(err), damagedHint(err))
	}
	cat, err := loadCatalog(db)
	if err == nil && len(cat.Models) == 0 && len(cat.Tables) == 0 {
		err = notUpdateLog(db)
	}
	if err != nil {
		db.Close()
		if lock != nil {
			lock.Close()
		}
		return nil, fmt.Errorf("open store %q: %w", dir, explainCorrupt(err))
	}
	s := &Store{opts: opts, dir: dir, db: db, lock: lock, popts: po, cat: cat, carryBatchBytes: carryBatchBytes, swapped: swapped}
	s.m.directReads = directReads
	s.m.corruptions = corruptions
	s.damaged = damaged
	s.reportDamage = reportDamage
	opened.Store(s)
	s.closeCtx, s.closeCancel = context.WithCancel(context.Background())
	s.scratch.New = func() any { return new(scratch) }
	s.missPoint.Store(opts.MissReads == MissPoint)
	s.missParallel.Store(int32(opts.MissParallel))
	s.publish(cat)
	if !opts.ReadOnly {
		_ = opts.FS.RemoveAll(opts.FS.PathJoin(dir, stagingDir))
		removeCheckpoints(opts.FS, dir)
		if err := s.dropCopies(); err != nil {
			s.Close()
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
		if err := s.dropUnreachable(); err != nil {
			s.Close()
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
	}
	// A tier that cannot hold every row, with a warm restart's snapshot
	// to restore, is preloaded after the restore (startWarm): preloaded
	// first, it would be full of rows in key order, and the restore would
	// find no free slot for the snapshot's hottest rows.
	afterWarm := false
	if opts.WarmRestart && opts.Preload == PreloadOn && !s.view.Load().tier.Complete() {
		saved, _, err := s.savedHotSnapshots()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
		afterWarm = saved
	}
	if !afterWarm {
		if err := s.Preload(context.Background()); err != nil {
			s.Close()
			return nil, fmt.Errorf("open store %q: %w", dir, err)
		}
	}
	s.startWarm(afterWarm)
	return s, nil
}

// damagedFiles is Open's error for the damage pebblecheck found in
// store folder dir: with the mend, unless the damage is to settings
// only (the error says what to do then).
func damagedFiles(dir string, err error) error {
	if errors.Is(err, pebblecheck.ErrSettingsOnly) {
		return fmt.Errorf("open store %q: %w", dir, err)
	}
	return fmt.Errorf("open store %q: %w; the store was not opened. Replace it with a copy of a serving worker's (prism store copy), or move its files away and ingest the plans again", dir, err)
}

// servedTables names the tables of the published view whose physical
// table is in [lo, hi] ("MODEL/TABLE", sorted), "" when none.
func (s *Store) servedTables(lo, hi uint32) string {
	v := s.view.Load()
	if v == nil {
		return ""
	}
	var out []string
	for _, m := range v.models {
		for _, t := range m.tables {
			if t.id >= lo && t.id <= hi {
				out = append(out, m.name+"/"+t.name)
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// FileTables names the tables whose rows table file name (a file of
// the store's folder, "000123.sst") holds: "physical tables LO to HI"
// (or "physical table N"), then the served ones ("MODEL/TABLE"), as
// the damage log line does; "" when the store does not list the file.
func (s *Store) FileTables(name string) string {
	levels, err := s.db.SSTables()
	if err != nil {
		return ""
	}
	for _, level := range levels {
		for _, t := range level {
			if fmt.Sprintf("%s.sst", t.BackingSSTNum) != name {
				continue
			}
			lo, hi := t.Smallest.UserKey, t.Largest.UserKey
			if len(lo) < 4 || len(hi) < 4 {
				return ""
			}
			return tablesOf(binary.BigEndian.Uint32(lo), binary.BigEndian.Uint32(hi), s.servedTables)
		}
	}
	return ""
}

// Damaged is the first file of the store a read of this process found
// damaged (a block whose checksum does not match), "" when none: its
// rows cannot be read here until the store is replaced.
func (s *Store) Damaged() string {
	if p := s.damaged.Load(); p != nil {
		return *p
	}
	return ""
}

// damagedHint is what to do about a store Pebble refused to open for a
// file that is damaged, cut short or missing (a table file of another
// size than its MANIFEST records, one it names that is not there): no
// part of such a store is served, so it is replaced.
func damagedHint(err error) string {
	if !pebble.IsCorruptionError(err) && !errors.Is(err, fs.ErrNotExist) && !strings.Contains(err.Error(), "object size mismatch") {
		return ""
	}
	return " (the store's files are damaged or incomplete: replace the store with a copy of a serving worker's, prism store copy, or ingest the plans into a new --db)"
}

// Close closes the store; lookups after Close fail with ErrClosed. A
// change under way (an ingest, a table copy, a version switch) is
// cancelled where it can stop safely and waited for; it fails with
// ErrClosed or completes.
func (s *Store) Close() error {
	s.opsMu.Lock()
	if s.closed.Swap(true) {
		s.opsMu.Unlock()
		return nil
	}
	s.opsMu.Unlock()
	s.closeCancel()
	s.ops.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.saveHot(); err != nil {
		// Only the next start's warmth is lost; the rows are all in Pebble.
		s.opts.Logger.Errorf("close store %q: saving the hot tier's snapshot: %v", s.dir, err)
	}
	err := s.db.Close()
	if s.lock != nil {
		// Taken by Open and handed to Pebble, which leaves it held.
		if lerr := s.lock.Close(); err == nil {
			err = lerr
		}
	}
	if err != nil {
		return fmt.Errorf("close store %q: %w", s.dir, err)
	}
	return nil
}

// enter registers a change that Close must wait for; it fails with
// ErrClosed once Close began. The caller calls s.ops.Done when done.
func (s *Store) enter() error {
	s.opsMu.Lock()
	defer s.opsMu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	s.ops.Add(1)
	return nil
}

// opContext is ctx, cancelled also when the store closes.
func (s *Store) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closeCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// closedErr is err, marked ErrClosed if the store closed meanwhile (a
// change that Close cancelled).
func (s *Store) closedErr(err error) error {
	if err != nil && s.closed.Load() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// hotBudget is the hot tier's bytes under the options and catalog for
// active tables of weight (float32 bytes per row width).
func (s *Store) hotBudget(cat *catalog, weight map[int]int64) int64 {
	b := s.hotBudgetUncapped(cat, weight)
	if m := s.opts.HotBytesMax; m > 0 && b > m {
		return m
	}
	return b
}

func (s *Store) hotBudgetUncapped(cat *catalog, weight map[int]int64) int64 {
	if s.opts.HotBytes == 0 && s.opts.HotBytesAutoMax > 0 && len(weight) > 0 {
		if full := hot.FullBytes(weight); full <= s.opts.HotBytesAutoMax {
			return full
		}
	}
	switch {
	case s.opts.HotBytes < 0:
		return 0
	case s.opts.HotBytes > 0:
		return s.opts.HotBytes
	case cat.HotBytes > 0:
		return cat.HotBytes
	}
	return DefaultHotBytes
}

// publish builds the readers' view of cat. The hot tier is kept while
// the set of row widths it serves stays the same, and rebuilt (cold)
// otherwise. Caller holds catMu, or is Open.
func (s *Store) publish(cat *catalog) {
	s.cat = cat
	// Rows of float16 and int8 tables are held in their stored form
	// (halves; a scale and int8s) when the tier cannot hold every row as
	// float32: 1.6x and 2.5x the dim-64 rows of a hashed class in the
	// same bytes, the same floats a read from the store gives. When it can, as float32 (a hit
	// is then a copy, not a conversion).
	weightOf := func(packed bool) (map[int]int64, map[uint32]bool) {
		weight := map[int]int64{}
		active := map[uint32]bool{}
		for _, m := range cat.Models {
			v := m.Versions[m.Active]
			if v == nil {
				continue
			}
			for _, vt := range v.Tables {
				if t := cat.Tables[vt.Phys]; t != nil && !active[t.ID] {
					active[t.ID] = true // a shared table weighs once
					weight[t.width(packed)] += t.held() * int64(t.Dim) * 4
				}
			}
		}
		return weight, active
	}
	weight, active := weightOf(false)
	budget := s.hotBudget(cat, weight)
	packed := false
	if pw, _ := weightOf(true); budget < hot.FullBytes(weight) && !maps.Equal(pw, weight) {
		packed, weight = true, pw
		budget = s.hotBudget(cat, weight)
	}
	dims := slices.Sorted(maps.Keys(weight))
	old := s.view.Load()
	var tier *hot.Tier
	// A complete tier is rebuilt when the active tables change (it holds
	// exactly their rows; the old version's would crowd the new one out),
	// and the caller preloads the new one.
	if old != nil && slices.Equal(old.dims, dims) && old.tier.Budget() == budget &&
		!(old.tier.Complete() && !maps.Equal(old.active, active)) {
		tier = old.tier
	} else {
		tier = hot.NewTier(budget, weight)
	}
	nv := &view{models: map[string]*modelView{}, tier: tier, dims: dims, active: active, packed: packed}
	for name, m := range cat.Models {
		v := m.Versions[m.Active]
		if v == nil {
			continue
		}
		mv := &modelView{name: name, version: v.N, tables: map[string]*tableView{}}
		for tn, vt := range v.Tables {
			t := cat.Tables[vt.Phys]
			if t == nil || t.State != stateReady {
				continue // never serve a table that is not fully ingested
			}
			lo, hi := tableBounds(t.ID)
			if c := tier.Class(t.width(packed)); c != nil {
				c.Lock()
				if p := t.Part; p != nil {
					c.AttachPart(t.ID, t.Rows, p.Mod, p.Rem)
				} else {
					c.Attach(t.ID, t.Rows)
				}
				c.Unlock()
			}
			mv.tables[tn] = &tableView{name: tn, id: t.ID, rows: t.Rows, dim: t.Dim, dtype: t.DType, unknown: vt.UnknownIDs, hot: tier.Class(t.width(packed)), lo: lo, hi: hi, part: t.Part, sha256: t.SHA256}
		}
		nv.models[name] = mv
	}
	if old != nil && old.tier != tier {
		// Swapping the tier must wait for readers of the old one (see mu).
		s.mu.Lock()
		s.view.Store(nv)
		s.mu.Unlock()
		return
	}
	s.view.Store(nv)
}

// commit saves next as the catalog and publishes it. Caller holds catMu.
func (s *Store) commit(next *catalog) error {
	if err := next.save(s.db); err != nil {
		return err
	}
	s.publish(next)
	return nil
}

// TableInfo describes a table of a model's active version.
type TableInfo struct {
	Name       string
	Rows       int64
	Dim        int
	DType      DType
	UnknownIDs plan.UnknownIDs
	// Phys is the physical table id; tables of two models with equal
	// Phys share one copy.
	Phys uint32
	// Part is the rows held of a row-wise sharded table (nil: all).
	Part *RowPart
	// SHA256 is the content hash of the table ingested (plan.Table's
	// sha256), which its updates do not change: it tells which plan's
	// tables a version holds.
	SHA256 string
}

// Tables lists the tables of model's active version, by name.
func (s *Store) Tables(model string) ([]TableInfo, error) {
	mv, err := s.model(model)
	if err != nil {
		return nil, err
	}
	out := make([]TableInfo, 0, len(mv.tables))
	for _, t := range mv.tables {
		out = append(out, TableInfo{Name: t.name, Rows: t.rows, Dim: t.dim, DType: t.dtype, UnknownIDs: t.unknown, Phys: t.id, Part: t.part, SHA256: t.sha256})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Models lists the models with an active version.
func (s *Store) Models() []string {
	return slices.Sorted(maps.Keys(s.view.Load().models))
}

func (s *Store) model(name string) (*modelView, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	mv := s.view.Load().models[name]
	if mv == nil {
		return nil, fmt.Errorf("model %q: %w", name, ErrUnknownModel)
	}
	return mv, nil
}

// VersionInfo describes one version of a model.
type VersionInfo struct {
	N        int
	Active   bool
	Previous bool // the version Rollback returns to
	Plan     string
	Created  string
	Tables   int
	// Shard is the shard of the plan's sharding the version holds (nil:
	// the whole model).
	Shard *ShardRef
}

// ActiveVersion is the version of model the store serves (0: none),
// read from the published view, without the catalog's lock: catalog
// changes and upserts hold that lock through their synced writes, so a
// lookup answering with its version, or a heartbeat announcing it,
// waited out every write under way (an upsert of a million rows: seconds).
func (s *Store) ActiveVersion(model string) int {
	if mv := s.view.Load().models[model]; mv != nil {
		return mv.version
	}
	return 0
}

// Versions lists model's versions, oldest first.
func (s *Store) Versions(model string) ([]VersionInfo, error) {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	m := s.cat.Models[model]
	if m == nil {
		return nil, fmt.Errorf("model %q: %w", model, ErrUnknownModel)
	}
	var out []VersionInfo
	for _, n := range slices.Sorted(maps.Keys(m.Versions)) {
		v := m.Versions[n]
		vi := VersionInfo{N: n, Active: n == m.Active, Previous: n == m.Previous, Plan: v.Plan, Created: v.Created, Tables: len(v.Tables)}
		if v.Shard != nil {
			ref := *v.Shard
			vi.Shard = &ref
		}
		out = append(out, vi)
	}
	return out, nil
}

// Activate makes version n of model the one lookups read, atomically: a
// lookup sees either the old version's tables or the new one's, never a
// mix. The model's updates are carried into the new version's tables in
// the same atomic step (carry.go), so AppliedSeq still tells what it
// serves. The version it replaces stays, and Rollback returns to it.
func (s *Store) Activate(model string, n int) error {
	if err := s.activate(model, n); err != nil {
		return err
	}
	return s.Preload(context.Background())
}

// Rollback switches model back to the version the last Activate replaced.
func (s *Store) Rollback(model string) error {
	s.catMu.Lock()
	prev := 0
	if m := s.cat.Models[model]; m != nil {
		prev = m.Previous
	}
	s.catMu.Unlock()
	if prev == 0 {
		return fmt.Errorf("rollback %q: no previous version: %w", model, ErrUnknownVersion)
	}
	return s.Activate(model, prev)
}

// DropVersion deletes version n of model (not the active one) and the
// rows of every table no other version names.
func (s *Store) DropVersion(ctx context.Context, model string, n int) error {
	if err := s.dropVersion(ctx, model, n); err != nil {
		return err
	}
	return s.Preload(ctx)
}

func (s *Store) dropVersion(ctx context.Context, model string, n int) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.ops.Done()
	s.catMu.Lock()
	defer s.catMu.Unlock()
	m := s.cat.Models[model]
	if m == nil {
		return fmt.Errorf("drop %q version %d: %w", model, n, ErrUnknownModel)
	}
	if m.Versions[n] == nil {
		return fmt.Errorf("drop %q version %d: %w", model, n, ErrUnknownVersion)
	}
	if m.Active == n {
		return badRequestf("drop %q version %d: it is active (activate another first)", model, n)
	}
	next := s.cat.clone()
	nm := next.Models[model]
	delete(nm.Versions, n)
	if nm.Previous == n {
		nm.Previous = 0
	}
	// The overlay of a table name no version names any more can never be
	// carried again (the active version names every table an upsert can
	// write): delete it, and a dropped model's whole overlay and seq.
	var prune []overlayPrune
	if len(nm.Versions) == 0 {
		delete(next.Models, model)
		prune = append(prune, overlayPrune{model: model, whole: true})
	} else {
		names := map[string]bool{}
		for _, v := range nm.Versions {
			for tn := range v.Tables {
				names[tn] = true
			}
		}
		for _, tn := range slices.Sorted(maps.Keys(m.Versions[n].Tables)) {
			if !names[tn] {
				prune = append(prune, overlayPrune{model: model, table: tn})
			}
		}
	}
	return s.gc(ctx, next, prune)
}

// overlayPrune names overlay keys to delete: those of model's table, or
// (whole) all of model's and its update seq.
type overlayPrune struct {
	model, table string
	whole        bool
}

// gc commits next after deleting the tables no version names (nor the
// ingest under way claimed): ready ones, and copies (state copying) that
// no copy in progress is writing, which an error path left behind. The overlay keys of prune go in the
// catalog's batch. Caller holds catMu.
func (s *Store) gc(ctx context.Context, next *catalog, prune []overlayPrune) error {
	ref := next.referenced()
	var drop []uint32
	for id, t := range next.Tables {
		if ref[id] || s.claimed[id] {
			continue
		}
		if t.State == stateReady || (t.State == stateCopying && id != s.copyDst) {
			drop = append(drop, id)
			delete(next.Tables, id)
		}
	}
	// The catalog forgets the tables first: a crash after this leaves
	// unreachable rows (which Open deletes, dropUnreachable), never a
	// served table without rows.
	if err := s.commitPruning(next, prune); err != nil {
		return err
	}
	return s.deleteTables(ctx, drop)
}

// commitPruning is commit, deleting the overlay keys of prune in the same
// synced batch. Caller holds catMu.
func (s *Store) commitPruning(next *catalog, prune []overlayPrune) error {
	if len(prune) == 0 {
		return s.commit(next)
	}
	buf, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("write catalog: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, p := range prune {
		pre := overlayModelPrefix(p.model)
		if !p.whole {
			pre = overlayTablePrefix(p.model, p.table)
		} else if err := b.Delete(seqKey(p.model), nil); err != nil {
			return fmt.Errorf("write catalog: %w", err)
		} else if err := b.Delete(divergedKey(p.model), nil); err != nil {
			return fmt.Errorf("write catalog: %w", err)
		}
		if err := b.DeleteRange(pre, prefixEnd(pre), nil); err != nil {
			return fmt.Errorf("write catalog: %w", err)
		}
	}
	if err := b.Set(catalogKey, buf, nil); err != nil {
		return fmt.Errorf("write catalog: %w", err)
	}
	s.updMu.Lock() // the seq cache
	defer s.updMu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.db.Apply(b, pebble.Sync); err != nil {
		return fmt.Errorf("write catalog: %w", err)
	}
	for _, p := range prune {
		if p.whole {
			s.dropSeqLocked(p.model)
			s.unmarkDivergedLocked(p.model)
		}
	}
	s.publish(next)
	return nil
}

// dropUnreachable deletes the rows of tables the catalog does not name
// (Open): a change commits the catalog that forgets tables (gc, an
// abandoned ingest) before it deletes their rows, and a crash in between
// leaves them, which nothing else would ever delete (a table id is not
// used again). One seek a table.
func (s *Store) dropUnreachable() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{0, 0, 0, 1}})
	if err != nil {
		return err
	}
	var drop []uint32
	for ok := it.First(); ok; {
		if len(it.Key()) < 4 {
			ok = it.Next() // no key of this store's
			continue
		}
		id := binary.BigEndian.Uint32(it.Key())
		if s.cat.Tables[id] == nil {
			drop = append(drop, id)
		}
		if id == math.MaxUint32 {
			break
		}
		_, hi := tableBounds(id)
		ok = it.SeekGE(hi)
	}
	if err := it.Close(); err != nil {
		if !pebble.IsCorruptionError(err) {
			return err
		}
		// Housekeeping: the damaged file is named in the log and
		// refused to the lookups of its rows; the store serves the rest.
		s.opts.Logger.Errorf("store %q: looking for rows of forgotten tables: %v; the tables after it were not looked at", s.dir, explainCorrupt(err))
	}
	return s.deleteTables(context.Background(), drop)
}

func (s *Store) deleteTables(ctx context.Context, ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	s.mu.Lock()
	tier := s.view.Load().tier
	for _, id := range ids {
		for _, d := range s.view.Load().dims {
			if c := tier.Class(d); c != nil {
				c.Lock()
				c.DeleteTable(id)
				c.Unlock()
			}
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		lo, hi := tableBounds(id)
		if err := s.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
			return fmt.Errorf("delete table %d: %w", id, err)
		}
	}
	// The tombstones free no disk while they sit in the memtable, which
	// only fills with upserts: a dropped version's files stayed until the
	// store was next opened (prism store versions --drop, run to free
	// disk, freed none). Compacting the ranges flushes the tombstones and
	// drops the files they cover (Pebble deletes them moments later, or
	// at Close). Stopped by ctx, the rows are deleted all the same and
	// the disk comes back at the next Open at the latest.
	for _, id := range ids {
		lo, hi := tableBounds(id)
		if err := s.db.Compact(ctx, lo, hi, true); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("delete table %d: reclaim its disk: %w", id, err)
		}
	}
	return nil
}

func now() string { return time.Now().UTC().Format(time.RFC3339) }
