package router

import (
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/prism-serve/prism/api/prismv1"
)

// restore is the event "the update log read back at start holds model
// at next, committed, with log holding floor+1 .. next"; it comes before
// any other. The model then continues from next and its workers serve
// only holding committed, and a worker behind is caught up from log.
// Updates the log numbered count as numbered by this router: a worker
// announcing a later seq, even inside the startup window, is foreign
// and never clears the log. The router writes an update to its log
// before it sends it, so no worker of this history can hold one the log
// lacks; a worker that does holds another history (a store copied from
// elsewhere, a second router) or lies, and adopting its number would
// leave every real worker behind and drop the log they catch up from.
// (A log folder restored from an older copy than the workers' stores is
// the operator's to remove: with no log the workers' numbering is
// adopted in the startup window, as at a first start.)
func (s *sequencer) restore(model string, next, committed, floor int64, log []*prismv1.ApplyUpdateRequest) {
	m := s.model(model)
	m.next, m.committed, m.floor, m.log, m.bytes = next, committed, floor, log, 0
	if n := len(log); n > 0 && m.shard >= 0 {
		// The sharding the shard's entries were numbered for.
		if _, fp := prismv1.ParseSequenceName(log[n-1].GetSequence()); fp != "" {
			s.layouts[m.name] = fp
		}
	}
	for _, e := range log {
		m.bytes += heldBytes(e)
	}
	if next > 0 {
		s.any = true
		m.handedOut = true
	}
}

// decide records that update seq's outcome is v (+1 some worker applied
// it, -1 its workers refused it as bad input), for the next persist to
// write (outcomeNew).
func (m *modelSeq) decide(seq int64, v int8) {
	m.outcome[seq] = v
	if m.outcomeNew == nil {
		m.outcomeNew = map[int64]int8{}
	}
	m.outcomeNew[seq] = v
	if m.runsDirty {
		return
	}
	refused := v < 0
	n := len(m.runs)
	if n == 0 {
		m.runs = append(m.runs, &prismv1.OutcomeRun{First: seq, Count: 1, Refused: refused})
		return
	}
	last := m.runs[n-1]
	switch end := last.GetFirst() + last.GetCount(); {
	case seq == end && last.GetRefused() == refused:
		last.Count++
	case seq >= end:
		m.runs = append(m.runs, &prismv1.OutcomeRun{First: seq, Count: 1, Refused: refused})
	default:
		m.runsDirty = true // out of order: made again at the next read
	}
}

