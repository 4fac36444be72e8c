package router

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// When the routers elect the one that sequences embedding updates
// (elect.go), each term's sequencer keeps its update log in memory, and
// the routers that follow it keep a copy (replica), pulled each
// heartbeat with Registry.UpdateLog. The router elected next starts its
// sequencer from its copy: a worker that missed updates the old holder
// numbered is caught up by replay, as after a restart of a router with
// an update log folder, instead of staying out of serving until an
// operator copies a store.
//
//   - The copy mirrors the holder's log: the same numbers (next,
//     committed, floor) and the entries floor+1 .. the copy's end,
//     consecutive. Each answer is a page of the entries after the
//     copy's end, cut to fit maxLogPage and the holder's message limit
//     (up to 16 pages a heartbeat, the rest at the next); entries the
//     holder trimmed leave the copy too. A follower's copy takes as much
//     memory as the holder's log (Options.UpdateLogBytes per model).
//   - Each term has its own identity (a random number): across terms the
//     same number may name another update (an update the old holder
//     numbered that no worker announced in the new holder's window is
//     numbered again), so a copy of another term is replaced whole.
//   - A copy is started from only when it comes from the hold right
//     before this router's: the election's epoch (the Lease's count of
//     holder changes, Election) of the new hold is the copy's plus one
//     (of the same Lease: one made anew starts another run of epochs),
//     or the same for this router's own log when it takes its own Lease
//     back with no other holder between. A router does not see every
//     holder (one cut off from the API server through another's whole
//     hold, or one whose Lease had expired when it took it), and a copy
//     from an earlier hold may hold updates under numbers a later holder
//     gave others: replaying those would give workers different rows
//     under one number. An answer of an older epoch than the copy's (a
//     call under way while the holder changed) is dropped.
//   - The copy lags the holder by up to a heartbeat. Updates numbered
//     after the last pull are not in it: a worker holding them announces
//     them in the new holder's start-up window, and the sequence is
//     adopted from there, as on a first start (the copy's entries are
//     then dropped: a worker lacking the adopted ones cannot be caught up
//     from them). So the copy's updates do not count as numbered by the
//     new holder (restore's rule for a log folder), and while the window
//     lasts a worker announcing an update the copy holds but not as
//     acknowledged raises the acknowledged number to it (the old holder
//     may have acknowledged it after the last pull): workers lacking it
//     serve only once caught up.
//   - All routers stopping together loses the log, as an in-memory one
//     does.

// maxLogPage bounds one Registry.UpdateLog answer, and so does the
// router's message limit less logPageMargin (Options.MaxMessageBytes;
// an update is at most that, Updater, so one fits a page with its
// model's numbers).
const (
	maxLogPage    = 16 << 20
	logPageMargin = 4 << 10
)

// newTerm names a sequencing term.
func newTerm() uint64 {
	for {
		if t := rand.Uint64(); t != 0 {
			return t
		}
	}
}

