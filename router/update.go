package router

import (
	"context"
	"encoding/binary"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/lograte"
	"github.com/prism-serve/prism/internal/tracing"
)

// Updater serves Embeddings.Update: it fans an upsert out to every live
// embedding worker of the model. Each worker's store is its own copy of
// the tables, so the router keeps the copies in step:
//
//   - One order per model. Updates of a model are numbered (seq 1, 2, 3
//     ...) and sent one at a time, so two updates of the same row land in
//     the same order on every worker. A worker's store records the last
//     seq it applied with the rows (one synced batch) and announces it.
//   - Group commit. The updates of one table waiting behind the one in
//     flight are numbered together when their turn comes: one update,
//     their rows in the order they were accepted (a later client's row
//     of an id wins), one entry in the log and one synced write on each
//     worker, each client answered as for its own update; one refused as
//     bad input is sent again alone, so only its client is refused
//     (sequencer_merge.go).
//   - Nobody serves stale rows. An update is acknowledged once the
//     quorum of the model's workers holds it (Options.UpdateQuorum:
//     one, a majority, all); from then on the router sends lookups only
//     to workers that hold every acknowledged update. Below the quorum
//     the caller gets Unavailable, and the update keeps its number and
//     reaches the others by catch-up, as one no worker applied does.
//   - Catching up. The router keeps the latest updates of each model
//     (Options.UpdateLogBytes) and replays to a worker what it missed
//     (down, restarted, slow), after which it serves again. The log is
//     in memory, or with Options.UpdateLogDir in a Pebble folder written
//     (synced) before any worker is sent an update or any client
//     answered, so a restarted router still catches workers up. A worker
//     further behind than the log reaches (or any behind worker after an
//     in-memory router restarted) is left out of serving, and the router
//     logs how to bring it back: give it a copy of an up-to-date
//     worker's store.
//   - A seq is handed out only while some live worker holds every
//     earlier one, and only to a request whose deadline has not passed,
//     so a number is never left without a worker to apply it; entries no
//     live worker holds, or one still lacks, are never trimmed from the
//     log (it exceeds its budget instead).
//   - No worker is sent an update the log on disk lacks: when a write
//     fails, the model takes no updates and replays none until its log
//     has been written again.
//   - A router that has just started takes no updates, and serves no
//     lookups of a model that has had updates, for Options.Heartbeat x 3:
//     every live worker has announced what it holds by then, so the
//     sequence continues from the true latest.
//   - A worker's announced seq sets the sequence only inside that
//     startup window (or a model's own, three heartbeats from the first
//     announcement of a model the router heard of later), and never
//     once this router has numbered the model's updates: a worker
//     claiming later updates is left out of the model, not followed.
//   - A worker that does not answer within Options.UpdateWorkerTimeout
//     is left behind (caught up later), not waited on; one refusing as
//     bad input an update another applied leaves serving the model, is
//     not counted for that update's quorum either, and the caller's
//     UpdateResponse.refused names it. That holds however each was sent
//     the update: a catch-up replay of the update still in flight (to a
//     worker left slow, or behind) answers for its worker in the
//     fan-out, counted when the last target answers (countReplays);
//     the answer of a worker already out of the model (diverged, still
//     caught up) counts for nothing, and an update only such workers
//     applied is one the model's workers refused.
//     The answers to the diverged worker's announcements tell it
//     (AnnounceResponse.diverged); its store records the mark and it
//     announces it, so it stays out under a restarted router, another
//     one, and after its registration lapses. Until it is told, the
//     update log keeps the mark (logChange.Diverged) for a router
//     restarted from it.
//
// One router sequences a model's updates; other routers serving the
// same workers forward their updates to it (Options.Sequencer;
// follow.go), or to the one they elected (Options.Election; elect.go).
//
// The rules live in sequencer (sequencer.go), a deterministic state
// machine; Updater and updateDriver only check requests at the RPC
// boundary and carry out what the sequencer asks (calls, answers,
// metrics, logs).
type Updater struct {
	prismv1.UnimplementedEmbeddingsServer
	reg     *Registry
	d       *updateDriver
	fol     *follower // nil: this router sequences
	el      *elected  // set: the sequencing router is elected (elect.go)
	timeout time.Duration
	// maxBytes is the largest update taken: under the workers' limit and
	// the router's own (Options.MaxMessageBytes), whose pages of the
	// update log must carry it (replica.go).
	maxBytes int
	// queued counts the memory the updates taken and not yet answered
	// hold (queuedBytes), at most maxQueued
	// (Options.MaxUpdateQueueBytes); refused counts those refused for
	// it.
	queued    *atomic.Int64
	maxQueued int64
	refused   prometheus.Counter
}

