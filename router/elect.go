package router

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Election chooses, among several routers serving the same workers,
// the one that sequences embedding updates (Options.Election). On
// Kubernetes it is a Lease (internal/kubelease); tests drive it by
// hand.
type Election interface {
	// Identity is this router's name in the election: the address the
	// other routers dial it at.
	Identity() string
	// Run takes part until ctx ends (then gives up the election if this
	// router holds it). It calls leader, one call at a time, whenever
	// the holder changes: Identity() while this router holds it, the
	// holder's address while another does, "" while none is known.
	// While this router holds it, epoch numbers its hold: one more than
	// the hold right before, or the same when this router takes its own
	// hold back with no other between (kubelease.Epoch: a Lease's
	// leaseTransitions plus one, its creation time in the high 32 bits,
	// so a Lease made anew numbers its holds after the old one's,
	// prismv1's ordered epochs); 0 when not known (a copy of the update
	// log is then not started from, but kept for the same hold's term
	// once a renewal names its epoch, replica.go). A new epoch for the
	// same holder is a new hold (the Lease made anew under it).
	Run(ctx context.Context, leader func(addr string, epoch uint64))
}

// elected runs a router whose role in update sequencing follows an
// Election (issue 12): every router serves lookups and takes updates;
// the holder of the election sequences them (a fresh sequencer for each
// term), the others forward them to it (follow.go):
//
//   - Becoming the holder starts a new term: a sequencer started now,
//     fed at once with the registry's live workers as announcements and
//     then with every announcement, so its start-up window of three
//     heartbeats learns what the workers hold (the updates the previous
//     holder numbered included) and the sequence goes on from there.
//     Until the window ends updates are Unavailable, and lookups are
//     judged by the follower's rule, as they were before.
//   - Losing it ends the term at once: the sequencer resigns (no new
//     number, no replay; the update being applied finishes or fails),
//     and the router forwards to the new holder.
//   - While no holder is known (an election under way) an update is
//     answered Unavailable; one forwarded to a router that does not
//     hold the election (the holder moved meanwhile) too. No router
//     ever applies an update it did not number.
//   - The follower hears every announcement in every role, so lookups
//     are judged the moment the router stops leading.
//
// Each term's update log is in memory, and the routers that follow keep
// a copy of it, pulled each heartbeat (replica.go): the new holder starts
// its sequencer from its copy and catches up a worker that lacks updates
// the old holder numbered. Known limits: updates numbered after the
// last pull are not in the copy; a worker holding them is followed in
// the new holder's window and the copy's entries dropped, so a worker
// lacking them stays out of serving the model, logged, until it gets a
// copy of an up-to-date worker's store.
//
// Fencing (issue 14): an update the old holder sent just before it lost
// the election may reach a worker late. Every apply carries the epoch of
// its sequencer's hold, and the holder tells the workers its epoch in
// every answer to their announcements (epoch), so a worker refuses the
// old holder's updates from its first heartbeat in the new term on
// (FAILED_PRECONDITION, nothing written, no number taken; the old
// holder answers its client Unavailable and stops sequencing). One that
// lands before is in what the worker announces in the new holder's
// start-up window. With workers of an earlier release (no epoch read),
// one landing after the window is as before: the new holder finds the
// worker claiming an update it did not number and leaves it out of the
// model (foreign, see sequencer.announced) until an operator gives it a
// store, as with any second history; or, when the new holder has
// numbered an update of its own under that number meanwhile, the
// worker answers its fan-out (sent fresh) AlreadyExists instead of
// acknowledging it as a replay, and is left out likewise (diverged),
// never counted as holding the new update. The old holder acknowledges
// such an update only if its quorum held it before it resigned.
type elected struct {
	r    *Router
	self string
	fol  *follower
	// term is the current role; replaced (never changed) by setLeader,
	// which holds mu and the registry's lock while it does, so the
	// registry's hooks see one term for a whole announcement.
	term atomic.Pointer[term]
	mu   sync.Mutex
	// copy is this router's copy of the holder's update log, pulled each
	// heartbeat while another router holds the election.
	copy replica
}