// outcomeRunsOf is m's outcomes of floor+1 .. next as ModelLog.outcomes
// carries them: copies, since the answer is sent after the driver's
// lock is released and decide goes on lengthening m.runs.
func (m *modelSeq) outcomeRunsOf() []*prismv1.OutcomeRun {
	if m.runsDirty {
		m.runs, m.runsDirty = outcomeRuns(m.outcome, m.floor, m.next), false
	}
	out := make([]*prismv1.OutcomeRun, 0, len(m.runs))
	for _, r := range m.runs {
		first, count := r.GetFirst(), r.GetCount()
		if first <= m.floor { // trimmed in part
			count -= m.floor + 1 - first
			first = m.floor + 1
		}
		if count > 0 {
			out = append(out, &prismv1.OutcomeRun{First: first, Count: count, Refused: r.GetRefused()})
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// appendLog keeps req as update seq, dropping the oldest beyond the
// byte budget (of the heap the entries hold, heldBytes), but none above
// upto (startNext passes the lowest seq a live worker holds: never one
// that no live worker holds, nor one that a live worker lacks).
func (m *modelSeq) appendLog(req *prismv1.ApplyUpdateRequest, budget, upto int64) {
	m.log = append(m.log, req)
	m.bytes += heldBytes(req)
	m.trim(budget, upto)
}

// trim drops the oldest entries beyond the byte budget, keeping the
// latest and none above upto (appendLog).
func (m *modelSeq) trim(budget, upto int64) {
	for len(m.log) > 1 && m.bytes > budget && m.floor+1 <= upto {
		m.bytes -= heldBytes(m.log[0])
		m.log[0] = nil
		m.log = m.log[1:]
		m.floor++
		delete(m.outcome, m.floor)
		delete(m.outcomeNew, m.floor)
	}
	for len(m.runs) > 0 && m.runs[0].GetFirst()+m.runs[0].GetCount() <= m.floor+1 {
		m.runs[0] = nil
		m.runs = m.runs[1:]
	}
}

// replayed goes on with a replay after one of its updates was answered.
func (s *sequencer) replayed(model string, m *modelSeq, worker string, seq int64, err error) {
	switch code := status.Code(err); {
	case err == nil || code == codes.InvalidArgument:
		// Either way the worker took the number. An answer other than
		// the one the update got before (applied where it was refused as
		// bad input, or refused where another worker applied it) leaves
		// this worker's copy different from the others', and no replay
		// can mend it: out of serving, as after a divergent fan-out.
		got := int8(1)
		if err != nil {
			got = -1
		}
		if _, out := m.diverged[worker]; out {
			// Out of the model already (marked while this replay was
			// under way: the catch-up sends none after the mark): its
			// copy is the one an operator
			// replaces, so its answer says nothing of the update's
			// outcome. Recorded, it set the outcome a worker of the
			// model's replay is judged by, or counted in the fan-out of
			// the update in flight (countReplays), where applying what
			// every target refused made each of them diverged. Checked
			// now, not only at the fan-out's end: a worker that leaves
			// meanwhile (gone) is no longer marked.
		} else if f := m.inflight; f != nil && f.seq == seq {
			// The update in flight (its fan-out did not wait for this
			// worker): its outcome is the fan-out's, decided once every
			// target answered, with this answer counted as the worker's
			// (countReplays). Set here, the fan-out's end overrode it, and
			// a worker answering otherwise than the targets was not found
			// diverged: it served another copy than theirs, and a merged
			// update it applied, refused by the targets, was split and
			// its parts sent to it again. The replay is not held back
			// until the fan-out ends instead: a slow worker rejoins the
			// fan-out only once it holds the latest update (ack), and
			// under steady load one is nearly always in flight, so a
			// worker never replayed it stayed one update behind, slow,
			// for as long as updates came.
			if f.replays == nil {
				f.replays = map[string]replayAnswer{}
			}
			addr := worker
			if w := s.workers[worker]; w != nil {
				addr = w.GetAddr()
			}
			f.replays[worker] = replayAnswer{err: err, addr: addr, early: !s.resigned}
		} else if seq <= m.floor {
			// Trimmed meanwhile: its outcome is kept no more.
		} else if was, known := m.outcome[seq]; !known {
			// Written with the model's next persist (an update or a
			// heartbeat's rewrite), not on its own: a restart before it
			// leaves the outcome unknown, as it was.
			m.decide(seq, got)
		} else if was != got {
			if _, already := m.diverged[worker]; !already {
				m.diverged[worker] = seq
				args := []any{"model", model, "worker", worker, "seq", seq, "applied", err == nil, "applied_before", was > 0}
				if err != nil {
					args = append(args, "refusal", err)
				}
				s.logf(slog.LevelError, "embedding worker answered a replayed update otherwise than the workers before it; its copy differs and it stays out of serving the model: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it", args...)
				s.persist(model, m, nil, m.floor) // the mark (logChange.Diverged)
			}
		}
		s.ack(m, worker, seq)
		s.replayNext(model, m, worker)
	case prismv1.IsStaleEpoch(err):
		// Fenced (a later holder of the Lease sequences): no more replays.
		delete(m.catching, worker)
		s.fenced(s.now, model, worker, err)
	case errors.Is(err, errRouterStopping), errors.Is(err, errNotLogged):
		// Stopping, or the log does not hold the update yet (writeFailed
		// logged it): the next heartbeat after the log is written again
		// goes on.
		delete(m.catching, worker)
	default:
		s.floodf(model+" "+worker, slog.LevelWarn, "replaying an update to an embedding worker failed; retrying at the next heartbeat", "model", model, "worker", worker, "seq", seq, "err", err)
		delete(m.catching, worker)
	}
}

// replayNext sends worker the next update of model it lacks, or ends its
// replay when it holds the latest, is gone, out of the model (diverged),
// or the log no longer reaches.
func (s *sequencer) replayNext(model string, m *modelSeq, id string) {
	k, ok := m.known[id]
	w := s.workers[id]
	_, out := m.diverged[id]
	if !ok || w == nil || out || keyOf(w, m.name) != model || !s.compatible(m.name, w) || k >= m.next || k < m.floor || m.unwritten || s.resigned {
		delete(m.catching, id)
		return
	}
	if f := m.inflight; f != nil && f.seq == k+1 {
		if _, sending := f.waiting[id]; sending {
			// The fan-out is sending it this update now, marked fresh: a
			// replay landing first would make the worker answer that it
			// held it already. The next heartbeat goes on if that fails.
			delete(m.catching, id)
			return
		}
	}
	s.send(message{Type: msgApply, Model: model, Worker: id, Addr: w.GetAddr(), Apply: s.stamped(m.log[k-m.floor])})
}

// stamped is req carrying this sequencer's epoch: the log keeps entries
// as numbered (a copy taken over by the next holder is replayed under
// its epoch), so each replay is stamped as it is sent. The copy is
// shallow (the rows are shared, never changed).
func (s *sequencer) stamped(req *prismv1.ApplyUpdateRequest) *prismv1.ApplyUpdateRequest {
	if s.epoch == 0 || req.GetEpoch() == s.epoch {
		return req
	}
	out := &prismv1.ApplyUpdateRequest{}
	dst := out.ProtoReflect()
	req.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	out.Epoch = s.epoch
	return out
}