var _ prismv1.EmbeddingsServer = (*Updater)(nil)

// Updater returns the Embeddings service of r.
func (r *Router) Updater() *Updater {
	return &Updater{reg: r.Reg, d: r.upd, fol: r.fol, el: r.el, timeout: r.opts.DefaultTimeout, maxBytes: min(maxUpdateBytes, r.opts.MaxMessageBytes-logPageMargin),
		queued: &r.updateBytes, maxQueued: r.opts.MaxUpdateQueueBytes, refused: r.m.rejected.WithLabelValues("updates")}
}

// nonFinite is the index of the first little-endian float32 of rows
// that is a NaN or an infinity (exponent bits all ones), -1 if none.
func nonFinite(rows []byte) int {
	for i := 0; i+4 <= len(rows); i += 4 {
		if binary.LittleEndian.Uint32(rows[i:])&0x7f800000 == 0x7f800000 {
			return i / 4
		}
	}
	return -1
}

// waitingUpdateBytes is the router's memory an Embeddings.Update call
// holds while it waits for its model's turn, besides its message: the
// handler goroutine's stack (8 KiB), gRPC's state of the stream (its
// structs, the decoded headers, the receive buffer and flow control:
// about 3 KB), the call's contexts and deadline timer, the driver's
// client and the sequencer's proposal (about 0.5 KB). Measured by
// TestUpdateQueueMemoryPerUpdate (a router served by serve.New on
// loopback, updates from 4 connections of another process waiting
// behind one held at the worker; Go 1.26, grpc-go 1.85), per waiting
// update besides its message: 4.0-4.1 KB of live heap, 4.7-5.3 KB of
// heap spans in use, 8 KiB of stack: 12.8-13.5 KB in all, for one row
// of 16 floats as for 64 rows of 64; rounded up. (The queue counted
// the ids and rows alone, 72 bytes for one row of 16 floats: its bound
// of 512 MiB let 7.4 million of them wait, some 95 GB.)
const waitingUpdateBytes = 14 << 10

// queuedBytes is what the update req holds in the router's memory
// from when it is taken until it is answered: its message as decoded
// and waitingUpdateBytes.
func queuedBytes(req *prismv1.UpdateRequest) int64 {
	return waitingUpdateBytes + updateMessageBytes(req)
}

// maxUpdateBytes is the largest ApplyUpdateRequest sent to a worker:
// under the 64 MiB the tiers accept by default.
const maxUpdateBytes = 64<<20 - 1<<10

// Update applies req on every embedding worker serving req.Model. A
// refusal in a start-up window carries the time left in it as the
// retry pushback (pushback.go, windowRefusal) in its trailer, as
// Recommend's overload refusals carry theirs. The others carry none:
// no embedding worker right now and the update queue full
// (ResourceExhausted) come with no prediction of when it changes (no
// rate of the queue's draining is measured), so the client's backoff
// decides, as it does for a Recommend refused before its model's rate
// is measured.
func (u *Updater) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	resp, err := u.update(ctx, req)
	if err != nil {
		setPushback(ctx, err)
	}
	if tracing.Recording(ctx) {
		// An update merged with others (group commit) was sent under the
		// first one's trace: the number it took says which.
		attrs := []attribute.KeyValue{attribute.String("prism.model", req.GetModel()), attribute.String("prism.table", req.GetTable()),
			attribute.Int("prism.rows", len(req.GetIds())), attribute.Int("prism.update.workers", int(resp.GetWorkers()))}
		for _, k := range slices.Sorted(maps.Keys(resp.GetHeld())) {
			attrs = append(attrs, attribute.Int64("prism.update.seq."+k, resp.GetHeld()[k].GetSeq()))
		}
		tracing.Annotate(ctx, attrs...)
	}
	return resp, err
}

