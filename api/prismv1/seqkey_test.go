package prismv1

import "testing"

// The key of a shard's update sequence reads back as its model and
// shard, and a name that is not one reads back as a model's own.
func TestUpdateSeqKey(t *testing.T) {
	for _, c := range []struct {
		key   string
		model string
		shard int32
	}{
		{"dlrm", "dlrm", -1},
		{"dlrm#shard0", "dlrm", 0},
		{"dlrm#shard12", "dlrm", 12},
		{"a#shard2#shard3", "a#shard2", 3},
		{"dlrm#shard", "dlrm#shard", -1},
		{"dlrm#shard01", "dlrm#shard01", -1},
		{"dlrm#shard-1", "dlrm#shard-1", -1},
		{"dlrm#shard1x", "dlrm#shard1x", -1},
		{"dlrm#shard99999999999", "dlrm#shard99999999999", -1},
	} {
		model, shard := ParseUpdateSeqKey(c.key)
		if model != c.model || shard != c.shard {
			t.Errorf("ParseUpdateSeqKey(%q) = %q, %d; want %q, %d", c.key, model, shard, c.model, c.shard)
		}
		if back := UpdateSeqKey(model, shard); back != c.key {
			t.Errorf("UpdateSeqKey(%q, %d) = %q, want %q", model, shard, back, c.key)
		}
	}
	w := &WorkerInfo{Shards: map[string]*ShardRef{"m": {Shard: 2, Shards: 3}}}
	if got := UpdateSeqKeyOf(w, "m"); got != "m#shard2" {
		t.Errorf("UpdateSeqKeyOf = %q", got)
	}
	if got := UpdateSeqKeyOf(w, "other"); got != "other" {
		t.Errorf("UpdateSeqKeyOf(unsharded) = %q", got)
	}
}
