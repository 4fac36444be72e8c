package storebench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/models"
)

// tiny sets up dlrm-tiny's tables (26 tables of 100-1000 rows) in a
// store under a test folder.
func tiny(t *testing.T, batches int) *Env {
	t.Helper()
	e, err := Setup(Config{Model: "dlrm-tiny", Batch: 32, Batches: batches, Warmup: 8, HotBytes: 8 << 20, CacheBytes: 8 << 20, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestRoundsHoldEveryBatch: the interleaved rounds measure every batch,
// in order, with fewer batches than rounds too (5 rounds of len/5
// measured none of 1-4 batches and dropped the rest of len/5).
func TestRoundsHoldEveryBatch(t *testing.T) {
	for n := 1; n <= 13; n++ {
		batches := make([][][]int64, n)
		for i := range batches {
			batches[i] = [][]int64{{int64(i)}}
		}
		parts := rounds(batches, 5)
		if len(parts) != min(n, 5) {
			t.Errorf("%d batches: %d rounds", n, len(parts))
		}
		next := int64(0)
		for _, p := range parts {
			if len(p) == 0 {
				t.Errorf("%d batches: an empty round", n)
			}
			for _, b := range p {
				if b[0][0] != next {
					t.Fatalf("%d batches: batch %d where %d was next", n, b[0][0], next)
				}
				next++
			}
		}
		if next != int64(n) {
			t.Errorf("%d batches: %d measured", n, next)
		}
	}
}

// TestGatherFewBatches: --batches below the 5 rounds still measures
// them; it printed NaN rows/s and a NaN hit ratio.
func TestGatherFewBatches(t *testing.T) {
	e := tiny(t, 3)
	var out bytes.Buffer
	if err := Run(&out, e, "gather", nil); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "NaN") || strings.Contains(s, " 0.00 M rows/s") {
		t.Fatalf("3 batches:\n%s", s)
	}
}

func TestStatCPU(t *testing.T) {
	for _, tc := range []struct {
		line string
		want time.Duration
		ok   bool
	}{
		{"4242 (redis-server) S 1 4242 4242 0 -1 4194560 312 0 0 0 150 37 0 0 20 0 5 0 123 10000 500 18446744073709551615\n", 1870 * time.Millisecond, true},
		// a name with spaces and a parenthesis of its own
		{"7 (a b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 9 1 1 1\n", 70 * time.Millisecond, true},
		{"7 (short) R 1 2 3\n", 0, false},
		{"garbage", 0, false},
	} {
		if got, ok := statCPU(tc.line); got != tc.want || ok != tc.ok {
			t.Errorf("statCPU(%q) = %v, %v; want %v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return
	}
	for t0 := time.Now(); time.Since(t0) < 100*time.Millisecond; {
	}
	if d, ok := processCPU(os.Getpid()); !ok || d <= 0 {
		t.Fatalf("processCPU(self) = %v, %v after 100 ms of work", d, ok)
	}
}

func needRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
}

// TestRedisScenario: the Redis comparison on tiny tables says how much
// of each store pass the hot tier answered and what CPU both sides
// spent, Redis's server included.
func TestRedisScenario(t *testing.T) {
	needRedis(t)
	e := tiny(t, 7)
	var out bytes.Buffer
	if err := Run(&out, e, "redis", nil); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if strings.Contains(s, "NaN") || strings.Count(s, "store hot hit ratio") != 2 || strings.Count(s, "+ redis-server ") != 2 {
		t.Fatalf("output:\n%s", s)
	}
	t.Log(s)
}

const holdRedisEnv = "STOREBENCH_HOLD_REDIS"

// TestMain: with holdRedisEnv set, the test binary starts redis-server,
// prints its pid and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv(holdRedisEnv) != "" {
		r, err := StartRedis()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(r.cmd.Process.Pid)
		select {}
	}
	os.Exit(m.Run())
}

// TestRedisDiesWithBenchmark: a benchmark killed (a script's timeout)
// takes its redis-server with it; the server ran on.
func TestRedisDiesWithBenchmark(t *testing.T) {
	needRedis(t)
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), holdRedisEnv+"=1", "TMPDIR="+t.TempDir()) // its server's folder
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the benchmark process: %q", line)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return // gone, or dead and not yet reaped by its new parent
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d still runs 5 s after its benchmark was killed", pid)
		}
	}
}

