package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

type proposal struct {
	client   uint64
	req      *prismv1.UpdateRequest
	deadline time.Time
}

// fanout is a numbered update waiting for its workers' answers.
type fanout struct {
	client  uint64
	seq     int64
	targets int
	// members are the workers the quorum counts (the targets and the
	// slow ones), need how many of them must hold the update.
	members, need int
	waiting       map[string]string // worker id -> addr, not yet answered
	applied       int
	inputErr      error
	failed        error
	// refusers are the workers that answered InvalidArgument, "id
	// addr: message" by id.
	refusers map[string]string
	// A sharded model (some member announced a shard): shardOf is each
	// member's shard (-1: the whole model), shards the shard count,
	// held the members that applied it, rows the shards holding the
	// update's rows as the answers named them (quorum.go).
	shardOf map[string]int32
	shards  int32
	held    map[string]bool
	rows    map[int32]bool
}

// targets are the live embedding workers serving model, by id, but
// the foreign, diverged and slow ones; members counts the workers the
// quorum counts: the targets and the slow ones, but not the stale ones
// (already behind what the log holds when the update is numbered: out
// of the model until an operator gives them a store, like the foreign
// and diverged ones). startNext counts them before its trim, which
// never leaves a live worker stale anyway.
func (s *sequencer) targets(model string) (out []*prismv1.WorkerInfo, members int) {
	out, ids := s.targetsOf(model)
	return out, len(ids)
}

// targetsOf is targets with the members' ids.
func (s *sequencer) targetsOf(model string) (out []*prismv1.WorkerInfo, members []string) {
	m := s.models[model]
	for _, id := range slices.Sorted(maps.Keys(s.workers)) {
		if _, foreign := m.foreign[id]; foreign {
			continue
		}
		if _, diverged := m.diverged[id]; diverged {
			continue
		}
		w := s.workers[id]
		if !slices.Contains(w.GetModels(), model) {
			continue
		}
		if k, ok := m.known[id]; !ok || k >= m.floor {
			members = append(members, id)
		}
		if !m.slow[id] {
			out = append(out, w)
		}
	}
	return out, members
}

