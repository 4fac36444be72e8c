package up

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/supervise"
	"github.com/prism-serve/prism/plan"
)

func TestDenseWorkers(t *testing.T) {
	cpu := devices.Discovery{Devices: []devices.Device{{Kind: devices.KindCPU, Name: "cpu"}}, NoDriver: "no driver"}
	gpus := devices.Discovery{Devices: []devices.Device{{Kind: devices.KindGPU, Name: "a", UUID: "GPU-a"}, {Kind: devices.KindGPU, Name: "b", UUID: "GPU-b"}}}
	for _, tc := range []struct {
		name string
		disc devices.Discovery
		n    int
		want int
	}{
		{"no driver: one per cpu", cpu, 0, 4},
		{"no driver, asked for 2", cpu, 2, 2},
		{"two per gpu", gpus, 0, 4},
		{"more than the gpus", gpus, 5, 5},
		{"fewer than the gpus", gpus, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := DenseWorkers(tc.disc, tc.n, 4)
			if len(ws) != tc.want {
				t.Fatalf("%d workers, want %d", len(ws), tc.want)
			}
			// Extra workers share the devices round-robin.
			for i, w := range ws {
				if want := tc.disc.Devices[i%len(tc.disc.Devices)].Name; w.Device.Name != want {
					t.Errorf("worker %d on %s, want %s", i, w.Device.Name, want)
				}
			}
		})
	}
}

// TestChildrenDenseSessions: --dense-sessions and --dense-shared-arena
// reach the dense workers.
func TestChildrenDenseSessions(t *testing.T) {
	c := Config{Plans: []string{"p"}, DB: "db", EmbeddingWorkers: 1, Threads: 1, DenseSessions: 2, DenseSharedArena: true, MaxDelay: 2 * time.Millisecond, Certs: "certs"}
	kids := Children(c, "127.0.0.1:9", []devices.Worker{{}})
	if got := strings.Join(kids[0].Args, " "); !strings.Contains(got, " --sessions 2 ") || !strings.Contains(got, " --shared-arena ") {
		t.Fatalf("dense args %q lack --sessions 2 or --shared-arena", got)
	}
}

func TestChildren(t *testing.T) {
	c := Config{Plans: []string{"p1", "p2"}, DB: "db", EmbeddingWorkers: 2, Threads: 1, MaxBatch: 512, MaxDelay: 2 * time.Millisecond, HotBytes: "1GiB", Certs: "certs"}
	dense := []devices.Worker{{Env: []string{"CUDA_VISIBLE_DEVICES=GPU-a"}}}
	kids := Children(c, "127.0.0.1:9", dense)
	var names []string
	for _, k := range kids {
		names = append(names, k.Name)
	}
	if !slices.Equal(names, []string{"dense0", "embedding0", "embedding1"}) {
		t.Fatalf("children %v", names)
	}
	if got := strings.Join(kids[0].Args, " "); got != "serve dense --router 127.0.0.1:9 --threads 1 --max-batch 512 --max-delay 2ms --certs certs/dense --plan p1 --plan p2" {
		t.Errorf("dense args %q", got)
	}
	if !slices.Equal(kids[0].Env, dense[0].Env) {
		t.Errorf("dense env %v", kids[0].Env)
	}
	if got := strings.Join(kids[2].Args, " "); got != "serve embedding --router 127.0.0.1:9 --db db-1 --certs certs/embedding --plan p1 --plan p2 --hot-bytes 1GiB --dictionary-frames=false" {
		t.Errorf("second embedding args %q", got)
	}
	if got := strings.Join(tlsArgs(c, auth.Router), " "); got != "--certs certs/router" {
		t.Errorf("router TLS args %q", got)
	}
	// A folder of the old flat layout has no role folders: passed whole.
	flat := c
	flat.flatCerts = true
	if got := strings.Join(Children(flat, "127.0.0.1:9", dense)[1].Args, " "); got != "serve embedding --router 127.0.0.1:9 --db db --certs certs --plan p1 --plan p2 --hot-bytes 1GiB --dictionary-frames=false" {
		t.Errorf("flat embedding args %q", got)
	}
	// Dictionary frames on (prism up's default) or off, said either way:
	// serve embedding's own default is on.
	on := c
	on.DictionaryFrames = true
	if got := strings.Join(Children(on, "127.0.0.1:9", dense)[1].Args, " "); !strings.HasSuffix(got, " --dictionary-frames=true") {
		t.Errorf("embedding args with dictionary frames %q", got)
	}
	c.Insecure = true
	if got := strings.Join(Children(c, "127.0.0.1:9", dense)[1].Args, " "); got != "serve embedding --router 127.0.0.1:9 --db db --insecure --plan p1 --plan p2 --hot-bytes 1GiB --dictionary-frames=false" {
		t.Errorf("insecure embedding args %q", got)
	}
	// Shutdown order: router, embedding, dense.
	if !(stageRouter < kids[1].Stage && kids[1].Stage < kids[0].Stage) {
		t.Errorf("stages: embedding %d, dense %d", kids[1].Stage, kids[0].Stage)
	}
}

