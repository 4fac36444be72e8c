package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Several routers serve the same workers (issue 12), but a model's
// updates must keep one order, so one router sequences them
// (update.go) and the others follow (Options.Sequencer names the
// sequencing router):
//
//   - Embeddings.Update on a following router is forwarded to the
//     sequencer and its answer passed back. A follower never numbers or
//     applies an update itself: when the sequencer cannot be reached it
//     answers Unavailable, naming it, also when the sequencer stops
//     answering without a reset (silentPolls polls of it failed in a
//     row, the last begun after the forward). The sequencer's answer names,
//     per sequence, the update's number and the workers holding it
//     (UpdateResponse.held); the follower takes it before passing it on
//     (took): from then on it sends the model's lookups only to those
//     workers, or to ones announcing the number, as if its view
//     acknowledged it, until a poll begun after the answer brings the
//     sequencer's view of it, one not settling (read-your-writes through the router
//     forwarding; an answer without held, from a sequencer of an
//     earlier release, is judged from that poll alone, as before).
//     A forwarded update that reaches a
//     router which itself follows is refused (FailedPrecondition): two
//     routers naming each other would otherwise pass it around.
//   - Lookups on a follower go only to embedding workers that hold the
//     model's acknowledged updates and that the sequencer has not left
//     out. Each heartbeat the follower asks the sequencer
//     (Registry.List's updates, describe.go) for each model's last
//     acknowledged and last numbered update, the workers it leaves out
//     whatever they claim (foreign, diverged) and whether the model's
//     start-up window is open, and applies that to the announcements it
//     hears itself: a worker serves when it is not left out, holds the
//     acknowledged update, and (when the sequencer did not know it yet)
//     claims nothing beyond the last numbered one. A worker announcing
//     that its store records a model's copy diverged
//     (WorkerInfo.diverged) is left out of that model whatever the
//     view says, as the sequencer leaves it out. Between two answers
//     the follower also raises the bar from the announcements: an update
//     the sequencer acknowledged is held by its quorum of the model's
//     workers, so the quorum-th highest number the workers not left out
//     announce (claims beyond any sequence ignored) is the latest
//     acknowledged one or later. A sharded model has a sequence per
//     shard (sequencer_split.go), and the follower judges each on its
//     own, from the claims of that shard's workers. A worker holding
//     the whole of a model whose shards have had updates does not
//     serve, as on the sequencer. The follower learns of a new update
//     it did not forward at the workers' next heartbeat: until then it
//     may serve rows one update older than the sequencer would.
//   - Without an answer from the sequencer yet (or from the current one,
//     after the election moved, or while the elected one's start-up
//     window is open: it judges so itself then) the follower judges by
//     announcements alone: the quorum-th highest claim, a floor that never goes down
//     while a live worker still holds it, so workers that lost their
//     stores do not come back into serving when the up-to-date ones are
//     fewer than the quorum (under quorum one, a single worker's claim
//     sets it: the sequencer's answer is what corrects that).
//   - Once polls failed cutOffPolls times in a row (the sequencer cut
//     off; one timeout alone, a sequencer busy for a heartbeat, is not),
//     until one succeeds: the highest claim, whatever the quorum, and
//     the last view's list of workers in sync no longer counts. The
//     sequencer counts an update's quorum among the workers it reaches,
//     which a partition may make fewer than the ones this router hears
//     (a majority of them cut off from it: it acknowledges on the rest
//     alone), and a worker in sync at the last answer may have missed
//     every update acknowledged since.
//   - A follower that has just started serves no lookups of a model
//     with updates for three heartbeats, as the sequencer does: every
//     live worker has announced what it holds by then.
type follower struct {
	// sequencer is the sequencing router's address; conn dials it.
	sequencer string
	conn      func(addr string) (*grpc.ClientConn, error)
	quorum    Quorum
	now       func() time.Time
	started   time.Time
	heartbeat time.Duration

	// elected: the routers elect the sequencer (elect.go), whose new
	// holder judges lookups by this follower's rule in its start-up
	// window; the followers then judge a settling sequence so too
	// (settling). A named sequencer serves no updated model in its
	// window, and its followers none either.
	elected bool

	// any is set once some worker announced an update of some model:
	// until then lookups take no lock here.
	any atomic.Bool
	mu  sync.Mutex
	// workers is per live embedding worker the models it serves and the
	// numbers it holds; floor is per sequence (seqKey: a model's, or a
	// shard's) the acknowledged number judged so far, and shardKeys
	// per sharded model the keys of its shards' sequences judged.
	workers   map[string]followed
	floor     map[string]int64
	shardKeys map[string]map[string]bool
	// claims are per sequence judged the numbers its workers hold that
	// its floor counts (judge): kept as each worker announces, so an
	// announcement costs the look at its own (judgeWorker), not at every
	// worker's. A fleet's announcements were each a scan of every
	// worker, under the registry's lock: 137 µs each at 500 workers of 4
	// models, 70 ms of every 100 ms heartbeat.
	claims map[string]*claimSet
	// view is the sequencer's last answer per sequence (nil: none yet);
	// viewWorkers the embedding workers it knew then; viewFrom the
	// address it came from; failures the polls failed in a row,
	// whatever their address (no view for as long: cutOff), and
	// failedAt the address of the last, whose run alone is atFailures
	// (the election moved: the new holder's first failed poll is its
	// first, which alone does not make it silent).
	view        map[string]*prismv1.ModelUpdates
	viewWorkers map[string]bool
	viewFrom    string
	failures    int
	failedAt    string
	atFailures  int
	// viewSets are the view's InSync and LeftOut lists as sets, made at
	// their first use (lists): a pick asks of every worker of the model
	// whether the view names it, and at hundreds of workers a scan of
	// the list for each made a pick's cost grow with their square.
	viewSets map[*prismv1.ModelUpdates]viewSet
	// acked is per sequence the latest update this router forwarded
	// whose answer named the workers holding it (UpdateResponse.held),
	// newer than the view: a bar as the view's acknowledged number,
	// which those workers meet before they announce it. polls counts
	// the polls begun: a poll begun after an entry was taken answers
	// for it, and drops it, unless its view is settling (dropAcked).
	acked map[string]*forwardedAck
	polls uint64
	// silent is closed by a failed poll that makes silentPolls or more
	// failed in a row (the sequencer does not answer), and made anew;
	// silentPoll is that poll's number (polls when it began). The
	// forwards under way that began before it are abandoned
	// (forwardTo).
	silent     chan struct{}
	silentPoll uint64
}

