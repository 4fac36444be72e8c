package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
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
