package storebench

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/memlimit"
)

// missMode is one way of reading the hot tier's misses.
type missMode struct {
	name     string
	mode     store.MissReads
	parallel int
}

// missResult sums one mode's rounds.
type missResult struct {
	res Result
	m   store.Metrics // deltas
	io  IOSnap        // deltas
}

// runMisses measures the miss path: after a warm-up that fills the hot
// tier, fresh Zipf batches per exponent, each mode (point reads, the
// sorted pass in one reader, the sorted pass split among readers) on its
// own draws of the same distribution, the modes interleaved in 5 rounds
// so drift hits them alike. The page cache of the store's files is
// dropped before each exponent's warm-up: run it in a memory cgroup
// smaller than the tables (scripts/bench-ltm.sh) and the misses are read
// from the device.
func runMisses(w io.Writer, e *Env, zipfs []float64) error {
	var tableBytes int64
	for _, rows := range e.Rows {
		tableBytes += rows * int64(e.Dim) * 4
	}
	idx, filter, err := e.Store.IndexBytes()
	if err != nil {
		return err
	}
	m := e.Store.Metrics()
	fmt.Fprintf(w, "tables %d MiB (float32), SST index blocks %.1f MiB, filter blocks %.1f MiB; hot tier %d MiB, block cache %d MiB (%s)\n",
		tableBytes>>20, float64(idx)/(1<<20), float64(filter)/(1<<20), m.HotBytes>>20, m.BlockCacheMaxBytes>>20, blockCacheNote(e.Cfg.CacheBytes, m))
	if lim := memlimit.Read().Cgroup; lim > 0 {
		fmt.Fprintf(w, "memory cgroup limit %d MiB: tables are %.1fx the limit\n", lim>>20, float64(tableBytes)/float64(lim))
	}
	par := e.Cfg.MissParallel
	if par == 0 {
		par = store.DefaultMissParallel
	}
	modes := []missMode{
		{"point Get per miss", store.MissPoint, 1},
		{"sorted pass, 1 reader", store.MissSorted, 1},
		{fmt.Sprintf("sorted pass, %d readers", par), store.MissSorted, par},
	}
	const rounds = 5
	per := max(1, e.Cfg.Batches/rounds)
	for zi, s := range zipfs {
		// Every exponent starts from the device: dropped once, the
		// later exponents read what the earlier ones left cached.
		n, err := EvictPageCache(filepath.Join(e.Cfg.Dir, "db"))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "dropped the page cache of %d store files\n", n)
		if err := e.Store.SetMissReads(store.MissSorted, par); err != nil {
			return err
		}
		// Warm-up in slices, so the id arrays stay small in the cgroup.
		for i := 0; i < e.Cfg.warmup(); i += per {
			warm, err := e.Batches(min(per, e.Cfg.warmup()-i), s, warmSeed(zi, i))
			if err != nil {
				return err
			}
			if _, err := e.StoreLookup("warmup", warm); err != nil {
				return err
			}
		}
		results := make([]missResult, len(modes))
		for r := range rounds {
			for mi, md := range modes {
				batches, err := e.Batches(per, s, roundSeed(zi, r, mi))
				if err != nil {
					return err
				}
				if err := e.Store.SetMissReads(md.mode, md.parallel); err != nil {
					return err
				}
				b0, io0 := e.Store.Metrics(), e.IO.Snap()
				res, err := e.StoreLookup(md.name, batches)
				if err != nil {
					return err
				}
				b1, io1 := e.Store.Metrics(), e.IO.Snap()
				mr := &results[mi]
				mr.res = merge(mr.res, res)
				mr.m = addMetrics(mr.m, subMetrics(b1, b0))
				d := io1.Sub(io0)
				mr.io = IOSnap{Reads: mr.io.Reads + d.Reads, Bytes: mr.io.Bytes + d.Bytes, Nanos: mr.io.Nanos + d.Nanos,
					DeviceBytes: mr.io.DeviceBytes + d.DeviceBytes, CPU: mr.io.CPU + d.CPU}
			}
		}
		fmt.Fprintf(w, "\nzipf %.2f, %d batches of %d samples x %d tables per mode (%d rounds):\n\n", s, per*rounds, e.Cfg.Batch, len(e.Rows), rounds)
		fmt.Fprintln(w, "| miss reads | hot hit ratio | lookup rows/s | p50 / p99 per batch | missed ids/s (miss path) | miss time per missed id | file reads: time share of miss path, in flight | device MB read | block cache hit ratio | CPU per missed id |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
		base := 0.0
		for mi, mr := range results {
			missSec := float64(mr.m.MissReadNanos) / 1e9
			missRate := float64(mr.m.HotMisses) / missSec
			if mi == 0 {
				base = missRate
			}
			ratio := ""
			if mi > 0 && base > 0 {
				ratio = fmt.Sprintf(" (%.2fx)", missRate/base)
			}
			share := float64(mr.io.Nanos) / float64(mr.m.MissReadNanos)
			bc := float64(mr.m.BlockCacheHits) / float64(max(1, mr.m.BlockCacheHits+mr.m.BlockCacheMisses))
			fmt.Fprintf(w, "| %s | %.3f | %.2f M | %s / %s | %.3f M%s | %.1f us | %.0f%% of %d reads, %.2f | %.0f | %.3f | %.1f us |\n",
				modes[mi].name, mr.m.HitRatio(), mr.res.RowsPerSec()/1e6,
				mr.res.Quantile(0.5).Round(10*time.Microsecond), mr.res.Quantile(0.99).Round(10*time.Microsecond),
				missRate/1e6, ratio, 1e6/missRate,
				100*min(share, 1), mr.io.Reads, share,
				float64(mr.io.DeviceBytes)/1e6, bc,
				float64(mr.io.CPU.Microseconds())/float64(max(1, mr.m.HotMisses)))
		}
		fmt.Fprintln(w)
		for mi, mr := range results {
			fmt.Fprintf(w, "  %s: %d missed ids, %d Pebble row reads, miss path %.2fs of %.2fs lookups; file reads %d (%.0f MB, %.2fs summed); Pebble block reads %.2fs summed, %.0f MB\n",
				modes[mi].name, mr.m.HotMisses, mr.m.PebbleReads, float64(mr.m.MissReadNanos)/1e9, mr.res.Elapsed.Seconds(),
				mr.io.Reads, float64(mr.io.Bytes)/1e6, float64(mr.io.Nanos)/1e9, float64(mr.m.BlockReadNanos)/1e9, float64(mr.m.BlockReadBytes)/1e6)
		}
	}
	return nil
}

