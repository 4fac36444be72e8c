package prismv1

import "testing"

// The key of a shard's update sequence reads back as its model and
// shard, and a name that is not one reads back as a model's own; a
// sequence's name reads back as its key and sharding.
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
		{"dlrm#shard1@ab", "dlrm#shard1@ab", -1},
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
	w := &WorkerInfo{Shards: map[string]*ShardRef{"m": {Shard: 2, Shards: 3, Sharding: "ab12"}}}
	if got := UpdateSeqKeyOf(w, "m"); got != "m#shard2" {
		t.Errorf("UpdateSeqKeyOf = %q", got)
	}
	if got := UpdateSeqKeyOf(w, "other"); got != "other" {
		t.Errorf("UpdateSeqKeyOf(unsharded) = %q", got)
	}
	for _, c := range []struct{ name, key, fp string }{
		{"m#shard2@9f3c0a1b2c3d4e5f", "m#shard2", "9f3c0a1b2c3d4e5f"},
		{"m#shard2", "m#shard2", ""},
		{"m@x#shard2", "m@x#shard2", ""},
		{"m", "m", ""},
	} {
		if key, fp := ParseSequenceName(c.name); key != c.key || fp != c.fp {
			t.Errorf("ParseSequenceName(%q) = %q, %q; want %q, %q", c.name, key, fp, c.key, c.fp)
		}
		if back := SequenceName(c.key, c.fp); back != c.name {
			t.Errorf("SequenceName(%q, %q) = %q, want %q", c.key, c.fp, back, c.name)
		}
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{{"aa", "aa", true}, {"aa", "", true}, {"", "bb", true}, {"aa", "bb", false}} {
		if SameSharding(c.a, c.b) != c.same {
			t.Errorf("SameSharding(%q, %q) = %v", c.a, c.b, !c.same)
		}
	}
}
