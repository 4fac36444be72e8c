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

// sequencer is the deterministic core of embedding-update sequencing:
// it decides every rule listed on Updater and does none of the work. It
// is driven by events, each carrying the logical time (announced, gone,
// propose, cancel, applied, tick), and answers with messages (apply an
// update on a worker, answer a client, set a gauge, log a line) that
// its caller takes with ready and carries out, reporting each apply's
// outcome back with applied. It reads no clock, starts no goroutine and
// takes no lock, so a test replays any interleaving by stepping events;
// the caller serializes the events (updateDriver does, under one mutex).
type sequencer struct {
	logBytes int64
	// quorum is how many of a model's workers must hold an update before
	// its client is answered OK (quorum.go).
	quorum Quorum
	// settled is when every live worker has announced what it holds
	// (three heartbeats after the router started): before it no update
	// is numbered and no updated model served.
	settled time.Time
	// window is how long after the router first hears of a model its
	// workers' update_seq may still set the model's sequence (three
	// heartbeats): a model whose workers join after the router started
	// gets a startup window of its own.
	window time.Duration
	// now is the latest logical time an event carried.
	now time.Time
	// workers are the live embedding workers by id, as last announced.
	workers map[string]*prismv1.WorkerInfo
	models  map[string]*modelSeq
	// any is set once some model has had an update: until then lookups
	// need not ask the sequencer at all.
	any bool
	out []message
}

// modelSeq is one model's sequence.
type modelSeq struct {
	// handedOut: this router has numbered updates of the model.
	handedOut bool
	next      int64 // the last seq handed out
	committed int64 // the last seq acknowledged to a client
	floor     int64 // log holds floor+1 .. next
	log       []*prismv1.ApplyUpdateRequest
	bytes     int64
	known     map[string]int64 // live worker id -> last seq it holds
	// foreign are live workers announcing updates this router did not
	// number and may not adopt (after the startup window, or once it
	// has numbered updates): worker id -> the seq claimed. They take no
	// updates and serve no lookups of the model.
	foreign map[string]int64
	// slow are live workers that let an update of the fan-out time out
	// (errWorkerTimeout): they get no new updates until the catch-up has
	// brought them to the latest, so each update does not wait for them.
	slow map[string]bool
	// diverged are live workers that refused as bad input an update
	// another worker applied (worker id -> that seq): their copy differs
	// and a replay cannot mend it (the refusal took the seq), so they
	// serve no lookups of the model and get no updates.
	diverged map[string]int64
	// opened is when a worker first announced the model's seq.
	opened   time.Time
	catching map[string]bool // a replay to the worker is under way
	stale    map[string]bool // reported once
	// queue holds the updates waiting their turn, oldest first; inflight
	// is the one being applied (one at a time gives one order).
	queue    []*proposal
	inflight *fanout
	// unwritten: a write of the model's update log failed (writeFailed),
	// so the log on disk may lack what memory holds. Until a rewrite of
	// it succeeds (rewritten with the latest wgen) the model numbers no
	// update and replays none: a worker is never sent an update a
	// restarted router would not know, whose number it could hand out
	// again. unwrittenFrom is the lowest update a failed write held (0:
	// none), unwrittenDrop the lowest DropFrom: the rewrite writes the
	// entries from there and drops what they dropped.
	unwritten     bool
	wgen          uint64
	unwrittenFrom int64
	unwrittenDrop int64
	// overBudget: the log is over its byte budget because a live worker
	// still lacks its oldest updates (reported once).
	overBudget bool
}

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
}

// msgType says what a message asks the caller to do.
type msgType int

const (
	// msgApply: send Apply to Worker at Addr and report the outcome with
	// applied. Client is the update's caller, 0 for a catch-up replay
	// (sent under the router's context, bounded by its default timeout).
	msgApply msgType = iota
	// msgAnswer: answer Client with Resp or Err.
	msgAnswer
	// msgBehind: set Model's embedding_workers_behind gauge to Behind.
	msgBehind
	// msgLog: log Text at Level with Attrs.
	msgLog
	// msgPersist: write Persist, Model's change of its update log,
	// durably (updatelog.go). The driver writes the persists of a step
	// before it carries out any other message of that step, so no
	// worker is sent an update, and no client answered, before the log
	// holds it (see updateDriver.step).
	msgPersist
)

