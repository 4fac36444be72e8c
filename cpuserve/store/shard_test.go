package store

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// storedRows reads every row a store holds of model's table, straight
// from Pebble: row id to value.
func storedRows(t *testing.T, s *Store, model, table string) map[int64][]float32 {
	t.Helper()
	mv, err := s.model(model)
	if err != nil {
		t.Fatal(err)
	}
	tv := mv.tables[table]
	if tv == nil {
		return nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: tv.lo, UpperBound: tv.hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	out := map[int64][]float32{}
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Key()) != keyLen {
			continue
		}
		row := make([]float32, tv.dim)
		if !tv.dtype.decode(row, it.Value()) {
			t.Fatalf("table %q row %d: bad value", table, keyRow(it.Key()))
		}
		out[keyRow(it.Key())] = row
	}
	return out
}

// Each shard of a small model ingested into its own store: together
// they hold every row of every table exactly once, with the unsharded
// store's values, and each store says which shard it holds.
func TestIngestShards(t *testing.T) {
	tables := []*testTable{
		{name: "big", rows: 1001, dim: 8, seed: 1},
		{name: "mid", rows: 300, dim: 16, seed: 2},
		{name: "small", rows: 37, dim: 4, seed: 3},
		{name: "tiny", rows: 5, dim: 4, seed: 4},
	}
	dir := writePlan(t, "m", tables)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	const shards = 3
	// A budget that forces "big" (32 KB) row-wise.
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: shards, ShardBytes: 20 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if pl := p.Sharding.Placement("big"); pl.Placement != plan.RowWise {
		t.Fatalf("big placed %+v, want row-wise", pl)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	whole, _ := openMem(t, nil)
	if _, err := whole.Ingest(ctx, dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := whole.Shard("m"); err != nil || ok {
		t.Fatalf("unsharded store: Shard says ok %v, %v", ok, err)
	}
	held := map[string]map[int64]int{} // table, row: shard
	for k := range shards {
		s, _ := openMem(t, nil)
		rep, err := s.Ingest(ctx, dir, IngestOptions{Shard: &k})
		if err != nil {
			t.Fatalf("shard %d: %v", k, err)
		}
		if ref, ok, err := s.Shard("m"); err != nil || !ok || ref != (ShardRef{Shard: k, Shards: shards, Sharding: p.Sharding.Fingerprint()}) {
			t.Fatalf("shard %d: Shard says %+v %v %v", k, ref, ok, err)
		}
		if rep.Rows != p.Sharding.Shard[k].Rows {
			t.Fatalf("shard %d: ingested %d rows, the plan says %d", k, rep.Rows, p.Sharding.Shard[k].Rows)
		}
		infos, err := s.Tables("m")
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range tables {
			_, _, want := p.Sharding.Placement(tt.name).Part(k)
			has := slices.ContainsFunc(infos, func(i TableInfo) bool { return i.Name == tt.name })
			if has != want {
				t.Fatalf("shard %d: table %q held %v, plan says %v", k, tt.name, has, want)
			}
			rows := storedRows(t, s, "m", tt.name)
			wholeRows := storedRows(t, whole, "m", tt.name)
			if held[tt.name] == nil {
				held[tt.name] = map[int64]int{}
			}
			pl := p.Sharding.Placement(tt.name)
			for id, v := range rows {
				if prev, ok := held[tt.name][id]; ok {
					t.Fatalf("table %q row %d on shard %d and %d", tt.name, id, prev, k)
				}
				held[tt.name][id] = k
				if pl.ShardOf(id) != k {
					t.Fatalf("table %q row %d on shard %d, ShardOf says %d", tt.name, id, k, pl.ShardOf(id))
				}
				if !slices.Equal(v, wholeRows[id]) {
					t.Fatalf("table %q row %d differs from the unsharded store's", tt.name, id)
				}
			}
			// Lookups of the rows it holds read them; of others, no row.
			if has {
				for id := range min(tt.rows, 12) {
					out := make([]float32, tt.dim)
					err := s.Lookup("m", []TableLookup{{Table: tt.name, IDs: []int64{id}, Bag: 1, Pooling: PoolSum, Out: out}})
					switch {
					case pl.ShardOf(id) == k && (err != nil || !slices.Equal(out, wholeRows[id])):
						t.Fatalf("shard %d table %q row %d: lookup %v %v", k, tt.name, id, out, err)
					case pl.ShardOf(id) != k && err == nil:
						t.Fatalf("shard %d table %q row %d: another shard's row looked up without error", k, tt.name, id)
					}
				}
			}
		}
		if pre := s.Preloaded(); pre.Rows != p.Sharding.Shard[k].Rows {
			t.Fatalf("shard %d: preloaded %d rows, holds %d", k, pre.Rows, p.Sharding.Shard[k].Rows)
		}
		// Ingesting the same shard again shares its copies; another
		// model's shard of the same content does not share a part.
		rep2, err := s.Ingest(ctx, dir, IngestOptions{Shard: &k, Model: "m2"})
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range rep2.Tables {
			if !tr.Shared {
				t.Fatalf("shard %d re-ingested: table %q not shared", k, tr.Name)
			}
		}
	}
	for _, tt := range tables {
		if int64(len(held[tt.name])) != tt.rows {
			t.Fatalf("table %q: the shards hold %d rows of %d", tt.name, len(held[tt.name]), tt.rows)
		}
	}
}

func TestIngestShardErrors(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}})
	s, _ := openMem(t, nil)
	k := 0
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("shard of a plan without sharding: %v", err)
	}
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{-1, 2} {
		if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("shard %d of 2: %v", k, err)
		}
	}
}

