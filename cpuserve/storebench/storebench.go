// Package storebench measures the embedding store against its limit (a
// raw gather from flat in-memory tables) and its peer (Redis), on
// zoo-shaped tables with Zipf ids. `prism store bench` runs it; the unit
// tests run its scenarios on dlrm-tiny's tables only.
package storebench

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// Config shapes a run.
type Config struct {
	Model      string  // zoo preset, default dlrm-kaggle
	Dim        int     // overrides the preset's embedding width when > 0
	RowsScale  float64 // scales the preset's rows (0: 1)
	MaxRows    int64   // caps every table (0: the preset's default cap)
	Zipf       float64 // id exponent (default 1.05)
	Batch      int     // samples per batch (default 256)
	Batches    int     // measured batches (default 2000)
	Warmup     int     // batches before measuring (default 2000; negative: none)
	HotBytes   int64   // store hot tier (-1: none)
	CacheBytes int64   // Pebble block cache
	DType      store.DType
	// MissParallel is the store's Options.MissParallel (0: its default).
	MissParallel int
	// NoTables keeps no flat tables in memory (Env.Tables nil): they are
	// built only to write a missing plan, then dropped, so the misses
	// and ltm scenarios fit a memory cgroup smaller than the tables.
	NoTables bool
	Dir      string // work folder: plan/ and db/ (reused when present)
	Seed     uint64
	Log      func(format string, args ...any)
}