// readLog is what a copy of the log lacks: per model whose updates were
// numbered, the numbers and the entries after after[model] (from the
// oldest when the copy is of another term, fresh, or ends outside the
// log), in a page of at most maxBytes (headers counted), which holds at
// least one entry when one is due: one entry larger than the bound has
// a page of its own, with its model's numbers only. The models with
// entries due come first, so the numbers of many models cannot crowd
// the entries out of every page. more: cut short; the models after the
// cut (or beside the large entry) are not in the page.
func (s *sequencer) readLog(after map[string]int64, fresh bool, maxBytes int64) (out map[string]*prismv1.ModelLog, more bool) {
	from := func(name string, m *modelSeq) int64 {
		if a, ok := after[name]; ok && !fresh && a >= m.floor && a <= m.next {
			return a + 1
		}
		return m.floor + 1
	}
	var due, rest []string
	for _, name := range slices.Sorted(maps.Keys(s.models)) {
		switch m := s.models[name]; {
		case m.next == 0:
		case from(name, m) <= m.next:
			due = append(due, name)
		default:
			rest = append(rest, name)
		}
	}
	out = map[string]*prismv1.ModelLog{}
	var bytes int64
	entries := 0
	for _, name := range append(due, rest...) {
		m := s.models[name]
		// The marks go in every answer naming the model, whole: a copy
		// has them as the holder's latest (replicaModel.diverged).
		ml := &prismv1.ModelLog{Next: m.next, Committed: m.committed, Floor: m.floor, Diverged: divergedCopy(m), Outcomes: m.outcomeRunsOf()}
		// The map entry: its key, the numbers, the marks, the framing.
		head := int64(len(name)+proto.Size(ml)) + 16
		if bytes > 0 && bytes+head > maxBytes {
			return out, true
		}
		out[name] = ml
		bytes += head
		for seq := from(name, m); seq <= m.next; seq++ {
			e := m.log[seq-m.floor-1]
			size := int64(proto.Size(e)) + 8
			if bytes+size > maxBytes {
				if entries == 0 {
					// An entry over the bound goes in a page of its own,
					// with its model's numbers alone (it fits the message
					// limit, Updater, with logPageMargin to spare: the
					// outcomes' runs, unbounded, stay out of that page, and
					// the copy keeps the ones it has).
					ml.Outcomes = nil
					ml.Entries = append(ml.Entries, e)
					return map[string]*prismv1.ModelLog{name: ml}, true
				}
				return out, true
			}
			ml.Entries = append(ml.Entries, e)
			bytes += size
			entries++
		}
	}
	return out, false
}

// readLog serves Registry.UpdateLog from the driver's sequencer.
func (d *updateDriver) readLog(req *prismv1.UpdateLogRequest) (*prismv1.UpdateLogResponse, error) {
	limit := req.GetMaxBytes()
	if limit <= 0 || limit > d.pageBytes {
		limit = d.pageBytes
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seq.resigned {
		return nil, status.Error(codes.Unavailable, "this router stopped sequencing embedding updates (another router holds the election now); read the update log there")
	}
	models, more := d.seq.readLog(req.GetAfter(), req.GetTerm() != d.term, limit)
	return &prismv1.UpdateLogResponse{Term: d.term, Epoch: d.epoch, Models: models, More: more}, nil
}

// readUpdateLog serves Registry.UpdateLog: the log of this router's
// sequencer, when it sequences.
func (r *Router) readUpdateLog(req *prismv1.UpdateLogRequest) (*prismv1.UpdateLogResponse, error) {
	switch {
	case r.el != nil:
		if t := r.el.term.Load(); t.d != nil {
			return t.d.readLog(req)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "this router does not sequence embedding updates now (the election is held by %q); read the update log there", r.el.leader())
	case r.fol != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "this router does not sequence embedding updates (%s sequences them); read the update log there", r.opts.Sequencer)
	}
	return r.upd.readLog(req)
}

// replica is a following router's copy of the sequencing router's
// update log.
type replica struct {
	mu     sync.Mutex
	term   uint64
	models map[string]*replicaModel
	// epoch is the election epoch of the hold the copy comes from (0:
	// not known: never started from); own: it is this router's own log,
	// kept when its hold ended (keep).
	epoch uint64
	own   bool
	// failures counts the pulls failed in a row.
	failures int
}

// failed counts a failed pull and says whether it is worth a log line:
// the first of a run, then one a minute at the default heartbeat.
func (c *replica) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	return c.failures == 1 || c.failures%60 == 0
}

// lag is, per model, the updates the holder numbered (as last heard)
// that the copy lacks.
func (c *replica) lag() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.models))
	for name, rm := range c.models {
		out[name] = rm.next - rm.end()
	}
	return out
}

// pulled ends a run of failed pulls.
func (c *replica) pulled() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = 0
}

// replicaModel is one model's copy: the holder's numbers as last heard,
// and the entries floor+1 .. end(), consecutive.
type replicaModel struct {
	next, committed, floor int64
	log                    []*prismv1.ApplyUpdateRequest
	// diverged are the holder's diverged marks as last heard
	// (ModelLog.diverged; nil: none, or a holder of an earlier release).
	diverged map[string]int64
	// outcomes are the holder's outcomes of its log's updates as last
	// heard, as it sends them (ModelLog.outcomes, runs; nil: none known,
	// or a holder of an earlier release). Kept as runs, expanded only
	// when the copy is started from (restoreTo): a map of every logged
	// update's outcome, made at each answer, cost a follower 15 ms and
	// 9 MB a model per heartbeat at 200,000 updates.
	outcomes []*prismv1.OutcomeRun
}

