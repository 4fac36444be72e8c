package server

import (
	"context"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// TestShardAdmissionBytes: a worker holding one shard of a model sends
// only its shard's columns, and admission charges a Lookup those bytes,
// not the whole model's cut: a shard of the small table (4 floats a
// sample) with room for 10 samples of it in flight took 9 behind 1, not
// refused them as 9 samples of both tables' 36 floats.
func TestShardAdmissionBytes(t *testing.T) {
	cut := func(name string, w int64) plan.CutTensor {
		return plan.CutTensor{TensorInfo: plan.TensorInfo{Name: name, DType: "float32", Shape: []int64{w}}, BytesPerSample: 4 * w, From: "lookup"}
	}
	cpu := []plan.Side{plan.CPU}
	p := &plan.Plan{
		Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Inputs: []plan.TensorInfo{
			{Name: "b", DType: "int64", Shape: []int64{1}, Sides: cpu},
			{Name: "s", DType: "int64", Shape: []int64{1}, Sides: cpu},
		},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut:     []plan.CutTensor{cut("bigout", 32), cut("smallout", 4)},
		Tables: []plan.Table{
			{Name: "big", Rows: 100, Dim: 32, File: "tables/big.arrow", Lookups: []plan.Lookup{{Input: "b", Bag: 1, Pooling: plan.PoolSum, Output: "bigout"}}},
			{Name: "small", Rows: 10, Dim: 4, File: "tables/small.arrow", Lookups: []plan.Lookup{{Input: "s", Bag: 1, Pooling: plan.PoolSum, Output: "smallout"}}},
		},
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2, ShardBytes: 13000})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	pl := p.Sharding.Placement("small")
	if pl.Placement != plan.TableWise || p.Sharding.Placement("big").Shards[0] == pl.Shards[0] {
		t.Fatalf("sharding %+v: want the tables on shards of their own", p.Sharding.Tables)
	}
	shard := pl.Shards[0]
	s, addr, d := serveValuesShard(t, p, Options{MaxInflightSamples: 1000, MaxInflightBytes: 10 * 16}, &shard)
	release, err := s.admit(1, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	const n = 9
	req := &prismv1.LookupRequest{Model: "m", NumSamples: n, DenseAddr: addr, FanoutKey: "k", Shard: int32(shard), Shards: 2,
		Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "s", Ids: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8}}}}}
	if _, err := s.Lookup(context.Background(), req); err != nil {
		t.Fatalf("9 samples of 16 bytes behind 16 bytes in flight, 160 allowed: %v", err)
	}
	if got := d.frame(); len(got) != 1 || len(got["smallout"]) != n*4 {
		t.Fatalf("frame %v: want the small table's column alone", got)
	}
}
