package router

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
)

var updateFleet = flag.Bool("update-fleet", false, "rewrite testdata/fleet.txt from WriteFleet")

// Fleet reads each worker's state for each of its models from a
// registry's answer as the router decides it: the sequencer's view
// (in_sync, left_out, settling) for embedding workers of a model with
// updates, the store's diverged mark whatever the view, health first.
func TestFleetStates(t *testing.T) {
	emb := func(id string, models []string, seq map[string]int64) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "addr-" + id, Models: models, Healthy: true, UpdateSeq: seq}
	}
	for _, tc := range []struct {
		name   string
		worker *prismv1.WorkerInfo
		resp   *prismv1.ListResponse
		want   string
		holds  int64
		acked  int64
	}{
		{"never updated", emb("e", []string{"m"}, nil), &prismv1.ListResponse{}, "serving", -1, -1},
		{"in sync", emb("e", []string{"m"}, map[string]int64{"m": 7}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 7, InSync: []string{"e"}}}}, "serving", 7, 7},
		{"behind", emb("e", []string{"m"}, map[string]int64{"m": 5}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 8}}}, "behind", 5, 7},
		{"behind the log", emb("e", []string{"m"}, map[string]int64{"m": 2}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 8, Stranded: []string{"e"}}}}, "stranded", 2, 7},
		{"settling", emb("e", []string{"m"}, map[string]int64{"m": 7}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 7, Settling: true}}}, "settling", 7, 7},
		{"diverged, its store not told yet", emb("e", []string{"m"}, map[string]int64{"m": 7}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 7, LeftOut: []string{"e"}}}}, "diverged", 7, 7},
		{"claims updates never numbered", emb("e", []string{"m"}, map[string]int64{"m": 1 << 40}),
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 7, LeftOut: []string{"e"}}}}, "left out", 1 << 40, 7},
		{"its store's mark", &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, Healthy: true, UpdateSeq: map[string]int64{"m": 7}, Diverged: map[string]int64{"m": 3}},
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7, Numbered: 7, InSync: []string{"e"}}}}, "diverged at 3", 7, 7},
		{"a shard's sequence", &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, Healthy: true, UpdateSeq: map[string]int64{"m": 2}, Shards: map[string]*prismv1.ShardRef{"m": {Shard: 1, Shards: 3}}},
			&prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 9, InSync: []string{"x"}}, "m#shard1": {Acknowledged: 2, Numbered: 2, InSync: []string{"e"}}}}, "serving", 2, 2},
		{"not sequencing", emb("e", []string{"m"}, map[string]int64{"m": 7}), &prismv1.ListResponse{NotSequencing: true}, "unknown", 7, -1},
		{"unhealthy", &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}}, &prismv1.ListResponse{}, "unhealthy", -1, -1},
		{"dense", &prismv1.WorkerInfo{Id: "d", Role: prismv1.Role_ROLE_DENSE, Models: []string{"m"}, Healthy: true}, &prismv1.ListResponse{Updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 7}}}, "serving", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.resp.Workers = []*prismv1.WorkerInfo{tc.worker}
			rows := Fleet(tc.resp)
			if len(rows) != 1 {
				t.Fatalf("%d rows, want 1", len(rows))
			}
			if r := rows[0]; r.State != tc.want || r.Holds != tc.holds || r.Acknowledged != tc.acked {
				t.Fatalf("state %q, holds %d of %d; want %q, %d of %d", r.State, r.Holds, r.Acknowledged, tc.want, tc.holds, tc.acked)
			}
		})
	}
}