func (rm *replicaModel) end() int64 { return rm.floor + int64(len(rm.log)) }

// after is, per model, the last update the copy holds.
func (c *replica) after() (uint64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for name, rm := range c.models {
		out[name] = rm.end()
	}
	return c.term, out
}

// keep is the report "this router's hold (its sequencer s, term, of
// epoch) ends": its own log becomes the copy. Called under the driver's
// lock.
func (c *replica) keep(s *sequencer, term, epoch uint64) {
	models, _ := s.readLog(nil, true, math.MaxInt64)
	c.mu.Lock()
	c.models, c.epoch = nil, epoch
	c.mu.Unlock()
	c.merge(&prismv1.UpdateLogResponse{Term: term, Epoch: epoch, Models: models})
	c.mu.Lock()
	c.own = true
	c.mu.Unlock()
}

// extend is the report "this router's hold, whose epoch was not known
// (0), has learnt it": s, the sequencer of its term of epoch 0, did not
// start from the copy (restoreTo) and may have numbered updates since,
// past the copy's end. They are appended to the copy, so the same hold's
// term under its epoch starts from the previous holder's updates and
// these: a worker that missed either is caught up. Left as it was: a
// model whose log does not continue the copy's where it ends, or whose
// copy ends before the previous holder's latest as last heard (its
// entries may be other updates under the numbers the previous holder
// gave, restoreTo's concern); a model the copy lacks is taken whole.
// Without a copy the term of epoch starts from (epoch 0: none, or of a
// hold not known; or of a hold not right before epoch, which restoreTo
// drops as stale) it does nothing and says so (false): the hold's own
// log is then the copy (keep, of the epoch learnt). Called under the
// driver's lock.
func (c *replica) extend(s *sequencer, epoch uint64) bool {
	models, _ := s.readLog(nil, true, math.MaxInt64)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch == 0 || c.models == nil || !c.precedes(epoch) {
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		ml := models[name]
		es := ml.GetEntries()
		rm := c.models[name]
		if rm != nil {
			// The marks this hold found join the previous holder's: both
			// describe the workers' copies, whatever becomes of the
			// entries.
			for id, seq := range ml.GetDiverged() {
				if rm.diverged == nil {
					rm.diverged = map[string]int64{}
				}
				if _, ok := rm.diverged[id]; !ok {
					rm.diverged[id] = seq
				}
			}
		}
		if len(es) == 0 {
			continue
		}
		if rm == nil {
			c.models[name] = &replicaModel{next: ml.GetNext(), committed: ml.GetCommitted(), floor: ml.GetFloor(), log: slices.Clone(es), diverged: maps.Clone(ml.GetDiverged()), outcomes: ml.GetOutcomes()}
			continue
		}
		if rm.end() != rm.next || ml.GetFloor() != rm.end() || es[0].GetSeq() != rm.end()+1 {
			continue
		}
		// The outcomes of this hold's own updates join the copy's, with
		// its entries (this hold never started from the copy, restoreTo:
		// its outcomes of lower numbers are of its own history).
		if own := outcomeMap(ml.GetOutcomes(), rm.end(), ml.GetNext()); len(own) > 0 {
			all := outcomeMap(rm.outcomes, rm.floor, rm.end())
			if all == nil {
				all = own
			} else {
				maps.Copy(all, own)
			}
			rm.outcomes = outcomeRuns(all, rm.floor, ml.GetNext())
		}
		rm.log = append(rm.log, es...)
		rm.next, rm.committed = max(rm.next, ml.GetNext()), max(rm.committed, ml.GetCommitted())
	}
	return true
}

