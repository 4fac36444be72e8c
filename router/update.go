package router

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// Updater serves Embeddings.Update: it fans an upsert out to every live
// embedding worker of the model. Each worker's store is its own copy of
// the tables, so the router keeps the copies in step:
//
//   - One order per model. Updates of a model are numbered (seq 1, 2, 3
//     ...) and sent one at a time, so two updates of the same row land in
//     the same order on every worker. A worker's store records the last
//     seq it applied with the rows (one synced batch) and announces it.
//   - Nobody serves stale rows. An update is acknowledged once at least
//     one worker holds it; from then on the router sends lookups only to
//     workers that hold every acknowledged update.
//   - Catching up. The router keeps the latest updates of each model
//     (Options.UpdateLogBytes) and replays to a worker what it missed
//     (down, restarted, slow), after which it serves again. A worker
//     further behind than the log reaches (or any behind worker after the
//     router restarted: the log lives in the router's memory) is left out
//     of serving, and the router logs how to bring it back: give it a
//     copy of an up-to-date worker's store.
//   - A seq is handed out only while some live worker holds every
//     earlier one, and only to a request whose deadline has not passed,
//     so a number is never left without a worker to apply it; entries no
//     live worker holds are never trimmed from the log.
//   - A router that has just started takes no updates, and serves no
//     lookups of a model that has had updates, for Options.Heartbeat x 3:
//     every live worker has announced what it holds by then, so the
//     sequence continues from the true latest.
//
// One router sequences a model's updates; several routers taking updates
// for the same model would need a shared sequencer.
type Updater struct {
	prismv1.UnimplementedEmbeddingsServer
	r *Router
}

// Updater returns the Embeddings service of r.
func (r *Router) Updater() *Updater { return &Updater{r: r} }

// updates is the router's per-model update state.
type updates struct {
	r        *Router
	logBytes int64
	// ready is when the router has heard from every live worker (three
	// heartbeats after it started).
	ready time.Time
	now   func() time.Time
	// any is set once some model has had an update (seq > 0).
	any    atomic.Bool
	mu     sync.Mutex
	models map[string]*modelUpdates
}

type modelUpdates struct {
	// fanout makes a model's updates one at a time (a one-slot
	// semaphore, taken before mu, given up at the caller's deadline).
	fanout chan struct{}
	// handedOut: this router has numbered updates of the model.
	handedOut bool
	// Under updates.mu:
	next      int64 // the last seq handed out
	committed int64 // the last seq acknowledged to a client
	floor     int64 // log holds floor+1 .. next
	log       []*prismv1.ApplyUpdateRequest
	bytes     int64
	known     map[string]int64 // worker id -> last seq it holds
	catching  map[string]bool
	stale     map[string]bool // reported once
}

func newUpdates(r *Router, logBytes int64, heartbeat time.Duration) *updates {
	return &updates{r: r, logBytes: logBytes, now: time.Now, ready: time.Now().Add(3 * heartbeat), models: map[string]*modelUpdates{}}
}

// modelLocked is model's state, created on first use; u.mu held.
func (u *updates) modelLocked(model string) *modelUpdates {
	m := u.models[model]
	if m == nil {
		m = &modelUpdates{fanout: make(chan struct{}, 1), known: map[string]int64{}, catching: map[string]bool{}, stale: map[string]bool{}}
		u.models[model] = m
	}
	return m
}

// observeOne learns what one announcing worker holds (Announce calls it,
// under the registry's lock: the registry's lock comes before u.mu).
func (u *updates) observeOne(w *prismv1.WorkerInfo) {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.learnLocked(w)
}

func (u *updates) learnLocked(w *prismv1.WorkerInfo) {
	for model, seq := range w.GetUpdateSeq() {
		m := u.modelLocked(model)
		if seq > 0 {
			u.any.Store(true)
		}
		if seq > m.next {
			if m.handedOut {
				// This router numbered the model's updates, and a worker
				// holds a later one: another history (a store copied from
				// elsewhere, a second router). Its updates are newer than
				// any this router knows; continue after them.
				u.r.log.Error("embedding worker holds updates this router never sent; continuing the sequence after them (do two routers take updates for this model?)",
					"model", model, "worker", w.GetId(), "holds", seq, "router_latest", m.next)
			}
			m.next, m.committed, m.floor, m.log, m.bytes = seq, seq, seq, nil, 0
		}
		m.known[w.GetId()] = max(m.known[w.GetId()], seq)
	}
}