// startNext numbers and sends model's next waiting update, if none is
// being applied.
func (s *sequencer) startNext(model string, m *modelSeq) {
	for m.inflight == nil && len(m.queue) > 0 {
		p := m.queue[0]
		m.queue = m.queue[1:]
		if s.resigned {
			s.answer(p.client, nil, errResigned)
			continue
		}
		if !s.now.Before(p.deadline) {
			// Its turn came too late: a number handed out now could be
			// left with no worker to apply it.
			s.answer(p.client, nil, status.FromContextError(context.DeadlineExceeded).Err())
			continue
		}
		if m.unwritten {
			s.answer(p.client, nil, status.Errorf(codes.Unavailable, "the router could not write the update log of model %q; it takes no updates until it has written it again; retry", model))
			continue
		}
		targets, memberIDs := s.targetsOf(model)
		members := len(memberIDs)
		if len(targets) == 0 {
			if n := len(m.slow) + len(m.diverged) + len(m.foreign); n > 0 {
				s.answer(p.client, nil, status.Errorf(codes.Unavailable, "model %q has no embedding worker taking updates right now (%d slow and being caught up, or out of serving; see the router's log); retry", model, n))
				continue
			}
			s.answer(p.client, nil, status.Errorf(codes.Unavailable, "model %q has no live embedding worker right now; retry", model))
			continue
		}
		// Number it only if some live worker holds every update before
		// it: otherwise it could not be applied anywhere now, and would
		// hold up the updates after it.
		var held int64
		for _, w := range targets {
			held = max(held, m.known[w.GetId()])
		}
		if held < m.next {
			s.answer(p.client, nil, status.Errorf(codes.Unavailable, "no live embedding worker of model %q holds update %d yet (they are being caught up); retry", model, m.next))
			continue
		}
		m.next++
		m.handedOut = true
		s.any = true
		areq := &prismv1.ApplyUpdateRequest{Update: p.req, Seq: m.next}
		dropFrom := m.floor
		// The trim stops at the lowest seq a live worker of the model
		// holds (one not already stale, foreign or diverged), which is
		// never above held: no trim leaves a live worker behind what the
		// log reaches, even if the log then exceeds its byte budget.
		lowest, lagging := held, ""
		for _, id := range slices.Sorted(maps.Keys(m.known)) {
			_, foreign := m.foreign[id]
			_, diverged := m.diverged[id]
			w := s.workers[id]
			if k := m.known[id]; w != nil && !foreign && !diverged && slices.Contains(w.GetModels(), model) && k >= m.floor && k < lowest {
				lowest, lagging = k, id
			}
		}
		m.appendLog(areq, s.logBytes, lowest)
		s.persist(model, m, areq, dropFrom)
		// members were counted before the trim: a worker that held
		// floor then counts against the quorum of this update.
		if over := m.bytes > s.logBytes && len(m.log) > 1 && lowest < held && m.floor+1 <= held; over && !m.overBudget {
			s.logf(slog.LevelWarn, "update log over its byte budget: it keeps updates a live embedding worker still lacks, so the worker can be caught up, until it is",
				"model", model, "worker", lagging, "holds", lowest, "bytes", m.bytes, "budget", s.logBytes)
			m.overBudget = true
		} else if m.bytes <= s.logBytes {
			m.overBudget = false
		}
		f := &fanout{client: p.client, seq: m.next, targets: len(targets), members: members, need: s.quorum.need(members), waiting: map[string]string{}}
		for _, id := range memberIDs {
			if ref := s.workers[id].GetShards()[model]; ref != nil && ref.GetShards() > 0 {
				if f.shardOf == nil {
					f.shardOf, f.held, f.rows = map[string]int32{}, map[string]bool{}, map[int32]bool{}
				}
				f.shards = max(f.shards, ref.GetShards())
			}
		}
		if f.shardOf != nil {
			for _, id := range memberIDs {
				f.shardOf[id] = -1
				if ref := s.workers[id].GetShards()[model]; ref != nil && ref.GetShards() > 0 {
					f.shardOf[id] = ref.GetShard()
				}
			}
		}
		m.inflight = f
		// A table no live worker announces holding (misspelt, or no
		// worker says which tables it holds) goes whole to every worker,
		// which refuses it or writes it as its plan says.
		route := slices.ContainsFunc(targets, func(w *prismv1.WorkerInfo) bool {
			return slices.Contains(w.GetShards()[model].GetTables(), p.req.GetTable())
		})
		for _, w := range targets {
			f.waiting[w.GetId()] = w.GetAddr()
			apply := areq
			if route {
				apply = routed(w, model, areq)
			}
			s.send(message{Type: msgApply, Client: p.client, Model: model, Worker: w.GetId(), Addr: w.GetAddr(), Apply: apply})
		}
	}
}

// routed is the apply to send worker w of model: areq itself, or, when
// w's shard does not hold the update's table (ShardRef.tables; a
// table-wise table lives on one shard), the number and the ids without
// the rows, so an update's rows cross the network to the shards that
// write them only.
// A worker announcing no tables (unsharded, or older) gets it whole.
func routed(w *prismv1.WorkerInfo, model string, areq *prismv1.ApplyUpdateRequest) *prismv1.ApplyUpdateRequest {
	ref := w.GetShards()[model]
	table := areq.GetUpdate().GetTable()
	if ref.GetShards() == 0 || len(ref.GetTables()) == 0 || slices.Contains(ref.GetTables(), table) {
		return areq
	}
	// The ids stay: the worker names the shards holding their rows, and
	// the router holds those shards to the quorum.
	return &prismv1.ApplyUpdateRequest{Update: &prismv1.UpdateRequest{Model: model, Table: table, Ids: areq.GetUpdate().GetIds()}, Seq: areq.GetSeq(), NumberOnly: true}
}

