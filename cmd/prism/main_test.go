package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-serve/prism/internal/shareddata"
)

// The tests run the real binary, as a user does.
//
// The end-to-end tests (and the subtests of a table whose cases each
// start a stack of their own) call t.Parallel: they spend their time
// waiting on heartbeats, ready lines, update windows and timed windows,
// not computing, so go test runs -parallel of them at once (GOMAXPROCS
// by default: 2 on a 2-core CI machine), which cuts the package's time
// there by about a third. Each keeps to its own t.TempDir, ports the
// kernel picks (127.0.0.1:0) and network namespaces of random names. A
// test that sets the environment (t.Setenv) or needs the machine to
// itself (TestLateWorkerKeepsCalls) stays sequential: the sequential
// ones run first, alone.
var prismBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "prism-bin")
	if err != nil {
		panic(err)
	}
	prismBin = filepath.Join(dir, "prism")
	// PRISM_TEST_BIN runs the tests against a binary built elsewhere
	// (go test -c carried to a machine without Go, such as a GPU host).
	if bin := os.Getenv("PRISM_TEST_BIN"); bin != "" {
		prismBin = bin
	} else if out, err := exec.Command("go", "build", "-o", prismBin, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(prismBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestModelsListAndBuildAndScore(t *testing.T) {
	out, err := run(t, nil, "models", "list")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, name := range []string{"dlrm-tiny", "dlrm-kaggle", "dlrm-terabyte", "dcnv2-mlperf", "dcnv2-tiny", "deepfm-tiny", "540.68M"} {
		if !strings.Contains(out, name) {
			t.Errorf("models list lacks %q:\n%s", name, out)
		}
	}
	dir := t.TempDir()
	if out, err := run(t, nil, "models", "build", "dcnv2-tiny", "-o", dir, "--seed", "3"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	model := filepath.Join(dir, "model.onnx")
	scores := filepath.Join(dir, "scores.txt")
	out, err = run(t, nil, "score", model, "--samples", "100", "--batch", "32", "--scores-out", scores)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(out, "scored 100 samples in 4 batches") {
		t.Errorf("unexpected summary:\n%s", out)
	}
	b, _ := os.ReadFile(scores)
	if n := strings.Count(string(b), "\n"); n != 100 {
		t.Errorf("%d scores written, want 100", n)
	}
	// The Criteo sample, when present.
	if criteo, err := shareddata.Path("criteo/criteo_sample.txt"); err == nil {
		out, err = run(t, nil, "score", model, "--criteo", criteo)
		if err != nil || !strings.Contains(out, "scored 200 samples") || !strings.Contains(out, "label") {
			t.Errorf("criteo scoring: %v\n%s", err, out)
		}
	}
}

// TestErrorsAreOneLine: bad input gets one clear line and exit status 1,
// never a Go or cgo stack trace.
func TestErrorsAreOneLine(t *testing.T) {
	dir := t.TempDir()
	notONNX := filepath.Join(dir, "notes.onnx")
	os.WriteFile(notONNX, []byte("hello"), 0o644)
	good := filepath.Join(dir, "m")
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", good); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no library", []string{"ORT_LIB=" + filepath.Join(dir, "missing.so")}, []string{"score", filepath.Join(good, "model.onnx")}, "make setup"},
		{"not onnx", nil, []string{"score", notONNX}, "notes.onnx"},
		{"missing model", nil, []string{"score", filepath.Join(dir, "nope.onnx")}, "nope.onnx"},
		{"bad batch", nil, []string{"score", filepath.Join(good, "model.onnx"), "--batch", "0"}, "--batch must be positive"},
		{"score negative warm-up", nil, []string{"score", filepath.Join(good, "model.onnx"), "--warmup", "-1"}, "--warmup -1: want 0 or more"},
		{"score negative show", nil, []string{"score", filepath.Join(good, "model.onnx"), "--show", "-2"}, "--show -2: want 0 or more"},
		{"unknown model", nil, []string{"models", "build", "bert", "-o", dir}, `unknown model "bert"`},
		{"bad scale", nil, []string{"models", "build", "dlrm-tiny", "-o", dir, "--rows-scale", "-2"}, "rows-scale"},
		{"no -o", nil, []string{"models", "build", "dlrm-tiny"}, "-o DIR is required"},
		{"criteo missing", nil, []string{"score", filepath.Join(good, "model.onnx"), "--criteo", filepath.Join(dir, "c.txt")}, "c.txt"},
		// The memory budget (membudget.go).
		{"hot tier over the memory limit", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--memory-limit", "512MiB", "--hot-bytes", "1GiB"}, "at most 224MiB"},
		{"memory limit too small", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--memory-limit", "100MiB"}, "raise the limit"},
		{"bad memory limit", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--memory-limit", "lots"}, `--memory-limit: "lots" is not a size`},
		{"bad up memory limit", nil, []string{"up", "--model", good, "--memory-limit", "-1"}, "--memory-limit"},
		// A numeric flag says what it wants, not strconv's message.
		{"seed not a number", nil, []string{"models", "build", "dlrm-tiny", "-o", dir, "--seed", "abc"}, `--seed "abc": want a whole number, 0 or more`},
		{"seed out of range", nil, []string{"models", "build", "dlrm-tiny", "-o", dir, "--seed", "99999999999999999999"}, `--seed "99999999999999999999": out of range for a flag of type uint64`},
		{"workers not whole", nil, []string{"up", "--model", good, "--dense-workers", "1.5"}, `--dense-workers "1.5": want a whole number`},
		{"rate not a number", nil, []string{"loadgen", "--model", "dlrm-tiny", "--rate", "fast"}, `--rate "fast": want a number`},
		{"up with one certificate", nil, []string{"up", "--model", good, "--tls-cert", "a.pem"}, "unknown flag: --tls-cert (prism up runs every role and takes a folder of their certificates: --certs DIR"},
		{"up micro-batch 0", nil, []string{"up", "--model", good, "--micro-batch", "0"}, "--micro-batch 0: want a positive value"},
		{"up ready-timeout 0", nil, []string{"up", "--model", good, "--ready-timeout", "0"}, "--ready-timeout 0s: want a positive value"},
		{"tune steps 0", nil, []string{"tune", "--model", good, "--steps", "0"}, "--steps 0: want a positive value"},
		{"bool not a bool", nil, []string{"up", "--model", good, "--insecure=maybe"}, `--insecure "maybe": want true or false`},
		{"tune negative threshold", nil, []string{"tune", "--model", good, "--threshold", "-1"}, "--threshold -1: want a positive value"},
		{"tune negative max trials", nil, []string{"tune", "--model", good, "--max-trials", "-2"}, "--max-trials -2: want 0 or more"},
		{"versions two actions", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--activate", "1", "--drop", "3"}, "give at most one of --activate N, --rollback and --drop N"},
		// A version that is not a whole number switched to the number
		// it began with (2.9: version 2), and an empty one did nothing.
		{"versions activate not whole", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--activate", "2.9"}, `--activate "2.9": want a whole number`},
		{"versions activate trailing text", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--activate", "1abc"}, `--activate "1abc": want a whole number`},
		{"versions activate empty", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--activate", ""}, `--activate "": want a whole number`},
		{"versions activate 0", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--activate", "0"}, "--activate 0: want a version number, 1 or more"},
		// Under 1 MiB the router's own check failed, and the command
		// pointed at --update-log-dir.
		{"router message limit under 1 MiB", nil, []string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--max-message-bytes", "100"}, "--max-message-bytes 100: want at least 1048576 (1 MiB)"},
		{"versions drop 0", nil, []string{"store", "versions", "m", "--db", filepath.Join(dir, "db"), "--drop", "0"}, "--drop 0: want a version number, 1 or more"},
		{"store bench negative batch", nil, []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--batch", "-5"}, "--batch -5: want a positive value"},
		// Values the tier took for its default, and errors that did not
		// name their flag.
		{"dense negative max-queue", nil, []string{"serve", "dense", "--insecure", "--plan", good, "--max-queue", "-1"}, "--max-queue -1: want 0 or more"},
		{"dense message limit 0", nil, []string{"serve", "dense", "--insecure", "--plan", good, "--max-message-bytes", "0"}, "--max-message-bytes 0: want a positive value"},
		{"dense too many sessions", nil, []string{"serve", "dense", "--insecure", "--plan", good, "--sessions", "100"}, "--sessions 100: want 1 to 64 per model"},
		{"dense shutdown-grace 0", nil, []string{"serve", "dense", "--insecure", "--plan", good, "--shutdown-grace", "0"}, "--shutdown-grace 0s: want a positive value"},
		{"embedding negative shutdown-grace", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--shutdown-grace", "-1s"}, "--shutdown-grace -1s: want a positive value"},
		{"dense unknown across-models", nil, []string{"serve", "dense", "--insecure", "--plan", good, "--across-models", "maybe"}, `--across-models "maybe": want on or off`},
		{"embedding negative warm-snapshot-every", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--warm-snapshot-every", "-1s"}, "--warm-snapshot-every -1s: want 0 or more"},
		{"embedding unknown preload", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--preload", "foo"}, `--preload "foo": want auto, on or off`},
		{"embedding miss-parallel over 64", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--miss-parallel", "100"}, "--miss-parallel 100: want 1 to 64 (0: 4)"},
		{"embedding negative miss-parallel", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--miss-parallel", "-1"}, "--miss-parallel -1: want 1 to 64 (0: 4)"},
		{"embedding negative threads", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--threads", "-1"}, "--threads -1: want 0 or more"},
		{"partition verify with report-only", nil, []string{"partition", filepath.Join(good, "model.onnx"), "--report-only", "--verify", "10"}, "--verify checks the written partition: not with --report-only"},
		{"certs validity 0", nil, []string{"certs", "init", filepath.Join(dir, "certs"), "--validity", "0"}, "--validity 0s: want a positive value"},
		{"ingest hot-bytes 0", nil, []string{"ingest", good, "--db", filepath.Join(dir, "db"), "--hot-bytes", "0MiB"}, "--hot-bytes 0MiB: want a positive size"},
		{"embedding cache-bytes 0", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--cache-bytes", "0"}, "--cache-bytes 0: want a positive size"},
		{"store bench cache-bytes 0", nil, []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--cache-bytes", "0"}, "--cache-bytes 0: want a positive size"},
		{"embedding hot-bytes 0", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--hot-bytes", "0"}, `--hot-bytes: "0": want a positive size (a negative one disables the hot tier)`},
		{"embedding hot-bytes not a negative size", nil, []string{"serve", "embedding", "--insecure", "--db", filepath.Join(dir, "db"), "--plan", good, "--hot-bytes", "-lots"}, `--hot-bytes: "-lots" is not a size`},
		{"ingest sst-bytes 0", nil, []string{"ingest", good, "--db", filepath.Join(dir, "db"), "--sst-bytes", "0"}, "--sst-bytes 0: want a positive size"},
		{"shard infinite tolerance", nil, []string{"shard", good, "--shards", "2", "--tolerance", "+Inf"}, "--tolerance +Inf: want a finite number"},
		{"store bench miss-parallel over 64", nil, []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--miss-parallel", "65"}, "--miss-parallel 65: want 1 to 64 (0: 4)"},
		{"store bench negative warm-up", nil, []string{"store", "bench", "--model", "dlrm-tiny", "--work", filepath.Join(dir, "sb"), "--warmup", "-10"}, "--warmup -10: want 0 or more"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.env, tc.args...)
			if err == nil {
				t.Fatalf("no error:\n%s", out)
			}
			if code := err.(*exec.ExitError).ExitCode(); code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "prism: ") || !strings.Contains(last, tc.want) {
				t.Errorf("last line %q, want a 'prism: ' line containing %q", last, tc.want)
			}
			if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") || strings.Contains(out, "SIGSEGV") {
				t.Errorf("stack trace in output:\n%s", out)
			}
		})
	}
}

func TestPartitionCommand(t *testing.T) {
	dir := t.TempDir()
	if out, err := run(t, nil, "models", "build", "dcnv2-tiny", "-o", filepath.Join(dir, "m"), "--external-data"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	model := filepath.Join(dir, "m", "model.onnx")
	part := filepath.Join(dir, "part")
	out, err := run(t, nil, "partition", model, "-o", part, "--verify", "100")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"cut: 27 tensors", "tables: 26", "verified on 100 samples"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"plan.json", "dense.onnx", "tables/emb_l.0.weight.arrow"} {
		if _, err := os.Stat(filepath.Join(part, f)); err != nil {
			t.Error(err)
		}
	}
	// Again into the same folder: refused without --overwrite.
	out, err = run(t, nil, "partition", model, "-o", part)
	if err == nil || !strings.Contains(out, "--overwrite") {
		t.Errorf("second partition into a full folder: %v\n%s", err, out)
	}
	out, err = run(t, nil, "partition", model, "--report-only")
	if err != nil || !strings.Contains(out, "dense side (dense.onnx)") {
		t.Errorf("--report-only: %v\n%s", err, out)
	}
	out, err = run(t, nil, "partition", model)
	if err == nil || !strings.Contains(out, "-o OUT is required") {
		t.Errorf("no -o: %v\n%s", err, out)
	}
	for args, want := range map[string]string{
		"--net-gbps 0":      "--net-gbps 0: want a positive value",
		"--gpu-launch-us 0": "--gpu-launch-us 0: want a positive value",
		"--batch -1":        "--batch -1: want a positive value",
		"--force-cpu /Relu_1 --force-gpu /Relu_1": `node "/Relu_1" is in both --force-cpu and --force-gpu`,
	} {
		out, err := run(t, nil, append([]string{"partition", model, "--report-only"}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("partition %s: %v\n%s\nwant %q", args, err, out, want)
		}
	}
}

// TestBadInputFailsFast: input a command can judge at once is refused
// at once, with a message that names what is wrong, before any work
// (store bench built and ingested gigabytes of tables before it read
// its --scenario: its --work folder is not even made).
func TestBadInputFailsFast(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	for _, tc := range []struct {
		args []string
		want string
		not  string // nor this in the output
	}{
		{args: []string{"store", "bench", "--work", work, "--scenario", "foo"}, want: `scenario "foo": want gather, redis, ltm, preload, misses or setup`},
		{args: []string{"shard", t.TempDir()}, want: `required flag(s) "shards" not set`},
		{args: []string{"loan"}, want: `required flag(s) "lender" not set`},
		// Outside a cluster without a kubeconfig: one line saying so, not
		// client-go's warnings and its hint about KUBERNETES_MASTER.
		{args: []string{"loan", "--lender", "kubernetes:max=2,template=d,pool=a=b,priority-class=p", "--router", "127.0.0.1:1", "--router-metrics", "http://127.0.0.1:1/metrics", "--insecure"},
			want: "not in a cluster", not: "KUBERNETES_MASTER"},
	} {
		out, err := run(t, []string{"KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT="}, tc.args...)
		if err == nil || !strings.Contains(out, tc.want) || tc.not != "" && strings.Contains(out, tc.not) {
			t.Errorf("prism %s: %v\n%s\nwant an error with %q (and without %q)", strings.Join(tc.args, " "), err, out, tc.want, tc.not)
		}
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("store bench with an unknown scenario made its --work folder: %v", err)
	}
	// An ingest refused for its input leaves no empty store in the
	// folder it made.
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "new-db")
	if out, err := run(t, nil, "ingest", part, "--db", db, "--shard", "0"); err == nil || !strings.Contains(out, "no sharding section") {
		t.Errorf("ingest --shard of an unsharded plan: %v\n%s", err, out)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("the refused ingest left its --db folder: %v", err)
	}
	if out, err := run(t, nil, "ingest", filepath.Join(dir, "nope"), "--db", db); err == nil || !strings.Contains(out, "plan.json") {
		t.Errorf("ingest of a missing plan folder: %v\n%s", err, out)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("the ingest of a missing plan left its --db folder: %v", err)
	}
}

// TestIngestIfChanged: prism ingest --if-changed leaves a store holding
// the plan as it is, and ingests it again when --dtype asks for another
// stored dtype than the store holds (before, the dtype was not compared
// and a store kept float32 rows though the chart asked for int8).
func TestIngestIfChanged(t *testing.T) {
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	versions := func() string {
		t.Helper()
		out, err := run(t, nil, "store", "versions", "dlrm-tiny", "--db", db)
		if err != nil {
			t.Fatalf("store versions: %v\n%s", err, out)
		}
		return out
	}
	for i, tc := range []struct {
		args     []string
		left     bool // "left as it is"
		versions int
	}{
		{[]string{"--if-changed"}, false, 1},
		{[]string{"--if-changed"}, true, 1},
		{[]string{"--if-changed", "--dtype", "float32", "--hot-bytes", "8MiB"}, true, 1},
		{[]string{"--if-changed", "--dtype", "int8"}, false, 2},
		{[]string{"--if-changed", "--dtype", "int8"}, true, 2},
		{[]string{"--if-changed"}, true, 2},
	} {
		out, err := run(t, nil, append([]string{"ingest", part, "--db", db}, tc.args...)...)
		if err != nil {
			t.Fatalf("%d: ingest %v: %v\n%s", i, tc.args, err, out)
		}
		if left := strings.Contains(out, "left as it is"); left != tc.left {
			t.Errorf("%d: ingest %v: left as it is %v, want %v\n%s", i, tc.args, left, tc.left, out)
		}
		vs := versions()
		if n := strings.Count(vs, "\n"); n != tc.versions {
			t.Errorf("%d: after ingest %v: %d versions, want %d\n%s", i, tc.args, n, tc.versions, vs)
		}
	}
}

// TestIngestKeepVersions: prism ingest --keep-versions N drops the
// model's versions older than the newest N after the ingest, never the
// active one nor the one a rollback returns to; without it every
// ingest of a retrained model (here: another stored dtype) kept a whole
// version until dropped by hand.
func TestIngestKeepVersions(t *testing.T) {
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	for i, tc := range []struct {
		args    []string
		want    []string // versions left, as prism store versions prints their numbers
		dropped string
	}{
		{[]string{"--dtype", "float32"}, []string{"1"}, ""},
		{[]string{"--dtype", "int8"}, []string{"1", "2"}, ""},
		{[]string{"--dtype", "float16", "--keep-versions", "2"}, []string{"2", "3"}, "dropped version 1"},
		// The newest alone, but the previous one (rollback's) stays.
		{[]string{"--dtype", "emb_l.0.weight=int8", "--keep-versions", "1"}, []string{"3", "4"}, "dropped version 2"},
		{[]string{"--keep-versions", "-1"}, nil, "--keep-versions -1: want 0"},
	} {
		out, err := run(t, nil, append([]string{"ingest", part, "--db", db}, tc.args...)...)
		if tc.want == nil {
			if err == nil || !strings.Contains(out, tc.dropped) {
				t.Errorf("%d: ingest %v: %v, want an error with %q\n%s", i, tc.args, err, tc.dropped, out)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d: ingest %v: %v\n%s", i, tc.args, err, out)
		}
		if tc.dropped != "" && !strings.Contains(out, tc.dropped) {
			t.Errorf("%d: ingest %v does not say %q:\n%s", i, tc.args, tc.dropped, out)
		}
		vs, err := run(t, nil, "store", "versions", "dlrm-tiny", "--db", db)
		if err != nil {
			t.Fatalf("store versions: %v\n%s", err, vs)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(vs), "\n") {
			// "*   3  26 tables ...": a mark (* active, < rollback's) or
			// none, then the version's number.
			f := strings.Fields(strings.TrimLeft(line, "*< "))
			if len(f) > 0 {
				got = append(got, f[0])
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%d: after ingest %v: versions %v, want %v\n%s", i, tc.args, got, tc.want, vs)
		}
	}
}
