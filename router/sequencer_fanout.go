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
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

type proposal struct {
	client   uint64
	req      *prismv1.UpdateRequest
	deadline time.Time
	// alone: sent on its own, merged with no other (a part of a merged
	// update its workers refused as bad input: unmerge).
	alone bool
	// ended is the end of the client's context (cancel) while the
	// merged update carrying it was in flight: it is not sent again
	// (unmerge).
	ended error
}

// fanout is a numbered update waiting for its workers' answers.
type fanout struct {
	// client is the update's client (the first, when merged: the
	// applies carry it), parts the updates merged into it, in order of
	// acceptance (one: not merged; sequencer_merge.go).
	client  uint64
	parts   []*proposal
	seq     int64
	targets int
	// members are the workers the quorum counts (the targets and the
	// slow ones), need how many of them must hold the update; memberIDs
	// their ids, sorted. A member found diverged by the time every
	// answer is in no longer counts (outOfModel).
	members, need int
	memberIDs     []string
	waiting       map[string]string // worker id -> addr, not yet answered
	applied       int
	// early counts the workers that applied it before the sequencer
	// resigned: only those are sure to be heard of by the router
	// sequencing next, in its start-up window.
	early    int
	inputErr error
	failed   error
	// refusers are the workers that answered InvalidArgument, "id
	// addr: message" by id.
	refusers map[string]string
	// holders are the ids of the workers that applied it (the answer's
	// held: a forwarding router sends lookups to them at once).
	holders []string
	// replays are the answers, by worker id, to catch-up replays of
	// this update while it was in flight (replayed): sent to a worker
	// the fan-out does not wait for (a slow one, left out of the
	// targets; one that answered it behind). Each counts as that
	// worker's answer to the fan-out when the last answer is in
	// (countReplays), so a worker applying it by replay makes the
	// targets refusing it diverged, and one refusing it by replay is
	// diverged where a target applied it: set from the replay alone,
	// the update's outcome was overridden by the fan-out's, and the
	// worker served a copy that differs from its peers', silently.
	replays map[string]replayAnswer
}

// replayAnswer is a worker's answer to a replay of the update in flight
// (fanout.replays): err nil (applied) or its refusal as bad input, addr
// the worker's address then, early: answered before the sequencer
// resigned (fanout.early).
type replayAnswer struct {
	err   error
	addr  string
	early bool
}

