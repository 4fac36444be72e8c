package store

import (
	"context"
	"slices"
	"testing"

	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// shardedPlan writes a plan of tables x (row-wise when shardBytes is
// small) and y sharded into shards (0: not sharded).
func shardedPlan(t *testing.T, shards int, shardBytes int64) string {
	t.Helper()
	dir := writePlan(t, "m", []*testTable{{name: "x", rows: 12, dim: 4, seed: 3}, {name: "y", rows: 4, dim: 4, seed: 4}})
	if shards == 0 {
		return dir
	}
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: shards, ShardBytes: shardBytes})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSwitchToAnotherSequenceCarriesNothing: a store switched to a
// version of another shard, another sharding or the whole model starts
// its update number at 0, and the router replays that sequence's
// updates to it (TestShardSwitchResetsSeq). Its tables must then hold
// what a store ingested afresh holds, no row of the sequence it left:
// the router takes two stores of one content at one number for copies
// of each other, and a replica ingested afresh beside it (a new replica,
// a lost store) served the other rows, whatever the router replayed.
// Nor may the rows of the sequence left come back at a later switch
// within the new sequence (a retrained model, another dtype).
func TestSwitchToAnotherSequenceCarriesNothing(t *testing.T) {
	ctx := context.Background()
	from := shardedPlan(t, 2, 160) // x row-wise over both shards
	shard := func(k int) *int { return &k }
	for _, tc := range []struct {
		name  string
		to    string
		shard *int
	}{
		{"another sharding", shardedPlan(t, 3, 120), shard(0)},
		{"the whole model", shardedPlan(t, 0, 0), nil},
		{"another shard", from, shard(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openMem(t, nil)
			if _, err := s.Ingest(ctx, from, IngestOptions{Shard: shard(0)}); err != nil {
				t.Fatal(err)
			}
			// Every row shard 0 holds of both tables updated, in its
			// sequence.
			seq := int64(0)
			for _, tn := range []string{"x", "y"} {
				for id := range storedRows(t, s, "m", tn) {
					seq++
					if _, err := s.UpsertSeq("m", tn, []int64{id}, []float32{9, 9, 9, 9}, seq); err != nil {
						t.Fatal(err)
					}
				}
			}
			if seq == 0 {
				t.Fatal("shard 0 holds no row")
			}
			fresh, _ := openMem(t, nil)
			for _, dt := range []DType{Float32, Float16} {
				for _, st := range []*Store{s, fresh} {
					if _, err := st.Ingest(ctx, tc.to, IngestOptions{Shard: tc.shard, DType: dt}); err != nil {
						t.Fatal(err)
					}
					if got, err := st.AppliedSeq("m"); err != nil || got != 0 {
						t.Fatalf("%s: AppliedSeq %d, %v; want 0", dt, got, err)
					}
				}
				for _, tn := range []string{"x", "y"} {
					got, want := storedRows(t, s, "m", tn), storedRows(t, fresh, "m", tn)
					if len(got) != len(want) {
						t.Fatalf("%s: table %q: %d rows, a store ingested afresh %d", dt, tn, len(got), len(want))
					}
					for id, w := range want {
						if !slices.Equal(got[id], w) {
							t.Fatalf("%s: table %q row %d: %v, a store ingested afresh at the same update number holds %v", dt, tn, id, got[id], w)
						}
					}
				}
			}
		})
	}
}