func (u *Updater) update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	if req.GetModel() == "" || req.GetTable() == "" || len(req.GetIds()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "update needs a model, a table and ids")
	}
	if n := len(req.GetRows()); n == 0 || n%len(req.GetIds()) != 0 || n/len(req.GetIds())%4 != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: %d row bytes are not whole float32 rows for %d ids", n, len(req.GetIds()))
	}
	if i := slices.IndexFunc(req.GetIds(), func(id int64) bool { return id < 0 }); i >= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: id %d (at %d) is negative", req.GetIds()[i], i)
	}
	if at := nonFinite(req.GetRows()); at >= 0 {
		// Every worker would refuse it (a NaN or an infinity poisons
		// every pool of its row): refused here, before it takes a
		// sequence number.
		dim := len(req.GetRows()) / 4 / len(req.GetIds())
		return nil, status.Errorf(codes.InvalidArgument, "update: id %d (at %d), column %d: %v is not a finite number: an embedding row must be", req.GetIds()[at/dim], at/dim, at%dim, math.Float32frombits(binary.LittleEndian.Uint32(req.GetRows()[4*at:])))
	}
	// Every update waits for its model's turn, here or at the router
	// it is forwarded to: taken past what the workers write, updates
	// queued in this router's memory until their deadlines. The bound
	// is on that memory, the message's and the call's (queuedBytes):
	// counted by its ids and rows alone, a waiting update of one row of
	// 16 floats held some 180 times the 72 bytes it counted.
	size := queuedBytes(req)
	if cur := u.queued.Add(size); cur > u.maxQueued && cur > size {
		u.queued.Add(-size)
		u.refused.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "embedding updates waiting for their turn hold %d bytes of this router's memory, and this one's %d would pass the limit of %d (--max-update-queue-bytes): updates are sent faster than the embedding workers write them; back off, or send fewer, larger updates (each waiting update holds about %d bytes besides its ids and rows)", cur-size, size, u.maxQueued, waitingUpdateBytes)
	}
	defer u.queued.Add(-size)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, u.timeout)
		defer cancel()
	}
	d := u.d
	if u.el != nil {
		var resp *prismv1.UpdateResponse
		var err error
		if d, resp, err = u.el.update(ctx, req); d == nil {
			return resp, err
		}
	} else if u.fol != nil {
		return u.fol.forward(ctx, req)
	}
	if !u.served(req.GetModel()) {
		if u.reg.Known(req.GetModel()) {
			return nil, status.Errorf(codes.Unavailable, "model %q has no live embedding worker right now; retry", req.GetModel())
		}
		return nil, status.Errorf(codes.NotFound, "model %q is not served", req.GetModel())
	}
	// Wrapped for the workers, the update must still fit their message
	// limit; a seq whose update cannot be sent would hold up every later
	// one.
	if size := proto.Size(&prismv1.ApplyUpdateRequest{Update: req, Seq: math.MaxInt64, Fresh: true, Epoch: math.MaxUint64}); size > u.maxBytes {
		return nil, status.Errorf(codes.InvalidArgument, "update of %d bytes: the limit is %d; split it", size, u.maxBytes)
	}
	return d.update(ctx, req)
}

// served says whether a live embedding worker serves model: a look in
// the registry's index. (It listed every worker, sorted, and asked the
// sequencer to describe every model, under its lock: 1 ms an update
// with 500 workers, BenchmarkScaleUpdateServed.)
func (u *Updater) served(model string) bool {
	return u.reg.ServedBy(prismv1.Role_ROLE_EMBEDDING, model)
}

