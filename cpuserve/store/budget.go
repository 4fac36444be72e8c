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
//	Limit = PageCache + Go
//	Go    = HotMax (at most) + Cache + MemTable + the requests' share
//
// The page cache keeps a quarter (at least MinPageCache): the store's
// index and data blocks that misses read and the code the process runs
// are file pages, charged to the same cgroup. Go's soft memory limit
// (runtime/debug.SetMemoryLimit) is the rest; the hot tier, the block
// cache and the memtable live in the Go heap (this build allocates
// Pebble's cache without cgo) for the process's life; what is left is
// the requests': the frames being filled and sent, decoded ids, and the
// garbage between collections. Half of that is what InflightBytes lets
// the Lookups in flight hold in cut-tensor frames.
type Budget struct {
	Limit, PageCache, Go int64
	Cache, MemTable      int64
	// HotMax is the largest hot tier that leaves the requests
	// MinRequestBytes.
	HotMax int64
}

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

// NewBudget splits limit for a store of options o (CacheBytes and
// MemTableBytes as set, their defaults when 0). An error says the limit
// cannot hold the store's fixed parts with MinRequestBytes to spare.
func NewBudget(limit int64, o Options) (Budget, error) {
	o.EnsureDefaults()
	b := Budget{Limit: limit, PageCache: max(limit/4, MinPageCache), Cache: o.CacheBytes, MemTable: int64(o.MemTableBytes)}
	b.Go = limit - b.PageCache
	b.HotMax = b.Go - b.Cache - b.MemTable - MinRequestBytes
	if b.HotMax <= 0 {
		return b, fmt.Errorf("a memory limit of %s leaves Go %s after %s for the page cache: not enough for the block cache (%s), the memtable (%s) and %s for requests; raise the limit or lower --cache-bytes",
			flagval.FormatBytes(limit), flagval.FormatBytes(b.Go), flagval.FormatBytes(b.PageCache), flagval.FormatBytes(b.Cache), flagval.FormatBytes(b.MemTable), flagval.FormatBytes(MinRequestBytes))
	}
	return b, nil
}

// Requests is what the budget leaves the requests once the hot tier
// holds hot bytes.
func (b Budget) Requests(hot int64) int64 { return b.Go - max(hot, 0) - b.Cache - b.MemTable }

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