// silentPolls is how many polls of the sequencer (one a heartbeat, each
// bounded by a heartbeat) must fail in a row before the updates
// forwarded to it are abandoned as not reached. A sequencer cut off
// without a reset (packets dropped: a partition, a lost node) fails no
// call: a forward waited for its whole deadline and ended
// DeadlineExceeded, which clients that retry on Unavailable do not
// retry, where one slow poll is no reason to give up an update.
const silentPolls = 2

// forwardedAck is an acknowledged update this router forwarded: seq in
// its sequence, the workers holding it, the sequencer that answered,
// and polls when the answer came.
type forwardedAck struct {
	seq     int64
	workers map[string]bool
	from    string
	polls   uint64
}

type followed struct {
	models []string
	held   map[string]int64
	// key is per sharded model the sequence of the worker's shard.
	key map[string]string
	// diverged are the models whose copy its store records diverged
	// (WorkerInfo.diverged): left out, as the sequencer leaves them.
	diverged map[string]bool
}

// viewSet is a view's InSync and LeftOut (ModelUpdates) as sets.
type viewSet struct{ inSync, leftOut map[string]bool }

// lists is u's viewSet (none for nil); f.mu is held.
func (f *follower) lists(u *prismv1.ModelUpdates) viewSet {
	if u == nil {
		return viewSet{}
	}
	if v, ok := f.viewSets[u]; ok {
		return v
	}
	set := func(ids []string) map[string]bool {
		out := make(map[string]bool, len(ids))
		for _, id := range ids {
			out[id] = true
		}
		return out
	}
	v := viewSet{inSync: set(u.GetInSync()), leftOut: set(u.GetLeftOut())}
	if f.viewSets == nil {
		f.viewSets = map[*prismv1.ModelUpdates]viewSet{}
	}
	f.viewSets[u] = v
	return v
}