// updateDriver runs a sequencer: it feeds it events one at a time under
// mu, with the time of the registry's clock, and carries out its
// messages after mu is released: applies as calls of their own, answers
// to the waiting Update handlers, gauges and log lines. The registry
// calls announced, gone and inSync under its own lock, so the
// registry's lock comes before mu, never after.
//
// Persistence (ulog set): the sequencer stays free of IO and says what
// to write with msgPersist messages. The driver writes a step's persists
// in one synced batch after mu is released (a lookup's inSync never
// waits for a disk) but before it carries out any other message of the
// step, and the steps' batches are written in the order of the steps
// (a ticket taken under mu), so the log on disk always holds every
// update any worker was sent and every number any client was told.
// No apply, a client's or a replay, is sent with a seq above what the
// driver knows the log holds for its model (written, set after each
// successful write). When a write fails, none of the step's applies is
// sent, an OK answer in it becomes Unavailable, and the sequencer hears
// of it (writeFailed): it reports the applies not sent and refuses the
// model's updates and replays until a rewrite of its log is written
// (rewritten).
type updateDriver struct {
	now func() time.Time
	// call applies req on the worker at addr.
	call func(ctx context.Context, addr string, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error)
	log  *slog.Logger
	// floods, when set, writes the sequencer's records keyed by Flood
	// (the router's Limiter, closed by its Run; nil: written plainly).
	floods *lograte.Limiter
	// timeout bounds one replayed update (the router's default timeout).
	timeout time.Duration
	// workerTimeout bounds one worker's answer to a client's update
	// (Options.UpdateWorkerTimeout; the client's deadline does not):
	// past it the worker is reported slow (errWorkerTimeout) while the
	// client still waits for the others.
	workerTimeout time.Duration
	// any mirrors sequencer.any, so the lookup path takes no lock until
	// some model has had an update (one atomic load).
	any atomic.Bool
	// calls counts the applies under way (wait).
	calls sync.WaitGroup

	// ulog is the update log's folder (nil: in memory only); tickets
	// order its writes: the step that took ticket n writes after the
	// one that took n-1 (written counts those done).
	ulog    *updateLog
	wmu     sync.Mutex
	wcond   *sync.Cond
	tickets uint64
	written uint64
	// wfailed counts the failed writes (under wmu): a client of a split
	// update (message.Parts) answered OK after a write failed since its
	// proposal is told Unavailable instead, since the failed write may
	// have held a part's acknowledgement, made in an earlier step than
	// the answer. (An update not split is acknowledged in the step that
	// answers it: that step's own write decides.)
	wfailed uint64
	// durable is, per model, the latest seq the log on disk holds with
	// every entry the log keeps up to it (under wmu): an apply above it
	// is not sent.
	durable map[string]int64

	// term names this sequencer's term for the copies of its log other
	// routers keep (replica.go).
	term uint64
	// epoch is the election's epoch of the hold this sequencer serves
	// (0: not elected, or not known).
	epoch uint64
	// pageBytes bounds a page of the update log served to other routers
	// (replica.go).
	pageBytes int64

	mu  sync.Mutex
	seq *sequencer
	// runCtx is Run's context: replays stop when it ends.
	runCtx  context.Context
	clients map[uint64]*updateClient
	last    uint64

	// logBytes is, per sequence, its update log's bytes as of the last
	// step (set under mu, read without it): a scrape never waits for
	// mu, which a flood of updates holds most of the time.
	logBytes atomic.Pointer[map[string]int64]
	// divergedN is, per sequence, how many live embedding workers it
	// holds out for a diverged copy (modelSeq.diverged), published as
	// logBytes is.
	divergedN atomic.Pointer[map[string]int64]
	// strandedN is, per sequence, how many live embedding workers are
	// behind by updates its log no longer holds (sequencer.stranded).
	strandedN atomic.Pointer[map[string]int64]
	// behindN is, per sequence, how many embedding workers it leaves out
	// of serving for lacking acknowledged updates (the sequencer's
	// msgBehind), published as logBytes is: reported only while this
	// driver sequences, so a router that lost the election reports none
	// (a gauge set by the last driver stayed at its last value).
	behindN atomic.Pointer[map[string]int64]
}