// observe learns what the live embedding workers hold from their
// announcements. A model seen for the first time (a router that just
// started) continues from the highest seq any worker holds.
func (u *updates) observe(ws []*prismv1.WorkerInfo) {
	u.mu.Lock()
	defer u.mu.Unlock()
	live := map[string]bool{}
	for _, w := range ws {
		if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
			continue
		}
		live[w.GetId()] = true
		u.learnLocked(w)
	}
	for _, m := range u.models {
		for id := range m.known {
			if !live[id] {
				delete(m.known, id)
				delete(m.stale, id)
			}
		}
	}
}

// inSync says whether w holds every acknowledged update of model: only
// then does it serve the model's lookups. Called under the registry's
// lock (the registry's lock is taken before u.mu, never after).
func (u *updates) inSync(w *prismv1.WorkerInfo, model string) bool {
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !u.any.Load() {
		return true // no model was ever updated: no lock on the lookup path
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	m := u.models[model]
	if m == nil {
		return true
	}
	if m.next > 0 && u.now().Before(u.ready) {
		// Just started: a worker holding later updates may not have
		// announced yet.
		return false
	}
	k, ok := m.known[w.GetId()]
	if !ok {
		k = w.GetUpdateSeq()[model]
	}
	return k >= m.committed
}

func (u *updates) ack(model, id string, seq int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if m := u.models[model]; m != nil {
		m.known[id] = max(m.known[id], seq)
	}
}

// appendLog keeps req as update seq, dropping the oldest beyond the
// byte budget, but never one that no live worker holds (held is the
// highest seq a live worker holds).
func (m *modelUpdates) appendLog(req *prismv1.ApplyUpdateRequest, budget, held int64) {
	m.log = append(m.log, req)
	m.bytes += int64(proto.Size(req))
	for len(m.log) > 1 && m.bytes > budget && m.floor+1 <= held {
		m.bytes -= int64(proto.Size(m.log[0]))
		m.log[0] = nil
		m.log = m.log[1:]
		m.floor++
	}
}

// Update applies req on every embedding worker serving req.Model.
func (u *Updater) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	r := u.r
	if req.GetModel() == "" || req.GetTable() == "" || len(req.GetIds()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "update needs a model, a table and ids")
	}
	if n := len(req.GetRows()); n%4 != 0 || n%len(req.GetIds()) != 0 || n == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: %d row bytes are not whole float32 rows for %d ids", n, len(req.GetIds()))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.DefaultTimeout)
		defer cancel()
	}
	ws, _ := r.Reg.List(ctx, nil)
	var targets []*prismv1.WorkerInfo
	for _, w := range ws.GetWorkers() {
		if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
			continue
		}
		for _, m := range w.GetModels() {
			if m == req.GetModel() {
				targets = append(targets, w)
				break
			}
		}
	}
	if len(targets) == 0 {
		if r.Reg.Known(req.GetModel()) {
			return nil, status.Errorf(codes.Unavailable, "model %q has no live embedding worker right now; retry", req.GetModel())
		}
		return nil, status.Errorf(codes.NotFound, "model %q is not served", req.GetModel())
	}
	// Wrapped for the workers, the update must still fit their message
	// limit; a seq whose update cannot be sent would hold up every later
	// one.
	if size := proto.Size(&prismv1.ApplyUpdateRequest{Update: req, Seq: math.MaxInt64}); size > maxUpdateBytes {
		return nil, status.Errorf(codes.InvalidArgument, "update of %d bytes: the limit is %d; split it", size, maxUpdateBytes)
	}
	up := r.upd
	if wait := up.ready.Sub(up.now()); wait > 0 {
		return nil, status.Errorf(codes.Unavailable, "router started moments ago and is still learning which updates the embedding workers hold; retry in %v", wait.Round(time.Millisecond))
	}
	up.observe(ws.GetWorkers())
	up.mu.Lock()
	m := up.modelLocked(req.GetModel())
	up.mu.Unlock()

	select {
	case m.fanout <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-m.fanout }()
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	// Number it only if some live worker holds every update before it:
	// otherwise it could not be applied anywhere now, and would hold up
	// the updates after it.
	up.mu.Lock()
	var held int64
	for _, w := range targets {
		held = max(held, m.known[w.GetId()])
	}
	if held < m.next {
		next := m.next
		up.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "no live embedding worker of model %q holds update %d yet (they are being caught up); retry", req.GetModel(), next)
	}
	m.next++
	m.handedOut = true
	up.any.Store(true)
	seq := m.next
	areq := &prismv1.ApplyUpdateRequest{Update: req, Seq: seq}
	m.appendLog(areq, up.logBytes, held)
	up.mu.Unlock()

	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, w := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := r.conn(w.GetAddr())
			if err != nil {
				errs[i] = err
				return
			}
			_, errs[i] = prismv1.NewEmbeddingTierClient(c).Update(ctx, areq)
		}()
	}
	wg.Wait()
	applied := 0
	var inputErr, failed error
	for i, err := range errs {
		w := targets[i]
		switch status.Code(err) {
		case codes.OK:
			applied++
			up.ack(req.GetModel(), w.GetId(), seq)
		case codes.InvalidArgument:
			// Bad input: every replica refuses it alike and takes the seq.
			if inputErr == nil {
				inputErr = err
			}
			up.ack(req.GetModel(), w.GetId(), seq)
		case codes.FailedPrecondition:
			// Behind: the catch-up replays what it missed, then this.
			r.log.Info("embedding worker behind on updates; catching it up", "model", req.GetModel(), "worker", w.GetId(), "seq", seq)
		default:
			if failed == nil {
				failed = fmt.Errorf("worker %s: %s", w.GetAddr(), status.Convert(err).Message())
			}
			r.log.Warn("update failed on an embedding worker; it is left out of serving until caught up", "model", req.GetModel(), "worker", w.GetId(), "seq", seq, "err", err)
		}
	}
	switch {
	case inputErr != nil && applied == 0:
		up.commit(req.GetModel(), seq)
		return nil, inputErr
	case applied == 0:
		if failed == nil {
			failed = fmt.Errorf("every worker is behind and catching up")
		}
		// The update keeps its number: a worker may have applied it and
		// lost the answer, so the number cannot be given to another. The
		// catch-up applies it everywhere later; a retry applies the same
		// rows again, which upserts make harmless.
		return nil, status.Errorf(codes.Unavailable, "update %d not acknowledged by any of %d embedding workers (%v); it may still be applied as they catch up; retrying is safe", seq, len(targets), failed)
	}
	up.commit(req.GetModel(), seq)
	return &prismv1.UpdateResponse{Workers: int32(applied)}, nil
}