// seqKey is the sequence numbering w's updates of model (keyOf).
func (w followed) seqKey(model string) string {
	if k, ok := w.key[model]; ok {
		return k
	}
	return model
}

func newFollower(sequencer string, conn func(string) (*grpc.ClientConn, error), q Quorum, now func() time.Time, heartbeat time.Duration) *follower {
	return &follower{
		sequencer: sequencer, conn: conn, quorum: q, now: now, started: now(), heartbeat: heartbeat,
		workers: map[string]followed{}, floor: map[string]int64{}, shardKeys: map[string]map[string]bool{}, claims: map[string]*claimSet{}, acked: map[string]*forwardedAck{},
		silent: make(chan struct{}),
	}
}

// errSequencerSilent is the cause of a forward abandoned because the
// sequencer's polls failed silentPolls times in a row.
var errSequencerSilent = errors.New("the update sequencer does not answer")

// forwardedKey marks an update one router forwards to another.
const forwardedKey = "prism-forwarded-by"

// forward sends an update to the sequencer and passes its answer back.
func (f *follower) forward(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	if forwarded(ctx) {
		return nil, status.Errorf(codes.FailedPrecondition, "this router does not sequence updates (it forwards them to %s) and was sent a forwarded one: two routers name each other with --sequencer", f.sequencer)
	}
	return f.forwardTo(ctx, f.sequencer, req)
}

// forwardTo sends an update to the sequencer at addr (the holder of
// the lease when routers elect theirs, elect.go) and passes its answer
// back.
func (f *follower) forwardTo(ctx context.Context, addr string, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	conn, err := f.conn(addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "update sequencer %s: %v; not applied (one router orders each model's updates)", addr, err)
	}
	// Abandoned, Unavailable, once the polls of the sequencer fail
	// silentPolls times in a row, the last begun after the forward: it
	// does not answer.
	f.mu.Lock()
	silent, sent := f.silent, f.polls
	f.mu.Unlock()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-silent:
			case <-stop:
				return
			}
			f.mu.Lock()
			after := f.silentPoll > sent
			silent = f.silent
			f.mu.Unlock()
			if after {
				cancel(errSequencerSilent)
				return
			}
		}
	}()
	var tr metadata.MD
	resp, err := prismv1.NewEmbeddingsClient(conn).Update(metadata.AppendToOutgoingContext(fctx, forwardedKey, "router"), req, grpc.Trailer(&tr))
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(fctx), errSequencerSilent) {
		return nil, status.Errorf(codes.Unavailable, "update sequencer %s does not answer (%d polls of it in a row failed); the update may or may not be applied; retry", addr, silentPolls)
	}
	if err != nil {
		st := status.Convert(err)
		switch st.Code() {
		case codes.Unavailable, codes.Unknown, codes.Internal:
			// Not reached, or it broke: say where the update went. A
			// refusal in the sequencer's start-up window keeps its
			// pushback.
			return nil, relayPushback(status.Errorf(codes.Unavailable, "update sequencer %s: %s; retry", addr, st.Message()), tr)
		}
		return nil, relayPushback(err, tr) // its own answer (bad input, deadline, quorum not reached, ...)
	}
	f.took(addr, req.GetModel(), resp)
	return resp, nil
}

// took records where the sequencer at addr says an update of model it
// acknowledged is held (resp.held), before the client hears of it: from
// then on this router sends the model's lookups only to workers
// holding it, as the sequencer does, not from its next poll. An answer
// without held (a sequencer of an earlier release) changes nothing.
func (f *follower) took(addr, model string, resp *prismv1.UpdateResponse) {
	if len(resp.GetHeld()) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, h := range resp.GetHeld() {
		m, shard := parseSeqKey(key)
		if m != model || h.GetSeq() <= 0 || h.GetSeq() > maxAnnouncedSeq {
			continue // not this update's
		}
		a := f.acked[key]
		switch {
		case a != nil && a.seq > h.GetSeq():
			continue // a later one's answer came first: its holders hold this one too
		case a == nil || a.seq < h.GetSeq():
			a = &forwardedAck{seq: h.GetSeq(), workers: map[string]bool{}}
			f.acked[key] = a
		}
		a.from, a.polls = addr, f.polls
		for _, id := range h.GetWorkers() {
			a.workers[id] = true
		}
		if shard >= 0 {
			if f.shardKeys[model] == nil {
				f.shardKeys[model] = map[string]bool{}
			}
			f.shardKeys[model][key] = true
		}
		f.any.Store(true)
	}
}

