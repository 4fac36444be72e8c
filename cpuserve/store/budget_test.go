package store

import (
	"strings"
	"testing"
)

func TestBudget(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		limit       int64
		o           Options
		offHeap     bool
		pageCache   int64
		goLimit     int64
		hotMax      int64
		hot         int64
		inflight    int64
		err, hotErr string
	}{
		// The LTM benchmark's worker: 768 MiB, 32 MiB of block cache.
		{name: "768MiB, caches in the Go heap", limit: 768 * mib, o: Options{CacheBytes: 32 * mib}, pageCache: 192 * mib, goLimit: 576 * mib, hotMax: 416 * mib, hot: 320 * mib, inflight: 80 * mib},
		{name: "768MiB, caches in C memory", limit: 768 * mib, o: Options{CacheBytes: 32 * mib}, offHeap: true, pageCache: 192 * mib, goLimit: 480 * mib, hotMax: 416 * mib, hot: 320 * mib, inflight: 80 * mib},
		{name: "hot tier over its share", limit: 768 * mib, o: Options{CacheBytes: 32 * mib}, pageCache: 192 * mib, goLimit: 576 * mib, hotMax: 416 * mib, hot: 417 * mib, hotErr: "at most 416MiB"},
		// Small limits keep MinPageCache.
		{name: "256MiB", limit: 256 * mib, o: Options{CacheBytes: CacheBytesFor(256 * mib), MemTableBytes: 16 * mib}, pageCache: 64 * mib, goLimit: 192 * mib, hotMax: 192*mib - 16*mib - 2*16*mib - 64*mib, hot: 0, inflight: (192*mib - 48*mib) / 2},
		{name: "too small", limit: 128 * mib, o: Options{}, err: "does not hold the block cache"},
		{name: "too small, off heap", limit: 128 * mib, o: Options{}, offHeap: true, err: "does not hold the block cache"},
		{name: "large", limit: 64 << 30, o: Options{CacheBytes: CacheBytesFor(64 << 30)}, offHeap: true, pageCache: 16 << 30, goLimit: 48<<30 - 256*mib - 64*mib, hotMax: 48<<30 - 256*mib - 64*mib - 64*mib, hot: 40 << 30, inflight: (48<<30 - 40<<30 - 256*mib - 64*mib) / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := newBudget(tc.limit, tc.o, tc.offHeap)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("newBudget: %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.PageCache != tc.pageCache || b.Go != tc.goLimit || b.HotMax != tc.hotMax {
				t.Fatalf("budget %+v: want page cache %d, Go %d, hot max %d", b, tc.pageCache, tc.goLimit, tc.hotMax)
			}
			// The parts add up to the limit, with the hot tier at its most.
			off := int64(0)
			if b.OffHeap {
				off = b.Cache + b.MemTable
			}
			if b.PageCache+b.Go+off != tc.limit || b.Requests(b.HotMax) != MinRequestBytes {
				t.Fatalf("budget %+v: page cache + Go + off-heap caches != limit %d, or requests at the hot tier's cap %d", b, tc.limit, b.Requests(b.HotMax))
			}
			err = b.CheckHot(tc.hot)
			if tc.hotErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.hotErr) {
					t.Fatalf("CheckHot(%d): %v, want %q", tc.hot, err, tc.hotErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := b.InflightBytes(tc.hot); got != tc.inflight {
				t.Fatalf("InflightBytes(%d) = %d, want %d", tc.hot, got, tc.inflight)
			}
			// GOMEMLIMIT set by hand: the cap follows it.
			if w := b.WithGo(b.Go + 100*mib); w.HotMax != b.HotMax+100*mib {
				t.Fatalf("WithGo: hot max %d, want %d", w.HotMax, b.HotMax+100*mib)
			}
		})
	}
}

func TestCacheBytesFor(t *testing.T) {
	for _, tc := range []struct{ limit, want int64 }{
		{0, DefaultCacheBytes}, {64 << 20, 8 << 20}, {768 << 20, 48 << 20}, {8 << 30, DefaultCacheBytes},
	} {
		if got := CacheBytesFor(tc.limit); got != tc.want {
			t.Errorf("CacheBytesFor(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

// TestHotBytesMaxCaps: the size a store falls back to (recorded or
// default) is capped by HotBytesMax.
func TestHotBytesMaxCaps(t *testing.T) {
	s := &Store{opts: Options{HotBytesMax: 100 << 20}}
	if got := s.hotBudget(&catalog{HotBytes: 1 << 30}, map[int]int64{16: 64}); got != 100<<20 {
		t.Fatalf("recorded 1GiB under a 100MiB cap: %d", got)
	}
	s.opts.HotBytesMax = 0
	if got := s.hotBudget(&catalog{HotBytes: 1 << 30}, map[int]int64{16: 64}); got != 1<<30 {
		t.Fatalf("no cap: %d", got)
	}
}

// TestNewBudgetSetsMemTable: a memtable not set by hand is set to
// BudgetMemTable in the options the store will be opened with, so the
// store has the two memtables the budget counts.
func TestNewBudgetSetsMemTable(t *testing.T) {
	o := Options{}
	b, err := NewBudget(1<<30, &o)
	if err != nil {
		t.Fatal(err)
	}
	if o.MemTableBytes != BudgetMemTable || b.MemTable != 2*BudgetMemTable {
		t.Fatalf("memtable %d, budgeted %d; want %d and twice that", o.MemTableBytes, b.MemTable, BudgetMemTable)
	}
	o = Options{MemTableBytes: 8 << 20}
	if b, _ := NewBudget(1<<30, &o); o.MemTableBytes != 8<<20 || b.MemTable != 16<<20 {
		t.Fatalf("a memtable set by hand: %d, budgeted %d", o.MemTableBytes, b.MemTable)
	}
}
