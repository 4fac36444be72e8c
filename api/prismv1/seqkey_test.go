package prismv1

import "testing"

// The key of a shard's update sequence reads back as its model, shard
// and sharding, and a name that is not one reads back as a model's own.
func TestUpdateSeqKey(t *testing.T) {
	for _, c := range []struct {
		key      string
		model    string
		shard    int32
		sharding string
	}{
		{"dlrm", "dlrm", -1, ""},
		{"dlrm#shard0", "dlrm", 0, ""},
		{"dlrm#shard12@9f3c0a1b2c3d4e5f", "dlrm", 12, "9f3c0a1b2c3d4e5f"},
		{"a#shard2#shard3", "a#shard2", 3, ""},
		{"dlrm#shard", "dlrm#shard", -1, ""},
		{"dlrm#shard01", "dlrm#shard01", -1, ""},
		{"dlrm#shard-1", "dlrm#shard-1", -1, ""},
		{"dlrm#shard1x", "dlrm#shard1x", -1, ""},
		{"dlrm#shard1@", "dlrm#shard1@", -1, ""},
		{"dlrm#shard1@XYZ", "dlrm#shard1@XYZ", -1, ""},
		{"dlrm#shard99999999999", "dlrm#shard99999999999", -1, ""},
	} {
		model, shard, fp := ParseUpdateSeqKey(c.key)
		if model != c.model || shard != c.shard || fp != c.sharding {
			t.Errorf("ParseUpdateSeqKey(%q) = %q, %d, %q; want %q, %d, %q", c.key, model, shard, fp, c.model, c.shard, c.sharding)
		}
		if back := UpdateSeqKey(model, shard, fp); back != c.key {
			t.Errorf("UpdateSeqKey(%q, %d, %q) = %q, want %q", model, shard, fp, back, c.key)
		}
	}
	w := &WorkerInfo{Shards: map[string]*ShardRef{"m": {Shard: 2, Shards: 3, Sharding: "ab12"}}}
	if got := UpdateSeqKeyOf(w, "m"); got != "m#shard2@ab12" {
		t.Errorf("UpdateSeqKeyOf = %q", got)
	}
	if got := UpdateSeqKeyOf(w, "other"); got != "other" {
		t.Errorf("UpdateSeqKeyOf(unsharded) = %q", got)
	}
}
