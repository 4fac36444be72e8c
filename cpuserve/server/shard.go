package server

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// A worker whose store holds one shard of a model's sharding (prism
// ingest --shard K; store.Shard says which) serves that shard: it
// announces it (WorkerInfo.shards), looks up only the lookups the shard
// answers in full (plan.json sharding.shard[K].full), and sends the
// dense worker a part holding only those columns, marked with the
// router's fan-out key, its shard and the shard count; the dense worker
// assembles the parts (gpuserve/assemble.go). Shard 0 also sends the cut
// tensors no lookup produces (dense features, cpu.onnx's outputs) and
// runs cpu.onnx.
//
// A shard holding part of a row-wise table (sharding.shard[K].partial)
// answers that table's lookup outputs in part: each bag pooled over the
// ids whose rows it holds (store.TableLookup.Partial), sent as the
// column arrowframe.PartialName(output) and, where the combine takes
// them (sum_count, max_count), the per-sample id counts as
// arrowframe.CountName(output); the dense worker combines the parts of
// every shard of the table (gpuserve/assemble.go).

// shardRef is a served model's shard.
type shardRef struct {
	shard, shards int
	// held: the plan's tables this shard holds (an update of another
	// table of the plan is some other shard's: skipped here).
	held map[string]bool
	// tables: every table of the plan.
	tables map[string]bool
	// partial: the lookup outputs this shard answers in part, by output.
	partial map[string]plan.PartialOutput
	// parts: for each row-wise table this shard holds part of, which
	// rows (id mod [0] == [1]) and the table's rows ([2]): an update
	// writes only its own rows.
	parts map[string][3]int64
	// place: where every table of the plan lives (rowShards).
	place map[string]*plan.TablePlacement
	// inputs: the model inputs this shard reads, sorted (announced in
	// ShardRef.inputs; the router sends only these).
	inputs []string
	// splits: every row-wise table of the plan and where its rows live
	// (announced in ShardRef.row_splits: the router splits an update of
	// one by shard).
	splits []*prismv1.RowSplit
	// sharding fingerprints the plan's sharding (ShardRef.sharding).
	sharding string
	// content fingerprints the plan's tables (ShardRef.content).
	content string
}

// takes says whether the worker's shard of model takes the numbers of
// the update sequence named name (ApplyUpdateRequest.sequence: its key,
// and the sharding it numbers updates of when known), and names its own.
func (sr *shardRef) takes(model, name string) (ok bool, own string) {
	key, sharding := prismv1.ParseSequenceName(name)
	if sr == nil {
		return key == model, model
	}
	ownKey := prismv1.UpdateSeqKey(model, int32(sr.shard))
	return key == ownKey && prismv1.SameSharding(sharding, sr.sharding), prismv1.SequenceName(ownKey, sr.sharding)
}

// rowShards are the shards of the model's sharding that hold the rows
// of an update of table with ids (UpdateResponse.shards): every worker
// of the model answers the same, so the router can hold each of them
// to its quorum. nil: not a sharded model, or not a table of its plan.
func (sr *shardRef) rowShards(table string, ids []int64) []int32 {
	if sr == nil || sr.place[table] == nil {
		return nil
	}
	tp := sr.place[table]
	on := map[int]bool{}
	for _, id := range ids {
		if id >= 0 {
			on[tp.ShardOf(id)] = true
		}
		if len(on) == len(tp.Shards) {
			break
		}
	}
	out := make([]int32, 0, len(on))
	for k := range sr.shards {
		if on[k] {
			out = append(out, int32(k))
		}
	}
	return out
}

// ownRows keeps of an update of table the ids (and their rows of width
// dim) this shard holds. An id outside the table is bad input on every
// shard alike (ok false), so replicas never split on it.
func (sr *shardRef) ownRows(table string, ids []int64, rows []float32) (keptIDs []int64, keptRows []float32, ok bool) {
	if sr == nil {
		return ids, rows, true
	}
	pt, split := sr.parts[table]
	if !split {
		return ids, rows, true
	}
	dim := len(rows) / len(ids)
	for i, id := range ids {
		if id < 0 || id >= pt[2] {
			return nil, nil, false
		}
		if id%pt[0] == pt[1] {
			keptIDs = append(keptIDs, id)
			keptRows = append(keptRows, rows[i*dim:(i+1)*dim]...)
		}
	}
	return keptIDs, keptRows, true
}

// partialOf is how this shard answers a lookup output in part (ok false:
// whole, or not a sharded model).
func (sr *shardRef) partialOf(output string) (po plan.PartialOutput, ok bool) {
	if sr == nil {
		return po, false
	}
	po, ok = sr.partial[output]
	return po, ok
}

