package router

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// ended, when set, is the status of client's ended context (nil
	// while it waits): asked as an update's turn comes (startNext,
	// gather), so that no update whose caller is gone is numbered (it
	// would be applied with no one told). The driver's; nil: no client
	// ends but by cancel.
	ended func(client uint64) error

	logBytes int64
	// totalBytes bounds every model's log together
	// (Options.UpdateLogTotalBytes; 0: no bound): budget, trimTotal.
	totalBytes int64
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
	// workers are the live embedding workers by id, as last announced;
	// ids their ids, sorted (nil: to be made again, workerIDs), kept
	// from one update to the next: each update's fan-out goes over the
	// workers in order, and a sort of hundreds of ids for each held the
	// sequencer (and the lookups' inSync) up.
	workers map[string]*prismv1.WorkerInfo
	ids     []string
	// models are the sequences by key (seqKey): a model's, or one per
	// shard of a sharded model. shardSeqs indexes a sharded model's
	// shard sequences by model name (inSync asks of a worker holding
	// the whole model whether its shards have had updates).
	models    map[string]*modelSeq
	shardSeqs map[string]map[string]*modelSeq
	// layouts are the sharded models' layouts: per model, the
	// fingerprint (ShardRef.sharding) of the sharding whose updates its
	// shard sequences number, bound by the first update numbered under a
	// named one (startNext), by history adopted from workers naming one
	// (announced), or read back from the log's entries
	// (ApplyUpdateRequest.sequence; restore). Unbound ("") until then:
	// workers of earlier releases name none. A worker naming another
	// fingerprint is of another sharding (a reshard), whose store may
	// lack the updates, whichever shard now holds their rows
	// (compatible).
	layouts map[string]string
	// shardSeen is when a worker last announced a shard of each sharded
	// model: a shard's sequence that never had an update is kept
	// shardGrace after that (forget, tick), so an update of a model
	// whose shard workers are restarting is not sent whole to a
	// worker of the whole model (the shards would come back lacking it).
	shardSeen  map[string]time.Time
	shardGrace time.Duration
	// giveUp: a live worker that took no update for this long (stuck)
	// while the update log is over its byte budget is not kept caught
	// up: the trim drops what it lacks, and it is stale. 30 heartbeats,
	// and at least three per-worker update timeouts (newUpdateDriver).
	giveUp time.Duration
	// joins are the clients whose update was split over shards (split),
	// answered once every part is (answer).
	joins map[uint64]*join
	// any is set once some model has had an update: until then lookups
	// need not ask the sequencer at all.
	any bool
	// resigned: another router sequences the updates now (resign): this
	// one numbers nothing more and replays nothing more.
	resigned bool
	// epoch is the election epoch of the hold this sequencer serves (0:
	// not elected, or not known): every apply it sends carries it
	// (ApplyUpdateRequest.epoch), and workers that heard of a later hold
	// refuse it (fenced).
	epoch uint64
	// mergeBytes bounds a merged update (group commit,
	// sequencer_merge.go): the updates waiting behind the one in flight
	// are numbered and sent together up to this many bytes (0: each
	// alone).
	mergeBytes int64
	out        []message
}