// logChange is one change of a model's update log: the state after it,
// the entries that leave it (DropFrom+1 .. Floor) and the one that joins
// it (Entry, nil when only the numbers change). A rewrite after a failed
// write (Rewrite, the failure's generation, not 0) writes Entries, every
// entry the failed writes held that the log still keeps, instead.
type logChange struct {
	Next, Committed, Floor int64
	DropFrom               int64
	Entry                  *prismv1.ApplyUpdateRequest
	Entries                []*prismv1.ApplyUpdateRequest
	Rewrite                uint64
}

// message is one thing the sequencer asks its caller to do.
type message struct {
	Type   msgType
	Client uint64
	Model  string
	Worker string
	Addr   string
	Apply  *prismv1.ApplyUpdateRequest
	Resp   *prismv1.UpdateResponse
	Err    error
	Behind int
	// Persist is the change a msgPersist writes.
	Persist *logChange
	Level   slog.Level
	Text    string
	Attrs   []any
}

// errRouterStopping is the outcome the caller reports for a replay it
// did not send because the router is stopping: the replay just ends.
var errRouterStopping = errors.New("router stopping")

// errNotLogged is the outcome the caller reports for an apply it did not
// send because the update log does not hold the update (the write of its
// step failed, or an earlier one did): writeFailed and the driver's
// check of what is written report it.
var errNotLogged = errors.New("not sent: the router could not write it to its update log")

// errWorkerTimeout is the outcome the caller reports for an apply of a
// client's update that the worker did not answer within the per-worker
// timeout while the client still waited.
var errWorkerTimeout = errors.New("no answer within the per-worker update timeout")

// newSequencer starts a sequencer at the router's start time.
func newSequencer(start time.Time, heartbeat time.Duration, logBytes int64, quorum Quorum) *sequencer {
	return &sequencer{
		logBytes: logBytes,
		quorum:   quorum,
		settled:  start.Add(3 * heartbeat),
		window:   3 * heartbeat,
		now:      start,
		workers:  map[string]*prismv1.WorkerInfo{},
		models:   map[string]*modelSeq{},
	}
}

// ready returns the messages out since the last call; the caller owns
// carrying them out, in order.
func (s *sequencer) ready() []message {
	out := s.out
	s.out = nil
	return out
}

func (s *sequencer) advance(now time.Time) {
	if now.After(s.now) {
		s.now = now
	}
}

func (s *sequencer) send(m message) { s.out = append(s.out, m) }

func (s *sequencer) logf(level slog.Level, text string, attrs ...any) {
	s.send(message{Type: msgLog, Level: level, Text: text, Attrs: attrs})
}

// persist asks the caller to write m's log state durably, entry (nil:
// none) joining it and dropFrom+1 .. m.floor leaving it.
func (s *sequencer) persist(model string, m *modelSeq, entry *prismv1.ApplyUpdateRequest, dropFrom int64) {
	s.send(message{Type: msgPersist, Model: model, Persist: &logChange{Next: m.next, Committed: m.committed, Floor: m.floor, DropFrom: dropFrom, Entry: entry}})
}

func (s *sequencer) answer(client uint64, resp *prismv1.UpdateResponse, err error) {
	s.send(message{Type: msgAnswer, Client: client, Resp: resp, Err: err})
}

// model is model's state, created on first use.
func (s *sequencer) model(model string) *modelSeq {
	m := s.models[model]
	if m == nil {
		m = &modelSeq{known: map[string]int64{}, foreign: map[string]int64{}, slow: map[string]bool{}, diverged: map[string]int64{}, catching: map[string]bool{}, stale: map[string]bool{}}
		s.models[model] = m
	}
	return m
}

// restore is the event "the update log read back at start holds model
// at next, committed, with log holding floor+1 .. next"; it comes before
// any other. The model then continues from next and its workers serve
// only holding committed, and a worker behind is caught up from log.
// The startup window still applies: inside it a worker announcing a
// later seq is adopted as with no log (the log is older than the
// workers' stores: a write of it failed, or it was copied back from
// elsewhere), since this router has numbered nothing yet.
func (s *sequencer) restore(model string, next, committed, floor int64, log []*prismv1.ApplyUpdateRequest) {
	m := s.model(model)
	m.next, m.committed, m.floor, m.log, m.bytes = next, committed, floor, log, 0
	for _, e := range log {
		m.bytes += int64(proto.Size(e))
	}
	if next > 0 {
		s.any = true
	}
}

