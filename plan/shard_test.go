package plan

import (
	"strings"
	"testing"
)

func shardedPlan() *Plan {
	lk := func(out string, pool Pooling) []Lookup {
		return []Lookup{{Input: "ids", Bag: 2, Pooling: pool, Output: out}}
	}
	return &Plan{Version: Version, DenseModel: "dense.onnx",
		Inputs:  []TensorInfo{{Name: "ids", DType: "int64", Shape: []int64{2}}},
		Outputs: []TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Tables: []Table{
			{Name: "a", File: "tables/a.arrow", Rows: 10, Dim: 2, Lookups: lk("ea", PoolSum)},
			{Name: "b", File: "tables/b.arrow", Rows: 5, Dim: 1, Lookups: lk("eb", PoolMean)},
		},
		Sharding: &Sharding{Shards: 2, Tolerance: 0.1,
			Tables: []TablePlacement{{Table: "a", Placement: TableWise, Shards: []int{0}}, {Table: "b", Placement: RowWise, Shards: []int{1, 0}}},
			Shard: []ShardInfo{
				{Shard: 0, Rows: 12, Bytes: 88, Full: []string{"ea"}, Partial: []PartialOutput{{Output: "eb", Table: "b", Pooling: PoolMean, Combine: CombineSumCount}}},
				{Shard: 1, Rows: 3, Bytes: 12, Partial: []PartialOutput{{Output: "eb", Table: "b", Pooling: PoolMean, Combine: CombineSumCount}}},
			}},
	}
}

func TestValidateSharding(t *testing.T) {
	if err := shardedPlan().ValidateSharding(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		breakIt func(s *Sharding)
		want    string
	}{
		{"table missing", func(s *Sharding) { s.Tables = s.Tables[:1] }, "1 tables placed, the plan has 2"},
		{"unknown table", func(s *Sharding) { s.Tables[0].Table = "x" }, `"x": not a table of the plan`},
		{"shard out of range", func(s *Sharding) { s.Tables[1].Shards = []int{1, 2} }, "shards[1]=2"},
		{"shard twice", func(s *Sharding) { s.Tables[1].Shards = []int{1, 1} }, "shard 1 listed twice"},
		{"row-wise on one", func(s *Sharding) { s.Tables[1].Shards = []int{1} }, "row-wise on 1 shards"},
		{"rows wrong", func(s *Sharding) { s.Shard[1].Rows = 4 }, "4 rows, 12 bytes; its tables make 3 rows, 12 bytes"},
		{"over budget", func(s *Sharding) { s.ShardBytes = 50 }, "88 bytes, over the budget of 50"},
		{"full wrong", func(s *Sharding) { s.Shard[0].Full = nil }, "full []"},
		{"combine wrong", func(s *Sharding) { s.Shard[1].Partial[0].Combine = CombineSum }, `partial output "eb"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := shardedPlan()
			tc.breakIt(p.Sharding)
			if err := p.ValidateSharding(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	// Row 3 of b: 3 mod 2 = 1, the second shard listed (0).
	if got := shardedPlan().Sharding.Placement("b").ShardOf(3); got != 0 {
		t.Fatalf("ShardOf(3) = %d, want 0", got)
	}
}
