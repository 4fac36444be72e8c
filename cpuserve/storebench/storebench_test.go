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