// ensureServed is ensureIngested for a store that may hold a shard of
// the model: such a store is checked against the shard's tables only.
func ensureServed(ctx context.Context, st *store.Store, dir string, p *plan.Plan, progress func(model string, done, total int64)) (bool, error) {
	name := p.ServedName(dir)
	if !slices.Contains(st.Models(), name) {
		return ensureIngested(ctx, st, dir, p, progress)
	}
	ref, ok, err := st.Shard(name)
	if err != nil {
		return false, fmt.Errorf("model %q: %w", name, err)
	}
	if !ok {
		return ensureIngested(ctx, st, dir, p, progress)
	}
	if err := checkShardPlan(name, dir, p, ref); err != nil {
		return false, err
	}
	if err := st.MatchShard(name, p, ref.Shard); err != nil {
		return false, fmt.Errorf("%w (plan in %s): ingest the shard (prism ingest --shard %d) or serve the plan the store holds", err, dir, ref.Shard)
	}
	return false, nil
}

// checkShardPlan checks that the plan's sharding is the one the store's
// shard came from, and that this build serves the shard.
func checkShardPlan(name, dir string, p *plan.Plan, ref store.ShardRef) error {
	sh := p.Sharding
	switch {
	case sh == nil:
		return fmt.Errorf("model %q: the store holds shard %d of %d, but the plan in %s has no sharding section: serve the plan the shard was ingested from", name, ref.Shard, ref.Shards, dir)
	case sh.Shards != ref.Shards || ref.Shard < 0 || ref.Shard >= sh.Shards:
		return fmt.Errorf("model %q: the store holds shard %d of %d, the plan in %s shards into %d", name, ref.Shard, ref.Shards, dir, sh.Shards)
	}
	if err := p.ValidateSharding(); err != nil {
		return fmt.Errorf("model %q: %w", name, err)
	}
	return nil
}

// shardModel narrows m to the shard the store holds, if it holds one:
// m's lookups, cut (the frame's columns) and cpu.onnx become the
// shard's. It returns nil for a store holding the whole model.
func shardModel(st *store.Store, m *model) (*shardRef, error) {
	ref, ok, err := st.Shard(m.name)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", m.name, err)
	}
	if !ok {
		return nil, nil
	}
	p := m.plan
	if err := checkShardPlan(m.name, m.dir, p, ref); err != nil {
		return nil, err
	}
	info := p.Sharding.Shard[ref.Shard]
	full := map[string]bool{}
	for _, o := range info.Full {
		full[o] = true
	}
	sr := &shardRef{shard: ref.Shard, shards: ref.Shards, held: map[string]bool{}, tables: map[string]bool{}, partial: map[string]plan.PartialOutput{}, parts: map[string][3]int64{}, sharding: p.Sharding.Fingerprint(), content: p.TablesFingerprint()}
	for _, po := range info.Partial {
		sr.partial[po.Output] = po
	}
	sr.place = map[string]*plan.TablePlacement{}
	for _, t := range p.Tables {
		sr.tables[t.Name] = true
		sr.place[t.Name] = p.Sharding.Placement(t.Name)
		if tp := sr.place[t.Name]; tp != nil && tp.Placement == plan.RowWise && len(tp.Shards) > 1 {
			shards := make([]int32, len(tp.Shards))
			for i, k := range tp.Shards {
				shards[i] = int32(k)
			}
			sr.splits = append(sr.splits, &prismv1.RowSplit{Table: t.Name, Shards: shards, Rows: t.Rows})
		}
		if mod, rem, holds := p.Sharding.Placement(t.Name).Part(ref.Shard); holds {
			sr.held[t.Name] = true
			if mod > 1 {
				sr.parts[t.Name] = [3]int64{mod, rem, t.Rows}
			}
		}
	}
	produced := map[string]bool{} // every lookup output of the plan
	for _, ls := range m.lookups {
		produced[ls.l.Output] = true
	}
	m.lookups = slices.DeleteFunc(m.lookups, func(ls lookupSpec) bool {
		_, part := sr.partial[ls.l.Output]
		return !full[ls.l.Output] && !part
	})
	if m.cpu != nil {
		if ref.Shard != 0 {
			m.cpu.Close()
			m.cpu, m.cpuIns, m.cpuOuts = nil, nil, nil
		} else {
			for _, in := range m.cpuIns {
				if _, part := sr.partial[in]; part {
					return nil, fmt.Errorf("model %q: cpu.onnx reads lookup output %q, which comes from a row-wise table: a row-wise table's lookups must feed the dense side directly (plan it table-wise: a larger --shard-bytes)", m.name, in)
				}
				if produced[in] && !full[in] {
					return nil, fmt.Errorf("model %q: cpu.onnx reads lookup output %q, which shard 0 does not hold: a sharded model's cpu.onnx may read only shard 0's lookups", m.name, in)
				}
			}
		}
	}
	// The shard sends its lookups' cut tensors; shard 0 also the others.
	// An output answered in part goes as its partial column (and counts).
	var cut []cutSpec
	sent := map[string]bool{}
	for _, c := range m.cut {
		po, part := sr.partial[c.name]
		switch {
		case part:
			cut = append(cut, cutSpec{name: arrowframe.PartialName(c.name), shape: c.shape})
			if po.Combine != plan.CombineSum {
				cut = append(cut, cutSpec{name: arrowframe.CountName(c.name), shape: []int64{1}})
			}
			sent[c.name] = true
		case produced[c.name] && full[c.name], !produced[c.name] && ref.Shard == 0:
			cut = append(cut, c)
		}
	}
	for o := range sr.partial {
		if !sent[o] {
			return nil, fmt.Errorf("model %q: shard %d answers %q in part, which is not a cut tensor: a row-wise table's lookups must feed the dense side directly (plan it table-wise: a larger --shard-bytes)", m.name, ref.Shard, o)
		}
	}
	m.cut = cut
	// Admission charges the frame this shard sends: its own columns
	// (loadModel counted the whole model's cut).
	m.sampleBytes = cutSampleBytes(m.cut)
	sr.inputs = shardInputs(m)
	m.needs = map[string]bool{}
	for _, in := range sr.inputs {
		m.needs[in] = true
	}
	if m.cols != nil {
		m.cols = m.cols[:0:0]
		for _, c := range m.cut {
			w := 1
			for _, d := range c.shape {
				w *= int(max(d, 0))
			}
			m.cols = append(m.cols, arrowframe.Column{Name: c.name, Width: w})
		}
	}
	return sr, nil
}