// settles is when the startup window of m ends: three heartbeats after
// the router started, or after the first announcement of m's seq when
// that came later.
func (s *sequencer) settles(m *modelSeq) time.Time {
	if m.opened.IsZero() {
		return s.settled
	}
	return later(s.settled, m.opened.Add(s.window))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// announced is the event "worker w announced what it serves and holds".
// Within the model's startup window, before this router numbered any
// of its updates, the sequence continues from the highest seq any
// worker holds. Later a worker claiming updates beyond the sequence is
// not believed: the numbering stays, and the worker is foreign (no
// updates, no lookups) until it announces a seq the router knows.
func (s *sequencer) announced(now time.Time, w *prismv1.WorkerInfo) {
	s.advance(now)
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
		// Not (or no longer) an embedding worker: nothing to sequence.
		s.forget(w.GetId())
		return
	}
	s.workers[w.GetId()] = w
	for _, model := range slices.Sorted(maps.Keys(w.GetUpdateSeq())) {
		seq := w.GetUpdateSeq()[model]
		// A claim about a model the worker does not serve, or a number
		// no store can hold, is not taken at all: it would open the
		// model's startup window or set its numbering for the workers
		// that do serve it.
		if !slices.Contains(w.GetModels(), model) || seq < 0 || seq > maxAnnouncedSeq {
			s.logf(slog.LevelWarn, "embedding worker announces an update number it cannot hold; ignored",
				"model", model, "worker", w.GetId(), "seq", seq, "serves_model", slices.Contains(w.GetModels(), model))
			continue
		}
		m := s.model(model)
		if m.opened.IsZero() {
			m.opened = s.now
		}
		if seq > m.next {
			if m.handedOut || !s.now.Before(s.settles(m)) {
				// Another history (a store copied from elsewhere, a
				// second router) or a lie: adopting it would renumber
				// the model and leave every real worker behind.
				if m.foreign[w.GetId()] != seq {
					s.logf(slog.LevelError, "embedding worker claims updates this router never numbered; it is left out of the model (no updates, no lookups) and the sequence goes on: give it a copy of an up-to-date worker's store (do two routers take updates for this model?)",
						"model", model, "worker", w.GetId(), "holds", seq, "router_latest", m.next)
				}
				m.foreign[w.GetId()] = seq
				delete(m.known, w.GetId())
				continue
			}
			dropFrom := m.floor
			m.next, m.committed, m.floor, m.log, m.bytes = seq, seq, seq, nil, 0
			s.persist(model, m, nil, dropFrom)
		}
		if seq > 0 {
			s.any = true
		}
		delete(m.foreign, w.GetId())
		m.known[w.GetId()] = max(m.known[w.GetId()], seq)
	}
}

// maxAnnouncedSeq bounds the update numbers taken from announcements:
// far beyond any real history (a billion updates a second for over a
// hundred days), and far enough below the int64 limit that numbering on
// from it cannot overflow.
const maxAnnouncedSeq = 1 << 53

// gone is the event "worker id left, expired or was removed".
func (s *sequencer) gone(now time.Time, id string) {
	s.advance(now)
	s.forget(id)
}

// forget drops what a worker held. A replay to it under way is left to
// end with its outcome (catching stays set until then, so a worker
// back meanwhile gets one replay, not two).
func (s *sequencer) forget(id string) {
	delete(s.workers, id)
	for _, m := range s.models {
		delete(m.known, id)
		delete(m.stale, id)
		delete(m.foreign, id)
		delete(m.slow, id)
		delete(m.diverged, id)
	}
}

// propose is the event "client asks for req to be applied, before
// deadline". Its answer comes as a msgAnswer, at once or after the
// update's turn and fan-out.
func (s *sequencer) propose(now time.Time, client uint64, req *prismv1.UpdateRequest, deadline time.Time) {
	s.advance(now)
	if wait := s.settled.Sub(s.now); wait > 0 {
		s.answer(client, nil, status.Errorf(codes.Unavailable, "router started moments ago and is still learning which updates the embedding workers hold; retry in %v", wait.Round(time.Millisecond)))
		return
	}
	m := s.model(req.GetModel())
	if wait := s.settles(m).Sub(s.now); wait > 0 {
		s.answer(client, nil, status.Errorf(codes.Unavailable, "router first heard of model %q moments ago and is still learning which updates its embedding workers hold; retry in %v", req.GetModel(), wait.Round(time.Millisecond)))
		return
	}
	m.queue = append(m.queue, &proposal{client: client, req: req, deadline: deadline})
	s.startNext(req.GetModel(), m)
}

