package store

import (
	"fmt"

	"github.com/prism-serve/prism/plan"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// RowPart is the part of a table's rows a physical table holds when its
// store holds a shard of a row-wise table (plan.Sharding): the rows r
// with r mod Mod == Rem, keyed by their row id in the whole table.
type RowPart struct {
	Mod int64 `json:"mod"`
	Rem int64 `json:"rem"`
}

// holds says whether row is in the part (a nil part holds every row).
func (p *RowPart) holds(row int64) bool { return p == nil || row%p.Mod == p.Rem }

// count is the number of rows of [0, rows) in the part.
func (p *RowPart) count(rows int64) int64 {
	if p == nil {
		return rows
	}
	return plan.PartRows(rows, p.Mod, p.Rem)
}

func (p *RowPart) equal(q *RowPart) bool {
	if p == nil || q == nil {
		return p == q
	}
	return *p == *q
}

// held is the number of rows the physical table holds.
func (t *physTable) held() int64 { return t.Part.count(t.Rows) }

// ShardRef is the shard of a plan's sharding a model version holds.
type ShardRef struct {
	Shard  int `json:"shard"`
	Shards int `json:"shards"`
	// Sharding is the fingerprint of the plan's sharding the shard was
	// ingested for (plan.Sharding.Fingerprint; "" in stores of earlier
	// releases): a plan sharded again with the same shard count may
	// place other tables, or other rows, on this shard.
	Sharding string `json:"sharding,omitempty"`
}

// Shard says which shard of model the active version holds, for the
// worker to announce; ok is false for a version that holds the whole
// model (ingested without IngestOptions.Shard).
func (s *Store) Shard(model string) (ref ShardRef, ok bool, err error) {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	m := s.cat.Models[model]
	if m == nil || m.Versions[m.Active] == nil {
		return ShardRef{}, false, fmt.Errorf("model %q: %w", model, ErrUnknownModel)
	}
	if r := m.Versions[m.Active].Shard; r != nil {
		return *r, true, nil
	}
	return ShardRef{}, false, nil
}

// shardJobs keeps the tables of plan p that shard k holds, each with the
// part of its rows (nil: all of them).
func shardTables(p *plan.Plan, k int) ([]plan.Table, []*RowPart, error) {
	if err := p.ValidateSharding(); err != nil {
		return nil, nil, badRequestf("%w", err)
	}
	sh := p.Sharding
	if sh == nil {
		return nil, nil, badRequestf("shard %d: the plan has no sharding section (run prism shard first)", k)
	}
	if k < 0 || k >= sh.Shards {
		return nil, nil, badRequestf("shard %d: the plan has shards 0 to %d", k, sh.Shards-1)
	}
	var tables []plan.Table
	var parts []*RowPart
	for _, t := range p.Tables {
		tp := sh.Placement(t.Name)
		mod, rem, ok := tp.Part(k)
		if !ok {
			continue
		}
		tables = append(tables, t)
		if mod > 1 {
			parts = append(parts, &RowPart{Mod: mod, Rem: rem})
		} else {
			parts = append(parts, nil)
		}
	}
	return tables, parts, nil
}

// width is the hot tier width code of the table's rows: when the tier
// holds rows packed, hot.HalfWidth of its dim for a float16 table and
// hot.Int8Width for an int8 one, else its dim.
func (t *physTable) width(packed bool) int {
	switch {
	case packed && t.DType == Float16:
		return hot.HalfWidth(t.Dim)
	case packed && t.DType == Int8:
		return hot.Int8Width(t.Dim)
	}
	return t.Dim
}

// MatchShard says whether model's active version holds shard k of the
// plan p's sharding as p places it: nil if so, else what differs (a
// whole model, another shard or shard count, another sharding's
// fingerprint, or a table of the shard missing, of another shape or
// holding other rows). A store of an earlier release records no
// fingerprint; its tables and rows are compared all the same. A table
// of other content than the plan's (its sha256) differs too.
func (s *Store) MatchShard(model string, p *plan.Plan, k int) error {
	ref, ok, err := s.Shard(model)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("model %q: the store holds the whole model, not shard %d", model, k)
	case p.Sharding == nil:
		return fmt.Errorf("model %q: the store holds shard %d of %d, the plan has no sharding section", model, ref.Shard, ref.Shards)
	case ref.Shard != k || ref.Shards != p.Sharding.Shards:
		return fmt.Errorf("model %q: the store holds shard %d of %d, not shard %d of %d", model, ref.Shard, ref.Shards, k, p.Sharding.Shards)
	case ref.Sharding != "" && ref.Sharding != p.Sharding.Fingerprint():
		return fmt.Errorf("model %q: the store's shard %d of %d was ingested for another sharding (%s) than the plan's (%s)", model, ref.Shard, ref.Shards, ref.Sharding, p.Sharding.Fingerprint())
	}
	tabs, err := s.Tables(model)
	if err != nil {
		return err
	}
	have := map[string]TableInfo{}
	for _, t := range tabs {
		have[t.Name] = t
	}
	for _, t := range p.Tables {
		mod, rem, holds := p.Sharding.Placement(t.Name).Part(k)
		if !holds {
			continue
		}
		h, ok := have[t.Name]
		if err := matchTable(model, fmt.Sprintf("the store's shard %d of %d", k, ref.Shards), t, h, ok); err != nil {
			return err
		}
		var want *RowPart
		if mod > 1 {
			want = &RowPart{Mod: mod, Rem: rem}
		}
		if !want.equal(h.Part) {
			return fmt.Errorf("model %q: the store's shard %d of %d holds rows %s of table %q, the plan places rows %s on it", model, k, ref.Shards, h.Part, t.Name, want)
		}
	}
	return nil
}