// updateClient is an Update handler waiting for its answer.
type updateClient struct {
	ctx    context.Context
	answer chan updateAnswer
	// wfailed is the driver's count of failed writes when the update
	// was proposed.
	wfailed uint64
}

type updateAnswer struct {
	resp *prismv1.UpdateResponse
	err  error
}

// step feeds the sequencer one event and carries out what it asks.
func (d *updateDriver) step(event func(now time.Time)) {
	d.mu.Lock()
	now := d.now()
	// The sequencer numbers no update whose caller is gone (it would be
	// applied with no one told): it asks the caller's context as the
	// update's turn comes (clientEnded), and the caller's own step
	// takes it out of the queue (update). A step reads no other
	// context: it read every waiting client's, under mu, and a flood
	// of updates queued a thousand: three quarters of each step's time
	// (thousands of steps a second), while lookups (inSync) and
	// scrapes waited for mu (BenchmarkScaleDriverStep).
	event(now)
	msgs := d.seq.ready()
	if d.seq.any {
		d.any.Store(true)
	}
	d.publishLogBytes()
	// What a message needs of the driver's state is taken under mu: the
	// context an apply runs under, the channel an answer goes to.
	var ticket uint64
	// Every step that sends, answers or persists takes a ticket: one
	// that only replays must not send an entry before the step that
	// numbered it has written it.
	if d.ulog != nil && slices.ContainsFunc(msgs, func(m message) bool { return m.Type == msgPersist || m.Type == msgApply || m.Type == msgAnswer }) {
		d.tickets++
		ticket = d.tickets
	}
	ctxs := make([]context.Context, len(msgs))
	answers := make([]chan updateAnswer, len(msgs))
	since := make([]uint64, len(msgs))
	for i, m := range msgs {
		if m.Type == msgBehind {
			// Published under mu, in the sequencer's order: after the
			// unlock a slower step's count (a dropped sequence's) could
			// land after a later step's and stay.
			d.setBehind(m.Model, int64(m.Behind))
			continue
		}
		c := d.clients[m.Client] // the sequencer answers a client once, after its applies
		switch {
		case m.Type == msgApply && c != nil:
			ctxs[i] = c.ctx
		case m.Type == msgApply:
			ctxs[i] = d.runCtx
		case m.Type == msgAnswer && c != nil:
			answers[i] = c.answer
			since[i] = c.wfailed
			delete(d.clients, m.Client)
		}
	}
	d.mu.Unlock()
	var werr error
	var notSent []message
	held := make([]bool, len(msgs)) // an apply not sent
	if ticket != 0 {
		var durable map[string]int64
		durable, werr = d.write(ticket, msgs)
		for i, m := range msgs {
			if m.Type == msgApply && (werr != nil || m.Apply.GetSeq() > durable[m.Model]) {
				held[i] = true
				notSent = append(notSent, m)
			}
		}
	}
	if werr != nil || len(notSent) > 0 {
		// Reported in a step of their own (with the failure first), as a
		// sent apply's outcome is.
		d.calls.Add(1)
		go d.unlogged(werr, msgs, notSent)
	}
	for i, m := range msgs {
		switch m.Type {
		case msgApply:
			if held[i] {
				continue
			}
			d.calls.Add(1)
			go d.apply(ctxs[i], m)
		case msgAnswer:
			if werr != nil && m.Err == nil {
				m.Resp, m.Err = nil, status.Errorf(codes.Unavailable, "the update was applied but the router could not write its update log (%v), so it is not acknowledged; retrying is safe", werr)
			} else if m.Err == nil && m.Parts > 1 && answers[i] != nil && d.writesFailed() != since[i] {
				m.Resp, m.Err = nil, status.Error(codes.Unavailable, "the update was applied but a write of the router's update log failed meanwhile (see the router's log), so it is not acknowledged; retrying is safe")
			}
			if answers[i] != nil {
				answers[i] <- updateAnswer{m.Resp, m.Err} // buffered: never blocks
			}
		case msgLog:
			if m.Flood != "" && d.floods != nil {
				d.floods.Log(m.Level, m.Flood, m.Text, m.Attrs...)
				break
			}
			d.log.Log(context.Background(), m.Level, m.Text, m.Attrs...)
		}
	}
	if ticket != 0 && werr == nil && slices.ContainsFunc(msgs, func(m message) bool { return m.Type == msgPersist && m.Persist.Rewrite != 0 }) {
		d.calls.Add(1)
		go d.rewrote(msgs)
	}
}