// forwarded says whether ctx is an update another router forwarded.
func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// announced is the registry's hook for every announcement.
func (f *follower) announced(w *prismv1.WorkerInfo) {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
		return
	}
	held := map[string]int64{}
	for m, s := range w.GetUpdateSeq() {
		if s > 0 {
			held[m] = s
			f.any.Store(true)
		}
	}
	diverged := markedDiverged(w)
	if len(diverged) > 0 {
		f.any.Store(true)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var key map[string]string
	for m := range w.GetShards() {
		if k := keyOf(w, m); k != m {
			if key == nil {
				key = map[string]string{}
			}
			key[m] = k
		}
	}
	prev, had := f.workers[w.GetId()]
	fw := followed{models: slices.Clone(w.GetModels()), held: held, key: key, diverged: diverged}
	f.workers[w.GetId()] = fw
	if had {
		// What it no longer serves, or a shard it left, loses its claim.
		for _, m := range prev.models {
			if k := prev.seqKey(m); !slices.Contains(fw.models, m) || k != fw.seqKey(m) {
				f.judgeWorker(k, w.GetId())
			}
		}
	}
	for _, m := range w.GetModels() {
		f.judgeWorker(fw.seqKey(m), w.GetId())
	}
}

// gone is the registry's hook for a worker that left or expired.
func (f *follower) gone(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return
	}
	delete(f.workers, id)
	for _, m := range w.models {
		f.judgeWorker(w.seqKey(m), id)
	}
}

// judge recomputes the floor of the sequence named key (a model's, or a
// shard's) from the live workers it numbers, its claims made anew;
// f.mu is held.
func (f *follower) judge(key string) {
	model := f.noteKey(key)
	u, settling := f.judgedView(key)
	leftOut := f.lists(u).leftOut
	c := f.claims[key]
	if c == nil {
		c = &claimSet{of: map[string]int64{}}
		f.claims[key] = c
	}
	clear(c.of)
	c.sorted = c.sorted[:0]
	for id, w := range f.workers {
		if h, ok := f.claim(id, w, key, model, u, leftOut); ok {
			c.of[id] = h
			c.sorted = append(c.sorted, h)
		}
	}
	slices.Sort(c.sorted)
	f.settle(key, settling)
}

// judgeWorker is judge of key after worker id's announcement (or
// departure) alone changed: its claim is taken out of the claims kept
// and its new one put in, and the floor recomputed from them. Every
// change of the view judges every sequence anew (rejudge), so the
// other workers' claims stand. f.mu is held.
func (f *follower) judgeWorker(key, id string) {
	c := f.claims[key]
	if c == nil {
		f.judge(key)
		return
	}
	model := f.noteKey(key)
	u, settling := f.judgedView(key)
	var h int64
	ok := false
	if w, live := f.workers[id]; live {
		h, ok = f.claim(id, w, key, model, u, f.lists(u).leftOut)
	}
	c.set(id, h, ok)
	f.settle(key, settling)
}

// noteKey records key among its model's shard sequences (a shard's)
// and returns its model; f.mu is held.
func (f *follower) noteKey(key string) string {
	model, shard := parseSeqKey(key)
	if shard >= 0 {
		if f.shardKeys[model] == nil {
			f.shardKeys[model] = map[string]bool{}
		}
		f.shardKeys[model][key] = true
	}
	return model
}