func TestRegistered(t *testing.T) {
	w := func(role prismv1.Role, models ...string) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Role: role, Models: models}
	}
	ws := []*prismv1.WorkerInfo{w(prismv1.Role_ROLE_EMBEDDING, "a", "b"), w(prismv1.Role_ROLE_DENSE, "a", "b"), w(prismv1.Role_ROLE_DENSE, "a")}
	if !Registered(ws, []string{"a", "b"}, 1, 1) {
		t.Error("1 dense, 1 embedding: registered")
	}
	if Registered(ws, []string{"a", "b"}, 2, 1) {
		t.Error("b has one dense worker, not 2")
	}
	if !Registered(ws, []string{"a"}, 2, 1) {
		t.Error("a has 2 dense workers")
	}
}

func TestEnsureCerts(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	os.Mkdir(empty, 0o755)
	partial := filepath.Join(root, "partial")
	os.Mkdir(partial, 0o755)
	os.WriteFile(filepath.Join(partial, "ca.pem"), []byte("x"), 0o644)
	// The old flat layout, from certs init's files.
	src := filepath.Join(root, "src")
	if err := auth.InitCerts(src, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	flat := filepath.Join(root, "flat")
	os.Mkdir(flat, 0o755)
	for _, r := range auth.Roles {
		f := auth.FilesFor(src, r)
		for from, to := range map[string]string{f.Cert: string(r) + ".pem", f.Key: string(r) + "-key.pem", f.CA: "ca.pem"} {
			b, _ := os.ReadFile(from)
			os.WriteFile(filepath.Join(flat, to), b, 0o600)
		}
	}
	for _, tc := range []struct {
		name     string
		dir      string
		made, ok bool
		layout   auth.Layout
	}{
		{"absent", filepath.Join(root, "absent"), true, true, auth.InitRoot},
		{"again", filepath.Join(root, "absent"), false, true, auth.InitRoot},
		{"empty", empty, true, true, auth.InitRoot},
		{"partial", partial, false, false, 0},
		{"flat", flat, false, true, auth.Flat},
		{"one role's folder", auth.RoleDir(src, auth.Admin), false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			made, layout, err := EnsureCerts(tc.dir, "127.0.0.1:0")
			if made != tc.made || (err == nil) != tc.ok || layout != tc.layout {
				t.Fatalf("made %v, layout %v, err %v", made, layout, err)
			}
		})
	}
}

// Embedding workers sharing the host's cores split them: GOMAXPROCS
// per worker is cores/workers, at least 1; one worker, or a GOMAXPROCS
// set for prism up itself, leaves the Go default.
func TestEmbeddingEnv(t *testing.T) {
	for _, tc := range []struct {
		cpus, workers int
		userSet       bool
		want          []string
	}{
		{2, 1, false, nil},
		{2, 3, false, []string{"GOMAXPROCS=1"}},
		{2, 2, false, []string{"GOMAXPROCS=1"}},
		{16, 3, false, []string{"GOMAXPROCS=5"}},
		{16, 4, false, []string{"GOMAXPROCS=4"}},
		{1, 6, false, []string{"GOMAXPROCS=1"}},
		{16, 3, true, nil},
	} {
		if got := embeddingEnv(tc.cpus, tc.workers, tc.userSet); !slices.Equal(got, tc.want) {
			t.Errorf("embeddingEnv(%d cpus, %d workers, user set %v) = %v, want %v", tc.cpus, tc.workers, tc.userSet, got, tc.want)
		}
	}
	c := Config{Plans: []string{"p"}, DB: "db", EmbeddingWorkers: 3, shards: 3, Replicas: 1, Insecure: true}
	want := embeddingEnv(runtime.GOMAXPROCS(0), 3, os.Getenv("GOMAXPROCS") != "")
	for _, k := range Children(c, "127.0.0.1:9", nil) {
		if !slices.Equal(k.Env, want) {
			t.Errorf("%s env %v, want %v", k.Name, k.Env, want)
		}
	}
}