// targetsOf returns the targets of an update of sequence model (a
// model's, or a shard's: keyOf): its live embedding workers of its
// layout, by id, but the foreign, diverged and slow ones; and members,
// the ids of the workers the quorum counts: the targets and the slow
// ones, but not the stale ones (already behind what the log holds when
// the update is numbered: out of the model until an operator gives them
// a store, like the foreign and diverged ones). startNext counts them
// before its trim, which never leaves a live worker stale anyway.
func (s *sequencer) targetsOf(model string) (out []*prismv1.WorkerInfo, members []string) {
	m := s.models[model]
	for _, id := range s.workerIDs() {
		if _, foreign := m.foreign[id]; foreign {
			continue
		}
		if _, diverged := m.diverged[id]; diverged {
			continue
		}
		w := s.workers[id]
		if !slices.Contains(w.GetModels(), m.name) || keyOf(w, m.name) != model || !s.compatible(m.name, w) {
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
			s.answer(p.client, model, nil, errResigned)
			continue
		}
		if !s.now.Before(p.deadline) {
			// Its turn came too late: a number handed out now could be
			// left with no worker to apply it.
			s.answer(p.client, model, nil, status.FromContextError(context.DeadlineExceeded).Err())
			continue
		}
		if err := s.endedErr(p.client); err != nil {
			// Its caller is gone: applied, no one would be told.
			s.answer(p.client, model, nil, err)
			continue
		}
		if m.owed > m.next {
			s.answer(p.client, model, nil, status.Errorf(codes.Unavailable, "model %q: the previous sequencing router acknowledged updates up to %d, past this router's copy of its log (%d), and no embedding worker holding them has announced yet; nothing is numbered until one does (numbering on would overwrite them); retry", model, m.owed, m.next))
			continue
		}
		if m.unwritten {
			s.answer(p.client, model, nil, status.Errorf(codes.Unavailable, "the router could not write the update log of model %q; it takes no updates until it has written it again; retry", model))
			continue
		}
		targets, memberIDs := s.targetsOf(model)
		members := len(memberIDs)
		if len(targets) == 0 {
			if n := len(m.slow) + len(m.diverged) + len(m.foreign); n > 0 {
				s.answer(p.client, model, nil, status.Errorf(codes.Unavailable, "model %q has no embedding worker taking updates right now (%d slow and being caught up, or out of serving; see the router's log); retry", model, n))
				continue
			}
			s.answer(p.client, model, nil, status.Errorf(codes.Unavailable, "model %q has no live embedding worker right now; retry", model))
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
			s.answer(p.client, model, nil, status.Errorf(codes.Unavailable, "no live embedding worker of model %q holds update %d yet (they are being caught up); retry", model, m.next))
			continue
		}
		// Group commit: the updates waiting behind it that merge with it
		// take its number (sequencer_merge.go).
		batch := s.gather(model, m, p)
		if m.shard >= 0 && s.layouts[m.name] == "" {
			// The model's first update numbered under a named sharding
			// binds it (layout).
			for _, w := range targets {
				if fp := w.GetShards()[m.name].GetSharding(); fp != "" {
					s.layouts[m.name] = fp
					break
				}
			}
		}
		for id, k := range m.known {
			if k >= m.next {
				m.progress[id] = s.now // held every update until this one
			}
		}
		m.next++
		m.handedOut = true
		s.any = true
		areq := &prismv1.ApplyUpdateRequest{Update: merged(batch), Seq: m.next}
		if m.shard >= 0 {
			// A worker of another shard, or sharding, refuses it.
			areq.Sequence = prismv1.SequenceName(model, s.layouts[m.name])
		}
		dropFrom := m.floor
		// The trim stops at the lowest seq a live worker of the model
		// holds (one not already stale, foreign or diverged), which is
		// never above held: no trim leaves a live worker behind what the
		// log reaches, even if the log then exceeds its byte budget. But
		// a stuck one, which took no update for giveUp: one that
		// announces but takes none (its updates cannot reach it, its
		// store's writes hang) held the log over its budget without
		// bound, for as long as it announced (the router's memory and
		// its log folder grew by every update). Over the budget the trim
		// passes it, and it is stale.
		budget := s.budget(m)
		lowest, lagging, stuck := s.trimBound(model, m, held)
		m.appendLog(areq, budget, lowest)
		s.persist(model, m, areq, dropFrom)
		s.trimmed(model, m, stuck, budget)
		// members were counted before the trim: a worker that held
		// floor then counts against the quorum of this update.
		if over := m.bytes > budget && len(m.log) > 1 && lowest < held && m.floor+1 <= held; over && !m.overBudget {
			s.logf(slog.LevelWarn, "update log over its byte budget: it keeps updates a live embedding worker still lacks, so the worker can be caught up, until it is (or has taken no update for a while)",
				"model", model, "worker", lagging, "holds", lowest, "bytes", m.bytes, "budget", budget)
			m.overBudget = true
		} else if m.bytes <= budget {
			m.overBudget = false
		}
		f := &fanout{client: p.client, parts: batch, seq: m.next, targets: len(targets), members: members, need: s.quorum.need(members), memberIDs: memberIDs, waiting: map[string]string{}}
		m.inflight = f
		// Sent marked fresh (the log keeps areq, replayed unmarked): a
		// worker holding the number already holds another sequencer's
		// update under it, and says so instead of acknowledging it.
		fresh := &prismv1.ApplyUpdateRequest{Update: areq.Update, Seq: areq.Seq, Sequence: areq.Sequence, Fresh: true, Epoch: s.epoch}
		for _, w := range targets {
			f.waiting[w.GetId()] = w.GetAddr()
			s.send(message{Type: msgApply, Client: p.client, Merged: clientsOf(batch), Model: model, Worker: w.GetId(), Addr: w.GetAddr(), Apply: fresh})
		}
	}
}

