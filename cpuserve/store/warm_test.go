package store

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// skewedLookups looks up batches of n skewed ids (u^4 of the rows: a
// head read often, a long tail) in every table, checks each row against
// the tables' data, and returns the share of rows the hot tier served.
func skewedLookups(t *testing.T, s *Store, tabs []*testTable, r *rand.Rand, batches, n int) float64 {
	t.Helper()
	before := s.Metrics()
	for range batches {
		var reqs []TableLookup
		for _, tt := range tabs {
			ids := make([]int64, n)
			for i := range ids {
				ids[i] = int64(math.Pow(r.Float64(), 4) * float64(tt.rows))
			}
			reqs = append(reqs, TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, n*tt.dim)})
		}
		if err := s.Lookup("m", reqs); err != nil {
			t.Fatal(err)
		}
		for ti, tt := range tabs {
			for i, id := range reqs[ti].IDs {
				got := reqs[ti].Out[i*tt.dim : (i+1)*tt.dim]
				if want := tt.data[id*int64(tt.dim) : (id+1)*int64(tt.dim)]; !slices.Equal(got, want) {
					t.Fatalf("table %s row %d = %v, want %v", tt.name, id, got, want)
				}
			}
		}
	}
	m := s.Metrics()
	hits, misses := m.HotHits-before.HotHits, m.HotMisses-before.HotMisses
	return float64(hits) / float64(hits+misses)
}

// resident is the hot tier's resident keys of width dim, ascending.
func resident(s *Store, dim int) []uint64 {
	c := s.view.Load().tier.Class(dim)
	c.RLock()
	snap := c.Snapshot()
	c.RUnlock()
	snap.SortKeys()
	return snap.Keys
}

func waitWarm(t *testing.T, s *Store) WarmReport {
	t.Helper()
	_, done := s.Warmed()
	<-done
	rep, _ := s.Warmed()
	return rep
}