// judgedView is the sequencer's view of key that judge counts the
// claims by (nil: none), and whether its sequencer is settling; f.mu
// is held.
func (f *follower) judgedView(key string) (u *prismv1.ModelUpdates, settling bool) {
	if f.view != nil {
		u = f.view[key]
	}
	if f.settling(u) {
		// The sequencer is in its start-up window (a new holder of the
		// election learning what the workers hold): judged as without
		// its answer, from the claims and the floor so far (poll keeps
		// the acknowledged number of the view before in it), as the
		// sequencer itself judges lookups until its window ends.
		return nil, true
	}
	return u, false
}

// claim is the number worker id (w) holds of sequence key of model
// that judge counts; ok false: none (it serves another, its copy
// diverged, the view u leaves it out, or it claims past any sequence
// or past u's and is not judged yet). f.mu is held.
func (f *follower) claim(id string, w followed, key, model string, u *prismv1.ModelUpdates, leftOut map[string]bool) (h int64, ok bool) {
	if !slices.Contains(w.models, model) || w.seqKey(model) != key || w.diverged[model] || leftOut[id] {
		return 0, false
	}
	h = w.held[model]
	if h > maxAnnouncedSeq || (u != nil && !f.viewWorkers[id] && h > u.GetNumbered()) {
		return 0, false // past any sequence, or past this one and not judged yet
	}
	return h, true
}

// settle sets key's floor from its claims; f.mu is held.
func (f *follower) settle(key string, settling bool) {
	held := f.claims[key].sorted
	q := f.quorum
	if f.cutOff() {
		// The sequencer cannot be asked (cut off): it counts an
		// update's quorum among the workers it reaches, which may be
		// fewer than the ones announcing here (a partition between it
		// and some of them), so an update it acknowledged meanwhile may
		// be held by one of these alone: the highest claim is the bar.
		q = QuorumOne
	}
	if f.view != nil && !settling {
		// The sequencer's acknowledged number is the lower bound
		// (inSync): the claims only raise it between two answers.
		f.floor[key] = sortedFloor(0, held, q)
		return
	}
	f.floor[key] = sortedFloor(f.floor[key], held, q)
}

// claimSet is the claims judge counts of one sequence: the numbers,
// ascending, and each worker's among them.
type claimSet struct {
	sorted []int64
	of     map[string]int64
}

// set replaces id's claim by h (ok false: by none).
func (c *claimSet) set(id string, h int64, ok bool) {
	if old, had := c.of[id]; had {
		i, _ := slices.BinarySearch(c.sorted, old)
		c.sorted = slices.Delete(c.sorted, i, i+1)
		delete(c.of, id)
	}
	if ok {
		i, _ := slices.BinarySearch(c.sorted, h)
		c.sorted = slices.Insert(c.sorted, i, h)
		c.of[id] = h
	}
}

// poll asks the sequencer at addr for its view of the models' updates
// (one call, bounded by timeout). A failure keeps the last view if it
// came from addr, and drops it if it came from another router (the
// election moved).
func (f *follower) poll(ctx context.Context, addr string, timeout time.Duration) error {
	f.mu.Lock()
	f.polls++
	began := f.polls
	f.mu.Unlock()
	conn, err := f.conn(addr)
	var resp *prismv1.ListResponse
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err = prismv1.NewRegistryClient(conn).List(cctx, &prismv1.ListRequest{})
		cancel()
	}
	if err == nil && resp.GetNotSequencing() {
		// The router there does not sequence now (the holder's restarted
		// process, say, while the Lease still names the crashed one): its
		// empty view is not the sequencer's.
		err = fmt.Errorf("%s does not sequence embedding updates now", addr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.failures++
		if f.failedAt != addr {
			f.failedAt, f.atFailures = addr, 0
		}
		f.atFailures++
		if f.atFailures >= silentPolls {
			close(f.silent)
			f.silent, f.silentPoll = make(chan struct{}), began
		}
		moved := false
		if f.viewFrom != addr && f.view != nil {
			// The view came from another router (the election moved).
			// Its acknowledged numbers stay as the floor, which the
			// announcements never lower while a worker holds it: a
			// worker lacking an acknowledged update must not serve
			// because the new holder has not answered yet.
			for m, u := range f.view {
				f.floor[m] = max(f.floor[m], u.GetAcknowledged())
			}
			f.view, f.viewWorkers, f.viewFrom, f.viewSets = nil, nil, "", nil
			moved = true
		}
		// The updates another router answered: this one answers for
		// them now (kept while judged without a view: dropAcked). From
		// the cutOffPolls-th failure of a run, judged by the highest
		// claim (judge).
		if f.dropAcked(func(a *forwardedAck) bool { return a.from != addr }) || moved || f.failures == cutOffPolls {
			f.rejudge()
		}
		return err
	}
	f.failures, f.failedAt, f.atFailures = 0, "", 0
	for m, u := range resp.GetUpdates() {
		if old := f.view[m]; f.settling(u) && old != nil {
			// Settling: judged from the floor (judge), which keeps what
			// the last view acknowledged.
			f.floor[m] = max(f.floor[m], old.GetAcknowledged())
		}
	}
	f.view, f.viewSets = resp.GetUpdates(), nil
	if f.view == nil {
		f.view = map[string]*prismv1.ModelUpdates{}
	}
	if len(f.view) > 0 {
		f.any.Store(true)
	}
	f.viewWorkers = map[string]bool{}
	for _, w := range resp.GetWorkers() {
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			f.viewWorkers[w.GetId()] = true
		}
	}
	f.viewFrom = addr
	// An update answered before this poll began is in the view (or,
	// from a sequencer settling, in the floor), as one the view
	// acknowledges already is.
	f.dropAcked(func(a *forwardedAck) bool { return a.polls < began })
	f.rejudge()
	return nil
}