// maxUpdateBytes is the largest ApplyUpdateRequest sent to a worker:
// under the 64 MiB the tiers accept by default.
const maxUpdateBytes = 64<<20 - 1<<10

func (u *updates) commit(model string, seq int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if m := u.models[model]; m != nil {
		m.committed = max(m.committed, seq)
	}
}

// catchUp starts a replay for every live embedding worker behind on a
// model's updates the log still holds, and reports (once) those it
// cannot reach. Run calls it every heartbeat.
func (u *updates) catchUp(ctx context.Context, ws []*prismv1.WorkerInfo) {
	u.observe(ws)
	addr := map[string]string{}
	for _, w := range ws {
		addr[w.GetId()] = w.GetAddr()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for model, m := range u.models {
		behind := 0
		for id, k := range m.known {
			if k >= m.next {
				continue
			}
			if k < m.committed {
				behind++
			}
			if k < m.floor {
				if !m.stale[id] {
					m.stale[id] = true
					u.r.log.Error("embedding worker misses updates the router no longer holds; it stays out of serving: stop it and give it a copy of an up-to-date worker's store",
						"model", model, "worker", id, "holds", k, "missing_from", k+1, "router_holds_from", m.floor+1, "latest", m.next)
				}
				continue
			}
			if m.catching[id] || addr[id] == "" {
				continue
			}
			m.catching[id] = true
			go u.replay(ctx, model, id, addr[id])
		}
		if u.r.m.behind != nil {
			u.r.m.behind.WithLabelValues(model).Set(float64(behind))
		}
	}
}

// replay sends worker id the updates of model it lacks, in order, until
// it holds the latest or a call fails (the next heartbeat tries again).
func (u *updates) replay(ctx context.Context, model, id, addr string) {
	defer func() {
		u.mu.Lock()
		if m := u.models[model]; m != nil {
			delete(m.catching, id)
		}
		u.mu.Unlock()
	}()
	for {
		u.mu.Lock()
		m := u.models[model]
		if m == nil {
			u.mu.Unlock()
			return
		}
		k, ok := m.known[id]
		if !ok || k >= m.next || k < m.floor {
			u.mu.Unlock()
			return
		}
		areq := m.log[k-m.floor]
		u.mu.Unlock()
		if ctx.Err() != nil {
			return // the router is stopping
		}
		c, err := u.r.conn(addr)
		if err != nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, u.r.opts.DefaultTimeout)
		_, err = prismv1.NewEmbeddingTierClient(c).Update(cctx, areq)
		cancel()
		switch status.Code(err) {
		case codes.OK, codes.InvalidArgument:
			u.ack(model, id, areq.GetSeq())
		default:
			u.r.log.Warn("replaying an update to an embedding worker failed; retrying at the next heartbeat", "model", model, "worker", id, "seq", areq.GetSeq(), "err", err)
			return
		}
	}
}