// TestWarmRestart: a store closed with a partly filled hot tier reopens
// with the same rows resident (read back from Pebble, so an update made
// before the restart is what the tier holds), its sketch restored, and a
// hit ratio near the one it had, where a cold reopen starts from none.
func TestWarmRestart(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 30000, dim: 8, seed: 1}, {name: "b", rows: 20000, dim: 8, seed: 2}, {name: "c", rows: 10000, dim: 16, seed: 3}}
	plan := writePlan(t, "m", tabs)
	opts := func(hotBytes int64, warm bool) *Options {
		return &Options{HotBytes: hotBytes, Preload: PreloadOff, WarmRestart: warm}
	}
	s, fs := openMem(t, opts(512<<10, true))
	if _, err := s.Ingest(ctx, plan, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	skewedLookups(t, s, tabs, r, 60, 256)
	warmHit := skewedLookups(t, s, tabs, r, 20, 256)
	want8, want16 := resident(s, 8), resident(s, 16)
	if len(want8) == 0 || len(want16) == 0 {
		t.Fatal("nothing resident before the restart")
	}
	// An update to a resident row after the tier read it: the restart
	// must read the row as it is now.
	upd := want8[len(want8)/2]
	tn, id := "", int64(upd&(hot.MaxRows-1))
	for name, tv := range s.view.Load().models["m"].tables {
		if tv.id == uint32(upd>>40) {
			tn = name
		}
	}
	row := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	if err := s.Upsert("m", tn, []int64{id}, row); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tabs {
		if tt.name == tn {
			copy(tt.data[id*8:], row)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	reopen := func(o *Options) *Store {
		o.FS = fs
		s, err := Open("db", o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s2 := reopen(opts(512<<10, true))
	rep := waitWarm(t, s2)
	if !rep.Done || rep.Err != nil || rep.Keys != int64(len(want8)+len(want16)) || rep.Rows != rep.Keys || rep.Sketches != 2 {
		t.Fatalf("warm report %+v, want %d keys restored, 2 sketches", rep, len(want8)+len(want16))
	}
	if got := resident(s2, 8); !slices.Equal(got, want8) {
		t.Fatalf("width 8: %d keys resident after the restart, want the %d before", len(got), len(want8))
	}
	if got := resident(s2, 16); !slices.Equal(got, want16) {
		t.Fatalf("width 16: %d keys resident after the restart, want the %d before", len(got), len(want16))
	}
	if got := lookupRow(t, s2, "m", tn, id, 8); !slices.Equal(got, row) {
		t.Fatalf("updated row %s/%d restored as %v, want %v", tn, id, got, row)
	}
	hitWarm := skewedLookups(t, s2, tabs, r, 5, 256)
	s2.Close()

	s3 := reopen(opts(512<<10, false)) // cold, and its Close drops the snapshots
	hitCold := skewedLookups(t, s3, tabs, r, 5, 256)
	if rep, _ := s3.Warmed(); rep.Keys != 0 || !rep.Done {
		t.Fatalf("cold open restored %+v", rep)
	}
	s3.Close()
	s3 = reopen(opts(512<<10, true))
	if rep := waitWarm(t, s3); rep.Keys != 0 || rep.Err != nil {
		t.Fatalf("a snapshot outlived a Close without WarmRestart: %+v", rep)
	}
	skewedLookups(t, s3, tabs, r, 60, 256) // warm it again for s4's snapshot
	s3.Close()
	t.Logf("hit ratio: %.3f before the restart, %.3f after a warm one, %.3f after a cold one", warmHit, hitWarm, hitCold)
	if hitWarm < warmHit-0.05 || hitCold > hitWarm-0.2 {
		t.Fatalf("hit ratio after a warm restart %.3f (before %.3f), after a cold one %.3f", hitWarm, warmHit, hitCold)
	}

	// A smaller tier: no sketch restored (its size changed), and it fills
	// with the hottest keys the snapshot held, as many as it has slots.
	s4 := reopen(opts(128<<10, true))
	rep = waitWarm(t, s4)
	st := s4.Metrics()
	if !rep.Done || rep.Err != nil || rep.Sketches != 0 || rep.Rows != st.HotSlots || rep.Rows != rep.Keys {
		t.Fatalf("smaller tier: report %+v, %d slots", rep, st.HotSlots)
	}
	snap, ok, err := s4.readHotSnapshot(8)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	held := resident(s4, 8)
	for _, k := range snap.Hottest()[:10] {
		if _, found := slices.BinarySearch(held, k); !found {
			t.Fatalf("smaller tier: hot key %x of the snapshot not restored", k)
		}
	}
	skewedLookups(t, s4, tabs, r, 2, 256)
	s4.Close()

	// A corrupt snapshot (width 8's) costs the restart that width's
	// warmth, nothing else (width 16's, s4's, is restored), and
	// the next Close writes a good one.
	db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	// Every part of every generation of width 8's snapshot garbled.
	it, _ := db.NewIter(&pebble.IterOptions{LowerBound: hotSnapKey(8), UpperBound: prefixEnd(hotSnapKey(8))})
	var keys8 [][]byte
	for ok := it.First(); ok; ok = it.Next() {
		keys8 = append(keys8, slices.Clone(it.Key()))
	}
	it.Close()
	if len(keys8) == 0 {
		t.Fatal("no snapshot of width 8 to garble")
	}
	for _, k := range keys8 {
		if err := db.Set(k, []byte("PHS1 not a snapshot"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s5 := reopen(opts(512<<10, true))
	rep = waitWarm(t, s5)
	if !errors.Is(rep.Err, hot.ErrSnapshot) || !rep.Done || rep.Keys == 0 || rep.Rows != rep.Keys {
		t.Fatalf("corrupt snapshot: report %+v", rep)
	}
	skewedLookups(t, s5, tabs, r, 5, 256)
	s5.Close()
	s6 := reopen(opts(512<<10, true))
	defer s6.Close()
	if rep := waitWarm(t, s6); rep.Err != nil || rep.Rows == 0 {
		t.Fatalf("after a corrupt snapshot was replaced: %+v", rep)
	}
}

// TestWarmSnapshotEvery: with WarmSnapshotEvery the snapshot is saved
// while serving, so a store that crashes (its file system cloned with
// only what was synced, no Close) restarts warm with the keys its tier
// held at the last save.
func TestWarmSnapshotEvery(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 30000, dim: 8, seed: 1}}
	fs := vfs.NewCrashableMem()
	o := &Options{FS: fs, HotBytes: 256 << 10, Preload: PreloadOff, WarmRestart: true, WarmSnapshotEvery: 20 * time.Millisecond}
	s, _ := openMem(t, o)
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(3, 4)), 40, 256)
	want := resident(s, 8)
	// Two saves after the lookups: the later one began after them.
	for n := s.warm.saves.Load() + 2; s.warm.saves.Load() < n; {
		time.Sleep(5 * time.Millisecond)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s2, err := Open("db", &Options{FS: crashed, HotBytes: 256 << 10, Preload: PreloadOff, WarmRestart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rep := waitWarm(t, s2)
	if rep.Err != nil || rep.Rows != int64(len(want)) || !slices.Equal(resident(s2, 8), want) {
		t.Fatalf("after a crash: %+v, %d keys resident, want the %d held at the last save", rep, len(resident(s2, 8)), len(want))
	}
}

// TestWarmRestartClosedMidway: a store closed while its restore runs
// keeps the snapshot it was restoring (its tier holds less), so the next
// Open restores all of it; and the worker serves while it restores.
func TestWarmRestartClosedMidway(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 60000, dim: 8, seed: 1}}
	o := func(fs vfs.FS) *Options {
		return &Options{FS: fs, HotBytes: 1 << 20, Preload: PreloadOff, WarmRestart: true}
	}
	s, fs := openMem(t, o(nil))
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(5, 6)), 60, 512)
	want := resident(s, 8)
	if len(want) <= warmChunk {
		t.Fatalf("%d keys resident: the restore needs more than one chunk", len(want))
	}
	s.Close()

	entered, release := make(chan struct{}, 1), make(chan struct{})
	warmChunkHook = func() {
		select {
		case entered <- struct{}{}:
			<-release // the first chunk waits for the test
		default:
		}
	}
	defer func() { warmChunkHook = nil }()
	s2, err := Open("db", o(fs))
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	// Lookups and the preload report do not wait for the restore.
	skewedLookups(t, s2, tabs, rand.New(rand.NewPCG(7, 8)), 1, 64)
	s2.Preloaded()
	closed := make(chan error)
	go func() { closed <- s2.Close() }()
	for !s2.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if rep, _ := s2.Warmed(); rep.Done || !errors.Is(rep.Err, context.Canceled) {
		t.Fatalf("restore stopped by Close: %+v", rep)
	}
	warmChunkHook = nil
	s3, err := Open("db", o(fs))
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if rep := waitWarm(t, s3); rep.Err != nil || rep.Keys != int64(len(want)) {
		t.Fatalf("after a restore cut short by Close: %+v, want the %d keys saved before", rep, len(want))
	}
}

// TestWarmRestoreReadError: a block read that fails during a restore ends
// it with that error (reported by Warmed), instead of counting the row as
// one the store does not hold: Pebble clears an iterator's error at its
// next seek, so a restore that went on would report success. A lookup
// whose miss read fails gets the read's error, not ErrCorrupt.
func TestWarmRestoreReadError(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 60000, dim: 8, seed: 1}}
	mem := vfs.NewMem()
	s, _ := openMem(t, &Options{FS: mem, HotBytes: 1 << 20, Preload: PreloadOff, WarmRestart: true})
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(5, 6)), 60, 512)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var armed, injected atomic.Int32
	var failAll atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileReadAt && strings.HasSuffix(op.Path, ".sst") && (failAll.Load() || armed.CompareAndSwap(1, 0)) {
			injected.Add(1)
			return errorfs.ErrInjected
		}
		return nil
	})
	var first atomic.Bool
	warmChunkHook = func() {
		if first.CompareAndSwap(false, true) {
			armed.Store(1) // one failed read in the first chunk
		}
	}
	defer func() { warmChunkHook = nil }()
	// Only the restore may read the table files while the fault is armed.
	// Pebble's table-stats collector reads each table's properties block
	// in the background after a reopen and could take the armed read
	// (Pebble then logged "background error: injected error" and the
	// restore succeeded); so could a compaction. Neither runs in this
	// store.
	pebbleOptionsHook = func(po *pebble.Options) {
		po.DisableTableStats = true
		po.DisableAutomaticCompactions = true
	}
	s2, err := Open("db", &Options{FS: errorfs.Wrap(mem, inj), HotBytes: 1 << 20, Preload: PreloadOff, WarmRestart: true, CacheBytes: 1 << 20})
	pebbleOptionsHook = nil
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rep := waitWarm(t, s2)
	if injected.Load() != 1 {
		t.Fatalf("%d reads failed, want 1", injected.Load())
	}
	if !errors.Is(rep.Err, errorfs.ErrInjected) || rep.Rows >= rep.Keys {
		t.Fatalf("a restore with a failed read: %+v", rep)
	}
	// The lookup path: a miss read that fails. Every table read fails
	// meanwhile, so the lookup's read fails whichever of its reads comes
	// first.
	failAll.Store(true)
	req := TableLookup{Table: "a", IDs: []int64{59999}, Pooling: PoolNone, Out: make([]float32, 8)}
	err = s2.Lookup("m", []TableLookup{req})
	failAll.Store(false)
	if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("a lookup whose read fails: %v", err)
	}
}