// warmSeed is the seed of the warm-up slice from batch i of exponent
// zi, roundSeed that of round r of mode mi: apart, so that no measured
// draw repeats a warm-up slice and finds its rows resident (warm-up
// seeds were 1000+100zi+i, which a warm-up of 9,000 batches took into
// the rounds' 10,000 on).
func warmSeed(zi, i int) uint64 { return 1<<40 | uint64(zi)<<32 | uint64(i) }

func roundSeed(zi, r, mi int) uint64 { return uint64(10_000*(zi+1) + 100*r + mi) }

func subMetrics(a, b store.Metrics) store.Metrics {
	return store.Metrics{
		HotHits: a.HotHits - b.HotHits, HotMisses: a.HotMisses - b.HotMisses,
		PebbleReads: a.PebbleReads - b.PebbleReads, PebbleBytes: a.PebbleBytes - b.PebbleBytes,
		MissReadNanos: a.MissReadNanos - b.MissReadNanos, BlockReadNanos: a.BlockReadNanos - b.BlockReadNanos,
		BlockReadBytes:   a.BlockReadBytes - b.BlockReadBytes,
		BlockCacheHits:   a.BlockCacheHits - b.BlockCacheHits,
		BlockCacheMisses: a.BlockCacheMisses - b.BlockCacheMisses,
	}
}

func addMetrics(a, b store.Metrics) store.Metrics {
	return store.Metrics{
		HotHits: a.HotHits + b.HotHits, HotMisses: a.HotMisses + b.HotMisses,
		PebbleReads: a.PebbleReads + b.PebbleReads, PebbleBytes: a.PebbleBytes + b.PebbleBytes,
		MissReadNanos: a.MissReadNanos + b.MissReadNanos, BlockReadNanos: a.BlockReadNanos + b.BlockReadNanos,
		BlockReadBytes:   a.BlockReadBytes + b.BlockReadBytes,
		BlockCacheHits:   a.BlockCacheHits + b.BlockCacheHits,
		BlockCacheMisses: a.BlockCacheMisses + b.BlockCacheMisses,
	}
}