// write writes the persists of msgs (if any), once the steps before
// ticket have written theirs, and returns what the log then holds of
// the models msgs apply (durable's entries).
func (d *updateDriver) write(ticket uint64, msgs []message) (map[string]int64, error) {
	d.wmu.Lock()
	for d.written+1 != ticket {
		d.wcond.Wait()
	}
	d.wmu.Unlock()
	err := d.ulog.write(msgs)
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.written = ticket
	d.wcond.Broadcast()
	if err != nil {
		d.wfailed++
		d.log.Error("cannot write the update log: the updates of this step are neither sent nor acknowledged", "err", err)
		return nil, err
	}
	held := map[string]int64{}
	for _, m := range msgs {
		if c := m.Persist; m.Type == msgPersist && (c.Entry != nil || c.Rewrite != 0 || c.Floor == c.Next) {
			// Written with its entry (or a rewrite of all it lacked,
			// or nothing to hold): every entry up to Next is on disk. A
			// change of the numbers alone says nothing of the entries
			// (one an earlier, failed write held may be missing).
			d.durable[m.Model] = c.Next
		}
	}
	for _, m := range msgs {
		if m.Type == msgApply {
			held[m.Model] = d.durable[m.Model]
		}
	}
	return held, nil
}

// writesFailed is how many writes of the update log have failed.
func (d *updateDriver) writesFailed() uint64 {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	return d.wfailed
}

// unlogged reports what a step could not do for want of its log: the
// failed write (werr, if any) of msgs, and the applies not sent.
func (d *updateDriver) unlogged(werr error, msgs, notSent []message) {
	defer d.calls.Done()
	d.step(func(now time.Time) {
		if werr != nil {
			d.seq.writeFailed(now, msgs) // reports each apply of msgs not sent
			return
		}
		for _, m := range notSent {
			d.seq.applied(now, m.Client, m.Model, m.Worker, m.Apply.GetSeq(), errNotLogged)
		}
	})
}

// rewrote tells the sequencer that the rewrites among msgs were written.
func (d *updateDriver) rewrote(msgs []message) {
	defer d.calls.Done()
	d.step(func(now time.Time) {
		for _, m := range msgs {
			if m.Type == msgPersist && m.Persist.Rewrite != 0 {
				d.seq.rewritten(now, m.Model, m.Persist.Rewrite)
			}
		}
	})
}