// shardInputs are the model inputs a shard reads (m already cut down
// to the shard's lookups and cut tensors): its lookups' ids (or the
// inputs their pre-lookup ops start from), per-id weights and offsets,
// every input of pre.onnx (which runs whole), and on shard 0 the inputs
// it passes to the dense side as they are and cpu.onnx's.
func shardInputs(m *model) []string {
	set := map[string]bool{}
	add := func(name string) {
		if name != "" && m.inputs[name] != nil {
			set[name] = true
		}
	}
	for _, ls := range m.lookups {
		l := ls.l
		add(l.Input)
		add(l.Weights)
		add(l.Offsets)
		for _, in := range l.PreInputs {
			add(in)
		}
	}
	if m.pre != nil {
		for _, in := range m.pre.ins {
			add(in)
		}
	}
	for _, c := range m.cut { // a model input crossing the cut as it is
		add(c.name)
	}
	for _, in := range m.cpuIns { // nil but on shard 0
		add(in)
	}
	// A jagged input's offsets come with it.
	for _, j := range m.plan.Jagged() {
		if set[j.Name] {
			add(j.Offsets)
		}
	}
	out := make([]string, 0, len(set))
	for name := range set {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// checkShard checks a Lookup's fan-out fields against the shard this
// worker holds of the model (sr nil: the whole model).
func checkShard(model string, sr *shardRef, req *prismv1.LookupRequest) error {
	if sr == nil {
		if req.GetShards() != 0 {
			return status.Errorf(codes.FailedPrecondition, "model %q: this embedding worker holds the whole model, the lookup asks for shard %d of %d", model, req.GetShard(), req.GetShards())
		}
		return nil
	}
	switch {
	case int(req.GetShards()) != sr.shards || int(req.GetShard()) != sr.shard:
		return status.Errorf(codes.FailedPrecondition, "model %q: this embedding worker holds shard %d of %d, the lookup asks for shard %d of %d (a router that does not fan out sharded models?)", model, sr.shard, sr.shards, req.GetShard(), req.GetShards())
	case req.GetFanoutKey() == "":
		return badInput("model %q: a lookup of shard %d of %d needs a fan-out key", model, sr.shard, sr.shards)
	}
	return nil
}

// skipsUpdate says whether an update of table belongs to another shard
// of model: a table of the plan this worker's shard does not hold.
func (s *Server) skipsUpdate(model, table string) bool {
	sr := s.shards[model]
	return sr != nil && sr.tables[table] && !sr.held[table]
}

// shardRefs is what WorkerInfo announces: per sharded model its shard.
func (s *Server) shardRefs() map[string]*prismv1.ShardRef {
	if len(s.shards) == 0 {
		return nil
	}
	out := make(map[string]*prismv1.ShardRef, len(s.shards))
	for name, sr := range s.shards {
		out[name] = &prismv1.ShardRef{Shard: int32(sr.shard), Shards: int32(sr.shards), Inputs: sr.inputs, Tables: slices.Sorted(maps.Keys(sr.held)), NumberRanges: true, RowSplits: sr.splits, RowSplitsComplete: true, Sharding: sr.sharding, Content: sr.content}
	}
	return out
}