// TestLookupPhaseTimes: a lookup's wall time is counted whole and by
// phase (hot rows gathered, misses read, finished), and the phases fit
// in the whole.
func TestLookupPhaseTimes(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 5000, dim: 8, seed: 1}}
	s, _ := openMem(t, &Options{HotBytes: 64 << 10, Preload: PreloadOff})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(1, 1)), 20, 256)
	m := s.Metrics()
	if m.GatherNanos <= 0 || m.MissReadNanos <= 0 || m.FinishNanos <= 0 || m.GatherNanos+m.MissReadNanos+m.FinishNanos > m.LookupNanos {
		t.Fatalf("lookup %d ns: gather %d, miss read %d, finish %d", m.LookupNanos, m.GatherNanos, m.MissReadNanos, m.FinishNanos)
	}
}

// TestWarmRestartInParts: a snapshot larger than a part is saved in
// several parts (each its own batch) and restored whole; a save cut
// short (its last part missing) costs the restart its warmth and
// nothing else, and the next Close saves a whole one again.
func TestWarmRestartInParts(t *testing.T) {
	defer func(n int) { snapPartBytes = n }(snapPartBytes)
	snapPartBytes = 4 << 10
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 30000, dim: 8, seed: 1}}
	o := &Options{HotBytes: 512 << 10, Preload: PreloadOff, WarmRestart: true}
	s, fs := openMem(t, o)
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	skewedLookups(t, s, tabs, r, 60, 256)
	want := resident(s, 8)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The parts as saved.
	db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	var parts [][]byte
	it, _ := db.NewIter(&pebble.IterOptions{LowerBound: hotSnapKey(8), UpperBound: prefixEnd(hotSnapKey(8))})
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Value()) > snapPartBytes {
			t.Fatalf("a part of %d bytes", len(it.Value()))
		}
		parts = append(parts, slices.Clone(it.Key()))
	}
	it.Close()
	db.Close()
	if len(parts) < 3 {
		t.Fatalf("%d parts for %d keys in parts of %d bytes", len(parts), len(want), snapPartBytes)
	}
	o.FS = fs
	s2, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	if rep := waitWarm(t, s2); rep.Err != nil || rep.Rows != int64(len(want)) || rep.Sketches != 1 {
		t.Fatalf("restored from %d parts: %+v, want %d rows", len(parts), rep, len(want))
	}
	if got := resident(s2, 8); !slices.Equal(got, want) {
		t.Fatalf("%d keys resident after the restart, want the %d before", len(got), len(want))
	}
	s2.Close()

	// Cut short: the last part of the one generation saved (s2's) lost.
	db, err = pebble.Open("db", &pebble.Options{FS: fs, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	var last []byte
	it, _ = db.NewIter(&pebble.IterOptions{LowerBound: hotSnapKey(8), UpperBound: prefixEnd(hotSnapKey(8))})
	for ok := it.First(); ok; ok = it.Next() {
		last = slices.Clone(it.Key())
	}
	it.Close()
	if err := db.Delete(last, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s3, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	if rep := waitWarm(t, s3); !errors.Is(rep.Err, hot.ErrSnapshot) || rep.Rows != 0 {
		t.Fatalf("a snapshot missing its last part: %+v", rep)
	}
	skewedLookups(t, s3, tabs, r, 60, 256) // serves, and warms again
	s3.Close()
	s4, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	defer s4.Close()
	if rep := waitWarm(t, s4); rep.Err != nil || rep.Rows == 0 {
		t.Fatalf("after a save cut short was replaced: %+v", rep)
	}
}

// partsCtx is a context whose Err turns Canceled after n calls: a save
// that checks it before each part stops after n parts.
type partsCtx struct {
	context.Context
	n int
}

func (c *partsCtx) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// TestSnapshotSaveStopped: a save stopped between parts (a periodic save
// when Close begins; a process killed mid-save) returns Canceled and
// leaves the snapshot saved before it whole and read; the Close after it
// saves the tier whole, and only that one is left.
func TestSnapshotSaveStopped(t *testing.T) {
	defer func(n int) { snapPartBytes = n }(snapPartBytes)
	snapPartBytes = 4 << 10
	tabs := []*testTable{{name: "a", rows: 30000, dim: 8, seed: 1}}
	o := &Options{HotBytes: 512 << 10, Preload: PreloadOff, WarmRestart: true}
	s, fs := openMem(t, o)
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(3, 4)), 60, 256)
	if err := s.commitHotSnapshots(context.Background(), s.hotClasses(true)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.readHotSnapshot(8); !ok || err != nil {
		t.Fatalf("a whole save: found %v, %v", ok, err)
	}
	whole, _, _ := s.readHotSnapshot(8)
	// The tier changes, then a save of it stops after two parts: the
	// snapshot saved before is what is read (a restart would restore
	// it), not the new one cut short.
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(7, 8)), 20, 256)
	if err := s.commitHotSnapshots(&partsCtx{context.Background(), 2}, s.hotClasses(true)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a save stopped after two parts: %v", err)
	}
	if got, ok, err := s.readHotSnapshot(8); !ok || err != nil || !slices.Equal(got.Keys, whole.Keys) {
		t.Fatalf("after a save stopped after two parts: found %v, %v, %d keys; want the %d keys saved before", ok, err, len(got.Keys), len(whole.Keys))
	}
	skewedLookups(t, s, tabs, rand.New(rand.NewPCG(5, 6)), 20, 256)
	want := resident(s, 8)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	o.FS = fs
	s2, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if rep := waitWarm(t, s2); rep.Err != nil || rep.Rows != int64(len(want)) {
		t.Fatalf("restored after Close saved over a stopped save: %+v, want %d rows", rep, len(want))
	}
	gens := map[string]bool{}
	it, _ := s2.db.NewIter(&pebble.IterOptions{LowerBound: hotSnapKey(8), UpperBound: prefixEnd(hotSnapKey(8))})
	for ok := it.First(); ok; ok = it.Next() {
		gens[string(it.Key()[:len(hotSnapKey(8))+8])] = true
	}
	it.Close()
	if len(gens) != 1 {
		t.Fatalf("%d generations of the snapshot left after a whole save, want 1", len(gens))
	}
}