// ack records that a live worker holds seq. A worker gone meanwhile is
// not recorded: it announces what it holds when it is back.
func (s *sequencer) ack(m *modelSeq, id string, seq int64) {
	if _, live := s.workers[id]; live {
		m.known[id] = max(m.known[id], seq)
		if m.known[id] >= m.next {
			delete(m.slow, id) // caught up: back in the fan-out
		}
	}
}

// applied is the event "worker answered the apply of model's update seq
// that a msgApply for client asked for" (err nil: applied; client 0: a
// replay); rows are the shards holding the update's rows that a worker
// of a sharded model named (UpdateResponse.shards).
func (s *sequencer) applied(now time.Time, client uint64, model, worker string, seq int64, rows []int32, err error) {
	s.advance(now)
	m := s.models[model]
	if m == nil {
		return
	}
	if client == 0 {
		s.replayed(model, m, worker, seq, rows, err)
		return
	}
	f := m.inflight
	addr, ok := "", false
	if f != nil && f.client == client && f.seq == seq {
		addr, ok = f.waiting[worker]
	}
	if !ok {
		return // not an answer this sequencer waits for
	}
	delete(f.waiting, worker)
	switch status.Code(err) {
	case codes.OK:
		f.applied++
		s.ack(m, worker, seq)
		if f.shardOf != nil {
			f.held[worker] = true
			for _, k := range rows {
				if k >= 0 && k < f.shards {
					f.rows[k] = true
				}
			}
		}
	case codes.InvalidArgument:
		// Bad input: every replica refuses it alike and takes the seq.
		if f.inputErr == nil {
			f.inputErr = err
		}
		if f.refusers == nil {
			f.refusers = map[string]string{}
		}
		f.refusers[worker] = addr + ": " + status.Convert(err).Message()
		s.ack(m, worker, seq)
	case codes.FailedPrecondition:
		// Behind: the catch-up replays what it missed, then this.
		s.logf(slog.LevelInfo, "embedding worker behind on updates; catching it up", "model", model, "worker", worker, "seq", seq)
	default:
		if errors.Is(err, errNotLogged) {
			// Not sent (writeFailed logged why, once for the model): the
			// worker is as it was and keeps serving what it holds.
			if f.failed == nil {
				f.failed = err
			}
			break
		}
		if f.failed == nil {
			f.failed = fmt.Errorf("worker %s: %s", addr, status.Convert(err).Message())
		}
		if errors.Is(err, errWorkerTimeout) {
			// Hung or slow: the next updates do not wait for it; the
			// catch-up brings it back.
			m.slow[worker] = true
			s.logf(slog.LevelWarn, "embedding worker did not answer an update in time; it gets no new updates until caught up", "model", model, "worker", worker, "seq", seq)
			break
		}
		s.logf(slog.LevelWarn, "update failed on an embedding worker; it is left out of serving until caught up", "model", model, "worker", worker, "seq", seq, "err", err)
	}
	if len(f.waiting) > 0 {
		return
	}
	m.inflight = nil
	// For a sharded model only the answers of the shards holding the
	// rows tell applied from refused: the other shards' workers take the
	// number without the rows (number only, or skipping the table), and
	// their OK says nothing of the rows. Bad rows that every holder
	// refused are bad input, not a divergence of the holders.
	applied, refusers := f.applied, f.refusers
	if f.shardOf != nil && len(f.rows) > 0 { // no shard named: workers of an older build, the model's quorum
		holds := func(id string) bool { sh, ok := f.shardOf[id]; return !ok || sh == -1 || f.rows[sh] }
		applied = 0
		for id := range f.held {
			if holds(id) {
				applied++
			}
		}
		refusers = maps.Clone(refusers)
		maps.DeleteFunc(refusers, func(id, _ string) bool { return !holds(id) })
	}
	switch {
	case f.inputErr != nil && applied == 0:
		m.outcome[f.seq] = -1
		m.committed = max(m.committed, f.seq)
		s.persist(model, m, nil, m.floor)
		s.answer(f.client, nil, f.inputErr)
	case f.applied == 0:
		failed := f.failed
		if failed == nil {
			failed = errors.New("every worker is behind and catching up")
		}
		// The update keeps its number: a worker may have applied it and
		// lost the answer, so the number cannot be given to another. The
		// catch-up applies it everywhere later; a retry applies the same
		// rows again, which upserts make harmless.
		s.answer(f.client, nil, status.Errorf(codes.Unavailable, "update %d not acknowledged by any of %d embedding workers (%v); it may still be applied as they catch up; retrying is safe", f.seq, f.targets, failed))
	default:
		if applied > 0 { // a worker holding the rows applied them
			m.outcome[f.seq] = 1
		}
		// Divergent answers: some applied it, some refused it as bad
		// input. The refusers' copies now lack the rows and a replay
		// cannot add them (the refusal took the seq): out of serving.
		var refused []string
		for _, id := range slices.Sorted(maps.Keys(refusers)) {
			refused = append(refused, refusers[id])
			if _, live := s.workers[id]; live {
				m.diverged[id] = f.seq
				s.logf(slog.LevelError, "embedding worker refused an update other workers applied; its copy differs and it stays out of serving the model: stop it and give it a copy of an up-to-date worker's store",
					"model", model, "worker", id, "seq", f.seq, "refusal", refusers[id])
			}
		}
		if on := slices.Sorted(maps.Keys(f.rows)); len(on) > 0 {
			// A sharded model: each shard holding the rows by its own
			// quorum; the others' workers took the number only.
			if short := s.quorum.shortShards(on, f.shardOf, f.held); len(short) > 0 {
				var lack []string
				for _, sh := range short {
					if sh.members == 0 {
						lack = append(lack, fmt.Sprintf("shard %d: no live worker", sh.shard))
						continue
					}
					lack = append(lack, fmt.Sprintf("shard %d: %d of %d, need %d", sh.shard, sh.held, sh.members, sh.needs))
				}
				why := ""
				if f.failed != nil {
					why = fmt.Sprintf("; %v", f.failed)
				}
				if len(refused) > 0 {
					why += "; refused by " + strings.Join(refused, "; ")
				}
				s.answer(f.client, nil, status.Errorf(codes.Unavailable, "update %d of rows on shards %v (of %d) held below the update quorum (%s) by the embedding workers of %s%s; it may still reach the others as they catch up; retrying is safe", f.seq, on, f.shards, s.quorum, strings.Join(lack, ", "), why))
				break
			}
			m.committed = max(m.committed, f.seq)
			s.persist(model, m, nil, m.floor)
			s.answer(f.client, &prismv1.UpdateResponse{Workers: int32(f.applied), Refused: refused, Shards: on}, nil)
			break
		}
		if f.applied < f.need {
			// Below the quorum: as with none above, the update keeps its
			// number and reaches the others by catch-up, and it is not
			// acknowledged (committed stays: workers lacking it still
			// serve, as they would had no worker applied it).
			why := ""
			if f.failed != nil {
				why = fmt.Sprintf("; %v", f.failed)
			}
			if len(refused) > 0 {
				why += "; refused by " + strings.Join(refused, "; ")
			}
			s.answer(f.client, nil, status.Errorf(codes.Unavailable, "update %d held by %d of %d embedding workers, below the update quorum (%s: %d)%s; it may still reach the others as they catch up; retrying is safe", f.seq, f.applied, f.members, s.quorum, f.need, why))
			break
		}
		m.committed = max(m.committed, f.seq)
		s.persist(model, m, nil, m.floor)
		s.answer(f.client, &prismv1.UpdateResponse{Workers: int32(f.applied), Refused: refused}, nil)
	}
	s.startNext(model, m)
}
