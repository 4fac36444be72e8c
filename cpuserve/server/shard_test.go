package server

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
)

// A lookup's fan-out fields must match the shard the worker holds; an
// update of another shard's table is skipped, one of no table is not.
func TestCheckShardAndSkips(t *testing.T) {
	sr := &shardRef{shard: 1, shards: 3, held: map[string]bool{"a": true}, tables: map[string]bool{"a": true, "b": true}}
	for _, tc := range []struct {
		sr   *shardRef
		req  *prismv1.LookupRequest
		want codes.Code
	}{
		{nil, &prismv1.LookupRequest{}, codes.OK},
		{nil, &prismv1.LookupRequest{Shards: 3, Shard: 1, FanoutKey: "k"}, codes.FailedPrecondition},
		{sr, &prismv1.LookupRequest{Shards: 3, Shard: 1, FanoutKey: "k"}, codes.OK},
		{sr, &prismv1.LookupRequest{}, codes.FailedPrecondition},
		{sr, &prismv1.LookupRequest{Shards: 3, Shard: 2, FanoutKey: "k"}, codes.FailedPrecondition},
		{sr, &prismv1.LookupRequest{Shards: 2, Shard: 1, FanoutKey: "k"}, codes.FailedPrecondition},
		{sr, &prismv1.LookupRequest{Shards: 3, Shard: 1}, codes.InvalidArgument},
	} {
		if got := status.Code(checkShard("m", tc.sr, tc.req)); got != tc.want {
			t.Errorf("shard %v, request %v: %s, want %s", tc.sr, tc.req, got, tc.want)
		}
	}
	s := &Server{shards: map[string]*shardRef{"m": sr}}
	for table, want := range map[string]bool{"a": false, "b": true, "nope": false} {
		if got := s.skipsUpdate("m", table); got != want {
			t.Errorf("table %q: skips %v, want %v", table, got, want)
		}
	}
	if s.skipsUpdate("other", "b") {
		t.Error("an unsharded model skips updates")
	}
}

// An update of a row-wise table keeps, on each shard, the rows that
// shard holds; an id outside the table is bad input on every shard.
func TestOwnRows(t *testing.T) {
	sr := &shardRef{parts: map[string][3]int64{"t": {3, 1, 10}}}
	ids, rows, ok := sr.ownRows("t", []int64{0, 1, 4, 5, 7}, []float32{0, 0, 1, 1, 4, 4, 5, 5, 7, 7})
	if !ok || !slices.Equal(ids, []int64{1, 4, 7}) || !slices.Equal(rows, []float32{1, 1, 4, 4, 7, 7}) {
		t.Fatalf("kept %v %v %v", ids, rows, ok)
	}
	if _, _, ok := sr.ownRows("t", []int64{1, 10}, []float32{1, 10}); ok {
		t.Fatal("an id past the table's rows was taken")
	}
	if ids, _, ok := sr.ownRows("whole", []int64{2}, []float32{2}); !ok || len(ids) != 1 {
		t.Fatal("a table not split row-wise lost its rows")
	}
	var none *shardRef
	if ids, _, ok := none.ownRows("t", []int64{2}, []float32{2}); !ok || len(ids) != 1 {
		t.Fatal("an unsharded model lost its rows")
	}
}

// Every worker of a sharded model names the shards holding an update's
// rows (the router holds each to its quorum): the table's shard, or the
// shards of its ids' rows for a row-wise table.
func TestRowShards(t *testing.T) {
	sr := &shardRef{shards: 3, place: map[string]*plan.TablePlacement{
		"whole": {Table: "whole", Placement: plan.TableWise, Shards: []int{2}},
		"rows":  {Table: "rows", Placement: plan.RowWise, Shards: []int{0, 2}},
	}}
	for _, tc := range []struct {
		table string
		ids   []int64
		want  []int32
	}{
		{"whole", []int64{5}, []int32{2}},
		{"rows", []int64{4}, []int32{0}},
		{"rows", []int64{3, 7}, []int32{2}},
		{"rows", []int64{1, 2}, []int32{0, 2}},
		{"nope", []int64{1}, nil},
	} {
		if got := sr.rowShards(tc.table, tc.ids); !slices.Equal(got, tc.want) {
			t.Errorf("table %q ids %v: shards %v, want %v", tc.table, tc.ids, got, tc.want)
		}
	}
	var none *shardRef
	if got := none.rowShards("whole", []int64{1}); got != nil {
		t.Errorf("an unsharded model names shards %v", got)
	}
}

// A worker of shard 1 of sharding aa takes the numbers of its shard's
// sequence (named with its sharding, or with none: numbered before a
// worker named one), and no other shard's or sharding's.
func TestShardTakesSequence(t *testing.T) {
	sr := &shardRef{shard: 1, shards: 2, sharding: "aa"}
	for name, want := range map[string]bool{
		"m#shard1@aa": true,
		"m#shard1":    true,
		"m#shard1@bb": false,
		"m#shard0@aa": false,
		"m":           false,
	} {
		if ok, own := sr.takes("m", name); ok != want || own != "m#shard1@aa" {
			t.Errorf("takes(%q) = %v, %q; want %v", name, ok, own, want)
		}
	}
	var whole *shardRef
	if ok, _ := whole.takes("m", "m"); !ok {
		t.Error("a whole-model worker refuses the model's sequence")
	}
	if ok, _ := whole.takes("m", "m#shard0"); ok {
		t.Error("a whole-model worker takes a shard's sequence")
	}
}