// dropAcked drops the forwarded updates that drop says no longer bar
// lookups (and those the view acknowledges). One of a sequence judged
// without the view (none, or its sequencer settling) is kept whatever
// drop says: its holders are the workers known to hold it, and moved
// into the floor instead it would not hold (the claims lower the floor
// to what the workers announced, and the holders may not have
// announced it yet), letting a worker lacking it serve right after the
// answer. It says whether it dropped any; f.mu is held.
func (f *follower) dropAcked(drop func(*forwardedAck) bool) bool {
	dropped := false
	for key, a := range f.acked {
		u := f.view[key]
		if u.GetAcknowledged() >= a.seq && !f.settling(u) {
			delete(f.acked, key)
			dropped = true
			continue
		}
		if !drop(a) || f.view == nil || f.settling(u) {
			continue
		}
		delete(f.acked, key)
		dropped = true
	}
	return dropped
}

// rejudge recomputes every model's floor; f.mu is held.
func (f *follower) rejudge() {
	models := map[string]bool{}
	for m := range f.floor {
		models[m] = true
	}
	for m := range f.view {
		models[m] = true
	}
	for m := range models {
		f.judge(m)
	}
}

// cutOffPolls is how many polls failed in a row take the sequencer for
// cut off (cutOff). One is not enough: the workers announce once a
// heartbeat, so while updates flow their claims differ by the updates
// since each last announced, and judged by the highest claim only the
// worker that announced last serves (TestFollowerOnePollFailure: 1 of
// 3 workers on average for the heartbeat after one failed poll, every
// worker holding every acknowledged update); a single poll timing out
// (a sequencer busy for a heartbeat) put the load on that one worker.
// The last view, one poll older, still judges meanwhile.
const cutOffPolls = 2

// cutOff says whether the sequencer is taken for cut off: its view
// aged, and an update it acknowledged since may be held by fewer
// workers than the quorum of the ones announcing here; f.mu is held.
func (f *follower) cutOff() bool { return f.failures >= cutOffPolls }

// noteFailure says whether a failed poll is worth a log line: the
// first of a run, then one a minute at the default heartbeat.
func (f *follower) noteFailure() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures == 1 || f.failures%60 == 0
}

// nextFloor is the pure rule: the quorum-th highest number the live
// workers hold, never below the floor so far while some worker still
// holds that; when none does, the quorum-th highest.
func nextFloor(floor int64, held []int64, q Quorum) int64 {
	sorted := slices.Clone(held)
	slices.Sort(sorted)
	return sortedFloor(floor, sorted, q)
}