// trimBound is the lowest seq a trim of sequence model's log may reach
// (appendLog's upto), starting from held, the most a live worker of it
// holds: the lowest seq a live worker of the model holds (one not
// already stale, foreign or diverged), which is never above held, so no
// trim leaves a live worker behind what the log reaches, even if the
// log then exceeds its byte budget; lagging is that worker. But a stuck
// one (took no update for giveUp: it announces but takes none, its
// updates cannot reach it, its store's writes hang) held the log over
// its budget without bound, for as long as it announced (the router's
// memory and its log folder grew by every update): the trim passes the
// stuck ones, and they are stale.
func (s *sequencer) trimBound(model string, m *modelSeq, held int64) (lowest int64, lagging string, stuck []string) {
	lowest = held
	for _, id := range s.workerIDs() { // those m.known names, in order
		k, known := m.known[id]
		if !known {
			continue
		}
		_, foreign := m.foreign[id]
		_, diverged := m.diverged[id]
		w := s.workers[id]
		if w != nil && !foreign && !diverged && slices.Contains(w.GetModels(), m.name) && keyOf(w, m.name) == model && k >= m.floor && k < lowest {
			if s.stuck(m, id) {
				stuck = append(stuck, id)
				continue
			}
			lowest, lagging = k, id
		}
	}
	return lowest, lagging, stuck
}

// trimmed logs the stuck workers (trimBound) a trim of m's log, to
// budget, passed.
func (s *sequencer) trimmed(model string, m *modelSeq, stuck []string, budget int64) {
	for _, id := range stuck {
		if k := m.known[id]; k < m.floor {
			s.logf(slog.LevelWarn, "embedding worker took no update for a while, and the update log over its byte budget no longer keeps those it lacks",
				"model", model, "worker", id, "holds", k, "since", s.giveUp, "router_holds_from", m.floor+1, "bytes", m.bytes, "budget", budget)
		}
	}
}

// budget is m's log's byte budget now: --update-log-bytes, but with
// Options.UpdateLogTotalBytes over every model's log, at most what the
// other models' logs leave of the total, and never less than an equal
// share of it (so a model whose updates are heavy may use what the
// others do not, and each keeps its share).
func (s *sequencer) budget(m *modelSeq) int64 {
	if s.totalBytes <= 0 {
		return s.logBytes
	}
	var others int64
	n := int64(1)
	for _, o := range s.models {
		if o != m && o.bytes > 0 {
			others += o.bytes
			n++
		}
	}
	return min(s.logBytes, max(s.totalBytes/n, s.totalBytes-others))
}

// trimTotal trims, at a heartbeat, the logs of the models over an equal
// share of Options.UpdateLogTotalBytes while their sum is over it (a
// model's own appends trim it only when it takes updates, and a model
// that stopped taking them kept a log the others' budgets counted):
// each to its share, under the same bound as an append (trimBound),
// its drop persisted.
func (s *sequencer) trimTotal() {
	if s.totalBytes <= 0 {
		return
	}
	var sum, n int64
	for _, m := range s.models {
		if m.bytes > 0 {
			sum += m.bytes
			n++
		}
	}
	if sum <= s.totalBytes {
		return
	}
	share := s.totalBytes / n
	for _, model := range slices.Sorted(maps.Keys(s.models)) {
		m := s.models[model]
		if m.bytes <= share || m.unwritten {
			continue
		}
		targets, _ := s.targetsOf(model)
		var held int64 = -1
		for _, w := range targets {
			held = max(held, m.known[w.GetId()])
		}
		if held < 0 {
			continue // no live worker: nothing it holds to trim to
		}
		lowest, _, stuck := s.trimBound(model, m, held)
		dropFrom := m.floor
		m.trim(share, lowest)
		if m.floor > dropFrom {
			s.persist(model, m, nil, dropFrom)
			s.trimmed(model, m, stuck, share)
		}
	}
}