func (c *Config) defaults() {
	if c.Model == "" {
		c.Model = "dlrm-kaggle"
	}
	if c.Zipf == 0 {
		c.Zipf = 1.05
	}
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.Batches == 0 {
		c.Batches = 2000
	}
	if c.Warmup == 0 {
		c.Warmup = 2000
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
}

// warmup is the warm-up batches to run: Warmup, none when negative.
func (c Config) warmup() int { return max(c.Warmup, 0) }

// Env is a built data set: the flat tables, the plan on disk, the store.
type Env struct {
	Cfg    Config
	Name   string
	Tables [][]float32
	Rows   []int64
	Dim    int
	Plan   string
	Store  *store.Store
	Ingest *store.IngestReport
	// IO counts the store's file reads (every ReadAt through its FS).
	IO *IOStats
}

// fits refuses a run whose tables (built in memory, float32) or ids
// (drawn ahead of the timed part: warm-up and measured batches) would
// take more than half of memory bytes (0: unknown, no check): --batch,
// --batches or --dim with a typo's extra digits ended in "fatal error:
// runtime: out of memory" and a stack trace. In float64: no product
// overflows.
func fits(cfg Config, rows []int64, dim int, memory int64) error {
	if memory <= 0 {
		return nil
	}
	var all float64
	for _, r := range rows {
		all += float64(r)
	}
	half := float64(memory) / 2
	if b := all * float64(dim) * 4; b > half {
		return fmt.Errorf("--dim %d: the %d tables' %.0f rows take %s at that width, more than half of the %s of memory", dim, len(rows), all, flagval.FormatBytes(int64(min(b, 1<<62))), flagval.FormatBytes(memory))
	}
	if b := float64(cfg.warmup()+cfg.Batches) * float64(len(rows)) * float64(cfg.Batch) * 8; b > half {
		return fmt.Errorf("--batch %d over --batches %d (and --warmup %d): the ids drawn ahead take %s, more than half of the %s of memory", cfg.Batch, cfg.Batches, cfg.warmup(), flagval.FormatBytes(int64(min(b, 1<<62))), flagval.FormatBytes(memory))
	}
	return nil
}

// Setup builds the tables (seeded), writes the plan, and ingests it into
// Dir/db unless the store there already holds the model.
func Setup(cfg Config) (*Env, error) {
	cfg.defaults()
	p, err := models.Lookup(cfg.Model)
	if err != nil {
		return nil, err
	}
	mc, err := p.Resolve(models.ScaleOptions{RowsScale: cfg.RowsScale, MaxRows: cfg.MaxRows})
	if err != nil {
		return nil, err
	}
	if cfg.Dim > 0 && cfg.Dim != mc.EmbDim {
		// Only the tables matter here; keep the config valid (DLRM's
		// bottom MLP ends in the embedding width).
		mc.EmbDim = cfg.Dim
		if n := len(mc.Bottom); n > 0 {
			mc.Bottom = append(append([]int(nil), mc.Bottom[:n-1]...), cfg.Dim)
		}
	}
	if err := fits(cfg, mc.TableRows, mc.EmbDim, memlimit.Read().Effective()); err != nil {
		return nil, err
	}
	// The table sizes are in the name: a --work folder kept from a run
	// with other --max-rows or --rows-scale then gets a plan and a model
	// of its own in the store instead of reusing tables of other sizes.
	name := fmt.Sprintf("%s-d%d-%s-r%08x", cfg.Model, mc.EmbDim, cfg.DType, rowsHash(mc.TableRows))
	e := &Env{Cfg: cfg, Name: name, Rows: mc.TableRows, Dim: mc.EmbDim, Plan: filepath.Join(cfg.Dir, "plan-"+name)}
	_, statErr := os.Stat(filepath.Join(e.Plan, plan.File))
	if !cfg.NoTables || statErr != nil {
		cfg.Log("building %s tables: %d tables, dim %d", cfg.Model, mc.NumTables(), mc.EmbDim)
		m, err := models.New(mc, 1)
		if err != nil {
			return nil, err
		}
		e.Tables = m.Tables
		if err := e.writePlan(); err != nil {
			return nil, err
		}
		if cfg.NoTables {
			e.Tables = nil
			runtime.GC()
			debug.FreeOSMemory()
		}
	}
	e.IO = &IOStats{}
	s, err := store.Open(filepath.Join(cfg.Dir, "db"), &store.Options{FS: timedFS{vfs.Default, e.IO}, HotBytes: cfg.HotBytes, CacheBytes: cfg.CacheBytes,
		NoSync: true, Preload: store.PreloadOff, MissParallel: cfg.MissParallel})
	if err != nil {
		return nil, err
	}
	e.Store = s
	if _, err := s.Tables(name); err != nil {
		cfg.Log("ingesting %s", e.Plan)
		e.Ingest, err = s.Ingest(context.Background(), e.Plan, store.IngestOptions{Model: name, DType: cfg.DType})
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	return e, nil
}

// rowsHash is FNV-1a over the tables' row counts.
func rowsHash(rows []int64) uint32 {
	h := fnv.New32a()
	var b [8]byte
	for _, r := range rows {
		binary.LittleEndian.PutUint64(b[:], uint64(r))
		h.Write(b[:])
	}
	return h.Sum32()
}

// Close closes the store.
func (e *Env) Close() error { return e.Store.Close() }

func (e *Env) writePlan() error {
	if _, err := os.Stat(filepath.Join(e.Plan, plan.File)); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(e.Plan, "tables"), 0o755); err != nil {
		return err
	}
	pl := &plan.Plan{Version: plan.Version, Model: plan.ModelInfo{Name: e.Name}, DenseModel: "dense.onnx",
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}}}
	for k, t := range e.Tables {
		pl.Inputs = append(pl.Inputs, plan.TensorInfo{Name: models.SparseInput(k), DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}})
		tn := models.TableName(k)
		file := tablefile.FileName(tn)
		meta, err := tablefile.Write(filepath.Join(e.Plan, file), tn, e.Dim, t, nil)
		if err != nil {
			return err
		}
		pl.Tables = append(pl.Tables, plan.Table{Name: tn, File: file, Rows: meta.Rows, Dim: meta.Dim, DType: "float32", SHA256: meta.SHA256,
			Lookups: []plan.Lookup{{Input: models.SparseInput(k), Bag: 1, Rank1: true, Pooling: plan.PoolSum, Output: tn + "_pooled"}}})
	}
	return plan.Write(e.Plan, pl)
}