// TestIngestTableDTypes: a dtype per table applies to the table it
// names; a name the plan has not is refused (ErrBadRequest) before
// anything is ingested, not left at the default dtype without a word.
func TestIngestTableDTypes(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}, {name: "b", rows: 10, dim: 4, seed: 2}})
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{TableDTypes: map[string]DType{"a": Int8, "nope": Float16}}); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("a dtype for a table the plan has not: %v", err)
	}
	if vs, _ := s.Versions("m"); len(vs) != 0 {
		t.Fatalf("the refused ingest left versions %v", vs)
	}
	rep, err := s.Ingest(context.Background(), dir, IngestOptions{TableDTypes: map[string]DType{"a": Int8}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]DType{}
	for _, tr := range rep.Tables {
		got[tr.Name] = tr.DType
	}
	if got["a"] != Int8 || got["b"] != Float32 {
		t.Fatalf("stored dtypes %v, want a int8 and b float32", got)
	}
}

// TestMatchShard: a store's shard matches a plan when it is that shard
// of that sharding: another shard, another shard count, the whole model
// or a sharding of the same count that places rows otherwise (the
// fingerprint recorded at ingest) do not, nor the same layout of other
// tables' content (a retrained model: prism up ingested nothing and
// served the old rows under the new plan).
func TestMatchShard(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "x", rows: 10, dim: 2, seed: 3}, {name: "y", rows: 2, dim: 2, seed: 4}})
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Layout a from the planner (x over budget: row-wise); b is a with
	// shards 0 and 1 swapped, another layout of the same count.
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2, ShardBytes: 70})
	if err != nil {
		t.Fatal(err)
	}
	layout := func(r *sharding.Result) *plan.Plan {
		q := *p
		if q.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
			t.Fatal(err)
		}
		return &q
	}
	a := layout(r)
	if pl := a.Sharding.Placement("x"); pl.Placement != plan.RowWise {
		t.Fatalf("x placed %+v, the test wants it row-wise", pl)
	}
	swapped := *r
	swapped.Placements = nil
	for _, pl := range r.Placements {
		pl.Shards = slices.Clone(pl.Shards)
		for i := range pl.Shards {
			pl.Shards[i] = 1 - pl.Shards[i]
		}
		swapped.Placements = append(swapped.Placements, pl)
	}
	swapped.Bytes = []int64{r.Bytes[1], r.Bytes[0]}
	swapped.Rows = []int64{r.Rows[1], r.Rows[0]}
	swapped.Lookups = []float64{r.Lookups[1], r.Lookups[0]}
	b := layout(&swapped)
	if a.Sharding.Fingerprint() == b.Sharding.Fingerprint() {
		t.Fatal("two layouts, one fingerprint")
	}
	if err := plan.Write(dir, a); err != nil {
		t.Fatal(err)
	}
	s, _ := openMem(t, nil)
	k := 0
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	whole := *p
	r3, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 3, ShardBytes: 70})
	if err != nil {
		t.Fatal(err)
	}
	three := layout(r3)
	// The same layout of a retrained model: x of other content.
	retrained := *a
	retrained.Tables = slices.Clone(a.Tables)
	for i := range retrained.Tables {
		if retrained.Tables[i].Name == "x" {
			retrained.Tables[i].SHA256 = strings.Repeat("0", 64)
		}
	}
	for _, tc := range []struct {
		name string
		p    *plan.Plan
		k    int
		want string // "" matches
	}{
		{"the shard it was ingested as", a, 0, ""},
		{"another shard", a, 1, "not shard 1 of 2"},
		{"another shard count", three, 0, "not shard 0 of 3"},
		{"no sharding", &whole, 0, "no sharding section"},
		{"another sharding of the same count", b, 0, "ingested for another sharding"},
		{"another version's content", &retrained, 0, `holds table "x" of other content than the plan's`},
	} {
		err := s.MatchShard("m", tc.p, tc.k)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A store of an earlier release, with no fingerprint: its tables'
	// rows are compared.
	s2, _ := openMem(t, nil)
	if _, err := s2.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	s2.catMu.Lock()
	m := s2.cat.Models["m"]
	m.Versions[m.Active].Shard.Sharding = ""
	s2.catMu.Unlock()
	if err := s2.MatchShard("m", a, 0); err != nil {
		t.Errorf("a store without a fingerprint, the same layout: %v", err)
	}
	if err := s2.MatchShard("m", b, 0); err == nil || !strings.Contains(err.Error(), "holds rows r mod 2 = ") {
		t.Errorf("a store without a fingerprint, rows placed otherwise: %v", err)
	}
}

