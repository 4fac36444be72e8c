package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAbsurdFlagValuesRefused: a value a typo makes absurd (extra
// digits, a malformed address) is refused at startup with one line
// naming the flag, exit status 1, before the process allocates, spawns
// or serves anything: no panic, no hang, no worker that serves and then
// misbehaves.
func TestAbsurdFlagValuesRefused(t *testing.T) {
	dir := t.TempDir()
	model, part := filepath.Join(dir, "m"), filepath.Join(dir, "p")
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", model); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := run(t, nil, "partition", filepath.Join(model, "model.onnx"), "-o", part); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	dense := []string{"serve", "dense", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--plan", part}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// The warm-up run allocated the batch: makeslice panicked past
		// int64, and below it the OOM killer came.
		{"dense max-batch past int64", append(dense, "--max-batch", "9223372036854775807"), "--max-batch 9223372036854775807: load " + part + `: model "dlrm-tiny": a batch of 9223372036854775807 samples`},
		{"dense max-batch 1e12", append(dense, "--max-batch", "1000000000000"), "of memory this process may use: want at most"},
		// Ten thousand ONNX Runtime threads on a 2-core machine: the
		// worker served, and after SIGTERM spun at 194% CPU for 12
		// minutes until killed.
		{"dense threads", append(dense, "--threads", "100000"), "--threads 100000: want at most"},
		{"embedding threads", []string{"serve", "embedding", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--plan", part, "--db", filepath.Join(dir, "db"), "--threads", "100000"}, "--threads 100000: want at most"},
		{"score threads", []string{"score", filepath.Join(model, "model.onnx"), "--threads", "100000"}, "--threads 100000: want at most"},
		{"up threads", []string{"up", "--insecure", "--model", part, "--threads", "100000"}, "--threads 100000: want at most"},
		{"tune threads", []string{"tune", "--insecure", "--model", part, "--threads", "1,100000"}, "--threads 100000: want at most"},
		// An empty address was taken for the default (127.0.0.1:0): a
		// port nobody asked for.
		{"router addr empty", []string{"serve", "router", "--insecure", "--addr", "", "--metrics-addr", "off"}, "--addr '': want HOST:PORT"},
		{"router http-addr port past 65535", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--http-addr", "127.0.0.1:99999"}, `port "99999" is not a number`},
		{"embedding metrics-addr empty", []string{"serve", "embedding", "--insecure", "--metrics-addr", "", "--plan", part, "--db", filepath.Join(dir, "db")}, "--metrics-addr '': want HOST:PORT"},
		{"dense addr empty", append(dense, "--addr", ""), "--addr '': want HOST:PORT"},
		{"up addr empty", []string{"up", "--insecure", "--model", part, "--addr", ""}, "--addr '': want HOST:PORT"},
		// The router served, warned every second that it could not
		// reach its sequencer, and forwarded updates there.
		{"router sequencer without a port", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--sequencer", "10xb"}, `--sequencer "10xb": want HOST:PORT`},
		{"router sequencer unbracketed IPv6", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--sequencer", "fd00::5:8500"}, `--sequencer "fd00::5:8500": want HOST:PORT`},
		{"router sequencer is itself", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:18577", "--metrics-addr", "off", "--sequencer", "127.0.0.1:18577"}, "--sequencer 127.0.0.1:18577 is this router's own --addr"},
		// Without a memory budget (no cgroup) the hot tier and the block
		// cache took any size, bounds they would grow to.
		{"embedding hot-bytes past memory", []string{"serve", "embedding", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--plan", part, "--db", filepath.Join(dir, "db"), "--memory-limit", "off", "--hot-bytes", "1e18"}, "--hot-bytes 1e18: 931322574.6GiB, more than this machine"},
		{"embedding cache-bytes past memory", []string{"serve", "embedding", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--plan", part, "--db", filepath.Join(dir, "db"), "--memory-limit", "off", "--cache-bytes", "1e18"}, "--cache-bytes 1e18: 931322574.6GiB, more than this machine"},
		// The planner said "shards 0, want at least 1"; ingest compared
		// the 0 with the plan's count and advised prism shard --shards 0.
		{"shard shards 0", []string{"shard", part, "--shards", "0"}, "--shards 0: want 1 to 4096"},
		{"shard shards past the most", []string{"shard", part, "--shards", "5000"}, "--shards 5000: want 1 to 4096"},
		{"ingest shards 0", []string{"ingest", part, "--db", filepath.Join(dir, "db"), "--shard", "0", "--shards", "0"}, "--shards 0: want 1 to 4096"},
		// Written, and expired before any tier read them.
		{"certs validity 1ns", []string{"certs", "init", filepath.Join(dir, "certs"), "--validity", "1ns"}, "--validity 1ns: want at least 1h"},
		// A local loan's slots are dense worker processes on this
		// machine; its addr failed only once the tiers had started.
		{"up local loan max", []string{"up", "--insecure", "--model", filepath.Join(dir, "none"), "--loan", "local:max=99999999999"}, "max=99999999999: want at most"},
		{"up local loan addr", []string{"up", "--insecure", "--model", filepath.Join(dir, "none"), "--loan", "local:max=2,addr=10xb"}, `addr: "10xb": want HOST:PORT`},
		// "fatal error: runtime: out of memory", exit status 2, and a
		// stack trace.
		{"store bench batch", []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--batch", "1000000000000"}, "--batch 1000000000000 over --batches 2000"},
		{"store bench dim", []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--dim", "1000000000"}, "--dim 1000000000: the 26 tables'"},
		// Past int64 rows: "panic: makeslice: len out of range"; past it
		// the preset was built as it is, silently.
		{"models build rows-scale 1e12", []string{"models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "big"), "--rows-scale", "1e12"}, "lower --rows-scale or --max-rows"},
		{"models build rows-scale 1e18", []string{"models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "big"), "--rows-scale", "1e18"}, "rows-scale 1e+18 gives table 0"},
		// "fatal error: runtime: out of memory", exit status 2.
		{"score samples", []string{"score", filepath.Join(model, "model.onnx"), "--samples", "1000000000000"}, "--samples 1000000000000: drawn at once"},
		// Addresses without a port: refused, but the errors named no
		// flag ("router address "10xb": want HOST:PORT", "listen 10xb").
		{"dense router without a port", append(dense, "--router", "10xb"), `--router "10xb": address "10xb": want HOST:PORT`},
		{"router addr without a port", []string{"serve", "router", "--insecure", "--addr", "10xb", "--metrics-addr", "off"}, "--addr 10xb: want HOST:PORT (address 10xb: missing port in address)"},
		{"router http-addr without a port", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--http-addr", "10xb"}, "--http-addr 10xb: want HOST:PORT (address 10xb: missing port in address)"},
		{"dense metrics-addr without a port", []string{"serve", "dense", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "1.5.2", "--plan", part}, "--metrics-addr 1.5.2: want HOST:PORT (address 1.5.2: missing port in address)"},
		// Refused, naming no flag: "candidates "0": ...", "clients must
		// not be negative", "the run needs a positive request cap".
		{"loadgen candidates 0", []string{"loadgen", "--fake", "--model", "dlrm-tiny", "--duration", "1s", "--candidates", "0"}, `--candidates "0": want a positive count`},
		{"loadgen negative clients", []string{"loadgen", "--fake", "--model", "dlrm-tiny", "--duration", "1s", "--clients", "-1"}, "--clients -1: want 0 or more"},
		{"loadgen max-requests 0", []string{"loadgen", "--fake", "--model", "dlrm-tiny", "--duration", "1s", "--max-requests", "0"}, "--max-requests 0: want a positive value"},
		// "costs too large to solve exactly", naming no flag.
		{"partition launch 1e18", []string{"partition", filepath.Join(model, "model.onnx"), "--report-only", "--gpu-launch-us", "1e18"}, "costs too large to solve exactly (check the cost model: --net-gbps"},
		{"router advertise-addr without a port", []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--metrics-addr", "off", "--sequencer-lease", "ns/lease", "--kubeconfig", filepath.Join(dir, "none"), "--advertise-addr", "10xb"}, `--advertise-addr "10xb": want HOST:PORT`},
		// As many processes as asked for (not run before the fix).
		{"up dense workers", []string{"up", "--insecure", "--model", part, "--dense-workers", "100000"}, "--dense-workers 100000: want at most"},
		{"up embedding workers", []string{"up", "--insecure", "--model", part, "--embedding-workers", "100000"}, "--embedding-workers 100000: want at most"},
		{"up replicas", []string{"up", "--insecure", "--model", part, "--replicas", "100000"}, "--replicas 100000: want at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, prismBin, tc.args...).CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("prism %s still running after 30s (took the value and served):\n%s", strings.Join(tc.args, " "), out)
			}
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 {
				t.Fatalf("prism %s: %v, want exit status 1:\n%s", strings.Join(tc.args, " "), err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, "prism: ") || !strings.Contains(last, tc.want) {
				t.Errorf("last line %q, want a 'prism: ' line containing %q", last, tc.want)
			}
			if s := string(out); strings.Contains(s, "goroutine ") || strings.Contains(s, "panic") {
				t.Errorf("stack trace in output:\n%s", s)
			}
		})
	}
}

// TestShardImbalanceWarned: a sharding past its --tolerance (1000
// shards of dlrm-tiny's 14,300 rows) is written but warned of, naming
// the busiest shard's share; a balanced one is not.
func TestShardImbalanceWarned(t *testing.T) {
	dir := t.TempDir()
	model, part := filepath.Join(dir, "m"), filepath.Join(dir, "p")
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", model); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := run(t, nil, "partition", filepath.Join(model, "model.onnx"), "-o", part); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := run(t, nil, "shard", part, "--shards", "1000", "--zipf", "1.05")
	if err != nil || !strings.Contains(out, "warning: imbalance") || !strings.Contains(out, "fewer --shards") {
		t.Fatalf("1000 shards: %v, want a warning:\n%s", err, out)
	}
	out, err = run(t, nil, "shard", part, "--shards", "2", "--zipf", "1.05")
	if err != nil || strings.Contains(out, "warning: imbalance") {
		t.Fatalf("2 shards: %v, want no warning:\n%s", err, out)
	}
}
