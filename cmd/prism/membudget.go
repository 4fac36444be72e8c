package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
)

// memoryLimit reads `serve embedding --memory-limit`: "auto" is this
// process's limits (the memory cgroup's, if any, as Cgroup); a size is
// that limit, as if a cgroup set it (under the process's own memory
// cgroup, whose smaller limit the kernel still applies: a size above it
// is the cgroup's limit); "off" keeps the machine's memory only (no
// budget).
func memoryLimit(spec string) (memlimit.Limits, error) {
	return memoryLimitFrom(spec, memlimit.Read())
}

// memoryLimitFrom is memoryLimit with the process's limits l. A limit
// above the machine's memory (a cgroup's or a size given) is the
// machine's: a budget of memory the machine does not have sized the
// hot tier and Go's limit past it.
func memoryLimitFrom(spec string, l memlimit.Limits) (memlimit.Limits, error) {
	l, err := memoryLimitSpec(spec, l)
	if err == nil && l.Cgroup > 0 && l.Physical > 0 && l.Cgroup > l.Physical {
		l.Cgroup = l.Physical
	}
	return l, err
}

func memoryLimitSpec(spec string, l memlimit.Limits) (memlimit.Limits, error) {
	switch s := strings.TrimSpace(spec); s {
	case "", "auto":
		return l, nil
	case "off":
		l.Cgroup = 0
		return l, nil
	default:
		n, err := flagval.Bytes(s)
		if err != nil {
			return l, err
		}
		if n <= 0 {
			return l, fmt.Errorf("%q: want a size, auto or off", spec)
		}
		// Budgeting more than the cgroup allows would grow the worker
		// into the OOM killer the budget is there to keep it from.
		if l.Cgroup <= 0 || n < l.Cgroup {
			l.Cgroup = n
		}
		return l, nil
	}
}

// pastMachine refuses, when there is no memory budget (no cgroup's
// limit, --memory-limit off) to check them against, a hot tier or block
// cache set past the machine's memory: taken, they were bounds the
// worker would grow to, into the OOM killer. Under a budget applyBudget
// checks them, with what else it holds.
// hot and cache are the flags' values as typed.
func pastMachine(so store.Options, l memlimit.Limits, hot, cache string) error {
	if l.Cgroup > 0 || l.Physical <= 0 {
		return nil
	}
	for _, c := range []struct {
		flag, typed string
		n           int64
	}{{"--hot-bytes", hot, so.HotBytes}, {"--cache-bytes", cache, so.CacheBytes}} {
		if c.n > l.Physical {
			return fmt.Errorf("%s %s: %s, more than this machine's %s of memory", c.flag, c.typed, flagval.FormatBytes(c.n), flagval.FormatBytes(l.Physical))
		}
	}
	return nil
}

// memBudget is an embedding worker's memory budget, nil without a limit.
type memBudget struct {
	b store.Budget
	// setGo: the worker set Go's memory limit (GOMEMLIMIT was not set);
	// otherwise b.Go is GOMEMLIMIT's.
	setGo bool
}

// applyBudget sizes the store's options to a memory limit (0: none, the
// options stay as they are): a hot tier set by hand must fit it, an
// automatic one is capped by it, and Go's soft memory limit is set to its
// share unless GOMEMLIMIT says otherwise.
func applyBudget(so *store.Options, limit int64) (*memBudget, error) {
	if limit <= 0 {
		return nil, nil
	}
	// Two memtables are budgeted (the active one and Pebble's spare): a
	// memtable not set by hand is half the default (NewBudget sets it),
	// so the two take what one default memtable did.
	b, err := store.NewBudget(limit, so)
	if err != nil {
		return nil, fmt.Errorf("memory budget: %w", err)
	}
	mb := &memBudget{b: b, setGo: os.Getenv("GOMEMLIMIT") == ""}
	if !mb.setGo {
		// Go's limit as GOMEMLIMIT set it (SetMemoryLimit(-1) reads it);
		// the hot tier's cap follows from it.
		mb.b = mb.b.WithGo(debug.SetMemoryLimit(-1))
		if mb.b.HotMax <= 0 {
			return nil, fmt.Errorf("memory budget: GOMEMLIMIT (%s) leaves no room for a hot tier beside %s for requests", flagval.FormatBytes(mb.b.Go), flagval.FormatBytes(store.MinRequestBytes))
		}
	}
	if so.HotBytes > 0 {
		if err := mb.b.CheckHot(so.HotBytes); err != nil {
			return nil, fmt.Errorf("--hot-bytes: %w (or raise --memory-limit)", err)
		}
	}
	so.HotBytesMax = mb.b.HotMax
	so.DropBehind = true
	if so.HotBytesAutoMax > mb.b.HotMax {
		so.HotBytesAutoMax = mb.b.HotMax
	}
	if mb.setGo {
		debug.SetMemoryLimit(mb.b.Go)
	}
	return mb, nil
}

