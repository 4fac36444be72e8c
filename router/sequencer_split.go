package router

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// part is one shard's share of an update: req numbered in the sequence
// named key.
type part struct {
	key string
	req *prismv1.UpdateRequest
}

// namedTables lists, sorted, the tables model's live workers say their
// shards hold (the first 16), for the refusal of an update of another:
// the name a client knows may not be the plan's (a float16 table is
// served as NAME_float).
func (s *sequencer) namedTables(model string) string {
	tables := map[string]bool{}
	for _, w := range s.workers {
		for _, t := range w.GetShards()[model].GetTables() {
			tables[t] = true
		}
	}
	names := slices.Sorted(maps.Keys(tables))
	if len(names) > 16 {
		return strings.Join(names[:16], ", ") + fmt.Sprintf(" and %d more", len(names)-16)
	}
	return strings.Join(names, ", ")
}

// split cuts req into the parts the sequences of its model take. A
// model that no live worker announces a shard of, and whose shards
// never had a sequence here, has one sequence: req goes whole to it. A
// sharded model's workers announce the tables their shard holds
// (ShardRef.tables) and where each row-wise table's rows live
// (ShardRef.row_splits): an update of a table-wise table goes whole to
// the sequence of the shard holding it, one of a row-wise table in one
// part per shard holding some of its ids, each with those ids and their
// rows. Each shard then numbers only the updates of its own rows: its
// workers are sent nothing of the other shards', and a shard slow or
// down holds up no other's updates.
//
// What split refuses is refused before any number is taken: an id
// outside a row-wise table (one shard would refuse its part while the
// others applied theirs), a table no shard holds while every shard has
// a live worker (InvalidArgument); and (Unavailable: retry) an update
// with rows on a shard that has no live worker, one of a model whose
// shards have no live worker at all, one whose table may have rows on
// such a shard (workers of earlier releases, which do not say which
// tables are row-wise), and one of a model whose workers disagree on
// its sharding (a reshard under way).
func (s *sequencer) split(req *prismv1.UpdateRequest) ([]part, error) {
	model, table := req.GetModel(), req.GetTable()
	var shards int32
	var sharding string
	live := map[int32]bool{}
	holders := map[int32]bool{}
	var rs *prismv1.RowSplit
	complete := false
	silent := map[int32]bool{}         // shards whose live workers name no tables
	for _, id := range s.workerIDs() { // sorted: the same refusal every time
		w := s.workers[id]
		ref := w.GetShards()[model]
		if !slices.Contains(w.GetModels(), model) || ref.GetShards() <= 0 || ref.GetShard() < 0 || ref.GetShard() >= ref.GetShards() {
			continue
		}
		if !s.compatible(model, w) {
			continue // another layout than its shard's sequence: takes nothing
		}
		if shards != 0 && (ref.GetShards() != shards || !prismv1.SameSharding(ref.GetSharding(), sharding)) {
			return nil, status.Errorf(codes.Unavailable, "update of model %q: its embedding workers hold shards of different shardings (%d shards %q, %d shards %q: a reshard under way?); the router takes its updates once they agree; retry", model, shards, sharding, ref.GetShards(), ref.GetSharding())
		}
		shards = ref.GetShards()
		if sharding == "" {
			sharding = ref.GetSharding()
		}
		live[ref.GetShard()] = true
		complete = complete || ref.GetRowSplitsComplete()
		if len(ref.GetTables()) == 0 && !ref.GetRowSplitsComplete() {
			// A worker of a release before ShardRef.tables (this one's say
			// row_splits_complete, also for a shard holding no table).
			silent[ref.GetShard()] = true
		}
		if slices.Contains(ref.GetTables(), table) {
			holders[ref.GetShard()] = true
		}
		for _, r := range ref.GetRowSplits() {
			if r.GetTable() != table || !validSplit(r, ref.GetShards()) {
				continue
			}
			if rs != nil && !proto.Equal(rs, r) {
				return nil, status.Errorf(codes.Unavailable, "update of table %q of model %q: its embedding workers place the table's rows differently (%v and %v); the router takes its updates once they agree; retry", table, model, rs.GetShards(), r.GetShards())
			}
			rs = r
		}
	}
	if shards == 0 {
		if s.updated(model) {
			return nil, status.Errorf(codes.Unavailable, "update of model %q: the model is sharded and none of its shards has a live embedding worker of its layout right now (see the router's log); nothing applied; retry", model)
		}
		if len(s.shardSeqs[model]) > 0 && s.now.Before(s.shardSeen[model].Add(s.shardGrace)) {
			return nil, status.Errorf(codes.Unavailable, "update of model %q: its shards' embedding workers left moments ago; its updates wait for them, or go to workers of the whole model once none has been back for %v; nothing applied; retry", model, s.shardGrace)
		}
		return []part{{key: model, req: req}}, nil
	}
	all := make([]int32, shards)
	for k := range shards {
		all[k] = k
	}
	lacking := func(want []int32) (lack []string) {
		for _, k := range want {
			if !live[k] {
				lack = append(lack, fmt.Sprint(k))
			}
		}
		return lack
	}
	if rs != nil {
		ids := req.GetIds()
		width := len(req.GetRows()) / len(ids) // bytes per row (checked at the RPC boundary)
		byShard := map[int32]*prismv1.UpdateRequest{}
		for i, id := range ids {
			if id >= rs.GetRows() {
				return nil, status.Errorf(codes.InvalidArgument, "update of table %q of model %q: id %d (at %d) is outside the table's %d rows", table, model, id, i, rs.GetRows())
			}
			k := rs.GetShards()[id%int64(len(rs.GetShards()))]
			p := byShard[k]
			if p == nil {
				p = &prismv1.UpdateRequest{Model: model, Table: table}
				byShard[k] = p
			}
			p.Ids = append(p.Ids, id)
			p.Rows = append(p.Rows, req.GetRows()[i*width:(i+1)*width]...)
		}
		on := slices.Sorted(maps.Keys(byShard))
		if lack := lacking(on); len(lack) > 0 {
			return nil, status.Errorf(codes.Unavailable, "update of table %q of model %q: shard %s of %d has no live embedding worker right now; nothing applied; retry", table, model, strings.Join(lack, ", "), shards)
		}
		out := make([]part, len(on))
		for i, k := range on {
			out[i] = part{key: seqKey(model, k), req: byShard[k]}
		}
		return out, nil
	}
	if lack := lacking(all); len(lack) > 0 && (len(holders) == 0 || !complete || len(silent) > 0) {
		// No live worker holds the table, or not every one says which
		// tables it holds and which are row-wise: the table may have
		// rows on the shards down.
		return nil, status.Errorf(codes.Unavailable, "update of table %q of model %q: it may have rows on shard %s of %d, which has no live embedding worker right now; nothing applied; retry", table, model, strings.Join(lack, ", "), shards)
	}
	for k := range silent {
		// Its workers are of a release before ShardRef.tables: its
		// sequence gets the whole update (each keeps its rows, or skips
		// a table it does not hold), as before.
		holders[k] = true
	}
	if len(holders) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: model %q has no table %q (no shard of its %d holds it; its tables: %s)", model, table, shards, s.namedTables(model))
	}
	// A table-wise table's one shard; or, from workers of earlier
	// releases (no row splits), every shard holding part of a row-wise
	// table, each sent the whole update and writing its own rows.
	on := slices.Sorted(maps.Keys(holders))
	out := make([]part, len(on))
	for i, k := range on {
		out[i] = part{key: seqKey(model, k), req: req}
	}
	return out, nil
}