// TestShardSwitchResetsSeq: a store's update number counts the
// sequence of the shard it holds (the router numbers each shard's
// updates apart). Switched to a version of another shard (prism ingest
// --shard K into the store of shard J, by mistake, or store versions
// --activate), or of the whole model, it holds none of that sequence's
// updates and must say 0, or the router takes it for holding the new
// shard's first updates and never replays them (it served their rows
// stale). A new version of the same shard keeps the number.
func TestShardSwitchResetsSeq(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "x", rows: 10, dim: 2, seed: 3}, {name: "y", rows: 4, dim: 2, seed: 4}})
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, _ := openMem(t, nil)
	ingest := func(k int) int {
		t.Helper()
		rep, err := s.Ingest(ctx, dir, IngestOptions{Shard: &k})
		if err != nil {
			t.Fatalf("ingest shard %d: %v", k, err)
		}
		return rep.Version
	}
	seq := func(want int64, what string) {
		t.Helper()
		if got, err := s.AppliedSeq("m"); err != nil || got != want {
			t.Fatalf("%s: AppliedSeq %d, %v; want %d", what, got, err, want)
		}
	}
	v0 := ingest(0)
	infos, err := s.Tables("m")
	if err != nil || len(infos) == 0 {
		t.Fatalf("shard 0 holds %v, %v", infos, err)
	}
	tab := infos[0].Name
	var id int64
	for id = 0; !infos[0].Part.holds(id); id++ {
	}
	for n := int64(1); n <= 2; n++ {
		if _, err := s.UpsertSeq("m", tab, []int64{id}, []float32{float32(n), 0}, n); err != nil {
			t.Fatal(err)
		}
	}
	seq(2, "shard 0 after its updates 1 and 2")
	ingest(0)
	seq(2, "a new version of shard 0")
	// A diverged mark names an update of shard 0's sequence: it goes
	// with the number (diverged.go).
	if marked, err := s.MarkDiverged("m", 2); err != nil || !marked {
		t.Fatalf("MarkDiverged: %v, %v", marked, err)
	}
	ingest(1)
	seq(0, "shard 1 ingested into shard 0's store")
	if d, err := s.Diverged(); err != nil || d != nil {
		t.Fatalf("shard 1 ingested into shard 0's store: diverged marks %v, %v; want none", d, err)
	}
	if err := s.Activate("m", v0); err != nil {
		t.Fatal(err)
	}
	seq(0, "shard 0 activated again after shard 1")
	// The number starts afresh: the router replays the shard's updates.
	if _, err := s.UpsertSeq("m", tab, []int64{id}, []float32{1, 0}, 1); err != nil {
		t.Fatal(err)
	}
	seq(1, "shard 0 replayed update 1")
	if _, err := s.Ingest(ctx, dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	seq(0, "the whole model ingested into a shard's store")
}

// TestVersionsNameShard: prism store versions says which shard each
// version holds (or none: the whole model). Switching a store to a
// version of another shard restarts its update number and makes its
// worker serve that shard; the list must tell the versions apart.
func TestVersionsNameShard(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "x", rows: 10, dim: 2, seed: 3}, {name: "y", rows: 4, dim: 2, seed: 4}})
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, _ := openMem(t, nil)
	for _, k := range []int{0, 1} {
		if _, err := s.Ingest(ctx, dir, IngestOptions{Shard: &k, NoActivate: k > 0}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Ingest(ctx, dir, IngestOptions{NoActivate: true}); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Versions("m")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	WriteVersions(&b, vs)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "shard 0 of 2") || !strings.Contains(lines[1], "shard 1 of 2") || strings.Contains(lines[2], "shard") {
		t.Fatalf("versions of shard 0, shard 1 and the whole model:\n%s", b.String())
	}
}

// TestIngestRefusesNonFinite: a table holding NaN or an infinity is
// refused with the table, row and column (ErrBadRequest), in every
// dtype, and nothing of it is served. Served, it turned every score it
// pooled into NaN; measured for int8 the loss record held NaN and the
// ingest failed writing the catalog ("json: unsupported value: NaN").
func TestIngestRefusesNonFinite(t *testing.T) {
	for _, bad := range []float32{float32(math.Inf(1)), float32(math.NaN())} {
		for _, dt := range []DType{Float32, Float16, Int8} {
			data := randomTable(10, 4, 1)
			data[3*4+2] = bad
			dir := writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, data: data}})
			s, _ := openMem(t, nil)
			_, err := s.Ingest(context.Background(), dir, IngestOptions{DType: dt})
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), `table "a" row 3: value `) || !strings.Contains(err.Error(), "in column 2 is not a finite number") {
				t.Errorf("%v in a %s table: %v, want ErrBadRequest naming row 3, column 2", bad, dt, err)
			}
			if vs, _ := s.Versions("m"); len(vs) != 0 {
				t.Errorf("%v in a %s table: versions %v after the refusal", bad, dt, vs)
			}
		}
	}
}