// TestWorkReusedForOtherRows: a --work folder kept from a run with other
// table sizes (--max-rows, --rows-scale) is not reused for this one: the
// store's tables have the rows this run draws ids for and gathers from.
// It reused the plan and store of the earlier run (same name): a larger
// run failed with "id out of range", a smaller one silently measured the
// old tables.
func TestWorkReusedForOtherRows(t *testing.T) {
	dir := t.TempDir()
	for _, maxRows := range []int64{50, 0, 50} {
		e, err := Setup(Config{Model: "dlrm-tiny", MaxRows: maxRows, Batch: 16, Batches: 4, Warmup: 2, HotBytes: 8 << 20, CacheBytes: 8 << 20, Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		tables, err := e.Store.Tables(e.Name)
		if err != nil {
			e.Close()
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, ti := range tables {
			got[ti.Name] = ti.Rows
		}
		for k, rows := range e.Rows {
			if n := got[models.TableName(k)]; n != rows {
				t.Errorf("max rows %d: table %d has %d rows in the store, the run draws ids for %d", maxRows, k, n, rows)
			}
		}
		var out bytes.Buffer
		if err := Run(&out, e, "gather", nil); err != nil {
			t.Errorf("max rows %d: %v", maxRows, err)
		}
		e.Close()
	}
}

// TestLTMBlockCacheSaid: the larger-than-memory scenarios say the block
// cache the store has, and the tables' ratio to the caches with it. The
// store sizes Pebble's cache --cache-bytes plus its two memtables, which
// a read-only run leaves empty: with --cache-bytes 1MiB the cache held
// all of these 12 MiB of tables while the report said "block cache 1
// MiB (tables are 4.2x)".
func TestLTMBlockCacheSaid(t *testing.T) {
	e, err := Setup(Config{Model: "dlrm-kaggle", MaxRows: 20000, Batch: 64, Batches: 50, Warmup: 50, HotBytes: 2 << 20, CacheBytes: 1 << 20, Dir: t.TempDir(), NoTables: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, scenario := range []string{"ltm", "misses"} {
		var out bytes.Buffer
		if err := Run(&out, e, scenario, []float64{0.9}); err != nil {
			t.Fatal(err)
		}
		var said int64
		s := out.String()
		if i := strings.Index(s, "block cache "); i < 0 {
			t.Fatalf("%s: no block cache said:\n%s", scenario, s)
		} else if _, err := fmt.Sscanf(s[i:], "block cache %d MiB", &said); err != nil {
			t.Fatalf("%s: %v:\n%s", scenario, err, s)
		}
		if held := e.Store.Metrics().BlockCacheBytes; held > said<<20 {
			t.Errorf("%s: the block cache holds %d MiB, the report says it has %d MiB:\n%s", scenario, held>>20, said, s)
		}
	}
}

// TestMissesDropsPageCachePerExponent: each --zipf exponent of the
// misses scenario starts from the device, its page cache dropped before
// its warm-up; it was dropped once, before the first, and the later
// exponents read what the earlier ones had left in the page cache.
func TestMissesDropsPageCachePerExponent(t *testing.T) {
	e := tiny(t, 5)
	var out bytes.Buffer
	if err := Run(&out, e, "misses", []float64{0.8, 1.2}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, z := range []string{"zipf 0.80", "zipf 1.20"} {
		i := strings.Index(s, "\n"+z+",")
		if i < 0 {
			t.Fatalf("no %s:\n%s", z, s)
		}
		before := s[:i]
		if j := strings.LastIndex(before, "dropped the page cache"); j < 0 || strings.Contains(before[j:], "| miss reads |") {
			t.Errorf("%s: its page cache not dropped before it:\n%s", z, s)
		}
	}
}

// TestMissSeedsApart: the misses scenario's measured draws never repeat
// a warm-up slice's (same exponent, same seed: the same ids, all
// resident), whatever --warmup.
func TestMissSeedsApart(t *testing.T) {
	const exponents, rounds, modes = 4, 5, 3
	measured := map[uint64]bool{}
	for zi := range exponents {
		for r := range rounds {
			for mi := range modes {
				measured[roundSeed(zi, r, mi)] = true
			}
		}
	}
	if len(measured) != exponents*rounds*modes {
		t.Fatalf("%d distinct round seeds, want %d", len(measured), exponents*rounds*modes)
	}
	for zi := range exponents {
		for i := range 200_000 {
			if measured[warmSeed(zi, i)] {
				t.Fatalf("exponent %d: the warm-up slice from batch %d has a measured round's seed %d", zi, i, warmSeed(zi, i))
			}
		}
	}
}