// Under a memory limit the embedding workers share half of it.
func TestEmbeddingMemArgs(t *testing.T) {
	for _, tc := range []struct {
		limit   int64
		workers int
		want    []string
	}{
		{0, 1, nil},
		{8 << 30, 1, []string{"--memory-limit", "4294967296"}},
		{6 << 30, 3, []string{"--memory-limit", "1073741824"}},
		// prism up --memory-limit off: off for the workers too, whose
		// own auto would budget the container's whole limit each.
		{-1, 2, []string{"--memory-limit", "off"}},
	} {
		if got := embeddingMemArgs(tc.limit, tc.workers); !slices.Equal(got, tc.want) {
			t.Errorf("embeddingMemArgs(%d, %d) = %v, want %v", tc.limit, tc.workers, got, tc.want)
		}
	}
	c := Config{Plans: []string{"p"}, DB: "db", EmbeddingWorkers: 2, Insecure: true, MemoryLimit: 4 << 30}
	for _, k := range Children(c, "127.0.0.1:9", nil) {
		if strings.HasPrefix(k.Name, "embedding") && !slices.Contains(k.Args, "1073741824") {
			t.Errorf("%s args %v: want --memory-limit 1073741824", k.Name, k.Args)
		}
	}
}

// With sharding, embedding worker i is replica i mod Replicas of shard
// i / Replicas, each on its own store under DB.
func TestChildrenSharded(t *testing.T) {
	c := Config{Plans: []string{"p"}, DB: "db", EmbeddingWorkers: 4, Replicas: 2, shards: 2, Insecure: true}
	var dbs []string
	for _, k := range Children(c, "127.0.0.1:9", nil) {
		i := slices.Index(k.Args, "--db")
		dbs = append(dbs, k.Name+" "+k.Args[i+1])
	}
	want := []string{"embedding0 db/shard-0", "embedding1 db/shard-0-1", "embedding2 db/shard-1", "embedding3 db/shard-1-1"}
	if !slices.Equal(dbs, want) {
		t.Fatalf("embedding workers %v, want %v", dbs, want)
	}
}

// Sharded plans must agree on their shard count; unsharded ones beside
// them are served whole.
func TestShardedPlans(t *testing.T) {
	sh := func(n int) *plan.Plan {
		return &plan.Plan{Model: plan.ModelInfo{Name: fmt.Sprint("m", n)}, Sharding: &plan.Sharding{Shards: n}}
	}
	got, n, err := shardedPlans([]string{"a", "b", "c"}, []*plan.Plan{sh(3), {}, sh(3)})
	if err != nil || n != 3 || len(got) != 2 || got[1].dir != "c" {
		t.Fatalf("%v %d %v", got, n, err)
	}
	if _, _, err := shardedPlans([]string{"a", "b"}, []*plan.Plan{sh(3), sh(2)}); err == nil {
		t.Fatal("plans of 3 and 2 shards taken together")
	}
	if _, n, err := shardedPlans([]string{"a"}, []*plan.Plan{{}}); n != 0 || err != nil {
		t.Fatalf("an unsharded plan: %d shards, %v", n, err)
	}
}

// TestDenseWorkersMIG: one worker per MIG slice (a slice is a small
// GPU), two per whole GPU beside them.
func TestDenseWorkersMIG(t *testing.T) {
	disc := devices.Discovery{Devices: []devices.Device{
		{Kind: devices.KindMIG, Name: "1g", UUID: "MIG-1"},
		{Kind: devices.KindMIG, Name: "2g", UUID: "MIG-2"},
		{Kind: devices.KindGPU, Name: "whole", UUID: "GPU-w"},
	}}
	var got []string
	for _, w := range DenseWorkers(disc, 0, 4) {
		got = append(got, w.Device.UUID+" "+strings.Join(w.Env, ","))
	}
	want := []string{
		"MIG-1 CUDA_VISIBLE_DEVICES=MIG-1",
		"MIG-2 CUDA_VISIBLE_DEVICES=MIG-2",
		"GPU-w CUDA_VISIBLE_DEVICES=GPU-w",
		"GPU-w CUDA_VISIBLE_DEVICES=GPU-w",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("workers\n%v\nwant\n%v", got, want)
	}
}

