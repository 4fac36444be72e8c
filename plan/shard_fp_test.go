package plan

import "testing"

// A sharding's fingerprint names its layout: the estimates and
// statistics do not change it, the shard count or any table's placement
// does, and the order tables are listed in does not.
func TestShardingFingerprint(t *testing.T) {
	base := func() *Sharding {
		return &Sharding{Shards: 2, ShardBytes: 100, Estimate: "uniform", Tables: []TablePlacement{
			{Table: "a", Placement: TableWise, Shards: []int{0}},
			{Table: "b", Placement: RowWise, Shards: []int{0, 1}},
		}}
	}
	fp := base().Fingerprint()
	if len(fp) != 16 {
		t.Fatalf("fingerprint %q", fp)
	}
	same := base()
	same.Estimate, same.ShardBytes, same.Imbalance = "zipf:1.05", 200, 0.3
	same.Tables[0], same.Tables[1] = same.Tables[1], same.Tables[0]
	if got := same.Fingerprint(); got != fp {
		t.Errorf("same layout: %q, want %q", got, fp)
	}
	for name, change := range map[string]func(*Sharding){
		"shard count":   func(s *Sharding) { s.Shards = 3 },
		"table moved":   func(s *Sharding) { s.Tables[0].Shards = []int{1} },
		"row-wise over": func(s *Sharding) { s.Tables[1].Shards = []int{1, 0} },
		"placement":     func(s *Sharding) { s.Tables[0].Placement = RowWise },
	} {
		s := base()
		change(s)
		if s.Fingerprint() == fp {
			t.Errorf("%s: the fingerprint did not change", name)
		}
	}
	var none *Sharding
	if none.Fingerprint() != "" {
		t.Error("no sharding has a fingerprint")
	}
}

// TestTablesFingerprint: the tables' names and contents, in any order;
// another content is another fingerprint; a table without a recorded
// content makes none.
func TestTablesFingerprint(t *testing.T) {
	p := &Plan{Tables: []Table{{Name: "a", SHA256: "11"}, {Name: "b", SHA256: "22"}}}
	q := &Plan{Tables: []Table{{Name: "b", SHA256: "22"}, {Name: "a", SHA256: "11"}}}
	fp := p.TablesFingerprint()
	if len(fp) != 16 || q.TablesFingerprint() != fp {
		t.Errorf("fingerprints %q and %q of the same tables", fp, q.TablesFingerprint())
	}
	q.Tables[0].SHA256 = "23"
	if q.TablesFingerprint() == fp {
		t.Error("another table content, the same fingerprint")
	}
	q.Tables[0].SHA256 = ""
	if got := q.TablesFingerprint(); got != "" {
		t.Errorf("a table without content: %q, want none", got)
	}
}
