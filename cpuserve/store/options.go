package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Options configure a Store. The zero value is usable after
// EnsureDefaults; Open calls it.
type Options struct {
	// FS is the file system the store lives on: vfs.Default on disk,
	// vfs.NewMem() or an errorfs wrapper in tests.
	FS vfs.FS
	// HotBytes bounds the hot tier (rows, index and sketch). 0 takes the
	// value recorded at ingest (IngestOptions.HotBytes), else DefaultHotBytes; a
	// negative value disables the hot tier.
	HotBytes int64
	// HotBytesAutoMax, when > 0 and HotBytes is 0, sizes the hot tier to
	// hold every row of the active tables (hot.FullBytes) if that needs at
	// most HotBytesAutoMax bytes; otherwise the recorded or default size.
	HotBytesAutoMax int64
	// HotBytesMax, when > 0, caps the hot tier whatever sized it (a
	// memory budget's share, Budget.HotMax): the recorded or default
	// size a store falls back to must not outgrow a small container.
	HotBytesMax int64
	// Preload fills the hot tier with every row of the active tables at
	// Open and after Ingest, Activate and DropVersion, by one sequential
	// scan per table, bypassing admission: PreloadAuto (the default) when
	// the tier holds them all, PreloadOn until the tier is full even if
	// they do not fit (a warm start), PreloadOff never.
	Preload PreloadMode
	// CacheBytes is Pebble's block cache, below the hot tier. When the
	// tables do not fit the hot tier, size it to hold the SSTs' index
	// blocks (Store.IndexBytes; there are no filter blocks: lookups seek,
	// and bloom filters serve only point reads) with room to spare, so a
	// miss costs one data block read and no index read; data blocks of
	// cold rows, each read once, gain little from more.
	CacheBytes int64
	// MissReads is how lookups read the rows the hot tier does not hold:
	// MissSorted (the default) or MissPoint (the baseline).
	MissReads MissReads
	// MissParallel is how many readers a lookup's sorted misses are
	// split among (DefaultMissParallel when 0; 1 reads them in the
	// caller's goroutine only).
	MissParallel int
	// MemTableBytes is Pebble's memtable size (online upserts land there).
	MemTableBytes uint64
	// NoSync skips the WAL sync of upserts: only for benchmarks and tests
	// that do not crash. An upsert is then not durable when acknowledged.
	NoSync bool
	// Logger receives Pebble's log; nil discards informational lines.
	// Its Fatalf ends the process even if it returns (fatalExits).
	Logger pebble.Logger
	// OnDamage, when set, is called (on a goroutine of Pebble's read)
	// with the path of each file of the store a read first found
	// damaged: an embedding worker mending itself (--mend) hears of it.
	OnDamage func(path string)
	// DropBehind drops the table files' pages from the kernel's page
	// cache as they are read (dropbehind.go): for a store under a memory
	// budget, where the hot tier and the block cache are the caches and
	// the page cache's copy only takes the budget's room. Off, the page
	// cache is a free cache below the block cache.
	DropBehind bool
	// DirectReads, with DropBehind, reads the table files' blocks for
	// lookups with O_DIRECT (Linux; dropbehind.go): no page is
	// allocated, charged to the cgroup and dropped again per missed
	// row. Sequential reads (compactions, preload scans) stay buffered.
	// A file system that refuses O_DIRECT keeps buffered reads.
	DirectReads bool
	// ReadOnly opens the store for lookups only.
	ReadOnly bool
	// MustExist refuses a folder that holds no store rather than making
	// an empty one there (tools that list or change what a store holds).
	MustExist bool
	// WarmRestart saves the hot tier's keys and frequency sketch at Close
	// and, at the next Open, reads those rows back into the tier in the
	// background, in key order, while lookups are served (warm.go;
	// Store.Warmed reports it). For a tier that does not hold every row:
	// a complete tier is preloaded instead. With PreloadOn, Open's preload
	// of such a tier runs after the restore, into the slots it leaves.
	WarmRestart bool
	// WarmSnapshotEvery, with WarmRestart, also saves the snapshot every
	// so often while serving, so that a worker that dies without a Close
	// restarts warm too (0: at Close only).
	WarmSnapshotEvery time.Duration
}

// PreloadMode says when the hot tier is filled from Pebble (Options.Preload).
type PreloadMode string

const (
	PreloadAuto PreloadMode = "auto"
	PreloadOn   PreloadMode = "on"
	PreloadOff  PreloadMode = "off"
)

// Defaults.
const (
	DefaultHotBytes   = 256 << 20
	DefaultCacheBytes = 256 << 20
	DefaultMemTable   = 64 << 20
)