// modelSeq is one sequence: a model's, or a shard's of a sharded model
// (each shard numbers its own updates, so a shard's workers get only
// the updates of its rows, and one shard slow or down holds up no
// other's).
type modelSeq struct {
	// key names the sequence (seqKey); name is the model and shard the
	// shard (-1: the whole model).
	key   string
	name  string
	shard int32

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
	// outcome is what became of each update the log holds, as far as
	// this router saw: +1 some worker applied it, -1 its workers refused
	// it as bad input (it took its number everywhere), absent not known
	// (no worker answered yet, or it was numbered before a restart). A
	// replay answered otherwise makes its worker diverged, as a
	// divergent fan-out does.
	outcome map[int64]int8
	// outcomeNew are the outcomes decided since the last persist, which
	// the next one writes (logChange.Outcomes): a router restarted
	// without them judged a replay's answer by the first worker to
	// answer it, and marked diverged the workers that agreed with the
	// update's first holders instead of the one that did not.
	outcomeNew map[int64]int8
	// runs are outcome as ModelLog.outcomes carries it to the routers
	// copying the log (runs of consecutive updates with one outcome, in
	// order; the first may start at or below floor), kept as outcomes
	// are decided (nearly always the next after the last) so a page of
	// the log does not walk the whole log under the driver's lock:
	// runsDirty when one was decided out of order, and runs are made
	// again from outcome at the next read.
	runs      []*prismv1.OutcomeRun
	runsDirty bool
	// opened is when a worker first announced the model's seq.
	opened   time.Time
	catching map[string]bool // a replay to the worker is under way
	stale    map[string]bool // reported once
	// progress is when each live worker last held every numbered update
	// or took one more (stuck): a worker that took none for
	// sequencer.giveUp while the log is over its byte budget is no
	// longer waited for by the log's trim.
	progress map[string]time.Time
	// queue holds the updates waiting their turn, oldest first; inflight
	// is the one being applied (one at a time gives one order), with the
	// run of waiting updates of its table merged into it as its turn
	// came (group commit, sequencer_merge.go).
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
	// copied: the log came from a copy of the previous sequencing
	// router's (restoreCopy, replica.go).
	copied bool
	// owed: the previous holder acknowledged updates up to owed, past
	// where this router's copy of its log ends (restoreCopy). Until a
	// worker holding them announces (adopted, even after the startup
	// window), nothing is numbered: numbering on from the copy's end
	// would give those numbers to other updates, and an acknowledged
	// update would be lost.
	owed int64
	// layoutLogged: layoutConflict reported a worker of another layout
	// of the model; wholeLogged: a worker of the shard came back below
	// what the model acknowledged while served whole (announced).
	layoutLogged, wholeLogged bool
}