// ack records that a live worker of m holds seq. A worker gone
// meanwhile is not recorded: it announces what it holds when it is
// back.
func (s *sequencer) ack(m *modelSeq, id string, seq int64) {
	// Only a live worker of the sequence: one that moved to another
	// shard meanwhile (announced) holds nothing of this one.
	if w := s.workers[id]; w != nil && keyOf(w, m.name) == m.key {
		if seq > m.known[id] {
			m.progress[id] = s.now
		}
		m.known[id] = max(m.known[id], seq)
		if m.known[id] >= m.next {
			delete(m.slow, id) // caught up: back in the fan-out
		}
	}
}

// applied is the event "worker answered the apply of update seq of
// sequence model (keyOf) that a msgApply for client asked for" (err
// nil: applied; client 0: a replay).
func (s *sequencer) applied(now time.Time, client uint64, model, worker string, seq int64, err error) {
	s.advance(now)
	m := s.models[model]
	if m == nil {
		return
	}
	if client == 0 {
		s.replayed(model, m, worker, seq, err)
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
		if !s.resigned {
			f.early++
		}
		f.holders = append(f.holders, worker)
		s.ack(m, worker, seq)
	case codes.AlreadyExists:
		// It held the number before this router first sent it: another
		// sequencer's update under it (one that lost the election and
		// whose update landed after this router's start-up window, a
		// second router, an in-memory router before its restart). Its
		// copy differs from what this router's log numbers so, and no
		// replay can mend it: out of serving, as a diverged worker.
		if f.failed == nil {
			f.failed = fmt.Errorf("worker %s: %s", addr, status.Convert(err).Message())
		}
		if _, live := s.workers[worker]; live {
			if _, already := m.diverged[worker]; !already {
				m.diverged[worker] = seq
				s.logf(slog.LevelError, "embedding worker holds another update under a number this router gave its own (numbered by another sequencer: a router that lost the election, a second router, or before an in-memory router restarted); its copy differs and it stays out of serving the model: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it",
					"model", model, "worker", worker, "seq", seq)
				s.persist(model, m, nil, m.floor) // the mark (logChange.Diverged)
			}
		}
		s.ack(m, worker, seq) // it holds the number (another update's): nothing to replay
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
		if prismv1.IsStaleEpoch(err) {
			// Fenced: the worker heard of a later hold of the Lease, so
			// this router no longer sequences; the worker wrote nothing
			// and did not take the number. Not held: the client is told
			// Unavailable (the router sequencing now takes its retry).
			if f.failed == nil {
				f.failed = fmt.Errorf("worker %s: %s", addr, status.Convert(err).Message())
			}
			s.fenced(now, model, worker, err)
			break
		}
		// Behind: the catch-up replays what it missed, then this.
		s.floodf(model+" "+worker, slog.LevelInfo, "embedding worker behind on updates; catching it up", "model", model, "worker", worker, "seq", seq)
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
			// catch-up brings it back. One gone meanwhile is not marked:
			// leave dropped what the sequence knew of it, and a mark left
			// now would never be cleared (it would count as a slow worker
			// of the model for good).
			if w := s.workers[worker]; w != nil && keyOf(w, m.name) == m.key {
				m.slow[worker] = true
				s.logf(slog.LevelWarn, "embedding worker did not answer an update in time; it gets no new updates until caught up", "model", model, "worker", worker, "seq", seq)
			}
			break
		}
		// Once per window: a worker that announces but cannot be reached
		// fails every update, and a line each flooded the log.
		s.floodf(model+" "+worker, slog.LevelWarn, "update failed on an embedding worker; it is caught up later, and serves the model's lookups only while it holds every acknowledged update", "model", model, "worker", worker, "seq", seq, "err", err)
	}
	if len(f.waiting) > 0 {
		return
	}
	m.inflight = nil
	s.countReplays(m, f)
	// A holder out of the model (diverged: a store mark announced
	// meanwhile) decides nothing of the update's outcome: an update only
	// such workers applied is one the model's workers refused (or none
	// answered), and its refusers keep serving, as its copy is the one
	// an operator replaces. Counted, its answer made every refusing
	// worker diverged, and the model had none left to serve.
	s.dropOutHolders(m, f)
	switch {
	case f.inputErr != nil && f.applied == 0:
		m.decide(f.seq, -1)
		m.committed = max(m.committed, f.seq)
		s.persist(model, m, nil, m.floor)
		if len(f.parts) > 1 {
			// One part's bad input refused them all: each goes again on
			// its own, for its own answer.
			s.unmerge(model, m, f)
			break
		}
		s.answerAll(model, f, nil, f.inputErr)
	case f.applied == 0:
		failed := f.failed
		if failed == nil {
			failed = errors.New("every worker is behind and catching up")
		}
		// The update keeps its number: a worker may have applied it and
		// lost the answer, so the number cannot be given to another. The
		// catch-up applies it everywhere later; a retry applies the same
		// rows again, which upserts make harmless.
		s.answerAll(model, f, nil, status.Errorf(codes.Unavailable, "update %d not acknowledged by any of %d embedding workers (%v); it may still be applied as they catch up; retrying is safe", f.seq, f.targets, failed))
	default:
		m.decide(f.seq, 1)
		// Divergent answers: some applied it, some refused it as bad
		// input. The refusers' copies now lack the rows and a replay
		// cannot add them (the refusal took the seq): out of serving.
		var refused []string
		marked := false
		for _, id := range slices.Sorted(maps.Keys(f.refusers)) {
			refused = append(refused, f.refusers[id])
			if _, live := s.workers[id]; live {
				m.diverged[id] = f.seq
				marked = true
				s.logf(slog.LevelError, "embedding worker refused an update other workers applied; its copy differs and it stays out of serving the model: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it",
					"model", model, "worker", id, "seq", f.seq, "refusal", f.refusers[id])
			}
		}
		s.outOfModel(m, f)
		if marked && (f.applied < f.need || (s.resigned && f.early < f.need)) {
			// Not acknowledged, so not persisted below: the marks are
			// written now, before any client hears of the refusers
			// (logChange.Diverged).
			s.persist(model, m, nil, m.floor)
		}
		if s.resigned && f.applied >= f.need && f.early < f.need {
			// The quorum came only after this router stopped sequencing:
			// the router sequencing now may have ended its start-up
			// window before the workers held it, and number another
			// update over it. Not acknowledged, as below the quorum.
			s.answerAll(model, f, nil, status.Errorf(codes.Unavailable, "update %d held by %d of %d embedding workers, but the update quorum (%s: %d) held it only after this router stopped sequencing updates (another router holds the sequencing lease now), which may not have heard of it: not acknowledged; retrying is safe", f.seq, f.applied, f.members, s.quorum, f.need))
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
			s.answerAll(model, f, nil, status.Errorf(codes.Unavailable, "update %d held by %d of %d embedding workers, below the update quorum (%s: %d)%s; it may still reach the others as they catch up; retrying is safe", f.seq, f.applied, f.members, s.quorum, f.need, why))
			break
		}
		m.committed = max(m.committed, f.seq)
		s.persist(model, m, nil, m.floor)
		slices.Sort(f.holders)
		s.answerAll(model, f, &prismv1.UpdateResponse{Workers: int32(f.applied), Refused: refused, Held: map[string]*prismv1.UpdateHeld{model: {Seq: f.seq, Workers: f.holders}}}, nil)
	}
	s.startNext(model, m)
}