// TestDenseDevices: GPUs the ONNX Runtime cannot use (a CPU build) get
// the CPU plan, one dense worker per core, and up says why; usable GPUs
// and no driver keep their discovery; a GPU discovery skipped (MIG on,
// no instances) is named.
func TestDenseDevices(t *testing.T) {
	gpus := devices.Discovery{Devices: []devices.Device{{Kind: devices.KindGPU, Name: "a", UUID: "GPU-a"}}}
	cpu := devices.Discovery{Devices: []devices.Device{{Kind: devices.KindCPU, Name: "cpu"}}, NoDriver: "NVML init: driver not loaded"}
	skipped := gpus
	skipped.Skipped = []string{"GPU 1 (GPU-b) has MIG enabled and no MIG devices: create GPU and compute instances (nvidia-smi mig -i 1 -cgi <profiles> -C) or disable MIG"}
	usable := func() string { return "" }
	cpuBuild := func() string { return "CPU-only ONNX Runtime build: no CUDA" }
	// NVML started (the driver is there) and listed no GPU.
	noGPUs, err := devices.Discover(&mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "580.65.06", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		disc    devices.Discovery
		cuda    func() string
		workers int
		say     string
	}{
		{"usable GPU", gpus, usable, 2, ""},
		{"CPU build on a GPU host", gpus, cpuBuild, 4, "1 NVIDIA device(s) found, but ONNX Runtime cannot use them (CPU-only ONNX Runtime build: no CUDA): dense workers run on the CPU, one per core"},
		{"no driver", cpu, cpuBuild, 4, "no NVIDIA driver (NVML init: driver not loaded)"},
		{"a driver and no GPU", noGPUs, usable, 4, "up: no usable NVIDIA device (NVML reports no GPUs): dense workers run on the CPU"},
		{"a MIG GPU without instances beside a usable GPU", skipped, usable, 2, "up: not used: GPU 1 (GPU-b) has MIG enabled and no MIG devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			d := denseDevices(tc.disc, tc.cuda, &out)
			if n := len(DenseWorkers(d, 0, 4)); n != tc.workers {
				t.Errorf("%d dense workers, want %d", n, tc.workers)
			}
			if tc.say == "" && out.Len() > 0 || !strings.Contains(out.String(), tc.say) {
				t.Errorf("said %q, want %q", out.String(), tc.say)
			}
		})
	}
}

// TestRunRefusesCounts: counts no stack can run with are refused before
// anything starts, in one line naming the flag.
func TestRunRefusesCounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		flag string
	}{
		{"negative dense workers", func(c *Config) { c.DenseWorkers = -3 }, "--dense-workers -3"},
		{"no embedding worker", func(c *Config) { c.EmbeddingWorkers = 0 }, "--embedding-workers 0"},
		{"negative embedding workers", func(c *Config) { c.EmbeddingWorkers = -1 }, "--embedding-workers -1"},
		{"negative replicas", func(c *Config) { c.Replicas = -1 }, "--replicas -1"},
		{"negative sessions", func(c *Config) { c.DenseSessions = -2 }, "--dense-sessions -2"},
		{"too many sessions", func(c *Config) { c.DenseSessions = 65 }, "--dense-sessions 65"},
		{"negative keep-versions", func(c *Config) { c.KeepVersions = -1 }, "--keep-versions -1"},
		{"across models", func(c *Config) { c.DenseAcrossModels = "auto" }, `--dense-across-models "auto"`},
		{"hot bytes not a size", func(c *Config) { c.HotBytes = "1XB" }, `--hot-bytes: "1XB" is not a size`},
		{"hot bytes negative not a size", func(c *Config) { c.HotBytes = "-lots" }, `--hot-bytes: "-lots" is not a size`},
		{"hot bytes 0", func(c *Config) { c.HotBytes = "0" }, `--hot-bytes: "0": want a positive size`},
		{"batch order", func(c *Config) { c.BatchOrder = "x" }, `--batch-order "x": want edf or fifo`},
		{"address", func(c *Config) { c.Addr = "foo" }, `--addr "foo": want HOST:PORT`},
		{"admit share", func(c *Config) { c.AdmitShare = 1.5 }, "--admit-share 1.5"},
		// Before the certificates and the shards' ingest, not after.
		{"loan spec", func(c *Config) { c.Loan = "local:max=x" }, "--loan"},
		{"loan provider", func(c *Config) {
			c.Loan = "kubernetes:max=2,template=prism-dense,pool=pool=training,priority-class=low"
		}, "prism loan --lender"},
		{"token over plaintext", func(c *Config) { c.AuthTokenFile = "token.txt" }, "--auth-token-file needs TLS"},
		{"no token file", func(c *Config) { c.Insecure, c.AuthTokenFile = false, filepath.Join(t.TempDir(), "none") }, "--auth-token-file"},
		{"short token", func(c *Config) {
			c.Insecure, c.AuthTokenFile = false, filepath.Join(t.TempDir(), "short")
			os.WriteFile(c.AuthTokenFile, []byte("abc\n"), 0o600)
		}, "--auth-token-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Plans: []string{t.TempDir()}, DB: "db", EmbeddingWorkers: 1, ReadyTimeout: time.Second, Insecure: true}
			tc.set(&c)
			err := Run(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("Run: %v, want an error naming %s", err, tc.flag)
			}
		})
	}
}