// apply sends one update to one worker and reports the outcome.
func (d *updateDriver) apply(ctx context.Context, m message) {
	defer d.calls.Done()
	var err error
	switch {
	case m.Client != 0:
		// Numbered, the update goes to every worker whatever becomes of
		// its caller (detached from its cancellation, keeping its
		// values): cut at the caller's deadline, it left every worker
		// behind it, and each later update of the model was refused
		// until the next heartbeat's catch-up. The per-worker timeout
		// bounds each worker's part (a hung worker is left behind, not
		// waited on), so the model's next update waits at most that for
		// its turn; Router.Close, closing the connections, ends it.
		timeout := d.workerTimeout
		if timeout <= 0 {
			timeout = d.timeout
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		_, err = d.call(cctx, m.Addr, m.Apply)
		// gRPC's own deadline timer may end the call (DeadlineExceeded)
		// a moment before cctx reports its end: that is the per-worker
		// timeout too, not a failure.
		if err != nil && (cctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded) {
			err = errWorkerTimeout
		}
		cancel()
	case ctx.Err() != nil:
		err = errRouterStopping
	default:
		cctx, cancel := context.WithTimeout(ctx, d.timeout)
		_, err = d.call(cctx, m.Addr, m.Apply)
		cancel()
	}
	d.step(func(now time.Time) {
		d.seq.applied(now, m.Client, m.Model, m.Worker, m.Apply.GetSeq(), err)
	})
}

// update proposes req and waits for the sequencer's answer. If ctx ends
// first the sequencer is told, and answers at once unless the update was
// already numbered: then the caller is answered ctx's end at once, and
// the fan-out goes on without it (apply), so that no worker misses the
// update and the model's next one finds them holding it.
func (d *updateDriver) update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	deadline, _ := ctx.Deadline()
	ch := make(chan updateAnswer, 1)
	var id uint64
	d.step(func(now time.Time) {
		d.last++
		id = d.last
		d.clients[id] = &updateClient{ctx: ctx, answer: ch, wfailed: d.writesFailed()}
		d.seq.propose(now, id, req, deadline)
	})
	var a updateAnswer
	select {
	case a = <-ch:
	case <-ctx.Done():
		d.step(func(now time.Time) { d.seq.cancel(now, id, status.FromContextError(ctx.Err()).Err()) })
		select {
		case a = <-ch: // answered by now: it was still waiting its turn, or it just was
		default:
			// Numbered: its answer comes once the workers have applied it
			// (to the buffered channel, read by no one).
			a.err = status.Error(status.FromContextError(ctx.Err()).Code(), "the deadline passed (or the caller cancelled) after the update was numbered and sent to the embedding workers: they go on applying it in its turn, so it may be applied or not; retrying is safe")
		}
	}
	return a.resp, a.err
}

// announced, gone and inSync are the registry's hooks (called under its
// lock).
func (d *updateDriver) announced(w *prismv1.WorkerInfo) {
	d.step(func(now time.Time) { d.seq.announced(now, w) })
}

func (d *updateDriver) gone(id string) {
	d.step(func(now time.Time) { d.seq.gone(now, id) })
}

