package router

import (
	"context"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestIncompleteLayoutNotChosen: while a model's workers move to another
// layout (sharded after serving whole, or into another shard count),
// the new layout's first workers are idle, so the least loaded pick;
// a micro-batch that lands on a layout missing a shard goes to a
// complete one, not failed Unavailable for the shard missing.
func TestIncompleteLayoutNotChosen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// the complete layout's workers, by shard count (0: whole).
		complete int
		// the incomplete layout: its shard count and the shards live.
		partial int
		live    []int
	}{
		{name: "whole, then the first shard of two", complete: 0, partial: 2, live: []int{0}},
		{name: "three shards, then two of two's missing one", complete: 3, partial: 2, live: []int{1}},
		{name: "two shards, then shard 0 of three", complete: 2, partial: 3, live: []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
			var served []*shardCN
			if tc.complete == 0 {
				f := &shardCN{}
				served = append(served, f)
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: "whole", Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, f), Models: []string{"m"}, Healthy: true, Outstanding: 50}}); err != nil {
					t.Fatal(err)
				}
			}
			for k := range tc.complete {
				f := &shardCN{}
				served = append(served, f)
				announceShard(t, r, "old"+string(rune('0'+k)), f, k, tc.complete, 50)
			}
			var idle []*shardCN
			for _, k := range tc.live {
				f := &shardCN{}
				idle = append(idle, f)
				announceShard(t, r, "new"+string(rune('0'+k)), f, k, tc.partial, 0)
			}
			for range 3 {
				if _, err := r.Recommend(context.Background(), request(25)); err != nil {
					t.Fatalf("with a complete layout live: %v", err)
				}
			}
			for _, f := range served {
				if len(f.got()) == 0 {
					t.Errorf("a worker of the complete layout got no lookup")
				}
			}
			for _, f := range idle {
				if n := len(f.got()); n != 0 {
					t.Errorf("a worker of the incomplete layout got %d lookups", n)
				}
			}
		})
	}
}
