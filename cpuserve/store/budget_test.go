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
		pageCache   int64
		hotMax      int64
		hot         int64
		inflight    int64
		err, hotErr string
	}{
		// The LTM benchmark's worker: 768 MiB, 32 MiB of block cache.
		{name: "768MiB", limit: 768 * mib, o: Options{CacheBytes: 32 * mib}, pageCache: 192 * mib, hotMax: 416 * mib, hot: 320 * mib, inflight: 80 * mib},
		{name: "hot tier over its share", limit: 768 * mib, o: Options{CacheBytes: 32 * mib}, pageCache: 192 * mib, hotMax: 416 * mib, hot: 417 * mib, hotErr: "at most 416MiB"},
		// Small limits keep MinPageCache.
		{name: "256MiB", limit: 256 * mib, o: Options{CacheBytes: CacheBytesFor(256 * mib), MemTableBytes: 16 * mib}, pageCache: 64 * mib, hotMax: 256*mib - 64*mib - 16*mib - 16*mib - 64*mib, hot: 0, inflight: (192*mib - 32*mib) / 2},
		{name: "too small", limit: 128 * mib, o: Options{}, err: "not enough for the block cache"},
		{name: "large", limit: 64 << 30, o: Options{CacheBytes: CacheBytesFor(64 << 30)}, pageCache: 16 << 30, hotMax: 48<<30 - 256*mib - 64*mib - 64*mib, hot: 40 << 30, inflight: (48<<30 - 40<<30 - 256*mib - 64*mib) / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBudget(tc.limit, tc.o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewBudget: %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.PageCache+b.Go != tc.limit || b.PageCache != tc.pageCache || b.HotMax != tc.hotMax {
				t.Fatalf("budget %+v: want page cache %d, hot max %d, page cache + Go = limit", b, tc.pageCache, tc.hotMax)
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
			// Hot tier, cache, memtable and requests add up to Go's share.
			if b.Requests(tc.hot)+tc.hot+b.Cache+b.MemTable != b.Go {
				t.Fatalf("parts do not add up to Go's %d", b.Go)
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