// cancel is the event "client's context ended" (err is its status): an
// update still waiting its turn is dropped and answered err. One already
// numbered is answered when its workers have.
func (s *sequencer) cancel(now time.Time, client uint64, err error) {
	s.advance(now)
	for _, m := range s.models {
		for i, p := range m.queue {
			if p.client == client {
				m.queue = slices.Delete(m.queue, i, i+1)
				s.answer(client, nil, err)
				return
			}
		}
	}
}

// targets are the live embedding workers serving model, by id, but
// the foreign, diverged and slow ones; members counts the workers the
// quorum counts: the targets and the slow ones, but not the stale ones
// (already behind what the log holds when the update is numbered: out
// of the model until an operator gives them a store, like the foreign
// and diverged ones). startNext counts them before its trim, which
// never leaves a live worker stale anyway.
func (s *sequencer) targets(model string) (out []*prismv1.WorkerInfo, members int) {
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
			members++
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
		targets, members := s.targets(model)
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
		m.inflight = f
		for _, w := range targets {
			f.waiting[w.GetId()] = w.GetAddr()
			s.send(message{Type: msgApply, Client: p.client, Model: model, Worker: w.GetId(), Addr: w.GetAddr(), Apply: areq})
		}
	}
}

// appendLog keeps req as update seq, dropping the oldest beyond the
// byte budget, but none above upto (startNext passes the lowest seq a
// live worker holds: never one that no live worker holds, nor one that
// a live worker lacks).
func (m *modelSeq) appendLog(req *prismv1.ApplyUpdateRequest, budget, upto int64) {
	m.log = append(m.log, req)
	m.bytes += int64(proto.Size(req))
	for len(m.log) > 1 && m.bytes > budget && m.floor+1 <= upto {
		m.bytes -= int64(proto.Size(m.log[0]))
		m.log[0] = nil
		m.log = m.log[1:]
		m.floor++
	}
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
// replay).
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
		s.ack(m, worker, seq)
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
	switch {
	case f.inputErr != nil && f.applied == 0:
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
		// Divergent answers: some applied it, some refused it as bad
		// input. The refusers' copies now lack the rows and a replay
		// cannot add them (the refusal took the seq): out of serving.
		var refused []string
		for _, id := range slices.Sorted(maps.Keys(f.refusers)) {
			refused = append(refused, f.refusers[id])
			if _, live := s.workers[id]; live {
				m.diverged[id] = f.seq
				s.logf(slog.LevelError, "embedding worker refused an update other workers applied; its copy differs and it stays out of serving the model: stop it and give it a copy of an up-to-date worker's store",
					"model", model, "worker", id, "seq", f.seq, "refusal", f.refusers[id])
			}
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

// replayed goes on with a replay after one of its updates was answered.
func (s *sequencer) replayed(model string, m *modelSeq, worker string, seq int64, err error) {
	switch code := status.Code(err); {
	case err == nil || code == codes.InvalidArgument:
		s.ack(m, worker, seq)
		s.replayNext(model, m, worker)
	case errors.Is(err, errRouterStopping), errors.Is(err, errNotLogged):
		// Stopping, or the log does not hold the update yet (writeFailed
		// logged it): the next heartbeat after the log is written again
		// goes on.
		delete(m.catching, worker)
	default:
		s.logf(slog.LevelWarn, "replaying an update to an embedding worker failed; retrying at the next heartbeat", "model", model, "worker", worker, "seq", seq, "err", err)
		delete(m.catching, worker)
	}
}

// replayNext sends worker the next update of model it lacks, or ends its
// replay when it holds the latest, is gone, or the log no longer reaches.
func (s *sequencer) replayNext(model string, m *modelSeq, id string) {
	k, ok := m.known[id]
	w := s.workers[id]
	if !ok || w == nil || k >= m.next || k < m.floor || m.unwritten {
		delete(m.catching, id)
		return
	}
	s.send(message{Type: msgApply, Model: model, Worker: id, Addr: w.GetAddr(), Apply: m.log[k-m.floor]})
}

// tick is the event "a heartbeat passed": updates whose deadline passed
// while waiting are answered, a replay starts for every live worker
// behind on updates the log still holds, those it cannot reach are
// reported (once), and each model's behind gauge is set.
func (s *sequencer) tick(now time.Time) {
	s.advance(now)
	for _, model := range slices.Sorted(maps.Keys(s.models)) {
		m := s.models[model]
		m.queue = slices.DeleteFunc(m.queue, func(p *proposal) bool {
			if s.now.Before(p.deadline) {
				return false
			}
			s.answer(p.client, nil, status.FromContextError(context.DeadlineExceeded).Err())
			return true
		})
		if m.unwritten {
			s.rewrite(model, m)
		}
		behind := 0
		for _, id := range slices.Sorted(maps.Keys(m.known)) {
			k := m.known[id]
			if k >= m.next {
				continue
			}
			if k < m.committed {
				behind++
			}
			if k < m.floor {
				if !m.stale[id] {
					m.stale[id] = true
					s.logf(slog.LevelError, "embedding worker misses updates the router no longer holds; it stays out of serving: stop it and give it a copy of an up-to-date worker's store",
						"model", model, "worker", id, "holds", k, "missing_from", k+1, "router_holds_from", m.floor+1, "latest", m.next)
				}
				continue
			}
			if m.catching[id] || m.unwritten {
				continue
			}
			if m.inflight != nil {
				if _, sending := m.inflight.waiting[id]; sending {
					// It is being sent the latest update now; a replay of
					// the same update would send the rows twice. If the
					// send fails, the next heartbeat catches it up.
					continue
				}
			}
			m.catching[id] = true
			s.replayNext(model, m, id)
		}
		s.send(message{Type: msgBehind, Model: model, Behind: behind})
	}
}

// writeFailed is the event "the write of msgs, the messages of one step,
// failed": the driver sent none of their applies (each is reported not
// sent, errNotLogged, as the step's other replays are), and the models
// they persisted are unwritten: the log on disk may lack their latest
// updates. Two ways out were possible: take the numbers back, or refuse
// the model until its log is written again. Taking back is not enough
// (the same write may have dropped trimmed entries or changed committed
// or the adopted sequence, which memory cannot undo); refusing is simple
// and always right: the model numbers no update and replays none
// (Unavailable) until a rewrite of what the failed writes held, sent at
// each heartbeat, has been written (rewritten). The numbered update
// keeps its number, like one no worker acknowledged, and reaches the
// workers by catch-up once it is on disk.
func (s *sequencer) writeFailed(now time.Time, msgs []message) {
	s.advance(now)
	for _, msg := range msgs {
		m := s.models[msg.Model]
		if msg.Type != msgPersist || m == nil {
			continue
		}
		c := msg.Persist
		if !m.unwritten {
			s.logf(slog.LevelError, "cannot write the update log of a model: it takes no updates and replays none until the router has written it again (retried each heartbeat)",
				"model", msg.Model, "latest", m.next)
			m.unwritten, m.unwrittenFrom, m.unwrittenDrop = true, 0, c.DropFrom
		}
		m.wgen++
		m.unwrittenDrop = min(m.unwrittenDrop, c.DropFrom)
		entries := slices.Clip(c.Entries) // a rewrite's; an append copies
		if c.Entry != nil {
			entries = append(entries, c.Entry)
		}
		for _, e := range entries {
			if m.unwrittenFrom == 0 || e.GetSeq() < m.unwrittenFrom {
				m.unwrittenFrom = e.GetSeq()
			}
		}
	}
	for _, msg := range msgs {
		if msg.Type == msgApply {
			s.applied(s.now, msg.Client, msg.Model, msg.Worker, msg.Apply.GetSeq(), errNotLogged)
		}
	}
}

// rewrite asks the caller to write what the failed writes of m held:
// the numbers, the entries from the lowest they held, the drops.
func (s *sequencer) rewrite(model string, m *modelSeq) {
	var entries []*prismv1.ApplyUpdateRequest
	if from := max(m.unwrittenFrom, m.floor+1); m.unwrittenFrom != 0 && from <= m.next {
		entries = slices.Clone(m.log[from-m.floor-1:])
	}
	s.send(message{Type: msgPersist, Model: model, Persist: &logChange{Next: m.next, Committed: m.committed, Floor: m.floor,
		DropFrom: min(m.unwrittenDrop, m.floor), Entries: entries, Rewrite: m.wgen}})
}

// rewritten is the event "the rewrite of model for failure generation
// gen was written": unless a write failed since, the log on disk holds
// what memory does again, and the model takes updates and replays.
func (s *sequencer) rewritten(now time.Time, model string, gen uint64) {
	s.advance(now)
	m := s.models[model]
	if m == nil || !m.unwritten || gen != m.wgen {
		return
	}
	m.unwritten, m.unwrittenFrom, m.unwrittenDrop = false, 0, 0
	s.logf(slog.LevelInfo, "update log of the model written again; it takes updates again", "model", model, "latest", m.next)
}

// inSync says whether w may serve model's lookups at now: only a worker
// holding every acknowledged update does, and, while the router is
// still hearing from its workers, none of a model that has had updates
// (a worker holding later ones may not have announced yet). It changes
// nothing.
func (s *sequencer) inSync(w *prismv1.WorkerInfo, model string, now time.Time) bool {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !s.any {
		return true
	}
	m := s.models[model]
	if m == nil {
		return true
	}
	if _, foreign := m.foreign[w.GetId()]; foreign {
		return false
	}
	if _, diverged := m.diverged[w.GetId()]; diverged {
		return false
	}
	if m.next > 0 && now.Before(s.settles(m)) {
		return false
	}
	k, ok := m.known[w.GetId()]
	if !ok {
		// Not yet learnt from an announcement: its claim counts only
		// where announced would have taken it.
		if c := w.GetUpdateSeq()[model]; c >= 0 && c <= maxAnnouncedSeq && slices.Contains(w.GetModels(), model) {
			k = c
		}
	}
	return k >= m.committed
}

// String is the message in one line, for tests and debugging.
func (m message) String() string {
	switch m.Type {
	case msgApply:
		to := "replay"
		if m.Client != 0 {
			to = fmt.Sprintf("c%d", m.Client)
		}
		return fmt.Sprintf("apply %s#%d -> %s (%s)", m.Model, m.Apply.GetSeq(), m.Worker, to)
	case msgAnswer:
		if m.Err != nil {
			st := status.Convert(m.Err)
			return fmt.Sprintf("answer c%d: %s: %s", m.Client, st.Code(), st.Message())
		}
		if r := m.Resp.GetRefused(); len(r) > 0 {
			return fmt.Sprintf("answer c%d: ok, %d workers, refused by %s", m.Client, m.Resp.GetWorkers(), strings.Join(r, "; "))
		}
		return fmt.Sprintf("answer c%d: ok, %d workers", m.Client, m.Resp.GetWorkers())
	case msgBehind:
		return fmt.Sprintf("behind %s = %d", m.Model, m.Behind)
	case msgPersist:
		c := m.Persist
		entry := ""
		if c.Entry != nil {
			entry = fmt.Sprintf(" +#%d", c.Entry.GetSeq())
		}
		if n := len(c.Entries); n > 0 {
			entry = fmt.Sprintf(" +#%d..%d", c.Entries[0].GetSeq(), c.Entries[n-1].GetSeq())
		}
		if c.Rewrite != 0 {
			entry += fmt.Sprintf(" (rewrite %d)", c.Rewrite)
		}
		drop := ""
		if c.Floor > c.DropFrom {
			drop = fmt.Sprintf(" -#%d..%d", c.DropFrom+1, c.Floor)
		}
		return fmt.Sprintf("persist %s next=%d committed=%d floor=%d%s%s", m.Model, c.Next, c.Committed, c.Floor, entry, drop)
	case msgLog:
		var b strings.Builder
		fmt.Fprintf(&b, "log %s %q", m.Level, m.Text)
		for i := 0; i+1 < len(m.Attrs); i += 2 {
			fmt.Fprintf(&b, " %v=%v", m.Attrs[i], m.Attrs[i+1])
		}
		return b.String()
	}
	return fmt.Sprintf("message type %d", m.Type)
}