// inflight is the cut-tensor bytes the Lookups in flight may hold (0:
// no bound), with the hot tier st opened with.
func (mb *memBudget) inflight(st *store.Store) int64 {
	if mb == nil {
		return 0
	}
	return mb.b.InflightBytes(st.Metrics().HotBytes)
}

// report says how the budget was split, on stderr and in the log.
func (mb *memBudget) report(w io.Writer, log *slog.Logger, st *store.Store) {
	if mb == nil {
		return
	}
	b, hot := mb.b, st.Metrics().HotBytes
	goFrom := "set by the worker"
	if !mb.setGo {
		goFrom = "GOMEMLIMIT"
	}
	where := "in Go's"
	if b.OffHeap {
		where = "beside Go's"
	}
	fmt.Fprintf(w, "memory budget %s: page cache %s, block cache %s and memtables %s (%s), Go %s (%s): hot tier %s, requests %s (%s of lookups' cut tensors in flight)\n",
		flagval.FormatBytes(b.Limit), flagval.FormatBytes(b.PageCache), flagval.FormatBytes(b.Cache), flagval.FormatBytes(b.MemTable), where,
		flagval.FormatBytes(b.Go), goFrom, flagval.FormatBytes(hot),
		flagval.FormatBytes(b.Requests(hot)), flagval.FormatBytes(b.InflightBytes(hot)))
	log.Info("memory budget", "limit", b.Limit, "page_cache", b.PageCache, "go", b.Go, "go_from", goFrom,
		"hot", hot, "block_cache", b.Cache, "memtable", b.MemTable, "requests", b.Requests(hot), "inflight_bytes", b.InflightBytes(hot))
}

// raiseProcs gives Go more Ps than cores when, under a budget, lookups
// read their misses from the device (the hot tier does not hold every
// row, and drop-behind keeps the page cache from answering): Go reads a
// regular file with a blocking pread that holds its P until the
// runtime's monitor takes the P back, which it does only after it has
// slept (up to 10 ms when the process was idle), so with as many Ps as
// cores the other lookups' goroutines wait runnable while the cores
// idle. bench-ltm-e2e at 25 req/s read p99 685 ms at GOMAXPROCS 2 and
// 98 ms at 8 (BENCHMARKS.md). At least two Ps per miss reader of a
// lookup; a GOMAXPROCS set by hand is kept. It returns the old and new
// counts (equal when nothing changed).
func (mb *memBudget) raiseProcs(st *store.Store, missParallel int) (from, to int) {
	from = runtime.GOMAXPROCS(0)
	if mb == nil || os.Getenv("GOMAXPROCS") != "" || st.Preloaded().Complete {
		return from, from
	}
	if missParallel <= 0 {
		missParallel = store.DefaultMissParallel
	}
	if want := 2 * missParallel; want > from {
		runtime.GOMAXPROCS(want)
		return from, want
	}
	return from, from
}

// indexCacheAdvice is what to tell an operator whose block cache of
// cache bytes cannot keep the SSTs' index and filter blocks (index +
// filter bytes, Store.IndexBytes) with a quarter to spare for data
// blocks, when lookups read misses from Pebble (the hot tier does not
// hold every row: complete false). Every missed row then reads its SST's
// index block from the device too, two reads instead of one
// (BENCHMARKS: a larger-than-memory worker whose cache held no index
// block). The index is about half a percent of the tables' bytes (one
// entry per 4 KiB block: 16.3 MB for bench-ltm-e2e's 3.4 GB store), so
// the 256 MiB default keeps the index of about 50 GB of tables. "" when
// nothing is to be said.
func indexCacheAdvice(index, filter, cache int64, complete bool) string {
	need := (index + filter) * 4 / 3
	if complete || need <= cache {
		return ""
	}
	return fmt.Sprintf("the block cache (%s) cannot keep the store's index blocks (%s) with room for data blocks: a row missed by the hot tier will also read its index block from the device; give --cache-bytes %s or more",
		flagval.FormatBytes(cache), flagval.FormatBytes(index+filter), flagval.FormatBytes(need))
}