// merge takes an answer of the holder in; one of an older epoch than
// the copy's (the holder changed while the call was under way) is
// dropped. An answer that does not fit the copy (entries not
// consecutive, or not within the holder's log) is an error and replaces
// nothing but that model's entries. A page cut short (more) leaves the
// models it does not name as they are.
func (c *replica) merge(resp *prismv1.UpdateLogResponse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prismv1.EpochStale(c.epoch, resp.GetEpoch()) {
		return nil
	}
	if resp.GetTerm() != c.term || resp.GetEpoch() != c.epoch || c.models == nil {
		c.term, c.epoch, c.own, c.models = resp.GetTerm(), resp.GetEpoch(), false, map[string]*replicaModel{}
	}
	if !resp.GetMore() {
		for name := range c.models {
			if _, ok := resp.GetModels()[name]; !ok {
				delete(c.models, name) // the holder keeps no log of it now
			}
		}
	}
	var bad error
	for _, name := range slices.Sorted(maps.Keys(resp.GetModels())) {
		ml := resp.GetModels()[name]
		rm := c.models[name]
		if !numbersInOrder(ml) {
			// Nothing of such an answer is taken: its floor taken as the
			// copy's, past the copy's latest, had the copy end beyond
			// the holder's latest (FuzzReplicaMerge).
			if bad == nil {
				bad = fmt.Errorf("update log of model %q: numbers out of order (floor %d, acknowledged %d, next %d)", name, ml.GetFloor(), ml.GetCommitted(), ml.GetNext())
			}
			continue
		}
		if rm == nil {
			rm = &replicaModel{floor: ml.GetFloor()}
			c.models[name] = rm
		}
		if err := rm.merge(ml); err != nil {
			// The entries do not fit: the copy restarts from the
			// holder's floor, with its numbers.
			rm.log, rm.floor, rm.next, rm.committed = nil, ml.GetFloor(), ml.GetNext(), ml.GetCommitted()
			if bad == nil {
				bad = fmt.Errorf("update log of model %q: %w", name, err)
			}
		}
		// The holder's marks, whole in each answer naming the model,
		// replace the copy's (a worker the holder forgot, its
		// registration lapsed, is forgotten here too; its store's mark
		// brings it back when it announces). They hold whatever became
		// of the entries.
		rm.diverged = nil
		if d := ml.GetDiverged(); len(d) > 0 {
			rm.diverged = maps.Clone(d)
		}
		// The outcomes too: whole in each answer naming the model,
		// except a page of one large entry (readLog), which leaves the
		// copy's as they are. Those of updates the holder trimmed or
		// renumbered since are left out where the copy is started from
		// (restoreTo reads them within its entries only).
		if o := ml.GetOutcomes(); len(o) > 0 {
			rm.outcomes = o
		}
	}
	return bad
}

// outcomeRuns is outcome's updates floor+1 .. next as runs
// (ModelLog.outcomes): one a stretch of updates with one outcome, none
// for those not known.
func outcomeRuns(outcome map[int64]int8, floor, next int64) []*prismv1.OutcomeRun {
	if len(outcome) == 0 {
		return nil
	}
	var runs []*prismv1.OutcomeRun
	var cur *prismv1.OutcomeRun
	for seq := floor + 1; seq <= next; seq++ {
		v, ok := outcome[seq]
		if !ok {
			cur = nil
			continue
		}
		if cur != nil && cur.Refused == (v < 0) {
			cur.Count++
			continue
		}
		cur = &prismv1.OutcomeRun{First: seq, Count: 1, Refused: v < 0}
		runs = append(runs, cur)
	}
	return runs
}