// TestServable: up's ready line waits, for a model that has had updates,
// for its start-up window to close and for a worker of each shard to
// hold every acknowledged update.
func TestServable(t *testing.T) {
	emb := func(id string, shard int32, sharded bool) *prismv1.WorkerInfo {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}}
		if sharded {
			w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: shard, Shards: 2}}
		}
		return w
	}
	one := []*prismv1.WorkerInfo{emb("e0", 0, false), emb("e1", 0, false), {Id: "d0", Role: prismv1.Role_ROLE_DENSE, Models: []string{"m"}}}
	two := []*prismv1.WorkerInfo{emb("a", 0, true), emb("b", 1, true)}
	whole := func(u *prismv1.ModelUpdates) map[string]*prismv1.ModelUpdates {
		return map[string]*prismv1.ModelUpdates{"m": u}
	}
	for _, tc := range []struct {
		name    string
		workers []*prismv1.WorkerInfo
		updates map[string]*prismv1.ModelUpdates // by sequence: a shard's is m#shardK
		ready   bool
	}{
		{"never updated", one, nil, true},
		{"settling", one, whole(&prismv1.ModelUpdates{Settling: true, InSync: []string{"e0", "e1"}}), false},
		{"catching up", one, whole(&prismv1.ModelUpdates{Acknowledged: 3}), false},
		{"one of two in sync", one, whole(&prismv1.ModelUpdates{Acknowledged: 3, InSync: []string{"e1"}}), true},
		{"sharded: one shard in sync", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, InSync: []string{"a"}}, "m#shard1": {Acknowledged: 5}}, false},
		{"sharded: both", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, InSync: []string{"a"}}, "m#shard1": {Acknowledged: 5, InSync: []string{"b"}}}, true},
		{"sharded: one shard never updated", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, InSync: []string{"a"}}}, true},
		{"sharded: a shard settling", two, map[string]*prismv1.ModelUpdates{"m#shard1": {Settling: true, InSync: []string{"b"}}}, false},
	} {
		resp := &prismv1.ListResponse{Workers: tc.workers, Updates: tc.updates}
		if why := Servable(resp, []string{"m"}); (why == "") != tc.ready {
			t.Errorf("%s: %q, want ready %v", tc.name, why, tc.ready)
		}
	}
}