// WriteFleet's table of a small fleet: two models, one sharded over two
// shards with one shard's only worker behind, one with no dense worker
// serving (testdata/fleet.txt; -update-fleet rewrites it).
func TestWriteFleet(t *testing.T) {
	resp := &prismv1.ListResponse{
		Workers: []*prismv1.WorkerInfo{
			{Id: "dense/h1/11/1", Role: prismv1.Role_ROLE_DENSE, Addr: "10.0.0.5:7001", Models: []string{"ranker", "sharded"}, Healthy: true, Outstanding: 3},
			{Id: "embedding/h2/21/1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "10.0.0.6:7002", Models: []string{"ranker"}, Healthy: true, UpdateSeq: map[string]int64{"ranker": 12}},
			{Id: "embedding/h3/31/1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "10.0.0.7:7002", Models: []string{"ranker"}, Healthy: true, UpdateSeq: map[string]int64{"ranker": 12}, Diverged: map[string]int64{"ranker": 11}},
			{Id: "embedding/h4/41/1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "10.0.0.8:7002", Models: []string{"sharded"}, Healthy: true, UpdateSeq: map[string]int64{"sharded": 4}, Shards: map[string]*prismv1.ShardRef{"sharded": {Shard: 0, Shards: 2}}},
			{Id: "embedding/h5/51/1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "10.0.0.9:7002", Models: []string{"sharded"}, Healthy: true, UpdateSeq: map[string]int64{"sharded": 1}, Shards: map[string]*prismv1.ShardRef{"sharded": {Shard: 1, Shards: 2}}},
			{Id: "embedding/h6/61/1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "10.0.0.10:7002", Models: []string{"lonely"}, Healthy: true},
		},
		Updates: map[string]*prismv1.ModelUpdates{
			"ranker":         {Acknowledged: 12, Numbered: 12, InSync: []string{"embedding/h2/21/1"}, LeftOut: []string{"embedding/h3/31/1"}},
			"sharded#shard0": {Acknowledged: 4, Numbered: 4, InSync: []string{"embedding/h4/41/1"}},
			"sharded#shard1": {Acknowledged: 3, Numbered: 3},
		},
	}
	var b bytes.Buffer
	if err := WriteFleet(&b, resp); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join("testdata", "fleet.txt")
	if *updateFleet {
		if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Fatalf("WriteFleet wrote:\n%s\nwant (testdata/fleet.txt):\n%s", b.String(), want)
	}
	// prism status --check: the gaps and the diverged worker, not the
	// one behind.
	wantProblems := []string{
		"lonely: no dense worker serving it",
		"sharded: no embedding worker serving shard 1/2",
		"ranker: embedding worker 10.0.0.7:7002 (embedding/h3/31/1) is diverged at 11",
	}
	if got := FleetProblems(resp); !slices.Equal(got, wantProblems) {
		t.Fatalf("FleetProblems = %q, want %q", got, wantProblems)
	}
}

// A router that follows another for updates says which one sequences
// them (ListResponse.sequencer), and prism status names it: only its
// answer says which embedding workers are in sync.
func TestListNamesSequencer(t *testing.T) {
	r := testRouter(Options{Sequencer: "10.0.0.9:8500"})
	defer r.Close()
	resp, err := r.Reg.List(context.Background(), &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetNotSequencing() || resp.GetSequencer() != "10.0.0.9:8500" {
		t.Fatalf("a follower's List: not_sequencing %v, sequencer %q; want true, 10.0.0.9:8500", resp.GetNotSequencing(), resp.GetSequencer())
	}
	var b bytes.Buffer
	if err := WriteFleet(&b, resp); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "prism status --router 10.0.0.9:8500") {
		t.Fatalf("WriteFleet of a follower's answer does not name the sequencer:\n%s", b.String())
	}
	seq := testRouter(Options{})
	defer seq.Close()
	if resp, err := seq.Reg.List(context.Background(), &prismv1.ListRequest{}); err != nil || resp.GetNotSequencing() || resp.GetSequencer() != "" {
		t.Fatalf("a sequencing router's List: %v, %v; want it sequencing, naming no other", resp, err)
	}
}

// fleetMends names as the copy's source only a worker serving every
// model of the one out, in the same shard and in sync.
func TestFleetMends(t *testing.T) {
	rows := []FleetRow{
		{Model: "a", Role: "embedding", Addr: "h1:1", ID: "w1", State: "diverged at 3"},
		{Model: "b", Role: "embedding", Addr: "h1:1", ID: "w1", Shard: "1/2", State: "serving"},
		{Model: "a", Role: "embedding", Addr: "h0:1", ID: "w0", State: "serving"}, // lacks b
		{Model: "a", Role: "embedding", Addr: "h2:1", ID: "w2", State: "serving"},
		{Model: "b", Role: "embedding", Addr: "h2:1", ID: "w2", Shard: "0/2", State: "serving"}, // another shard
		{Model: "a", Role: "embedding", Addr: "h3:1", ID: "w3", State: "behind"},
		{Model: "b", Role: "embedding", Addr: "h3:1", ID: "w3", Shard: "1/2", State: "serving"},
		{Model: "a", Role: "dense", Addr: "h9:1", ID: "d", State: "serving"},
	}
	want := []string{"embedding worker h1:1 (a: diverged at 3) is out for good; no worker serves all of its models (and shards) in sync to copy a store from yet"}
	if got := fleetMends(rows, false, ""); !slices.Equal(got, want) {
		t.Fatalf("fleetMends = %q, want %q", got, want)
	}
	rows[5].State = "serving" // w3 caught up
	want = []string{"embedding worker h1:1 (a: diverged at 3) is out for good; mend it on its host: prism store copy --from h3:1 --db ITS_STORE, then restart it"}
	if got := fleetMends(rows, false, ""); !slices.Equal(got, want) {
		t.Fatalf("fleetMends = %q, want %q", got, want)
	}
	// A worker serving with --mend (WorkerInfo.mends) copies by itself.
	mending := slices.Clone(rows)
	mending[0].Mends, mending[1].Mends = true, true
	want = []string{`embedding worker h1:1 (a: diverged at 3) is out for good until it mends itself (--mend): it copies a serving worker's store (h3:1) and restarts; its log's "mend:" lines say how far, or why not`}
	if got := fleetMends(mending, false, ""); !slices.Equal(got, want) {
		t.Fatalf("fleetMends of a worker mending itself = %q, want %q", got, want)
	}
	// Not when it is left out (claiming updates never numbered): no
	// router tells it so, and it does not copy.
	mending[0].State = "left out"
	want = []string{"embedding worker h1:1 (a: left out) is out for good; mend it on its host: prism store copy --from h3:1 --db ITS_STORE, then restart it"}
	if got := fleetMends(mending, false, ""); !slices.Equal(got, want) {
		t.Fatalf("fleetMends of a worker left out = %q, want %q", got, want)
	}
	// A source whose store marks another model out is no source.
	rows = append(rows, FleetRow{Model: "c", Role: "embedding", Addr: "h3:1", ID: "w3", State: "diverged at 5"})
	got := fleetMends(rows, false, "")
	if len(got) != 2 || !strings.Contains(got[0], "h1:1") || !strings.Contains(got[0], "no worker serves") {
		t.Fatalf("fleetMends with the only source out of another model = %q", got)
	}
	// A router that does not sequence updates names the one that does.
	want = []string{"embedding worker h1:1 (a: diverged at 3) is out for good; prism status --router r0:8500 names a worker to copy its store from (prism store copy)"}
	if got := fleetMends(rows[:3], true, "r0:8500"); !slices.Equal(got, want) {
		t.Fatalf("fleetMends, not sequencing = %q, want %q", got, want)
	}
	// Of a sharded model, the same shard of the same sharding: a worker
	// of another sharding with as many shards places tables otherwise.
	// One naming none (an earlier release) is taken.
	resharded := []FleetRow{
		{Model: "b", Role: "embedding", Addr: "h1:1", ID: "w1", Shard: "1/2", Sharding: "fpA", State: "stranded"},
		{Model: "b", Role: "embedding", Addr: "h2:1", ID: "w2", Shard: "1/2", Sharding: "fpB", State: "serving"},
	}
	for _, tc := range []struct {
		sharding, want string
	}{{"fpB", ""}, {"fpA", "h4:1"}, {"", "h4:1"}} {
		rows := append(slices.Clone(resharded), FleetRow{Model: "b", Role: "embedding", Addr: "h4:1", ID: "w4", Shard: "1/2", Sharding: tc.sharding, State: "serving"})
		got := CopySources(rows, map[string]ShardNeed{"b": {"1/2", "fpA"}}, "w1")
		if want := []string{tc.want}; tc.want == "" && len(got) != 0 || tc.want != "" && !slices.Equal(got, want) {
			t.Errorf("CopySources for fpA's shard 1/2, h4:1 of sharding %q = %q, want %q", tc.sharding, got, tc.want)
		}
	}
}