// outcomeMap is runs as seq -> +1 applied, -1 refused, of the updates
// floor+1 .. next only (nil: none), and at most maxOutcomes of them, the
// latest (the ones a replay most likely needs): a holder's answer does
// not make the copy hold more than its log could.
func outcomeMap(runs []*prismv1.OutcomeRun, floor, next int64) map[int64]int8 {
	if len(runs) == 0 {
		return nil
	}
	out := map[int64]int8{}
	for i := len(runs) - 1; i >= 0 && len(out) < maxOutcomes; i-- {
		r := runs[i]
		v := int8(1)
		if r.GetRefused() {
			v = -1
		}
		from, to := max(r.GetFirst(), floor+1), min(r.GetFirst()+max(r.GetCount(), 0)-1, next)
		for seq := to; seq >= from && len(out) < maxOutcomes; seq-- {
			out[seq] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// maxOutcomes bounds the outcomes a copy takes from one answer: more
// than a log within the default byte budget holds entries.
const maxOutcomes = 1 << 20

// numbersInOrder: 0 <= floor <= next and 0 <= committed <= next.
func numbersInOrder(ml *prismv1.ModelLog) bool {
	return ml.GetFloor() >= 0 && ml.GetFloor() <= ml.GetNext() && ml.GetCommitted() >= 0 && ml.GetCommitted() <= ml.GetNext()
}

func (rm *replicaModel) merge(ml *prismv1.ModelLog) error {
	if !numbersInOrder(ml) {
		return fmt.Errorf("numbers out of order (floor %d, acknowledged %d, next %d)", ml.GetFloor(), ml.GetCommitted(), ml.GetNext())
	}
	if es := ml.GetEntries(); len(es) > 0 {
		first := es[0].GetSeq()
		for i, e := range es {
			if e.GetSeq() != first+int64(i) || e.GetSeq() <= ml.GetFloor() || e.GetSeq() > ml.GetNext() || e.GetUpdate() == nil {
				return fmt.Errorf("entry %d of the answer (seq %d) is not the next of the log %d .. %d", i, e.GetSeq(), ml.GetFloor()+1, ml.GetNext())
			}
		}
		if first != rm.end()+1 {
			// Not where the copy ends: the holder's log moved past it
			// (trimmed), or the copy restarts.
			rm.log, rm.floor = nil, first-1
		}
		rm.log = append(rm.log, es...)
	}
	if drop := ml.GetFloor() - rm.floor; drop > 0 {
		// Trimmed by the holder: the copy drops the same.
		if drop >= int64(len(rm.log)) {
			rm.log = nil
		} else {
			rm.log = slices.Clone(rm.log[drop:])
		}
		rm.floor = ml.GetFloor()
	}
	if rm.end() > ml.GetNext() {
		rm.log, rm.floor = nil, ml.GetFloor()
		return fmt.Errorf("the copy holds %d updates past the holder's latest %d", rm.end()-ml.GetNext(), ml.GetNext())
	}
	rm.next, rm.committed = ml.GetNext(), ml.GetCommitted()
	return nil
}

// pull brings the copy up to the log of the sequencing router on conn:
// pages until the answer is complete, or maxPages of them (the rest
// comes at the next heartbeat).
func (c *replica) pull(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration, maxPages int) error {
	client := prismv1.NewRegistryClient(conn)
	for range maxPages {
		term, after := c.after()
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := client.UpdateLog(cctx, &prismv1.UpdateLogRequest{Term: term, After: after, MaxBytes: maxLogPage},
			grpc.MaxCallRecvMsgSize(maxLogPage+2*maxUpdateBytes))
		cancel()
		if err != nil {
			return err
		}
		if err := c.merge(resp); err != nil {
			return err
		}
		if !resp.GetMore() {
			return nil
		}
	}
	return nil
}

// restoreTo starts s, the sequencer of this router's new hold of
// epoch, from the copy, if it comes from the hold right before (stale:
// it does not, and is dropped). A hold of epoch 0 (not known yet) does
// not start from the copy and leaves it: the same hold's term under its
// epoch, reported once a renewal names it, may.
func (c *replica) restoreTo(s *sequencer, epoch uint64) (models, updates int, stale bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch == 0 {
		return 0, 0, false
	}
	if c.epoch == 0 || !c.precedes(epoch) {
		stale = len(c.models) > 0
		c.models = nil
		return 0, 0, stale
	}
	for _, name := range slices.Sorted(maps.Keys(c.models)) {
		rm := c.models[name]
		end := rm.end()
		if end == 0 {
			continue
		}
		if end < rm.next && rm.committed <= end {
			s.logf(slog.LevelWarn, "this router's copy of the update log ends before the previous holder's latest update as last heard; a worker holding the later ones is followed in the start-up window, and one lacking them is caught up only if the copy reaches them",
				"model", name, "copy_ends", end, "holder_latest", rm.next, "holder_acknowledged", rm.committed)
		}
		s.restoreCopy(name, end, min(rm.committed, end), rm.floor, slices.Clone(rm.log), rm.diverged)
		s.restoreOutcomes(name, outcomeMap(rm.outcomes, rm.floor, end))
		if rm.committed > end {
			s.owe(name, rm.committed, end)
		}
		models++
		updates += len(rm.log)
	}
	return models, updates, false
}

// precedes says whether the copy comes from the hold right before
// this router's hold of epoch (or is this router's own log of epoch).
// c.mu is held.
func (c *replica) precedes(epoch uint64) bool {
	return epoch == c.epoch+1 || (epoch == c.epoch && c.own)
}

// restoreCopy is the event "this router starts sequencing from its copy
// of the previous holder's log: model at next, committed, with log
// holding floor+1 .. next"; it comes before any other. Unlike restore
// (a log folder this router wrote), the numbers do not count as numbered
// by this router: the previous holder may have numbered later updates
// after the copy was taken, and a worker announcing them in the startup
// window is followed (announced), the copy's entries then dropped.
// diverged are the previous holder's diverged marks (worker id -> seq,
// ModelLog.diverged): a worker so marked stays out of serving and takes
// no updates, as under the previous holder, and the answer to its
// announcement tells it (divergedOf), so its store records it; without
// them one the previous holder had not told yet announced no mark and
// was served again.
func (s *sequencer) restoreCopy(model string, next, committed, floor int64, log []*prismv1.ApplyUpdateRequest, diverged map[string]int64) {
	s.restore(model, next, committed, floor, log)
	m := s.models[model]
	m.handedOut, m.copied = false, true
	s.restoreMarks(model, diverged, "the update log copied from the previous sequencing router records that an embedding worker's copy of the model diverged from its peers'; it stays out of serving the model and takes no updates: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it")
}

// owe is the event "the previous holder acknowledged model's updates up
// to acknowledged, past end, where this router's copy of its log ends":
// nothing of the model is numbered until a worker holding them announces
// (announced adopts its number), since numbering on from end would give
// acknowledged updates' numbers to others.
func (s *sequencer) owe(model string, acknowledged, end int64) {
	m := s.model(model)
	m.owed = acknowledged
	s.logf(slog.LevelWarn, "the previous sequencing router acknowledged updates past the end of this router's copy of its log: no update of the model is numbered until an embedding worker holding them announces (numbering on would give their numbers to other updates; if no worker holds them any more, a sequencer started without a copy, after the routers restart, numbers on from what the workers hold)",
		"model", model, "copy_ends", end, "holder_acknowledged", acknowledged)
}

// numbered says whether s has numbered an update (its log holds
// entries no copy of another router's log has).
func (s *sequencer) numbered() bool {
	for _, m := range s.models {
		if m.handedOut {
			return true
		}
	}
	return false
}

// from is the epoch of the hold the copy comes from.
func (c *replica) from() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

var copyLagDesc = prometheus.NewDesc("prism_router_update_log_copy_lag",
	"Updates the elected sequencer numbered that this router's copy of its update log lacks, per model, as of the last pull (a following router elected next catches lagging embedding workers up only from its copy); absent while this router holds the election or none is known.",
	[]string{"model"}, nil)

// copyLagCollector reports the copy's lag at each scrape, while this
// router follows an elected holder.
type copyLagCollector struct{ r *Router }

func (copyLagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- copyLagDesc }

func (c copyLagCollector) Collect(ch chan<- prometheus.Metric) {
	el := c.r.el
	if el == nil {
		return
	}
	if leader := el.leader(); leader == "" || leader == el.self {
		return
	}
	for model, lag := range el.copy.lag() {
		ch <- prometheus.MustNewConstMetric(copyLagDesc, prometheus.GaugeValue, float64(lag), model)
	}
}