// term is one stretch of one role: leading (d set) or following leader
// ("" while none is known).
type term struct {
	leader string
	d      *updateDriver
	// settled ends the start-up window of d's sequencer: lookups are
	// judged by the follower's rule until then.
	settled time.Time
	// ctx is d's replays' context, ended with the term.
	ctx    context.Context
	cancel context.CancelFunc
}

func newElected(r *Router, self string) *elected {
	e := &elected{r: r, self: self,
		fol: newFollower("", r.sequencerConn, r.opts.UpdateQuorum, r.Reg.now, r.opts.Heartbeat)}
	e.fol.elected = true
	e.term.Store(&term{})
	return e
}

// setLeader is the Election's report: addr holds it now (in epoch,
// when addr is this router).
func (e *elected) setLeader(addr string, epoch uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.term.Load()
	if old.leader == addr && (old.d == nil || old.d.epoch == epoch) {
		return
	}
	reg := e.r.Reg
	reg.mu.Lock()
	defer reg.mu.Unlock()
	now := reg.now()
	if old.d != nil && old.d.epoch == 0 && epoch != 0 && old.leader == e.self && addr == e.self {
		// This router's hold, its epoch learnt from a renewal: the
		// updates its term of epoch 0 numbered go on the copy of the
		// previous holder's log, which the term of the epoch starts
		// from (else a worker holding them, announcing past the copy's
		// end, had the copy dropped, and the workers that missed the
		// previous holder's updates or these were not caught up); with
		// no copy to extend (none, or one not of the hold right before
		// the epoch: stale), its own log is the copy, of the epoch (the
		// term of the epoch starts from it as from its own). It resigns
		// in the same step: nothing numbered after escapes the copy.
		old.d.step(func(now time.Time) {
			if !e.copy.extend(old.d.seq, epoch) {
				e.copy.keep(old.d.seq, old.d.term, epoch)
			}
			old.d.seq.resign(now)
		})
	}
	next := &term{leader: addr}
	if addr == e.self {
		o := e.r.opts
		next.d = newUpdateDriver(newSequencer(now, o.Heartbeat, o.UpdateLogBytes, o.UpdateLogTotalBytes, o.UpdateQuorum), reg.now, e.r.log, o.DefaultTimeout, o.UpdateWorkerTimeout, e.r.applyUpdate)
		next.d.floods = e.r.floods
		next.settled = now.Add(3 * o.Heartbeat)
		next.ctx, next.cancel = context.WithCancel(context.Background())
		next.d.runCtx = next.ctx
		next.d.epoch = epoch
		next.d.seq.epoch = epoch // every apply carries it (fencing)
		next.d.pageBytes = min(maxLogPage, int64(o.MaxMessageBytes-logPageMargin))
		next.d.seq.mergeBytes = mergeBytesFor(o.MaxMessageBytes)
		switch models, updates, stale := e.copy.restoreTo(next.d.seq, epoch); {
		case epoch == 0:
			// Not known yet (the Lease could not be read as the hold
			// began): the copy is kept, not started from, and this term
			// leaves it in place (the updates it numbers are appended to
			// it then: extend, above), so the same hold, once a renewal
			// names its epoch, starts from it.
			e.r.log.Warn("the epoch of this router's hold of the election is not known yet: its sequencer does not start from its copy of the previous holder's update log until it is", "self", e.self)
		case models > 0:
			e.r.log.Info("this router's sequencer starts from its copy of the previous holder's update log", "models", models, "updates", updates)
		case stale:
			e.r.log.Warn("this router's copy of the update log does not come from the hold right before its own; it starts without one (a worker that missed updates stays out of serving until it gets an up-to-date store)", "copy_epoch", e.copy.from(), "epoch", epoch)
		}
		// What the workers announced so far, as if announced now; later
		// announcements come through the hooks (the registry's lock is
		// held: none comes in between).
		for _, id := range slices.Sorted(maps.Keys(reg.workers)) {
			next.d.announced(reg.workers[id].info)
		}
	}
	e.term.Store(next)
	if old.d != nil {
		old.d.step(func(now time.Time) {
			if old.d.epoch != 0 || old.d.seq.numbered() {
				// A term of an unknown epoch that numbered nothing leaves
				// the copy it did not start from: its log holds nothing
				// the copy lacks, and the hold it served (its epoch learnt
				// from a renewal, the next term's) may follow the copy's.
				e.copy.keep(old.d.seq, old.d.term, old.d.epoch)
			}
			old.d.seq.resign(now)
		})
		old.cancel()
	}
	switch {
	case next.d != nil:
		e.r.log.Info("this router sequences embedding updates now (it holds the election); it takes updates once it has heard from its workers", "self", e.self, "window", 3*e.r.opts.Heartbeat)
	case addr == "":
		e.r.log.Warn("no router is known to sequence embedding updates (election under way): updates are answered Unavailable", "self", e.self)
	default:
		e.r.log.Info("embedding updates go to the router holding the election", "sequencer", addr, "self", e.self)
	}
}