// TestLeftOut: up stops waiting for a model whose shard has workers
// only of the kind the router leaves out whatever they hold (another
// sharding than the one its updates were numbered in: prism shard run
// again, and up on the same --db, whose update log binds the old one);
// it waited --ready-timeout (10 minutes) and then blamed a catch-up.
// A shard with one worker left out and another in sync or catching up,
// or a sequence still settling, is no reason to stop.
func TestLeftOut(t *testing.T) {
	emb := func(id string, shard int32) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"},
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: shard, Shards: 2}}}
	}
	two := []*prismv1.WorkerInfo{emb("a", 0), emb("b", 1)}
	three := append([]*prismv1.WorkerInfo{emb("a2", 0)}, two...)
	for _, tc := range []struct {
		name    string
		workers []*prismv1.WorkerInfo
		updates map[string]*prismv1.ModelUpdates
		stuck   string // "" none, else in the reason
	}{
		{"never updated", two, nil, ""},
		{"catching up", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2}}, ""},
		{"another sharding", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, LeftOut: []string{"a"}}}, "shard 0 of 2"},
		{"settling", two, map[string]*prismv1.ModelUpdates{"m#shard0": {Settling: true, LeftOut: []string{"a"}}}, ""},
		{"one of two left out", three, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, LeftOut: []string{"a"}}}, ""},
		{"both left out", three, map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 2, LeftOut: []string{"a", "a2"}}}, "2 of them"},
		{"the whole model", []*prismv1.WorkerInfo{{Id: "w", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}}}, map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 1, LeftOut: []string{"w"}}}, `model "m",`},
	} {
		resp := &prismv1.ListResponse{Workers: tc.workers, Updates: tc.updates}
		why := LeftOut(resp, []string{"m"})
		if (why == "") != (tc.stuck == "") || !strings.Contains(why, tc.stuck) {
			t.Errorf("%s: %q, want %q", tc.name, why, tc.stuck)
		}
	}
}

// TestLocked: a folder whose Pebble LOCK another open holds is locked;
// closed, or without a LOCK file, it is not.
func TestLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	if locked(dir) {
		t.Fatal("a folder that does not exist is locked")
	}
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Pebble's lock is a POSIX record lock: another process's. In this
	// one F_GETLK sees no conflict with its own lock, so the check is
	// run in a child (the test binary, told by the environment).
	if !lockedInChild(t, dir) {
		t.Error("a folder an open store holds is not locked")
	}
	db.Close()
	if lockedInChild(t, dir) || locked(dir) {
		t.Error("a closed store's folder is locked")
	}
}

// lockedInChild asks locked(dir) in a child process: this test binary,
// which TestMain turns into the child when the environment names dir.
func lockedInChild(t *testing.T, dir string) bool {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), lockedChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	return strings.Contains(string(out), "locked=true")
}

const lockedChildEnv = "PRISM_TEST_LOCKED_DIR"

// TestMain runs the tests, or, as lockedInChild's child, prints
// locked(dir) and exits.
func TestMain(m *testing.M) {
	if exe := os.Getenv(ingestChildEnv); exe != "" {
		ingestInChild(exe)
		os.Exit(0)
	}
	if dir := os.Getenv(lockedChildEnv); dir != "" {
		fmt.Printf("locked=%v\n", locked(dir))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestChildrenCPUDenseThreads: with --threads 0, each of several dense
// workers on the CPU is given its share of the cores (GOMAXPROCS, by
// which serve dense sizes its sessions' pools), not every core of the
// machine; explicit threads, one worker and GPU workers get nothing.
func TestChildrenCPUDenseThreads(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // prism up's own, unset
	cpu := devices.Worker{Device: devices.Device{Kind: devices.KindCPU, Name: "cpu"}}
	gpu := devices.Worker{Device: devices.Device{Kind: devices.KindGPU, Name: "gpu"}, Env: []string{"CUDA_VISIBLE_DEVICES=GPU-a"}}
	cpus := runtime.GOMAXPROCS(0)
	share := fmt.Sprintf("GOMAXPROCS=%d", max(1, cpus/2))
	for _, tc := range []struct {
		name    string
		threads int
		dense   []devices.Worker
		want    [][]string
	}{
		{"two CPU workers, threads 0", 0, []devices.Worker{cpu, cpu}, [][]string{{share}, {share}}},
		{"two CPU workers, threads 1", 1, []devices.Worker{cpu, cpu}, [][]string{nil, nil}},
		{"one CPU worker, threads 0", 0, []devices.Worker{cpu}, [][]string{nil}},
		{"GPU workers, threads 0", 0, []devices.Worker{gpu, gpu}, [][]string{gpu.Env, gpu.Env}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Plans: []string{"p"}, DB: "db", Threads: tc.threads, Insecure: true}
			kids := Children(c, "127.0.0.1:9", tc.dense)
			for i, want := range tc.want {
				if !slices.Equal(kids[i].Env, want) {
					t.Errorf("dense%d env %v, want %v", i, kids[i].Env, want)
				}
			}
		})
	}
	if got := cpuDenseEnv(0, 2, 4, false); !slices.Equal(got, []string{"GOMAXPROCS=1"}) {
		t.Errorf("four workers on two cores: %v, want GOMAXPROCS=1", got)
	}
	if got := cpuDenseEnv(0, 16, 2, true); got != nil {
		t.Errorf("GOMAXPROCS set by the user: %v, want nothing", got)
	}
}

