package router

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// part is one shard's share of an update: req numbered in the sequence
// named key.
type part struct {
	key string
	req *prismv1.UpdateRequest
}

// split cuts req into the parts the sequences of its model take. A
// model no live worker announces a shard of has one sequence: req goes
// whole to it. A sharded model's workers announce the tables their
// shard holds (ShardRef.tables) and where each row-wise table's rows
// live (ShardRef.row_splits): an update of a table-wise table goes
// whole to the sequence of the shard holding it, one of a row-wise
// table in one part per shard holding some of its ids, each with those
// ids and their rows. Each shard then numbers only the updates of its
// own rows: its workers are sent nothing of the other shards', and a
// shard slow or down holds up no other's updates.
//
// What split refuses is refused before any number is taken: an id
// outside a row-wise table (one shard would refuse its part while the
// others applied theirs), a table no shard holds while every shard has
// a live worker (InvalidArgument), and an update whose shard, or one of
// whose shards, has no live worker (Unavailable: retry).
func (s *sequencer) split(req *prismv1.UpdateRequest) ([]part, error) {
	model, table := req.GetModel(), req.GetTable()
	var shards int32
	live := map[int32]bool{}
	holders := map[int32]bool{}
	var rs *prismv1.RowSplit
	for _, id := range slices.Sorted(maps.Keys(s.workers)) {
		w := s.workers[id]
		ref := w.GetShards()[model]
		if !slices.Contains(w.GetModels(), model) || ref.GetShards() <= 0 || ref.GetShard() < 0 || ref.GetShard() >= ref.GetShards() {
			continue
		}
		shards = max(shards, ref.GetShards())
		live[ref.GetShard()] = true
		if slices.Contains(ref.GetTables(), table) {
			holders[ref.GetShard()] = true
		}
		for _, r := range ref.GetRowSplits() {
			if r.GetTable() == table && rs == nil && validSplit(r, ref.GetShards()) {
				rs = r
			}
		}
	}
	if shards == 0 {
		return []part{{key: model, req: req}}, nil
	}
	lacking := func(want []int32) (lack []string) {
		for _, k := range want {
			if !live[k] {
				lack = append(lack, fmt.Sprint(k))
			}
		}
		return lack
	}
	down := func(want []int32) error {
		if lack := lacking(want); len(lack) > 0 {
			return status.Errorf(codes.Unavailable, "update of table %q of model %q: shard %s of %d has no live embedding worker right now; nothing applied; retry", table, model, strings.Join(lack, ", "), shards)
		}
		return nil
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
		if err := down(on); err != nil {
			return nil, err
		}
		out := make([]part, len(on))
		for i, k := range on {
			out[i] = part{key: seqKey(model, k), req: byShard[k]}
		}
		return out, nil
	}
	if len(holders) == 0 {
		var all []int32
		for k := range shards {
			all = append(all, k)
		}
		if lack := lacking(all); len(lack) > 0 {
			return nil, status.Errorf(codes.Unavailable, "update of table %q of model %q: no live embedding worker holds the table, and it may be on shard %s of %d, which has none right now; nothing applied; retry", table, model, strings.Join(lack, ", "), shards)
		}
		return nil, status.Errorf(codes.InvalidArgument, "update: model %q has no table %q (no shard of its %d holds it)", model, table, shards)
	}
	// A table-wise table's one shard; or, from workers announcing no
	// row splits, every shard holding part of a row-wise table, each
	// sent the whole update and writing its own rows.
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
	left int
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
	s.send(message{Type: msgAnswer, Client: client, Resp: resp, Err: err})
}

// result is a split update's answer: OK when every part was applied
// (the workers summed, the shards listed); else the parts' refusals,
// each named by its shard, under their code when they share one and
// Unavailable otherwise. A part applied stays applied: the rows of an
// upsert, so retrying the whole update is safe.
func (j *join) result() (*prismv1.UpdateResponse, error) {
	if len(j.failed) == 0 {
		out := &prismv1.UpdateResponse{}
		for _, key := range slices.Sorted(maps.Keys(j.ok)) {
			r := j.ok[key]
			out.Workers += r.GetWorkers()
			out.Refused = append(out.Refused, r.GetRefused()...)
			out.Shards = append(out.Shards, r.GetShards()...)
		}
		slices.Sort(out.Shards)
		return out, nil
	}
	code := codes.OK
	var msgs []string
	for _, key := range slices.Sorted(maps.Keys(j.failed)) {
		st := status.Convert(j.failed[key])
		if code == codes.OK {
			code = st.Code()
		} else if code != st.Code() {
			code = codes.Unavailable
		}
		_, shard := parseSeqKey(key)
		msgs = append(msgs, fmt.Sprintf("shard %d: %s", shard, st.Message()))
	}
	var applied []int32
	for key := range j.ok {
		_, shard := parseSeqKey(key)
		applied = append(applied, shard)
	}
	if len(applied) > 0 {
		slices.Sort(applied)
		code = codes.Unavailable
		return nil, status.Errorf(code, "update applied on shards %v only (retrying it is safe); %s", applied, strings.Join(msgs, "; "))
	}
	return nil, status.Error(code, strings.Join(msgs, "; "))
}
