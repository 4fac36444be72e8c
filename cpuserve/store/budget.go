package store

import (
	"fmt"

	"github.com/prism-serve/prism/internal/flagval"
)

// Budget splits a memory limit (a container's cgroup limit) among an
// embedding worker's parts, so that it neither grows into the limit (the
// kernel's OOM killer ends it) nor fills it (every allocation then waits
// on the kernel reclaiming the worker's own page cache, including the
// pages of its executable's code):
//
//	Limit = PageCache + Go + Pebble's caches when they are off the Go heap
//	Go    = HotMax (at most) + Pebble's caches when they are on it + the requests' share
//
// The page cache keeps a quarter (at least MinPageCache): the code the
// process runs and the files it writes are file pages charged to the
// same cgroup. Pebble's block cache and memtables are C memory in a cgo
// build (OffHeap; Go's limit does not see them) and Go slices without
// cgo. Go's soft memory limit (runtime/debug.SetMemoryLimit) is what is
// left for the Go heap: the hot tier for the process's life, and the
// requests: the frames being filled and sent, decoded ids, and the
// garbage between collections. Half of the requests' share is what
// InflightBytes lets the Lookups in flight hold in cut-tensor frames.
type Budget struct {
	Limit, PageCache, Go int64
	// MemTable is two memtables' bytes: Pebble keeps one to recycle
	// beside the active one (and reserves both against the cache).
	Cache, MemTable int64
	// OffHeap: the block cache and memtables are outside the Go heap.
	OffHeap bool
	// HotMax is the largest hot tier that leaves the requests
	// MinRequestBytes.
	HotMax int64
}

// BudgetMemTable is the memtable a store under a budget gets by default:
// half of DefaultMemTable, as two are budgeted (Budget.MemTable).
const BudgetMemTable = DefaultMemTable / 2

// Budget's floors.
const (
	MinPageCache    = 64 << 20
	MinRequestBytes = 64 << 20
)

// CacheBytesFor is the block cache a store under a memory limit gets by
// default: DefaultCacheBytes, or a sixteenth of the limit when that is
// less (at least 8 MiB).
func CacheBytesFor(limit int64) int64 {
	if limit <= 0 {
		return DefaultCacheBytes
	}
	return max(min(DefaultCacheBytes, limit/16), 8<<20)
}

// NewBudget splits limit for a store of options o (CacheBytes as set or
// its default when 0) and sets o.MemTableBytes to BudgetMemTable when it
// is 0, so the store opened with o has the memtables the budget counts.
// An error says the limit cannot hold the store's fixed parts with
// MinRequestBytes to spare.
func NewBudget(limit int64, o *Options) (Budget, error) {
	if o.MemTableBytes == 0 {
		o.MemTableBytes = BudgetMemTable
	}
	return newBudget(limit, *o, pebbleOffHeap)
}

func newBudget(limit int64, o Options, offHeap bool) (Budget, error) {
	if o.MemTableBytes == 0 {
		o.MemTableBytes = BudgetMemTable
	}
	o.EnsureDefaults()
	b := Budget{Limit: limit, PageCache: max(limit/4, MinPageCache), Cache: o.CacheBytes, MemTable: 2 * int64(o.MemTableBytes), OffHeap: offHeap}
	b.Go = limit - b.PageCache
	if offHeap {
		b.Go -= b.Cache + b.MemTable
	}
	b.HotMax = b.Go - b.onHeap() - MinRequestBytes
	if b.HotMax <= 0 {
		return b, fmt.Errorf("a memory limit of %s, less %s for the page cache, does not hold the block cache (%s), the memtable (%s) and %s for requests; raise the limit or lower --cache-bytes",
			flagval.FormatBytes(limit), flagval.FormatBytes(b.PageCache), flagval.FormatBytes(b.Cache), flagval.FormatBytes(b.MemTable), flagval.FormatBytes(MinRequestBytes))
	}
	return b, nil
}

// onHeap is the bytes of Pebble's caches inside the Go heap.
func (b Budget) onHeap() int64 {
	if b.OffHeap {
		return 0
	}
	return b.Cache + b.MemTable
}

// WithGo is the budget with Go's limit set to g (GOMEMLIMIT set by hand)
// and the hot tier's cap following from it.
func (b Budget) WithGo(g int64) Budget {
	b.Go = g
	b.HotMax = g - b.onHeap() - MinRequestBytes
	return b
}

// Requests is what the budget leaves the requests in the Go heap once
// the hot tier holds hot bytes.
func (b Budget) Requests(hot int64) int64 { return b.Go - max(hot, 0) - b.onHeap() }

// InflightBytes is the cut-tensor bytes the Lookups in flight may hold
// with a hot tier of hot bytes: half the requests' share.
func (b Budget) InflightBytes(hot int64) int64 { return max(b.Requests(hot)/2, 1) }

// CheckHot refuses a hot tier size (HotBytes as set by hand) that does
// not fit the budget.
func (b Budget) CheckHot(hot int64) error {
	if hot > b.HotMax {
		return fmt.Errorf("a hot tier of %s does not fit the memory limit of %s: with %s for the page cache, %s of block cache, a %s memtable and %s for requests, at most %s",
			flagval.FormatBytes(hot), flagval.FormatBytes(b.Limit), flagval.FormatBytes(b.PageCache), flagval.FormatBytes(b.Cache), flagval.FormatBytes(b.MemTable), flagval.FormatBytes(MinRequestBytes), flagval.FormatBytes(b.HotMax))
	}
	return nil
}
