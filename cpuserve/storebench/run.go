package storebench

import (
	"fmt"
	"io"
	"slices"

	"github.com/prism-serve/prism/cpuserve/store"
)

// Scenarios are the scenarios Run knows.
var Scenarios = []string{"gather", "redis", "ltm", "preload", "misses", "setup"}

// CheckScenario says whether Run knows scenario: callers check before
// Setup, which builds and ingests the tables (minutes, gigabytes).
func CheckScenario(scenario string) error {
	if !slices.Contains(Scenarios, scenario) {
		return fmt.Errorf("scenario %q: want gather, redis, ltm, preload, misses or setup", scenario)
	}
	return nil
}

// Run runs a scenario and writes its report to w.
func Run(w io.Writer, e *Env, scenario string, zipfs []float64) error {
	switch scenario {
	case "gather":
		return runGather(w, e)
	case "redis":
		return runRedis(w, e)
	case "ltm":
		return runLTM(w, e, zipfs)
	case "preload":
		return runPreload(w, e)
	case "misses":
		return runMisses(w, e, zipfs)
	case "setup":
		return nil
	}
	return CheckScenario(scenario)
}

func runGather(w io.Writer, e *Env) error {
	warm, err := e.Batches(e.Cfg.warmup(), e.Cfg.Zipf, 1)
	if err != nil {
		return err
	}
	if _, err := e.StoreLookup("warmup", warm); err != nil {
		return err
	}
	batches, err := e.Batches(e.Cfg.Batches, e.Cfg.Zipf, 2)
	if err != nil {
		return err
	}
	// Fresh batches: ids never seen before miss the tier and go to Pebble.
	if err := compare(w, e, "fresh batches (hot tier + Pebble)", batches); err != nil {
		return err
	}
	// The same batches again: every id is resident, the hot-tier path.
	return compare(w, e, "hot-tier path (all resident)", batches)
}

// compare runs the raw gather and the store over batches, interleaved in
// rounds so drift (another job on the machine) hits both alike.
func compare(w io.Writer, e *Env, name string, batches [][][]int64) error {
	before := e.Store.Metrics()
	var raw, st Result
	for _, part := range rounds(batches, 5) {
		r := e.RawGather(part)
		s, err := e.StoreLookup("store: "+name, part)
		if err != nil {
			return err
		}
		raw = merge(raw, r)
		st = merge(st, s)
	}
	after := e.Store.Metrics()
	hits, miss := after.HotHits-before.HotHits, after.HotMisses-before.HotMisses
	fmt.Fprintf(w, "%s: zipf %.2f, hot tier %d MiB (%d rows resident), hit ratio %.4f\n", name, e.Cfg.Zipf, after.HotBytes>>20, after.HotUsed, float64(hits)/float64(hits+miss))
	fmt.Fprintln(w, "  ", raw)
	fmt.Fprintln(w, "  ", st)
	fmt.Fprintf(w, "   ratio store/raw: %.2fx rows/s\n", st.RowsPerSec()/raw.RowsPerSec())
	return nil
}

// rounds cuts batches into n parts of near-equal size, in order, that
// hold every batch (fewer parts, of one batch each, when there are fewer
// than n batches): a part per round of an interleaved comparison.
func rounds(batches [][][]int64, n int) [][][][]int64 {
	n = min(n, len(batches))
	parts := make([][][][]int64, 0, n)
	for i := range n {
		parts = append(parts, batches[i*len(batches)/n:(i+1)*len(batches)/n])
	}
	return parts
}

func merge(a, b Result) Result {
	a.Name = b.Name
	a.Rows += b.Rows
	a.Elapsed += b.Elapsed
	a.Latencies = append(a.Latencies, b.Latencies...)
	return a
}

// runLTM measures fresh Zipf batches per exponent; the caller sizes the
// tables against --hot-bytes and --cache-bytes (and the machine's memory).
func runLTM(w io.Writer, e *Env, zipfs []float64) error {
	var tableBytes int64
	for _, rows := range e.Rows {
		tableBytes += rows * int64(e.Cfg.DType.RowBytes(e.Dim)) // as stored: --dtype's bytes a value
	}
	m := e.Store.Metrics()
	fmt.Fprintf(w, "larger than memory: tables %d MiB, hot tier %d MiB + block cache %d MiB (tables are %.1fx; %s)\n",
		tableBytes>>20, m.HotBytes>>20, m.BlockCacheMaxBytes>>20, float64(tableBytes)/float64(m.HotBytes+m.BlockCacheMaxBytes), blockCacheNote(e.Cfg.CacheBytes, m))
	for i, s := range zipfs {
		warm, err := e.Batches(e.Cfg.warmup(), s, uint64(10+2*i))
		if err != nil {
			return err
		}
		if _, err := e.StoreLookup("warmup", warm); err != nil {
			return err
		}
		batches, err := e.Batches(e.Cfg.Batches, s, uint64(11+2*i))
		if err != nil {
			return err
		}
		before := e.Store.Metrics()
		r, err := e.StoreLookup(fmt.Sprintf("zipf %.2f", s), batches)
		if err != nil {
			return err
		}
		after := e.Store.Metrics()
		hits, miss := after.HotHits-before.HotHits, after.HotMisses-before.HotMisses
		fmt.Fprintf(w, "   %s  hot hit ratio %.3f, pebble reads %d\n", r, float64(hits)/float64(hits+miss), after.PebbleReads-before.PebbleReads)
	}
	return nil
}

// blockCacheNote says what the block cache is made of: --cache-bytes
// and the memtables' reserve, which a read-only run leaves to blocks.
func blockCacheNote(cacheBytes int64, m store.Metrics) string {
	return fmt.Sprintf("block cache: --cache-bytes %d MiB + %d MiB Pebble reserves for its memtables, blocks' while they are empty",
		cacheBytes>>20, (m.BlockCacheMaxBytes-cacheBytes)>>20)
}