// MatchPlan says whether model's active version holds the whole model
// with the tables of plan p: nil if so, else what differs (a shard, a
// table missing, of another shape, or of other content than the
// plan's sha256). Updates made since the ingest do not count: the
// version holds the plan, and its updates.
func (s *Store) MatchPlan(model string, p *plan.Plan) error {
	ref, ok, err := s.Shard(model)
	switch {
	case err != nil:
		return err
	case ok:
		return fmt.Errorf("model %q: the store holds shard %d of %d, not the whole model", model, ref.Shard, ref.Shards)
	}
	tabs, err := s.Tables(model)
	if err != nil {
		return err
	}
	have := map[string]TableInfo{}
	for _, t := range tabs {
		have[t.Name] = t
	}
	for _, t := range p.Tables {
		h, ok := have[t.Name]
		if err := matchTable(model, "the store's active version", t, h, ok); err != nil {
			return err
		}
	}
	return nil
}

// matchTable says how where (the store's copy of model), holding h of
// plan table t (ok false: not at all), differs from the plan: missing,
// of another shape, or of other content (its sha256; a side that
// recorded none matches). Another version of the model (retrained, or
// the store switched to another) served under this plan would meet this
// plan's cpu.onnx and dense side, and its worker would announce this
// plan's content.
func matchTable(model, where string, t plan.Table, h TableInfo, ok bool) error {
	switch {
	case !ok:
		return fmt.Errorf("model %q: %s lacks table %q, which the plan holds", model, where, t.Name)
	case h.Rows != t.Rows || h.Dim != t.Dim:
		return fmt.Errorf("model %q: %s holds table %q as %d x %d, the plan as %d x %d", model, where, t.Name, h.Rows, h.Dim, t.Rows, t.Dim)
	case t.SHA256 != "" && h.SHA256 != "" && h.SHA256 != t.SHA256:
		return fmt.Errorf("model %q: %s holds table %q of other content than the plan's (sha256 %.12s, the plan's %.12s): another version of the model", model, where, t.Name, h.SHA256, t.SHA256)
	}
	return nil
}

// String is "r mod M = R", or "all" for a nil part.
func (p *RowPart) String() string {
	if p == nil {
		return "all"
	}
	return fmt.Sprintf("r mod %d = %d", p.Mod, p.Rem)
}

// MatchDTypes says how model's active version stores its tables in other
// dtypes than o asks for (its DType, or TableDTypes per table), or nil
// when every table of the version is stored so. prism ingest
// --if-changed --dtype uses it: the same plan in another dtype is other
// physical tables, so another version.
func (s *Store) MatchDTypes(model string, o IngestOptions) error {
	tabs, err := s.Tables(model)
	if err != nil {
		return err
	}
	for _, t := range tabs {
		want, err := o.tableDType(t.Name)
		if err != nil {
			return fmt.Errorf("table %q: %w", t.Name, err)
		}
		if have, _ := ParseDType(string(t.DType)); have != want {
			return fmt.Errorf("model %q: the store's active version holds table %q as %s, not %s", model, t.Name, have, want)
		}
	}
	return nil
}

// RecordHotBytes records n (> 0) as the store's default hot tier size,
// as an ingest with IngestOptions.HotBytes does, for a start that takes
// no size of its own.
func (s *Store) RecordHotBytes(n int64) error {
	if n <= 0 {
		return fmt.Errorf("hot tier size %d: want a positive size", n)
	}
	s.catMu.Lock()
	defer s.catMu.Unlock()
	if s.cat.HotBytes == n {
		return nil
	}
	next := s.cat.clone()
	next.HotBytes = n
	return s.commit(next)
}