// TestCheckNames: up names a plan as its workers do (a nameless
// graph's plan by its folder) and refuses one model name twice.
func TestCheckNames(t *testing.T) {
	named := func(n string) *plan.Plan { return &plan.Plan{Model: plan.ModelInfo{Name: n}} }
	if got := (&plan.Plan{}).ServedName("x/part/"); got != "part" {
		t.Fatalf("a plan without a model name is named %q, want its folder's, part", got)
	}
	if err := checkNames([]string{"a", "b", "m"}, []*plan.Plan{named("m"), named("n"), {}}); err == nil || !strings.Contains(err.Error(), `--model a and --model m are both model "m"`) {
		t.Fatalf("model m given by name and by folder: %v", err)
	}
	if err := checkNames([]string{"a", "b"}, []*plan.Plan{named("m"), named("n")}); err != nil {
		t.Fatal(err)
	}
}

// TestShellQuote: the command up prints for a client is one a shell
// runs as printed: an IPv6 address ([::1]:8500, a glob pattern to zsh)
// or a path with a space is quoted, a plain word is not.
func TestShellQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:8500", "127.0.0.1:8500"},
		{"out/demo/certs", "out/demo/certs"},
		{"[::1]:8500", "'[::1]:8500'"},
		{"my certs", "'my certs'"},
		{"it's", `'it'\''s'`},
		{"", "''"},
	} {
		if got := shellQuote(tc.in); got != tc.want {
			t.Errorf("shellQuote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestRouterHTTPAddr: the router's HTTP/JSON address is read from its
// ready line as up's supervisor echoes it, and a port the OS picked
// (--http-addr HOST:0) is pinned for a restarted router, as --addr is;
// the curl command up prints is one a shell runs as printed.
func TestRouterHTTPAddr(t *testing.T) {
	var out strings.Builder
	w := &routerMetricsWatch{w: &out}
	if w.http() != "" {
		t.Fatalf("an address before any line: %q", w.http())
	}
	fmt.Fprint(w, "[router] router listening on 127.0.0.1:8500 (metrics 127.0.0.1:9100) (http 127.0.0.1:41234)\n")
	if w.http() != "127.0.0.1:41234" || w.url() != "http://127.0.0.1:9100/metrics" {
		t.Fatalf("http %q, metrics %q", w.http(), w.url())
	}
	rt := &supervise.Child{Args: []string{"serve", "router", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}}
	pinRouterAddr(rt, "--addr", "127.0.0.1:0", "127.0.0.1:8500")
	pinRouterAddr(rt, "--http-addr", "127.0.0.1:0", w.http())
	if want := []string{"serve", "router", "--addr", "127.0.0.1:8500", "--http-addr", "127.0.0.1:41234"}; !slices.Equal(rt.Args, want) {
		t.Fatalf("pinned %q, want %q", rt.Args, want)
	}
	for _, tc := range []struct {
		admin auth.Files
		addr  string
		want  string
	}{
		{auth.Files{}, "127.0.0.1:8080", "curl --json @req.json http://127.0.0.1:8080/v1/recommend"},
		{auth.FilesFor("certs", auth.Admin), "[::1]:8080", "curl --cacert certs/admin/ca.pem --cert certs/admin/cert.pem --key certs/admin/key.pem --json @req.json 'https://[::1]:8080/v1/recommend'"},
		{auth.FilesFor("my certs", auth.Admin), "127.0.0.1:8080", "curl --cacert 'my certs/admin/ca.pem' --cert 'my certs/admin/cert.pem' --key 'my certs/admin/key.pem' --json @req.json https://127.0.0.1:8080/v1/recommend"},
	} {
		if got := curlHint(tc.admin, tc.addr); got != tc.want {
			t.Errorf("curlHint(%v, %s) = %s\nwant %s", tc.admin, tc.addr, got, tc.want)
		}
	}
}