// countReplays counts, once every target answered, the answers to
// replays of f's update as their workers' answers to it (replays): an
// OK makes the worker a holder, a refusal as bad input a refuser, as if
// the fan-out had sent it the update. A worker the quorum did not count
// (it announced after the update was numbered) counts from its answer
// on: its store holds the seq either way, and a holder left uncounted
// made "all" acknowledge an update a counted member lacks. A worker
// already counted from its own fan-out answer keeps that answer.
func (s *sequencer) countReplays(m *modelSeq, f *fanout) {
	for _, id := range slices.Sorted(maps.Keys(f.replays)) {
		r := f.replays[id]
		if _, refused := f.refusers[id]; refused || slices.Contains(f.holders, id) {
			continue
		}
		if _, diverged := m.diverged[id]; diverged {
			// Out of the model (marked while its replay was under way):
			// its copy is the one an operator replaces, so its answer is
			// no evidence of the update's outcome. Counted, a diverged
			// worker applying an update every worker of the model
			// refused made each of them diverged.
			continue
		}
		if i, member := slices.BinarySearch(f.memberIDs, id); !member {
			f.memberIDs = slices.Insert(f.memberIDs, i, id)
			f.members++
			f.need = s.quorum.need(f.members)
		}
		if r.err == nil {
			f.applied++
			if r.early {
				f.early++
			}
			f.holders = append(f.holders, id)
			continue
		}
		if f.inputErr == nil {
			f.inputErr = r.err
		}
		if f.refusers == nil {
			f.refusers = map[string]string{}
		}
		f.refusers[id] = r.addr + ": " + status.Convert(r.err).Message()
	}
}