// update routes an update by the current term: the driver to sequence
// it with (this router leads and its window has ended), or else the
// answer (forwarded to the holder, or Unavailable).
func (e *elected) update(ctx context.Context, req *prismv1.UpdateRequest) (*updateDriver, *prismv1.UpdateResponse, error) {
	t := e.term.Load()
	switch {
	case t.d != nil:
		if wait := t.settled.Sub(e.r.Reg.now()); wait > 0 {
			return nil, nil, windowRefusal(status.Errorf(codes.Unavailable, "this router began sequencing embedding updates moments ago and is still learning which updates the embedding workers hold; not applied; retry in %v", wait.Round(time.Millisecond)), wait)
		}
		return t.d, nil, nil
	case forwarded(ctx):
		// Sent by a router that took this one for the holder: the
		// election moved meanwhile.
		return nil, nil, status.Errorf(codes.Unavailable, "this router does not sequence embedding updates (the election is held by %q); not applied; retry", t.leader)
	case t.leader == "":
		return nil, nil, status.Error(codes.Unavailable, "no router sequences embedding updates right now (the election of one is under way); not applied; retry")
	}
	resp, err := e.fol.forwardTo(ctx, t.leader, req)
	return nil, resp, err
}

// announced, gone and inSync are the registry's hooks (under its lock):
// the follower hears everything, the term's sequencer too while it
// leads.
func (e *elected) announced(w *prismv1.WorkerInfo) {
	e.fol.announced(w)
	if t := e.term.Load(); t.d != nil {
		t.d.announced(w)
	}
}

func (e *elected) gone(id string) {
	e.fol.gone(id)
	if t := e.term.Load(); t.d != nil {
		t.d.gone(id)
	}
}

func (e *elected) inSync(w *prismv1.WorkerInfo, model string) bool {
	if t := e.term.Load(); t.d != nil && !e.r.Reg.now().Before(t.settled) {
		return t.d.inSync(w, model)
	}
	return e.fol.inSync(w, model)
}

// outOf is the registry's hook for the answer to an announcement: what
// the term's sequencer found of w's copies while this router leads (nil
// otherwise: the holder's answer tells the worker).
func (e *elected) outOf(w *prismv1.WorkerInfo) (map[string]int64, []string) {
	if t := e.term.Load(); t.d != nil {
		return t.d.outOf(w)
	}
	return nil, nil
}

// tick is one heartbeat of the leading term.
func (e *elected) tick() {
	if t := e.term.Load(); t.d != nil {
		t.d.tick(t.ctx)
	}
}

// epoch is the election epoch of this router's hold while it sequences
// updates as the holder (0 otherwise): the registry tells it to the
// embedding workers in every answer to their announcements, so each
// refuses the updates of the routers that held the Lease before from
// its first heartbeat in this term on, within the start-up window
// (three heartbeats) in which this router learns what they hold. An
// update of the old holder that lands before it is in what they
// announce in the window; one that comes later is refused (fenced:
// prismv1.StaleEpochError), where before it could land after the window
// under a number this router then gave its own update, leaving the
// workers diverged.
func (e *elected) epoch() uint64 {
	if t := e.term.Load(); t.d != nil {
		return t.d.epoch
	}
	return 0
}

// leader is the holder as last reported ("" none known).
func (e *elected) leader() string { return e.term.Load().leader }

// close ends the term (the router is stopping).
func (e *elected) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.cancel != nil {
		t.cancel()
	}
}