// Batches draws n batches of ids: [batch][table][]id, Zipf(s) per table
// with the hot ids scattered over the table.
func (e *Env) Batches(n int, s float64, seed uint64) ([][][]int64, error) {
	r := rand.New(rand.NewPCG(seed, 99))
	zs := make([]*models.Zipf, len(e.Rows))
	mult := make([]int64, len(e.Rows))
	for k, rows := range e.Rows {
		z, err := models.NewZipf(r, s, rows)
		if err != nil {
			return nil, err
		}
		zs[k] = z
		mult[k] = 1
		for _, p := range []int64{1_000_003, 999_983, 998_111} {
			if gcd(p, rows) == 1 {
				mult[k] = p
				break
			}
		}
	}
	out := make([][][]int64, n)
	for b := range out {
		out[b] = make([][]int64, len(e.Rows))
		for k := range e.Rows {
			ids := make([]int64, e.Cfg.Batch)
			for i := range ids {
				rank := zs[k].Rank() - 1
				ids[i] = int64((uint64(rank) * uint64(mult[k])) % uint64(e.Rows[k]))
			}
			out[b][k] = ids
		}
	}
	return out, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Result is one measured path.
type Result struct {
	Name      string
	Rows      int64
	Elapsed   time.Duration
	Latencies []time.Duration // per batch
}

// RowsPerSec is ids resolved per second.
func (r Result) RowsPerSec() float64 { return float64(r.Rows) / r.Elapsed.Seconds() }

// Quantile is the q-quantile of the batch latencies by nearest rank
// (the ceil(q*n)-th smallest, as loadgen's histograms give it: the p99
// of 100 batches is the 99th, not the slowest).
func (r Result) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	l := slices.Clone(r.Latencies)
	slices.Sort(l)
	i := int(math.Ceil(q*float64(len(l)))) - 1
	return l[min(len(l)-1, max(0, i))]
}

func (r Result) String() string {
	return fmt.Sprintf("%-28s %8.2f M rows/s  p50 %8s  p99 %8s", r.Name, r.RowsPerSec()/1e6, r.Quantile(0.5).Round(time.Microsecond), r.Quantile(0.99).Round(time.Microsecond))
}

// RawGather is the limit: copy each id's row from the flat table into a
// batch x dim output, table by table.
func (e *Env) RawGather(batches [][][]int64) Result {
	out := make([][]float32, len(e.Tables))
	for k := range out {
		out[k] = make([]float32, e.Cfg.Batch*e.Dim)
	}
	dim := e.Dim
	res := Result{Name: "raw gather (flat []float32)"}
	start := time.Now()
	for _, b := range batches {
		t0 := time.Now()
		for k, ids := range b {
			t, o := e.Tables[k], out[k]
			for i, id := range ids {
				copy(o[i*dim:(i+1)*dim], t[id*int64(dim):(id+1)*int64(dim)])
			}
			res.Rows += int64(len(ids))
		}
		res.Latencies = append(res.Latencies, time.Since(t0))
	}
	res.Elapsed = time.Since(start)
	return res
}

// StoreLookup runs the batches through Store.Lookup (sum pooling, bag 1).
func (e *Env) StoreLookup(name string, batches [][][]int64) (Result, error) {
	req := make([]store.TableLookup, len(e.Rows))
	for k := range req {
		req[k] = store.TableLookup{Table: models.TableName(k), Pooling: store.PoolSum, Out: make([]float32, e.Cfg.Batch*e.Dim)}
	}
	res := Result{Name: name}
	start := time.Now()
	for _, b := range batches {
		t0 := time.Now()
		for k, ids := range b {
			req[k].IDs = ids
			res.Rows += int64(len(ids))
		}
		if err := e.Store.Lookup(e.Name, req); err != nil {
			return res, err
		}
		res.Latencies = append(res.Latencies, time.Since(t0))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}