func (d *updateDriver) inSync(w *prismv1.WorkerInfo, model string) bool {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !d.any.Load() {
		return true // no model was ever updated: no lock on the lookup path
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq.inSync(w, model, d.now())
}

// outOf is the registry's hook for the answer to an announcement: what
// the sequencer found of w's copies (sequencer.divergedOf) and models
// (sequencer.strandedOf), under one hold of its lock.
func (d *updateDriver) outOf(w *prismv1.WorkerInfo) (map[string]int64, []string) {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
		return nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq.divergedOf(w), d.seq.strandedOf(w)
}

// tick is one heartbeat (Run calls it); replays it starts run under ctx.
func (d *updateDriver) tick(ctx context.Context) {
	d.step(func(now time.Time) {
		d.runCtx = ctx
		d.seq.tick(now)
	})
}

func newUpdateDriver(seq *sequencer, now func() time.Time, log *slog.Logger, timeout, workerTimeout time.Duration,
	call func(ctx context.Context, addr string, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error)) *updateDriver {
	d := &updateDriver{seq: seq, now: now, log: log, timeout: timeout, workerTimeout: workerTimeout, call: call, term: newTerm(), pageBytes: maxLogPage, runCtx: context.Background(), clients: map[uint64]*updateClient{}, durable: map[string]int64{}}
	d.wcond = sync.NewCond(&d.wmu)
	seq.ended = d.clientEnded
	// A worker whose update or replay is still within workerTimeout is
	// not stuck, however many heartbeats that is (a short --heartbeat
	// made giveUp shorter than one timeout): it is given up only after
	// giveUpTimeouts of them without taking an update.
	seq.giveUp = max(seq.giveUp, giveUpTimeouts*workerTimeout)
	return d
}

// restore feeds the sequencer what l holds and writes through l from
// then on; call it before any other event.
func (d *updateDriver) restore(l *updateLog) (models, updates int, err error) {
	rs, err := l.load()
	if err != nil {
		return 0, 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rs {
		d.seq.restore(r.model, r.next, r.committed, r.floor, r.log)
		d.seq.restoreDiverged(r.model, r.diverged)
		d.seq.restoreOutcomes(r.model, r.outcomes)
		d.durable[r.model] = r.next // load keeps only the run of entries ending at next
		models++
		updates += len(r.log)
	}
	for _, m := range d.seq.ready() {
		// The diverged marks read back (restoreDiverged), logged now.
		if m.Type == msgLog && d.log != nil {
			d.log.Log(context.Background(), m.Level, m.Text, m.Attrs...)
		}
	}
	if d.seq.any {
		d.any.Store(true)
	}
	d.publishLogBytes()
	d.ulog = l
	return models, updates, nil
}

// clientEnded is the status of client's ended context, nil while it
// waits (or for no client of this driver); mu held (the sequencer asks
// it within a step).
func (d *updateDriver) clientEnded(client uint64) error {
	c := d.clients[client]
	if c == nil {
		return nil
	}
	if err := c.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// publishLogBytes publishes the log's bytes by sequence (logBytes), a
// new map only when they changed; mu held.
func (d *updateDriver) publishLogBytes() {
	publishBy(&d.logBytes, d.seq.models, func(m *modelSeq) int64 { return m.bytes })
	publishBy(&d.divergedN, d.seq.models, func(m *modelSeq) int64 {
		// Live ones only: a mark read back from the update log (or a
		// copy of one) stays until its worker leaves, which one that
		// never announces again does not.
		n := int64(0)
		for id := range m.diverged {
			// Of this sequence still: a mark read back is kept while
			// its worker is live, also once it serves the model (or
			// shard) no more.
			if w := d.seq.workers[id]; w != nil && keyOf(w, m.name) == m.key {
				n++
			}
		}
		return n
	})
	publishBy(&d.strandedN, d.seq.models, func(m *modelSeq) int64 { return int64(len(d.seq.stranded(m))) })
}

// setBehind publishes n workers behind in sequence key (behindN; n < 0:
// the sequence was dropped); under mu.
func (d *updateDriver) setBehind(key string, n int64) {
	var next map[string]int64
	if last := d.behindN.Load(); last != nil {
		if v, ok := (*last)[key]; ok && v == n || !ok && n < 0 {
			return
		}
		next = maps.Clone(*last)
	} else {
		next = map[string]int64{}
	}
	if n < 0 {
		delete(next, key)
	} else {
		next[key] = n
	}
	d.behindN.Store(&next)
}

// publishBy stores in p, per sequence whose value is not 0, its value,
// unless p holds the same already (a step publishes without allocating
// when nothing changed).
func publishBy(p *atomic.Pointer[map[string]int64], models map[string]*modelSeq, value func(*modelSeq) int64) {
	var last map[string]int64
	if l := p.Load(); l != nil {
		last = *l
	}
	n := 0
	same := true
	for key, m := range models {
		if v := value(m); v != 0 {
			n++
			same = same && last[key] == v
		}
	}
	if same && n == len(last) {
		return
	}
	now := make(map[string]int64, n)
	for key, m := range models {
		if v := value(m); v != 0 {
			now[key] = v
		}
	}
	p.Store(&now)
}

// wait returns once no apply is under way (a replay goes on until the
// worker holds the latest or a call fails).
func (d *updateDriver) wait() { d.calls.Wait() }