// outOfModel counts f's quorum again without the members that are out
// of the model now that every worker answered: those found diverged
// meanwhile (refusing as bad input the update another applied, holding
// another sequencer's update under its number, a replay answered
// otherwise, their store's mark). Such a worker serves no lookups and
// takes no updates until an operator gives it a store, as one diverged
// before the update was numbered, which targetsOf leaves out of the
// members. Counted, it held below the quorum an update that every
// worker still in the model answering OK holds: the clients were told
// Unavailable, and their retry, numbered without it, was acknowledged.
// With group commit that failed every client merged with the one whose
// rows the worker refused, where each alone (and the refused one too)
// would have been acknowledged. A member that left (gone) still counts:
// its store may come back holding what it held. A worker that applied
// the update and is out of the model all the same (its store's mark
// announced meanwhile) is no holder either: it is not counted towards
// the quorum, nor named as holding the update.
func (s *sequencer) outOfModel(m *modelSeq, f *fanout) {
	out := 0
	for _, id := range f.memberIDs {
		if _, diverged := m.diverged[id]; diverged {
			out++
		}
	}
	if out > 0 {
		f.members -= out
		// At least one: a quorum of none would acknowledge an update
		// only workers out of the model hold.
		f.need = max(1, s.quorum.need(f.members))
	}
	s.dropOutHolders(m, f)
}

// dropOutHolders drops from f's holders the workers out of the model
// (diverged): they are not counted towards the quorum, nor named as
// holding the update.
func (s *sequencer) dropOutHolders(m *modelSeq, f *fanout) {
	f.holders = slices.DeleteFunc(f.holders, func(id string) bool {
		_, diverged := m.diverged[id]
		return diverged
	})
	f.applied = len(f.holders)
}

// answerAll answers every client of f (each part of a merged update)
// resp or err: each its own copy of resp, which answer completes (the
// shard) and a split update's join sums with its other parts' answers.
func (s *sequencer) answerAll(model string, f *fanout, resp *prismv1.UpdateResponse, err error) {
	for i, p := range f.parts {
		r := resp
		if r != nil && i < len(f.parts)-1 {
			r = proto.Clone(resp).(*prismv1.UpdateResponse)
		}
		s.answer(p.client, model, r, err)
	}
}