// sortedFloor is nextFloor of held sorted ascending.
func sortedFloor(floor int64, held []int64, q Quorum) int64 {
	if len(held) == 0 {
		return floor
	}
	top := held[len(held)-1]
	kth := held[len(held)-max(q.need(len(held)), 1)]
	if top >= floor {
		return max(floor, kth)
	}
	return kth
}

// inSync is the registry's eligibility hook: may w serve model's
// lookups? It is called under the registry's lock.
func (f *follower) inSync(w *prismv1.WorkerInfo, model string) bool {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !f.any.Load() {
		return true
	}
	if markedDiverged(w)[model] {
		// Its store records that its copy diverged: left out whatever
		// the sequencer's view (a sequencer of an earlier release, or
		// none heard from yet) says.
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key := keyOf(w, model)
	if key == model {
		// The whole model: it lacks every update of its shards
		// (sequencer.inSync). A worker of another layout than its shard's
		// sequence is left out by the sequencer's view (LeftOut).
		for k := range f.shardKeys[model] {
			if f.floor[k] > 0 || f.view[k].GetNumbered() > 0 || f.view[k].GetAcknowledged() > 0 || f.acked[k] != nil {
				return false
			}
		}
	}
	floor := f.floor[key]
	held := w.GetUpdateSeq()[model]
	// An update forwarded here and acknowledged since the view (took):
	// its holders hold it, whatever they announced so far, and the
	// others lack it.
	a := f.acked[key]
	claimed := held
	if a != nil && a.workers[w.GetId()] {
		held = max(held, a.seq)
	}
	if f.view != nil {
		// A sequence whose elected sequencer is settling (a new holder
		// in its start-up window, learning what the workers hold) is
		// judged by the floor, as the holder judges it until its window
		// ends (elected.inSync), not left out whole (settling).
		if u := f.view[key]; u != nil && !f.settling(u) {
			lists := f.lists(u)
			switch {
			case u.GetSettling():
				return false // the sequencer is learning what the workers hold
			case lists.leftOut[w.GetId()]:
				return false // foreign or diverged, by the sequencer's judgment
			case !f.viewWorkers[w.GetId()] && claimed > max(u.GetNumbered(), a.numbered()):
				return false // claims more than was numbered; not judged yet
			case !f.cutOff() && lists.inSync[w.GetId()] && a.numbered() <= u.GetAcknowledged():
				// The sequencer sends it lookups: this router's copy of its
				// announcement may lag the sequencer's acknowledgement.
				// Only while the view is recent: once polls failed
				// (cutOff: the sequencer cut off), the sequencer may have
				// acknowledged later updates without this worker, and the
				// announcements judge it (the floor), not a list that
				// ages for as long as the partition lasts.
				return claimed <= maxAnnouncedSeq
			}
			floor = max(floor, u.GetAcknowledged())
		}
	}
	floor = max(floor, a.numbered())
	if floor == 0 {
		return true
	}
	if f.now().Sub(f.started) < 3*f.heartbeat {
		return false // the workers are still announcing what they hold
	}
	return held >= floor && claimed <= maxAnnouncedSeq
}

// numbered is the forwarded update's number (0: none).
func (a *forwardedAck) numbered() int64 {
	if a == nil {
		return 0
	}
	return a.seq
}

// settling says whether the sequence of view u is judged as without
// the sequencer's answer: its elected sequencer is in its start-up
// window (elected).
func (f *follower) settling(u *prismv1.ModelUpdates) bool {
	return f.elected && u.GetSettling()
}

// markedDiverged are the models w serves whose copy its store records
// diverged (WorkerInfo.diverged; taken as sequencer.markedDiverged
// takes them).
func markedDiverged(w *prismv1.WorkerInfo) map[string]bool {
	var out map[string]bool
	for m, seq := range w.GetDiverged() {
		if seq > 0 && seq <= maxAnnouncedSeq && slices.Contains(w.GetModels(), m) {
			if out == nil {
				out = map[string]bool{}
			}
			out[m] = true
		}
	}
	return out
}

// String describes the follower for logs.
func (f *follower) String() string {
	return fmt.Sprintf("following update sequencer %s", f.sequencer)
}