// BenchmarkSnapshotSave: one save of a full 320 MiB class of dim-64 rows
// (bench-ltm-e2e's tier, 1,034,778 keys) into a store on disk, as a
// periodic save makes it: encoding in 4 MiB parts, each its own batch,
// the last synced. Its time is what --warm-snapshot-every costs a
// worker per save.
func BenchmarkSnapshotSave(b *testing.B) {
	s, err := Open(b.TempDir(), &Options{HotBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := hot.NewClass(64, 320<<20)
	row := make([]float32, 64)
	c.Lock()
	for i := int64(0); !c.Full(); i++ {
		k := hot.Key(uint32(1+i%26), (i*2654435761)%1911047)
		c.Admit(k, hot.Hash(k), row)
	}
	c.Unlock()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	b.ResetTimer()
	for b.Loop() {
		if err := s.commitHotSnapshots(context.Background(), []*hot.Class{c}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.TotalAlloc-before)/float64(b.N)/(1<<20), "MiB-alloc/save")
	b.ReportMetric(float64(c.Used()), "keys")
}

// TestOldSnapshotLayouts: snapshots saved before generations still read:
// one value under hotSnapKey, or parts numbered right after it.
func TestOldSnapshotLayouts(t *testing.T) {
	c := hot.NewClass(8, 64<<10)
	c.Lock()
	for i := range int64(300) {
		k := hot.Key(1, i*7)
		c.Admit(k, hot.Hash(k), make([]float32, 8))
	}
	snap := c.Snapshot()
	c.Unlock()
	snap.SortKeys()
	enc, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, layout := range []string{"one value", "parts"} {
		s, _ := openMem(t, &Options{HotBytes: 64 << 10, Preload: PreloadOff})
		b := s.db.NewBatch()
		if layout == "one value" {
			b.Set(hotSnapKey(8), enc, nil)
		} else {
			half := len(enc) / 2
			b.Set(binary.BigEndian.AppendUint32(hotSnapKey(8), 0), enc[:half], nil)
			b.Set(binary.BigEndian.AppendUint32(hotSnapKey(8), 1), enc[half:], nil)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.readHotSnapshot(8)
		if !ok || err != nil || !slices.Equal(got.Keys, snap.Keys) {
			t.Fatalf("%s: found %v, %v, %d keys; want %d", layout, ok, err, len(got.Keys), len(snap.Keys))
		}
		s.Close()
	}
}

// TestWarmRestartPreloadOn: with Preload on, a tier that cannot hold
// every row gets the snapshot's rows back first and is then filled by
// the preload's scan; preloaded first, the tier was full of the tables'
// first rows in key order and the restore found no free slot for any.
func TestWarmRestartPreloadOn(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 30000, dim: 8, seed: 1}}
	plan := writePlan(t, "m", tabs)
	o := Options{HotBytes: 256 << 10, Preload: PreloadOff, WarmRestart: true}
	s, fs := openMem(t, &o)
	if _, err := s.Ingest(ctx, plan, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	// A hot set at the end of the table, where a scan comes last.
	r := rand.New(rand.NewPCG(4, 5))
	ids := make([]int64, 500)
	for i := range ids {
		ids[i] = 20000 + r.Int64N(10000)
	}
	for range 3 {
		if err := s.Lookup("m", []TableLookup{{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, len(ids)*8)}}); err != nil {
			t.Fatal(err)
		}
	}
	want := resident(s, 8)
	if len(want) == 0 {
		t.Fatal("nothing resident before the restart")
	}
	o.Preload = PreloadOn
	s = reopen(t, s, o, fs)
	rep := waitWarm(t, s)
	if !rep.Done || rep.Err != nil || rep.Keys != int64(len(want)) || rep.Rows != rep.Keys {
		t.Errorf("warm report %+v, want the %d keys saved restored", rep, len(want))
	}
	got := map[uint64]bool{}
	for _, k := range resident(s, 8) {
		got[k] = true
	}
	missing := 0
	for _, k := range want {
		if !got[k] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the %d keys resident before the restart are not after it", missing, len(want))
	}
	if c := s.view.Load().tier.Class(8); c.Used() != c.Slots() || s.Preloaded().Rows == 0 {
		t.Errorf("after the restore the preload filled %d of %d slots (%+v)", c.Used(), c.Slots(), s.Preloaded())
	}
	for _, id := range ids[:20] {
		if got := lookupRow(t, s, "m", "a", id, 8); !slices.Equal(got, tabs[0].data[id*8:(id+1)*8]) {
			t.Fatalf("row %d = %v", id, got)
		}
	}
}

// TestToolKeepsWarmSnapshot: a tool's store (prism store versions, prism
// ingest: no hot tier, no warm restart) opened between a worker's stop
// and its restart leaves the worker's snapshot, and a version switch
// keeps the rows of the tables both versions share. Its Close dropped
// the snapshot, so the restart after it was cold: after every
// `prism store versions --activate`, and after the init step that runs
// `prism store versions` before every embedding pod on Kubernetes.
func TestToolKeepsWarmSnapshot(t *testing.T) {
	ctx := context.Background()
	shared := &testTable{name: "a", rows: 20000, dim: 8, seed: 1}
	v1 := []*testTable{shared, {name: "b", rows: 20000, dim: 8, seed: 2}}
	v2 := []*testTable{shared, {name: "b", rows: 20000, dim: 8, seed: 3}}
	worker := func() *Options { return &Options{HotBytes: 256 << 10, Preload: PreloadOff, WarmRestart: true} }
	s, fs := openMem(t, worker())
	p1, p2 := writePlan(t, "m", v1), writePlan(t, "m", v2)
	for _, p := range []string{p1, p2} {
		if _, err := s.Ingest(ctx, p, IngestOptions{NoActivate: p == p2}); err != nil {
			t.Fatal(err)
		}
	}
	skewedLookups(t, s, v1, rand.New(rand.NewPCG(1, 2)), 40, 256)
	tabs, err := s.Tables("m")
	if err != nil {
		t.Fatal(err)
	}
	var sharedKeys int64
	for _, k := range resident(s, 8) {
		if uint32(k>>40) == tabs[0].Phys {
			sharedKeys++
		}
	}
	if sharedKeys == 0 {
		t.Fatal("no row of the shared table resident")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	open := func(o *Options) *Store {
		t.Helper()
		o.FS = fs
		s, err := Open("db", o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// prism store versions: list, then switch to version 2.
	for _, activate := range []bool{false, true} {
		tool := open(&Options{HotBytes: -1, MustExist: true})
		if _, err := tool.Versions("m"); err != nil {
			t.Fatal(err)
		}
		if activate {
			if err := tool.Activate("m", 2); err != nil {
				t.Fatal(err)
			}
		}
		if err := tool.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s2 := open(worker())
	defer s2.Close()
	if rep := waitWarm(t, s2); rep.Err != nil || rep.Keys != sharedKeys {
		t.Fatalf("restart after the tools: %+v, want the %d keys of the shared table restored", rep, sharedKeys)
	}
}