// newSequencer starts a sequencer at the router's start time.
func newSequencer(start time.Time, heartbeat time.Duration, logBytes, totalBytes int64, quorum Quorum) *sequencer {
	return &sequencer{
		logBytes:   logBytes,
		totalBytes: totalBytes,
		quorum:     quorum,
		settled:    start.Add(3 * heartbeat),
		window:     3 * heartbeat,
		now:        start,
		workers:    map[string]*prismv1.WorkerInfo{},
		models:     map[string]*modelSeq{},
		shardSeqs:  map[string]map[string]*modelSeq{},
		layouts:    map[string]string{},
		shardSeen:  map[string]time.Time{},
		// Ten heartbeats: a worker restarting comes back well within it.
		shardGrace: 10 * heartbeat,
		giveUp:     giveUpHeartbeats * heartbeat,
		joins:      map[uint64]*join{},
		mergeBytes: defaultMergeBytes,
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

// model is the state of the sequence named key (seqKey), created on
// first use.
func (s *sequencer) model(key string) *modelSeq {
	m := s.models[key]
	if m == nil {
		name, shard := parseSeqKey(key)
		m = &modelSeq{key: key, name: name, shard: shard, known: map[string]int64{}, foreign: map[string]int64{}, slow: map[string]bool{}, diverged: map[string]int64{}, outcome: map[int64]int8{}, catching: map[string]bool{}, stale: map[string]bool{}, progress: map[string]time.Time{}}
		s.models[key] = m
		if shard >= 0 {
			if s.shardSeqs[name] == nil {
				s.shardSeqs[name] = map[string]*modelSeq{}
			}
			s.shardSeqs[name][key] = m
		}
	}
	return m
}

// drop forgets the sequence named key.
func (s *sequencer) drop(key string) {
	m := s.models[key]
	if m == nil {
		return
	}
	delete(s.models, key)
	// Its gauge goes too: kept, it reported the last count for a
	// sequence no longer kept.
	s.send(message{Type: msgBehind, Model: key, Behind: -1})
	if m.shard >= 0 {
		delete(s.shardSeqs[m.name], key)
		if len(s.shardSeqs[m.name]) == 0 {
			delete(s.shardSeqs, m.name)
			delete(s.layouts, m.name)
			delete(s.shardSeen, m.name)
		}
	}
}

// seqKey, parseSeqKey and keyOf name the sequences: a model's, or a
// shard's of a sharded model (prismv1.UpdateSeqKey).
func seqKey(model string, shard int32) string { return prismv1.UpdateSeqKey(model, shard) }

func parseSeqKey(key string) (string, int32) { return prismv1.ParseUpdateSeqKey(key) }

func keyOf(w *prismv1.WorkerInfo, model string) string { return prismv1.UpdateSeqKeyOf(w, model) }

// workerIDs are the live workers' ids, sorted; the caller does not
// change the slice.
func (s *sequencer) workerIDs() []string {
	if s.ids == nil {
		s.ids = slices.Sorted(maps.Keys(s.workers))
	}
	return s.ids
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
	if prev := s.workers[w.GetId()]; prev != nil {
		// A model it no longer serves, or whose shard it changed: it
		// holds nothing of the sequence it left.
		for _, model := range prev.GetModels() {
			if old := keyOf(prev, model); !slices.Contains(w.GetModels(), model) || old != keyOf(w, model) {
				if m := s.models[old]; m != nil {
					m.leave(w.GetId())
				}
			}
		}
	}
	if _, ok := s.workers[w.GetId()]; !ok {
		s.ids = nil
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
		key := keyOf(w, model)
		m := s.model(key)
		if m.shard >= 0 {
			s.shardSeen[model] = s.now
			if whole := s.models[model]; whole != nil && whole.committed > seq && !m.wholeLogged {
				// Served whole meanwhile: its store may lack what the
				// whole model's workers acknowledged.
				m.wholeLogged = true
				s.logf(slog.LevelWarn, "embedding worker of a shard of a model whose updates were acknowledged while it was served whole holds an earlier number: its store may lack those updates (its shard numbers its own from now on)",
					"model", model, "worker", w.GetId(), "holds", seq, "acknowledged_whole", whole.committed)
			}
		}
		if m.shard < 0 && s.updated(model) {
			s.layoutConflict(m, w.GetId()) // the whole model, its shards updated: out of serving (inSync)
		}
		if !s.compatible(model, w) {
			s.layoutConflict(m, w.GetId())
			delete(m.known, w.GetId())
			continue
		}
		if m.opened.IsZero() {
			m.opened = s.now
		}
		if seq > m.next {
			if m.handedOut || (!s.now.Before(s.settles(m)) && m.owed <= m.next) {
				// Another history (a store copied from elsewhere, a
				// second router) or a lie: adopting it would renumber
				// the model and leave every real worker behind.
				if m.foreign[w.GetId()] != seq {
					s.logf(slog.LevelError, "embedding worker claims updates this router never numbered; it is left out of the model (no updates, no lookups) and the sequence goes on: give it a copy of an up-to-date worker's store (prism store copy; do two routers take updates for this model? was the router's update log folder restored from a copy older than the workers' stores? then remove that folder and restart the router)",
						"model", key, "worker", w.GetId(), "holds", seq, "router_latest", m.next)
				}
				m.foreign[w.GetId()] = seq
				delete(m.known, w.GetId())
				continue
			}
			dropFrom := m.floor
			m.next, m.committed, m.floor, m.log, m.bytes = seq, seq, seq, nil, 0
			clear(m.outcome)
			m.outcomeNew, m.runs, m.runsDirty = nil, nil, false
			s.persist(key, m, nil, dropFrom)
		}
		if ref := w.GetShards()[model]; ref.GetShards() > 0 && ref.GetSharding() != "" && s.layouts[model] == "" && seq > 0 && s.updated(model) {
			// History this router did not number (adopted at a start, or
			// a copied log that lost its entries) binds the layout to the
			// sharding of the workers holding it.
			s.layouts[model] = ref.GetSharding()
		}
		if m.copied && seq > m.committed && s.now.Before(s.settles(m)) {
			// The previous holder may have acknowledged it after this
			// router's copy of its log was taken: a worker lacking it
			// serves only once caught up.
			m.committed = seq
		}
		if seq > 0 {
			s.any = true
		}
		delete(m.foreign, w.GetId())
		if k, ok := m.known[w.GetId()]; !ok || seq > k {
			m.progress[w.GetId()] = s.now
		}
		m.known[w.GetId()] = max(m.known[w.GetId()], seq)
		if m.known[w.GetId()] >= m.next {
			// A slow worker whose late apply landed holds the latest:
			// caught up (as ack), though no replay was needed. Left slow,
			// it would get no update again (tick replays nothing to a
			// worker holding the latest), and with every worker slow no
			// update could be numbered.
			delete(m.slow, w.GetId())
		}
	}
	s.markedDiverged(w)
}

// markedDiverged takes the diverged marks w's store recorded
// (WorkerInfo.diverged): a router told it, in the answer to an
// announcement (divergedOf), that its copy of the model diverged from
// its peers'. Its update number counts the update it answered
// otherwise, so only the mark keeps it out of serving for a router that
// did not see it happen (this one restarted, or another holds the
// sequencing now) or that forgot it (leave, when the worker's
// registration lapsed). A mark is never dropped by an announcement
// lacking it (a worker of an earlier release announces none); a worker
// with another store announces under another id.
func (s *sequencer) markedDiverged(w *prismv1.WorkerInfo) {
	for _, model := range slices.Sorted(maps.Keys(w.GetDiverged())) {
		seq := w.GetDiverged()[model]
		if !slices.Contains(w.GetModels(), model) || seq <= 0 || seq > maxAnnouncedSeq {
			continue // not a mark of a copy it serves
		}
		key := keyOf(w, model)
		m := s.model(key)
		if _, already := m.diverged[w.GetId()]; already {
			continue
		}
		m.diverged[w.GetId()] = seq
		s.any = true // inSync asks from now on
		s.logf(slog.LevelError, "embedding worker's store records that its copy of the model diverged from its peers' (a router found it answering an update otherwise than they did); it stays out of serving the model and takes no updates: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it",
			"model", key, "worker", w.GetId(), "seq", seq)
	}
}

// updated says whether a shard of model has had updates.
func (s *sequencer) updated(model string) bool {
	for _, m := range s.shardSeqs[model] {
		if m.next > 0 || m.committed > 0 {
			return true
		}
	}
	return false
}

// compatible says whether worker w, announcing a shard of model, is of
// its layout: a fingerprint unknown on either side is taken for the
// same (prismv1.SameSharding; a reshard among workers of earlier
// releases is the operator's to tell the routers, README). A worker of
// the whole model is judged by inSync.
func (s *sequencer) compatible(model string, w *prismv1.WorkerInfo) bool {
	ref := w.GetShards()[model]
	return ref.GetShards() <= 0 || prismv1.SameSharding(s.layouts[model], ref.GetSharding())
}

// layoutConflict logs, once per sequence, that worker holds another
// layout of m's model than m: it serves no lookups and takes no
// updates until the operator switches.
func (s *sequencer) layoutConflict(m *modelSeq, worker string) {
	if m.layoutLogged {
		return
	}
	m.layoutLogged = true
	s.logf(slog.LevelError, "embedding worker holds another layout of the model (the whole model, or another sharding) than the one its updates were numbered in: it serves no lookups and takes no updates, since its store may lack them. To switch to its layout (its stores made after those updates, or the updates applied again), stop the routers, remove their update log folders (--update-log-dir; prism up: DB-router-log) and start them",
		"model", m.name, "worker", worker, "sequence", m.key, "sharding", s.layouts[m.name])
}

// giveUpHeartbeats is sequencer.giveUp in heartbeats: far longer than a
// catch-up takes a live worker its replays (each answered within the
// per-worker update timeout moves it on), short enough that a worker
// that announces but takes no update (its updates cannot reach it, its
// store's writes hang) holds the log over its budget for half a minute
// of updates, not for as long as it announces.
const giveUpHeartbeats = 30

// giveUpTimeouts is the least sequencer.giveUp in per-worker update
// timeouts (newUpdateDriver): the assumption above, that a replay is
// answered within a few heartbeats, fails for a heartbeat short against
// the timeout (30 heartbeats of 100 ms are 3 s, a timeout 10 s), and a
// live worker still within the timeout of its update was given up.
const giveUpTimeouts = 3

// stuck says whether live worker id of m lacks an update and has taken
// none for s.giveUp.
func (s *sequencer) stuck(m *modelSeq, id string) bool {
	if m.known[id] >= m.next {
		return false
	}
	since, ok := m.progress[id]
	return ok && s.now.Sub(since) >= s.giveUp
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
	if _, ok := s.workers[id]; ok {
		delete(s.workers, id)
		s.ids = nil
	}
	for name, m := range s.models {
		m.leave(id)
		if m.idle() && !s.keepShard(m) {
			// A model no live worker serves and that never had an update
			// leaves no state to keep: the map stays bounded by the models
			// served, not every name ever announced.
			s.drop(name)
		}
	}
}

// keepShard says whether m, a shard's sequence that is idle, stays: while
// a worker announces a shard of its model, and shardGrace after the last
// did. The model is then still known sharded (split does not send its
// updates whole to a worker of the whole model), and the view followers
// get still leaves out the workers of another sharding.
func (s *sequencer) keepShard(m *modelSeq) bool {
	if m.shard < 0 {
		return false
	}
	if s.now.Before(s.shardSeen[m.name].Add(s.shardGrace)) {
		return true
	}
	for _, w := range s.workers {
		if w.GetShards()[m.name].GetShards() > 0 && slices.Contains(w.GetModels(), m.name) {
			return true
		}
	}
	return false
}

// leave drops what the sequence knew of worker id.
func (m *modelSeq) leave(id string) {
	delete(m.known, id)
	delete(m.progress, id)
	delete(m.stale, id)
	delete(m.foreign, id)
	delete(m.slow, id)
	delete(m.diverged, id)
}

// idle: no live worker, no update ever numbered or held, nothing queued
// or in flight, nothing being replayed.
func (m *modelSeq) idle() bool {
	return len(m.known) == 0 && len(m.catching) == 0 && !m.handedOut && m.next == 0 && m.committed == 0 &&
		len(m.log) == 0 && len(m.queue) == 0 && m.inflight == nil && !m.unwritten
}

// propose is the event "client asks for req to be applied, before
// deadline". Its answer comes as a msgAnswer, at once or after the
// update's turn and fan-out. An update of a sharded model is split over
// the shards holding its rows (split), each part numbered in its
// shard's sequence, and answered once every part is (join).
func (s *sequencer) propose(now time.Time, client uint64, req *prismv1.UpdateRequest, deadline time.Time) {
	s.advance(now)
	if wait := s.settled.Sub(s.now); wait > 0 {
		s.answer(client, "", nil, windowRefusal(status.Errorf(codes.Unavailable, "router started moments ago and is still learning which updates the embedding workers hold; retry in %v", wait.Round(time.Millisecond)), wait))
		return
	}
	parts, err := s.split(req)
	if err != nil {
		s.answer(client, "", nil, err)
		return
	}
	for _, p := range parts {
		if wait := s.settles(s.model(p.key)).Sub(s.now); wait > 0 {
			s.answer(client, "", nil, windowRefusal(status.Errorf(codes.Unavailable, "router first heard of model %q moments ago and is still learning which updates its embedding workers hold; retry in %v", p.key, wait.Round(time.Millisecond)), wait))
			return
		}
	}
	if len(parts) > 1 {
		s.joins[client] = &join{parts: len(parts), left: len(parts)}
	}
	for _, p := range parts {
		m := s.model(p.key)
		m.queue = append(m.queue, &proposal{client: client, req: p.req, deadline: deadline})
		s.startNext(p.key, m)
	}
}

// endedErr is ended's answer for client (nil without ended).
func (s *sequencer) endedErr(client uint64) error {
	if s.ended == nil {
		return nil
	}
	return s.ended(client)
}

// cancel is the event "client's context ended" (err is its status): an
// update still waiting its turn is dropped and answered err (each part
// of a split one still waiting): it is never applied. One already
// numbered is answered when its workers have (one merged with others
// and refused with them is then answered err, and not sent again).
func (s *sequencer) cancel(now time.Time, client uint64, err error) {
	s.advance(now)
	for key, m := range s.models { // the order is no matter: one answer, joined
		for i, p := range m.queue {
			if p.client == client {
				m.queue = slices.Delete(m.queue, i, i+1)
				s.answer(client, key, nil, err)
				break
			}
		}
		if f := m.inflight; f != nil && len(f.parts) > 1 {
			// Sent, merged with others: answered when they are, but not
			// sent again should its workers refuse the merged update
			// (unmerge).
			for _, p := range f.parts {
				if p.client == client && p.ended == nil {
					p.ended = err
				}
			}
		}
	}
}

// tick is the event "a heartbeat passed": updates whose deadline passed
// while waiting are answered, a replay starts for every live worker
// behind on updates the log still holds, those it cannot reach are
// reported (once), and each model's behind gauge is set.
func (s *sequencer) tick(now time.Time) {
	s.advance(now)
	for _, model := range slices.Sorted(maps.Keys(s.models)) {
		if m := s.models[model]; m.idle() && m.shard >= 0 && !s.keepShard(m) {
			s.drop(model) // its model's shard workers gone for shardGrace
		}
	}
	s.trimTotal()
	for _, model := range slices.Sorted(maps.Keys(s.models)) {
		m := s.models[model]
		m.queue = slices.DeleteFunc(m.queue, func(p *proposal) bool {
			if s.now.Before(p.deadline) {
				return false
			}
			s.answer(p.client, model, nil, status.FromContextError(context.DeadlineExceeded).Err())
			return true
		})
		if m.unwritten {
			s.rewrite(model, m)
		} else if len(m.outcomeNew) > 0 {
			// Outcomes decided since the last write (a replay's answer,
			// an update below the quorum, which writes nothing): written
			// at the heartbeat, not only with the model's next update,
			// so a restart a heartbeat later still has them.
			s.persist(model, m, nil, m.floor)
		}
		behind := 0
		for _, id := range slices.Sorted(maps.Keys(m.known)) {
			k := m.known[id]
			if k >= m.next {
				continue
			}
			if _, out := m.diverged[id]; out {
				// Out of the model for good (its copy is the one an
				// operator replaces, under a new worker id): it takes no
				// updates, so no replays either, and it is not behind.
				// Replayed, it took every later update for nothing and
				// counted in prism_router_embedding_workers_behind as if catching
				// up would bring it back.
				continue
			}
			if k < m.committed {
				behind++
			}
			if k < m.floor {
				if !m.stale[id] {
					m.stale[id] = true
					s.logf(slog.LevelError, "embedding worker misses updates the router no longer holds; it stays out of serving: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it",
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

// inSync says whether w may serve model's lookups at now: only a worker
// holding every acknowledged update of its sequence (its shard's, or
// the model's) does, and, while the router is still hearing from its
// workers, none of a sequence that has had updates (a worker holding
// later ones may not have announced yet). A worker holding the whole of
// a model whose shards have had updates lacks them, as does a worker of
// another layout than its shard's sequence (compatible): it does not
// serve.
// It changes nothing.
func (s *sequencer) inSync(w *prismv1.WorkerInfo, model string, now time.Time) bool {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !s.any {
		return true
	}
	key := keyOf(w, model)
	if (key == model && s.updated(model)) || !s.compatible(model, w) {
		// The whole model, lacking every update of its shards; or
		// another layout than its shards'.
		return false
	}
	m := s.models[key]
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

// divergedOf is what the answer to w's announcement tells it of its
// copies (AnnounceResponse.diverged): per model it serves, the update at
// which this sequencer found its copy diverged. Nil when none. It
// changes nothing.
func (s *sequencer) divergedOf(w *prismv1.WorkerInfo) map[string]int64 {
	var out map[string]int64
	for _, model := range w.GetModels() {
		m := s.models[keyOf(w, model)]
		if m == nil {
			continue
		}
		if seq, ok := m.diverged[w.GetId()]; ok {
			if out == nil {
				out = map[string]int64{}
			}
			out[model] = seq
		}
	}
	return out
}

// strandedOf is what the answer to w's announcement tells it of the
// models whose updates it lacks and this sequencer's log no longer holds
// (AnnounceResponse.stranded; stranded's rule): the models it serves,
// sorted. Nil when none. It changes nothing.
func (s *sequencer) strandedOf(w *prismv1.WorkerInfo) []string {
	var out []string
	id := w.GetId()
	for _, model := range w.GetModels() {
		m := s.models[keyOf(w, model)]
		if m == nil || !m.stale[id] {
			continue
		}
		if _, diverged := m.diverged[id]; !diverged && m.known[id] < m.floor {
			out = append(out, model)
		}
	}
	slices.Sort(out)
	return out
}