// validSplit: every shard r names is one of shards, and the table has
// rows.
func validSplit(r *prismv1.RowSplit, shards int32) bool {
	return len(r.GetShards()) > 0 && r.GetRows() > 0 && !slices.ContainsFunc(r.GetShards(), func(k int32) bool { return k < 0 || k >= shards })
}

// join is a client whose update was split over several shards: it is
// answered once every part is. left counts the parts not answered yet.
type join struct {
	// parts is how many parts the update was split into, left how many
	// are not answered yet.
	parts, left int
	// ok are the answers of the parts applied, failed the refusals, by
	// the part's sequence key.
	ok     map[string]*prismv1.UpdateResponse
	failed map[string]error
}

// answer answers client, or, for a part of a split update (key names
// its sequence), records the part's answer and answers the client once
// every part is answered.
func (s *sequencer) answer(client uint64, key string, resp *prismv1.UpdateResponse, err error) {
	if m := s.models[key]; m != nil && m.shard >= 0 && err == nil && resp != nil {
		resp.Shards = []int32{m.shard}
	}
	j := s.joins[client]
	if j == nil || key == "" {
		if j != nil {
			delete(s.joins, client)
		}
		s.send(message{Type: msgAnswer, Client: client, Resp: resp, Err: err})
		return
	}
	if err != nil {
		if j.failed == nil {
			j.failed = map[string]error{}
		}
		j.failed[key] = err
	} else {
		if j.ok == nil {
			j.ok = map[string]*prismv1.UpdateResponse{}
		}
		j.ok[key] = resp
	}
	if j.left--; j.left > 0 {
		return
	}
	delete(s.joins, client)
	resp, err = j.result()
	s.send(message{Type: msgAnswer, Client: client, Resp: resp, Err: err, Parts: j.parts})
}

// result is a split update's answer: OK when every part was applied
// (the workers summed, the shards listed); else the parts' refusals,
// each named by its shard. A part applied stays applied (an upsert):
// retrying the whole update is safe, so the code is Unavailable, but
// InvalidArgument when a part was refused as bad input (a retry would
// be refused again), and the parts' shared code when none was applied.
func (j *join) result() (*prismv1.UpdateResponse, error) {
	if len(j.failed) == 0 {
		out := &prismv1.UpdateResponse{}
		for _, key := range slices.Sorted(maps.Keys(j.ok)) {
			r := j.ok[key]
			out.Workers += r.GetWorkers()
			out.Refused = append(out.Refused, r.GetRefused()...)
			out.Shards = append(out.Shards, r.GetShards()...)
			for k, h := range r.GetHeld() {
				if out.Held == nil {
					out.Held = map[string]*prismv1.UpdateHeld{}
				}
				out.Held[k] = h
			}
		}
		slices.Sort(out.Shards)
		return out, nil
	}
	code := codes.OK
	bad := false
	var msgs []string
	for _, key := range slices.Sorted(maps.Keys(j.failed)) {
		st := status.Convert(j.failed[key])
		if code == codes.OK {
			code = st.Code()
		} else if code != st.Code() {
			code = codes.Unavailable
		}
		bad = bad || st.Code() == codes.InvalidArgument
		_, shard := parseSeqKey(key)
		msgs = append(msgs, fmt.Sprintf("shard %d: %s", shard, st.Message()))
	}
	if bad {
		code = codes.InvalidArgument
	}
	var applied []int32
	for key := range j.ok {
		_, shard := parseSeqKey(key)
		applied = append(applied, shard)
	}
	if len(applied) > 0 {
		slices.Sort(applied)
		if bad {
			return nil, status.Errorf(code, "update applied on shards %v only; %s", applied, strings.Join(msgs, "; "))
		}
		return nil, status.Errorf(codes.Unavailable, "update applied on shards %v only (retrying it is safe); %s", applied, strings.Join(msgs, "; "))
	}
	return nil, status.Error(code, strings.Join(msgs, "; "))
}