// EnsureDefaults fills unset fields and returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Preload == "" {
		o.Preload = PreloadAuto
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = DefaultMemTable
	}
	o.ensureMiss()
	if o.Logger == nil {
		o.Logger = quietLogger{}
	}
	return o
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	var errs []error
	if o.CacheBytes < 0 {
		errs = append(errs, fmt.Errorf("cache bytes %d < 0", o.CacheBytes))
	}
	switch o.Preload {
	case "", PreloadAuto, PreloadOn, PreloadOff:
	default:
		errs = append(errs, fmt.Errorf("preload %q: want auto, on or off", o.Preload))
	}
	if err := o.validateMiss(); err != nil {
		errs = append(errs, err)
	}
	if o.HotBytesMax < 0 {
		errs = append(errs, fmt.Errorf("hot bytes max %d < 0", o.HotBytesMax))
	}
	if o.HotBytesAutoMax < 0 {
		errs = append(errs, fmt.Errorf("hot bytes auto max %d < 0", o.HotBytesAutoMax))
	}
	if o.MemTableBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("memtable bytes %d < 1 MiB", o.MemTableBytes))
	}
	return errors.Join(errs...)
}

func (o *Options) ensureMiss() {
	if o.MissReads == "" {
		o.MissReads = MissSorted
	}
	if o.MissParallel == 0 {
		o.MissParallel = DefaultMissParallel
	}
}

func (o *Options) validateMiss() error {
	switch o.MissReads {
	case "", MissSorted, MissPoint:
	default:
		return fmt.Errorf("miss reads %q: want sorted or point", o.MissReads)
	}
	if o.MissParallel < 0 || o.MissParallel > 64 {
		return fmt.Errorf("miss parallel %d: want 1 to 64", o.MissParallel)
	}
	return nil
}

// quietLogger drops Pebble's informational lines and keeps its errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)              {}
func (quietLogger) Errorf(format string, args ...any) { pebble.DefaultLogger.Errorf(format, args...) }
func (quietLogger) Fatalf(format string, args ...any) { pebble.DefaultLogger.Fatalf(format, args...) }

var _ pebble.Logger = quietLogger{}

// fatalExits is Options.Logger as the store hands it to Pebble: its
// Fatalf ends the process after the Logger's own, should that return.
// Pebble goes on after a Fatalf that returns, and after a commit whose
// write-ahead log write or sync failed ("fatal commit error") its Apply
// then returns nil: an upsert acknowledged as durable that is not on
// disk, lost in a crash.
type fatalExits struct{ pebble.Logger }

func (l fatalExits) Fatalf(format string, args ...any) {
	l.Logger.Fatalf(format, args...)
	pebble.DefaultLogger.Fatalf(format, args...)
}

// tablesOf names physical tables lo to hi, then those of them served
// (names: "MODEL/TABLE, ...", "" when none).
func tablesOf(lo, hi uint32, names func(lo, hi uint32) string) string {
	tables := fmt.Sprintf("physical tables %d to %d", lo, hi)
	if lo == hi {
		tables = fmt.Sprintf("physical table %d", lo)
	}
	if served := names(lo, hi); served != "" {
		tables += ": " + served
	}
	return tables
}

// reportCorruption is the store's Pebble EventListener.DataCorruption:
// it counts every read that found a damaged block (Metrics.Corruptions)
// and logs the first of each file, naming it, the tables whose keys it
// holds, and what to do. The read itself fails with the error.
func reportCorruption(dir string, l pebble.Logger, n *atomic.Int64, first *atomic.Pointer[string], notify func(string), names func(lo, hi uint32) string) func(pebble.DataCorruptionInfo) {
	var mu sync.Mutex
	logged := map[string]bool{}
	return func(info pebble.DataCorruptionInfo) {
		n.Add(1)
		mu.Lock()
		isFirst := !logged[info.Path]
		logged[info.Path] = true
		mu.Unlock()
		if !isFirst {
			return
		}
		path := info.Path
		first.CompareAndSwap(nil, &path)
		tables := "unknown tables"
		if len(info.Bounds.Start) >= 4 && len(info.Bounds.End.Key) >= 4 {
			tables = tablesOf(binary.BigEndian.Uint32(info.Bounds.Start), binary.BigEndian.Uint32(info.Bounds.End.Key), names)
		}
		l.Errorf("store %q: %s is damaged (%s, holding rows of %s): lookups of its rows fail (DataLoss) and the rest is served; replace the store with a copy of a serving worker's (prism store copy; a worker serving with --mend does) or ingest the plan into a new --db", dir, info.Path, firstLine(info.Details), tables)
		if notify != nil {
			notify(path)
		}
	}
}

// firstLine is err's message up to its first line break.
func firstLine(err error) string {
	if err == nil {
		return "no detail"
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return msg
}
