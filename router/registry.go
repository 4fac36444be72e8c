// Package router is Prism's front door: it accepts Recommend, cuts each
// request into micro-batches, pipelines them across the embedding and
// dense tiers, and keeps the registry of their workers.
package router

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/lograte"
)

// RegistryLimits bound what workers may register: the registry takes
// nothing a worker says about itself on trust.
type RegistryLimits struct {
	// MaxWorkers bounds the workers registered at once (default 4096):
	// a new id beyond it is ResourceExhausted.
	MaxWorkers int
	// MaxModels bounds the models (and update_seq entries) of one worker
	// (default 256).
	MaxModels int
	// MaxNameBytes bounds a worker's id, address, device and model names
	// (default 256).
	MaxNameBytes int
	// MaxOutstanding is the most outstanding samples a worker's
	// announcement counts for (default 1<<20): what it reports is
	// clamped to [0, MaxOutstanding], so a negative figure cannot win
	// every pick.
	MaxOutstanding int64
}

// EnsureDefaults fills zero fields.
func (l *RegistryLimits) EnsureDefaults() {
	if l.MaxWorkers <= 0 {
		l.MaxWorkers = 4096
	}
	if l.MaxModels <= 0 {
		l.MaxModels = 256
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = 256
	}
	if l.MaxOutstanding <= 0 {
		l.MaxOutstanding = 1 << 20
	}
}

// PeerFunc names the caller of an RPC from its transport credentials
// (the mTLS certificate): its role ("embedding", "dense", ...) and its
// name. ok false: no identity to bind (plaintext).
type PeerFunc func(ctx context.Context) (role, name string, ok bool)

// Registry is the set of live workers. Its core is deterministic: time
// comes from the clock it is given, and expiry happens in Expire.
type Registry struct {
	prismv1.UnimplementedRegistryServer
	// Limits and Peer are set before the registry serves.
	Limits RegistryLimits
	// Peer, when set, binds a worker id to the identity that first
	// announced it: a later Announce or Leave of the id from another
	// name is PermissionDenied, also once the worker has been dropped
	// (retired), and a worker's role must be its peer's.
	Peer PeerFunc
	// Instance, when set, says whether the caller's certificate names
	// one worker (auth.PeerInstance): a new id announced under such a
	// certificate replaces the live ids it announced before, so one
	// certificate counts as one worker (towards an update's quorum, in
	// picks), where a role's shared certificate speaks for many.
	Instance func(ctx context.Context) bool
	// Log, when set, hears what the registry does on its own (an id
	// replaced by another of its certificate at another address; a
	// warning when the two replace each other).
	Log *slog.Logger

	mu        sync.Mutex
	now       func() time.Time
	heartbeat time.Duration
	workers   map[string]*worker
	// retired keeps the identity a dropped worker's id was bound to
	// (expired, left, its pod gone): a worker back from a pause gets its
	// id back, while another certificate, which may have read the id
	// from List, cannot take it over in the meantime and so lock the
	// worker out of the registry (a worker keeps its id for its
	// process's life). retiredBy lists each identity's, oldest first, at
	// most maxRetiredPerPeer: ids dropped in bulk under one certificate
	// push out only that certificate's own.
	retired   map[string]string
	retiredBy map[string][]string
	// displaced is, per worker's own certificate, the id last dropped
	// because another id of it announced at another address: a worker
	// restarted there, unless that id announces again (two processes
	// holding the certificate, replacing each other at every heartbeat).
	displaced map[string]string
	// floods holds the warning of displaced back to once per
	// certificate and window: the two processes replace each other at
	// every heartbeat for as long as both run (made from Log at its
	// first use).
	floods *lograte.Limiter
	// byModel indexes the workers by (role, model): a pick looks at the
	// workers of its model only.
	byModel map[roleModel]*workerSet
	// contents counts the healthy workers of each (role, model) by the
	// content they announce for it ("" unknown): a pick filters by
	// content only while the counts say some worker would be filtered
	// out.
	contents map[roleModel]map[string]int
	// numbers counts the healthy embedding workers of each model by the
	// content they announce and the number their store gives it
	// (ContentVersion, VersionContent); content "" left out.
	numbers map[string]map[answer]int
	// denseAddrs are the registered dense workers' addresses, sorted: the
	// embedding workers are told them (the only dense_addr they accept).
	// denseVersion names the list (AnnounceResponse.dense_version): this
	// process's random number and the list's changes; a new one,
	// replaced and never changed in place, whenever the list changes. An
	// answer to a worker holding it leaves the list out.
	denseAddrs   []string
	denseVersion *prismv1.ListVersion
	// known holds every model any worker announced and not retired: a
	// known model without live workers is Unavailable (retry), an
	// unknown one NotFound.
	known map[string]bool
	// lastAt is, per role and address, what the latest worker announced
	// there listed, kept after it goes, and whether it left (Leave: a
	// stop, as a rollout stops it) rather than died; retiredPairs is the
	// (role, model) pairs whose last worker was retired: a worker at an
	// address announced without a model the one before it there served,
	// and either served another model of that one or followed it after
	// it left (a worker restarted with the model removed from its
	// plans, as a rollout that drops or replaces a model does;
	// restartedThere). A model none serves whose pairs are retired is
	// forgotten: NotFound, and out of prism_router_model_workers, whose
	// 0 paged until the routers restarted. A worker that died or left
	// retires nothing by itself: its model stays known, Unavailable, at
	// 0. lastID is, per worker id, the address whose latest worker it is
	// (lastAt's ids, inverted): the Leave of a worker already dropped
	// (its Pod gone, PodGone, or expired) still marks its stop there.
	lastAt map[roleAddr]addrRecord
	lastID map[string]roleAddr
	// leaving is the worker Leave drops (drop: a stop, not a death).
	leaving      string
	retiredPairs map[roleModel]bool
	// gen counts announcements (joined, told).
	gen uint64
	// unreachable counts the workers marked so (worker.unreachable):
	// Reached reads it without mu, and does nothing while none is.
	unreachable atomic.Int64
	// changed is closed and replaced whenever the set of workers changes.
	changed chan struct{}
	// eligible, when set, says whether a worker may serve a model now
	// (an embedding worker lacking acknowledged updates may not). It is
	// called under mu.
	eligible func(w *prismv1.WorkerInfo, model string) bool
	// observe, when set, sees every announcement (under mu).
	observe func(w *prismv1.WorkerInfo)
	// gone, when set, hears of every worker removed: left, expired or
	// found dead (under mu).
	gone func(id string)
	// podsGone are the Pods Kubernetes says are gone (podgone.go).
	podsGone map[string]PodName
	// describe, when set, fills List's updates (describe.go); called
	// without mu.
	describe func() (map[string]*prismv1.ModelUpdates, bool)
	// sequencer, when set, is the address of the router that sequences
	// updates when it is another (ListResponse.sequencer); called
	// without mu.
	sequencer func() string
	// readLog, when set, serves UpdateLog (replica.go).
	readLog func(*prismv1.UpdateLogRequest) (*prismv1.UpdateLogResponse, error)
	// epoch, when set, is the election epoch of this router's hold while
	// it sequences updates as the holder (0 otherwise): embedding workers
	// are told it in every answer (AnnounceResponse.epoch), so they refuse
	// the updates of earlier holders from the new holder's first
	// heartbeat on (elect.go). Called under mu, which the change of holder
	// holds too: an answer after the change carries the new epoch.
	epoch func() uint64
	// outOf, when set, is what the router sequencing updates found of an
	// embedding worker's models: per model, the update at which its copy
	// diverged from its peers' (sequencer.divergedOf), and the models
	// whose updates it lacks and the router's log no longer holds
	// (sequencer.strandedOf). Every answer to the worker tells it
	// (AnnounceResponse.diverged, .stranded): its store records each
	// mark and it announces it to every router from then on, and a
	// worker that mends itself (prism serve embedding --mend) knows to.
	// Called under mu, after observe has taken the announcement.
	outOf func(w *prismv1.WorkerInfo) (diverged map[string]int64, stranded []string)
}

type roleModel struct {
	role  prismv1.Role
	model string
}

type roleAddr struct {
	role prismv1.Role
	addr string
}

// addrRecord is what the latest worker at an address announced, and
// whether it left (Registry.lastAt): its id and the identity it is
// bound to ("" none) say whose Leave marks it.
type addrRecord struct {
	models   []string
	left     bool
	id, peer string
}

// maxAddrs bounds the addresses whose last models are kept (lastAt).
const maxAddrs = 1 << 16

// workerSet is the workers of one (role, model): a slice to scan, and
// each one's place in it for removal.
type workerSet struct {
	ws  []*worker
	pos map[string]int
}

func (s *workerSet) add(e *worker) {
	if _, ok := s.pos[e.info.GetId()]; ok {
		return
	}
	s.pos[e.info.GetId()] = len(s.ws)
	s.ws = append(s.ws, e)
}

func (s *workerSet) remove(id string) {
	i, ok := s.pos[id]
	if !ok {
		return
	}
	last := len(s.ws) - 1
	s.ws[i] = s.ws[last]
	s.pos[s.ws[i].info.GetId()] = i
	s.ws[last] = nil
	s.ws = s.ws[:last]
	delete(s.pos, id)
}

type worker struct {
	info     *prismv1.WorkerInfo
	lastSeen time.Time
	// inflight is what this router has sent the worker and not heard back.
	inflight int64
	// peer is the identity the id is bound to ("" if none).
	peer string
	// joined is the announcement (r.gen) that registered the worker at
	// its address; told, for an embedding worker, the one whose answer
	// it has applied: a dense worker that joined before it is one the
	// embedding worker accepts. offered is its last announcement, whose
	// answer is on its way to it: the worker applies an answer before
	// it announces again (internal/serve), so its next announcement
	// makes offered told. Taken as told at once, a dense worker that
	// joined just before was picked for lookups of a worker still
	// refusing it (PermissionDenied), and a request could fail both its
	// attempts while borrowed dense workers joined.
	joined, told, offered uint64
	// unreachable: a call of this router to the worker failed at the
	// transport (refused, reset, lost: it did not answer) since its last
	// announcement or answer. Picks leave it out while a worker they
	// would take instead is not so (Unreachable).
	unreachable bool
}

// maxKnownModels bounds the models remembered as once served.
const maxKnownModels = 1 << 16

// NewRegistry makes an empty registry; workers are expected every
// heartbeat and removed after three missed ones.
func NewRegistry(heartbeat time.Duration, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{now: now, heartbeat: heartbeat, workers: map[string]*worker{}, byModel: map[roleModel]*workerSet{},
		contents: map[roleModel]map[string]int{}, numbers: map[string]map[answer]int{}, known: map[string]bool{}, changed: make(chan struct{}),
		denseVersion: &prismv1.ListVersion{Process: listProcess(), Gen: 1}}
}

// listProcess is a random non-zero number naming this registry's lists
// (ListVersion.process): drawn per registry, so a router restarted at
// the same address, or another router a worker announces to, never
// names another list by a version a worker holds.
func listProcess() uint64 {
	for {
		if p := rand.Uint64(); p != 0 {
			return p
		}
	}
}

func (r *Registry) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// maxShardInputs bounds the inputs a shard says it reads, and the
// tables and row splits it names.
const maxShardInputs = 1 << 12

// check refuses an announcement the registry cannot take as given.
func (r *Registry) check(w *prismv1.WorkerInfo, l RegistryLimits) error {
	if w.GetId() == "" || w.GetAddr() == "" || (w.GetRole() != prismv1.Role_ROLE_EMBEDDING && w.GetRole() != prismv1.Role_ROLE_DENSE) {
		return status.Errorf(codes.InvalidArgument, "announce: a worker needs an id, an address and the role embedding or dense (got id %.64q addr %.64q role %s)", w.GetId(), w.GetAddr(), w.GetRole())
	}
	for what, v := range map[string]string{"id": w.GetId(), "addr": w.GetAddr(), "device": w.GetDevice()} {
		if len(v) > l.MaxNameBytes {
			return status.Errorf(codes.InvalidArgument, "announce: worker %s of %d bytes, the limit is %d", what, len(v), l.MaxNameBytes)
		}
	}
	if n := max(len(w.GetModels()), len(w.GetUpdateSeq()), len(w.GetShards()), len(w.GetSharding()), len(w.GetDiverged()), len(w.GetContent()), len(w.GetVersion())); n > l.MaxModels {
		return status.Errorf(codes.ResourceExhausted, "announce: worker %.64q names %d models, the limit is %d", w.GetId(), n, l.MaxModels)
	}
	for _, m := range w.GetModels() {
		if m == "" || len(m) > l.MaxNameBytes {
			return status.Errorf(codes.InvalidArgument, "announce: model name of %d bytes, want 1 to %d", len(m), l.MaxNameBytes)
		}
		if _, shard := parseSeqKey(m); shard >= 0 {
			// It would name a shard's update sequence (seqKey).
			return status.Errorf(codes.InvalidArgument, "announce: model name %.64q: a name ending in %q and a number is reserved for a shard's update sequence; rename the model", m, prismv1.ShardSeqSep)
		}
	}
	for m := range w.GetUpdateSeq() {
		if len(m) > l.MaxNameBytes {
			return status.Errorf(codes.InvalidArgument, "announce: update_seq model name of %d bytes, the limit is %d", len(m), l.MaxNameBytes)
		}
	}
	for m, fp := range w.GetSharding() {
		if len(m) > l.MaxNameBytes || !prismv1.ValidSharding(fp) {
			return status.Errorf(codes.InvalidArgument, "announce: sharding of model %.64q: %.40q, want a model name of at most %d bytes and 1 to 32 lower-case hex digits", m, fp, l.MaxNameBytes)
		}
	}
	for m, c := range w.GetContent() {
		if len(m) > l.MaxNameBytes || !prismv1.ValidSharding(c) {
			return status.Errorf(codes.InvalidArgument, "announce: content of model %.64q: %.40q, want a model name of at most %d bytes and 1 to 32 lower-case hex digits", m, c, l.MaxNameBytes)
		}
	}
	for m := range w.GetVersion() {
		if len(m) > l.MaxNameBytes {
			return status.Errorf(codes.InvalidArgument, "announce: version model name of %d bytes, the limit is %d", len(m), l.MaxNameBytes)
		}
	}
	for m, ref := range w.GetShards() {
		if len(m) > l.MaxNameBytes {
			return status.Errorf(codes.InvalidArgument, "announce: shards model name of %d bytes, the limit is %d", len(m), l.MaxNameBytes)
		}
		if n, k := ref.GetShards(), ref.GetShard(); n < 1 || n > maxShards || k < 0 || k >= n {
			return status.Errorf(codes.InvalidArgument, "announce: model %.64q: shard %d of %d", m, k, n)
		}
		if len(ref.GetInputs()) > maxShardInputs {
			return status.Errorf(codes.InvalidArgument, "announce: model %.64q: shard %d reads %d inputs, the limit is %d", m, ref.GetShard(), len(ref.GetInputs()), maxShardInputs)
		}
		for _, in := range ref.GetInputs() {
			if in == "" || len(in) > l.MaxNameBytes {
				return status.Errorf(codes.InvalidArgument, "announce: model %.64q: shard input name of %d bytes, want 1 to %d", m, len(in), l.MaxNameBytes)
			}
		}
		if fp := ref.GetSharding(); fp != "" && !prismv1.ValidSharding(fp) {
			return status.Errorf(codes.InvalidArgument, "announce: model %.64q: sharding fingerprint %.40q: want 1 to 32 lower-case hex digits", m, fp)
		}
		if n := max(len(ref.GetTables()), len(ref.GetRowSplits())); n > maxShardInputs {
			return status.Errorf(codes.InvalidArgument, "announce: model %.64q: shard %d names %d tables, the limit is %d", m, ref.GetShard(), n, maxShardInputs)
		}
		for _, t := range ref.GetTables() {
			if t == "" || len(t) > l.MaxNameBytes {
				return status.Errorf(codes.InvalidArgument, "announce: model %.64q: shard table name of %d bytes, want 1 to %d", m, len(t), l.MaxNameBytes)
			}
		}
		for _, rs := range ref.GetRowSplits() {
			if t := rs.GetTable(); t == "" || len(t) > l.MaxNameBytes {
				return status.Errorf(codes.InvalidArgument, "announce: model %.64q: row split table name of %d bytes, want 1 to %d", m, len(t), l.MaxNameBytes)
			}
			if !validSplit(rs, ref.GetShards()) || len(rs.GetShards()) > maxShards {
				return status.Errorf(codes.InvalidArgument, "announce: model %.64q: row split of table %.64q: %d rows over shards %v, want rows and shards below %d", m, rs.GetTable(), rs.GetRows(), rs.GetShards(), ref.GetShards())
			}
		}
	}
	return nil
}

// Announce registers or refreshes a worker. It answers an embedding
// worker with the dense workers it may send cut tensors to: their list
// when it changed since the version the worker holds
// (AnnounceRequest.dense_held), else dense_unchanged.
func (r *Registry) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	w := req.GetWorker()
	l := r.Limits
	l.EnsureDefaults()
	if err := r.check(w, l); err != nil {
		return nil, err
	}
	var peer string
	one := false // peer names one worker
	if r.Peer != nil {
		role, name, ok := r.Peer(ctx)
		if ok {
			if role != w.GetRole().Name() {
				return nil, status.Errorf(codes.PermissionDenied, "announce: %q holds the role %q and cannot announce a worker of role %s", name, role, w.GetRole().Name())
			}
			peer = name
			one = r.Instance != nil && r.Instance(ctx)
		}
	}
	// The worker's own figure counts within bounds only.
	w.Outstanding = min(max(w.GetOutstanding(), 0), l.MaxOutstanding)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.podGone(w.GetAddr()); err != nil {
		return nil, err
	}
	e, ok := r.workers[w.GetId()]
	retired, wasRetired := r.retired[w.GetId()]
	switch {
	case ok && e.peer != "" && peer != e.peer:
		return nil, status.Errorf(codes.PermissionDenied, "announce: worker id %.64q belongs to %q, not %q", w.GetId(), e.peer, peer)
	case !ok && wasRetired && peer != retired:
		return nil, status.Errorf(codes.PermissionDenied, "announce: worker id %.64q belongs to %q, not %q", w.GetId(), retired, peer)
	}
	if !ok {
		r.replaced(w, peer, one)
		if len(r.workers) >= l.MaxWorkers {
			return nil, status.Errorf(codes.ResourceExhausted, "announce: %d workers registered, the limit is %d", len(r.workers), l.MaxWorkers)
		}
	}
	changed := !ok
	if !ok {
		e = &worker{peer: peer}
		r.workers[w.GetId()] = e
	} else {
		changed = e.info.GetRole() != w.GetRole() || e.info.GetAddr() != w.GetAddr() || !slices.Equal(e.info.GetModels(), w.GetModels()) ||
			!maps.Equal(e.info.GetContent(), w.GetContent())
		if changed {
			r.unindex(e)
		}
	}
	if e.peer == "" {
		e.peer = peer
	}
	old := e.info
	if !changed && (old.GetHealthy() != w.GetHealthy() || !maps.Equal(old.GetVersion(), w.GetVersion())) {
		r.count(old, -1)
		r.count(w, 1)
	}
	e.info, e.lastSeen = w, r.now()
	// An announcement after a failure proves the worker alive: picks
	// take it again.
	r.setUnreachable(e, false)
	r.gen++
	if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
		// 1 before any answer is applied: every dense worker joined at
		// 1 or later, so none is told yet (0 would take all as told).
		e.told, e.offered = max(e.offered, 1), r.gen
	}
	if changed {
		e.joined = r.gen
		r.index(e)
		if w.GetRole() == prismv1.Role_ROLE_DENSE || old.GetRole() == prismv1.Role_ROLE_DENSE {
			r.listDense()
		}
	}
	if r.observe != nil {
		r.observe(w)
	}
	for _, m := range w.GetModels() {
		if len(r.known) < maxKnownModels {
			r.known[m] = true
		}
		delete(r.retiredPairs, roleModel{w.GetRole(), m})
	}
	r.retireDropped(roleAddr{w.GetRole(), w.GetAddr()}, w.GetId(), e.peer, w.GetModels())
	if !ok {
		r.notify()
	}
	resp := &prismv1.AnnounceResponse{HeartbeatMs: r.heartbeat.Milliseconds()}
	if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
		// The list only to a worker not holding it: a worker of an
		// earlier release, which sends no version, gets it every time.
		// Both are replaced, never changed in place.
		resp.DenseVersion = r.denseVersion
		if prismv1.SameList(req.GetDenseHeld(), r.denseVersion) {
			resp.DenseUnchanged = true
		} else {
			resp.DenseAddrs = r.denseAddrs
		}
		if r.epoch != nil {
			resp.Epoch = r.epoch()
		}
		if r.outOf != nil {
			resp.Diverged, resp.Stranded = r.outOf(w)
		}
	}
	return resp, nil
}

// retireDropped records models as what the worker id (bound to peer)
// at ra announces, and retires each model the worker before it there
// listed and it does not, when it is that worker restarted
// (restartedThere); r.mu held.
func (r *Registry) retireDropped(ra roleAddr, id, peer string, models []string) {
	if r.lastAt == nil {
		r.lastAt, r.lastID = map[roleAddr]addrRecord{}, map[string]roleAddr{}
	}
	prev, had := r.lastAt[ra]
	if had && !prev.left && prev.id == id && slices.Equal(prev.models, models) {
		return // every heartbeat
	}
	if !had && len(r.lastAt) >= maxAddrs {
		for k, rec := range r.lastAt { // any one: an address gone long since, most likely
			r.forgetAddr(k, rec)
			break
		}
	}
	if had {
		r.forgetAddr(ra, prev)
	}
	r.lastAt[ra] = addrRecord{models: models, id: id, peer: peer}
	r.lastID[id] = ra
	if !had || !restartedThere(prev.models, models, prev.left) {
		return
	}
	for _, m := range prev.models {
		if !slices.Contains(models, m) {
			r.retire(roleModel{ra.role, m}, ra.addr)
		}
	}
}

// forgetAddr removes ra's record rec from lastAt, and its id's entry
// in lastID while that names ra; r.mu held.
func (r *Registry) forgetAddr(ra roleAddr, rec addrRecord) {
	delete(r.lastAt, ra)
	if r.lastID[rec.id] == ra {
		delete(r.lastID, rec.id)
	}
}

// restartedThere says whether a worker serving later, announced at an
// address after one serving earlier there (which left, when left), is
// that worker restarted in place with its plans changed: when the two
// serve a model in common, or the earlier one left (a stop, as a
// rollout's). An address is reused by other workers too (a pod IP the
// network hands another pod, a port the host hands another process),
// and one of other models after a worker that died says nothing of its
// models: that one is down, not retired, and must go on paging.
func restartedThere(earlier, later []string, left bool) bool {
	if left {
		return true
	}
	for _, m := range earlier {
		if slices.Contains(later, m) {
			return true
		}
	}
	return false
}

// retire takes k as retired when no live worker serves it (a worker of
// it elsewhere keeps it), and forgets its model when no worker of
// either role serves it; r.mu held. A dropped worker whose address has
// since announced without the model retires it too (drop).
func (r *Registry) retire(k roleModel, addr string) {
	if r.byModel[k] != nil || !r.known[k.model] {
		return
	}
	if r.retiredPairs == nil {
		r.retiredPairs = map[roleModel]bool{}
	}
	r.retiredPairs[k] = true
	other := roleModel{prismv1.Role_ROLE_DENSE, k.model}
	if k.role == prismv1.Role_ROLE_DENSE {
		other.role = prismv1.Role_ROLE_EMBEDDING
	}
	if r.byModel[other] != nil {
		if r.Log != nil {
			r.Log.Info("model retired from a tier: its last worker there announced without it", "model", k.model, "role", k.role.Name(), "addr", addr)
		}
		return
	}
	delete(r.known, k.model)
	delete(r.retiredPairs, k)
	delete(r.retiredPairs, other)
	if r.Log != nil {
		r.Log.Info("model retired: no worker serves it, and its last one announced without it; its requests are NotFound", "model", k.model, "role", k.role.Name(), "addr", addr)
	}
}

// replaced drops the embedding workers that w, an embedding worker
// announced under an id new to the registry, replaces: those at its
// address bound to the same identity. A worker process restarted in
// place announces under a new id (serve.WorkerID) before its old entry
// expires, and one address reaches one process: left in, the old entry
// would count again towards an update's quorum (its calls reach the new
// process) and serve lookups by what the old process held (a store
// restored from an older copy holds less). With one (peer is a
// certificate naming one worker), every worker bound to peer, of either
// role and at any address: the certificate's worker restarted (on
// another address too), and a stolen one cannot register many ids to
// count as most of a quorum. r.mu held.
func (r *Registry) replaced(w *prismv1.WorkerInfo, peer string, one bool) {
	var old []string
	for id, e := range r.workers {
		if one && e.peer == peer ||
			e.info.GetAddr() == w.GetAddr() && e.info.GetRole() == prismv1.Role_ROLE_EMBEDDING && w.GetRole() == prismv1.Role_ROLE_EMBEDDING && e.peer == peer {
			old = append(old, id)
			if one && e.info.GetAddr() != w.GetAddr() {
				r.displace(peer, id, e.info.GetAddr(), w)
			}
		}
	}
	sort.Strings(old)
	for _, id := range old {
		r.drop(id)
	}
}

// displace logs id, at addr, dropped for w, a new id of the same
// worker's own certificate peer at another address: a worker restarted
// there (a rolling upgrade restarts every worker so) is said at Info;
// an id dropped so that announces again (displaced) is a second process
// holding the certificate, and the two replace each other at every
// heartbeat: said at Warn, once per window of lograte.DefaultWindow
// while they do. r.mu held.
func (r *Registry) displace(peer, id, addr string, w *prismv1.WorkerInfo) {
	if r.displaced == nil {
		r.displaced = map[string]string{}
	}
	back := r.displaced[peer] == w.GetId()
	r.displaced[peer] = id
	if r.Log == nil {
		return
	}
	if back {
		if r.floods == nil {
			r.floods = lograte.New(r.Log, lograte.DefaultWindow)
		}
		r.floods.Warn(peer, "a worker's own certificate announced a new id at another address again, under an id it replaced before: two processes hold one worker's certificate and replace each other at every heartbeat (give each its own)",
			"old_id", id, "old_addr", addr, "id", w.GetId(), "addr", w.GetAddr())
		return
	}
	r.Log.Info("a worker's own certificate announced a new id at another address: the old id is dropped (the worker restarted there)",
		"old_id", id, "old_addr", addr, "id", w.GetId(), "addr", w.GetAddr())
}

// index and unindex add e to and remove it from byModel; r.mu held.
func (r *Registry) index(e *worker) {
	for _, m := range e.info.GetModels() {
		k := roleModel{e.info.GetRole(), m}
		set := r.byModel[k]
		if set == nil {
			set = &workerSet{pos: map[string]int{}}
			r.byModel[k] = set
		}
		set.add(e)
	}
	r.count(e.info, 1)
}

// count adds d to the contents counts of info's models, when info is
// healthy: an unhealthy worker (a dense worker draining before it
// stops, say) takes no picks, so it pairs no embedding worker of its
// content. Announce recounts a worker whose health changed. r.mu held.
func (r *Registry) count(info *prismv1.WorkerInfo, d int) {
	if !info.GetHealthy() {
		return
	}
	for _, m := range info.GetModels() {
		k := roleModel{info.GetRole(), m}
		c := r.contents[k]
		if c == nil {
			c = map[string]int{}
			r.contents[k] = c
		}
		cm := info.GetContent()[m]
		if c[cm] += d; c[cm] <= 0 {
			delete(c, cm)
		}
		if len(c) == 0 {
			delete(r.contents, k)
		}
		if info.GetRole() != prismv1.Role_ROLE_EMBEDDING || cm == "" {
			continue
		}
		n := r.numbers[m]
		if n == nil {
			n = map[answer]int{}
			r.numbers[m] = n
		}
		a := answer{version: info.GetVersion()[m], content: cm}
		if n[a] += d; n[a] <= 0 {
			delete(n, a)
		}
		if len(n) == 0 {
			delete(r.numbers, m)
		}
	}
}

func (r *Registry) unindex(e *worker) {
	for _, m := range e.info.GetModels() {
		k := roleModel{e.info.GetRole(), m}
		if set := r.byModel[k]; set != nil {
			set.remove(e.info.GetId())
			if len(set.ws) == 0 {
				delete(r.byModel, k)
			}
		}
	}
	r.count(e.info, -1)
}

// listDense rebuilds denseAddrs, and names a list that changed by a
// new version; r.mu held.
func (r *Registry) listDense() {
	seen := map[string]bool{}
	for _, e := range r.workers {
		if e.info.GetRole() == prismv1.Role_ROLE_DENSE {
			seen[e.info.GetAddr()] = true
		}
	}
	addrs := slices.Sorted(maps.Keys(seen))
	if slices.Equal(addrs, r.denseAddrs) {
		return
	}
	r.denseAddrs = addrs
	r.denseVersion = &prismv1.ListVersion{Process: r.denseVersion.GetProcess(), Gen: r.denseVersion.GetGen() + 1}
}

// DenseAddrs are the registered dense workers' addresses, sorted.
func (r *Registry) DenseAddrs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.denseAddrs)
}

// Leave removes a worker at once. With Peer set, only the identity the
// worker id is bound to may remove it.
func (r *Registry) Leave(ctx context.Context, req *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	var peer string
	if r.Peer != nil {
		if _, name, ok := r.Peer(ctx); ok {
			peer = name
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.workers[req.GetId()]
	if ok && e.peer != "" && e.peer != peer {
		return nil, status.Errorf(codes.PermissionDenied, "leave: worker id %.64q belongs to %q, not %q", req.GetId(), e.peer, peer)
	}
	// A stop, not a death: a worker that announces at its address next
	// is it restarted (restartedThere), when it is the latest worker
	// there. Also when it was dropped already: on Kubernetes its Pod's
	// endpoint turning terminating (PodGone) may come first.
	if ra, had := r.lastID[req.GetId()]; had {
		if rec := r.lastAt[ra]; rec.peer == "" || rec.peer == peer {
			rec.left = true
			r.lastAt[ra] = rec
		}
	}
	if ok {
		r.leaving = req.GetId()
		r.drop(req.GetId())
		r.leaving = ""
	}
	return &prismv1.LeaveResponse{}, nil
}

// live returns the live workers' infos, in no order: for the router's
// own heartbeat (worker counts, connections to retire), which needs
// neither List's sort nor its description of every model's updates.
func (r *Registry) live() []*prismv1.WorkerInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.infos()
}

// infos are the live workers' infos, in no order; r.mu held.
func (r *Registry) infos() []*prismv1.WorkerInfo {
	out := make([]*prismv1.WorkerInfo, 0, len(r.workers))
	for _, e := range r.workers {
		out = append(out, e.info)
	}
	return out
}

// List returns the live workers, sorted by role and address.
func (r *Registry) List(context.Context, *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.infos()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Role != out[j].Role {
			return out[i].Role < out[j].Role
		}
		return out[i].Addr < out[j].Addr
	})
	resp := &prismv1.ListResponse{Workers: out}
	if r.describe != nil {
		r.mu.Unlock()
		var sequencing bool
		resp.Updates, sequencing = r.describe()
		resp.NotSequencing = !sequencing
		if !sequencing && r.sequencer != nil {
			resp.Sequencer = r.sequencer()
		}
		r.mu.Lock() // the deferred Unlock
	}
	return resp, nil
}

// UpdateLog serves the update log of the router that sequences
// embedding updates to the routers keeping a copy (replica.go).
func (r *Registry) UpdateLog(_ context.Context, req *prismv1.UpdateLogRequest) (*prismv1.UpdateLogResponse, error) {
	if r.readLog == nil {
		return nil, status.Error(codes.FailedPrecondition, "this router keeps no embedding update log")
	}
	return r.readLog(req)
}

// Expire removes workers not heard from for three heartbeats and returns
// their ids.
func (r *Registry) Expire() []string {
	var ids []string
	for _, w := range r.expire() {
		ids = append(ids, w.GetId())
	}
	return ids
}

// expire is Expire returning the workers removed, in order of id.
func (r *Registry) expire() []*prismv1.WorkerInfo {
	var ids []string
	for _, w := range r.overdue() {
		ids = append(ids, w.GetId())
	}
	return r.expireIDs(ids)
}

// overdue lists the workers not heard from for three heartbeats, in
// order of id, without removing them: the router's sweep expires them
// (expireIDs) but those it probes first (silent.go).
func (r *Registry) overdue() []*prismv1.WorkerInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*prismv1.WorkerInfo
	now := r.now()
	for _, e := range r.workers {
		if r.isOverdue(e, now) {
			out = append(out, e.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return out
}

// isOverdue: e has not announced for three heartbeats; r.mu held.
func (r *Registry) isOverdue(e *worker, now time.Time) bool {
	return now.Sub(e.lastSeen) > 3*r.heartbeat
}

// expireIDs removes the workers of ids that are still overdue (one that
// announced since overdue listed it stays) and returns them, in the
// order of ids.
func (r *Registry) expireIDs(ids []string) []*prismv1.WorkerInfo {
	if len(ids) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*prismv1.WorkerInfo, 0, len(ids))
	now := r.now()
	for _, id := range ids {
		if e := r.workers[id]; e != nil && r.isOverdue(e, now) {
			out = append(out, e.info)
			r.drop(id)
		}
	}
	return out
}

// registered says whether a worker of role is registered: an embedding
// worker by id, a dense worker by address (calls name it so).
func (r *Registry) registered(role prismv1.Role, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if role == prismv1.Role_ROLE_DENSE {
		_, ok := slices.BinarySearch(r.denseAddrs, name)
		return ok
	}
	e, ok := r.workers[name]
	return ok && e.info.GetRole() == role
}

// Remove drops a worker the router found dead (it re-registers with its
// next heartbeat if it is not).
func (r *Registry) Remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.workers[id]; ok {
		r.drop(id)
	}
}

// Unreachable marks the worker id as one this router's call failed to
// reach (serve.TransportFailed: refused, reset or lost, no answer), and
// UnreachableAt every worker of role at addr (a dense worker an
// embedding worker could not reach, prismv1.DenseUnreachable). From
// then on picks leave it out, router-wide, while another worker they
// would take is not marked: a dead worker whose calls fail fast never
// looks busy to least-outstanding, and took its share of micro-batches
// until its heartbeats expired (three heartbeats). It is taken again
// after its next announcement, or an answer from it (Reached); a worker
// alone in its role for a model is still picked, its calls failing
// fast. An answer of the worker, whatever its code (InvalidArgument,
// ResourceExhausted, its own Unavailable), and the caller's deadline
// never mark it.
func (r *Registry) Unreachable(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.workers[id]; e != nil {
		r.setUnreachable(e, true)
	}
}

// UnreachableAt is Unreachable of every worker of role at addr.
func (r *Registry) UnreachableAt(role prismv1.Role, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.workers {
		if e.info.GetRole() == role && e.info.GetAddr() == addr {
			r.setUnreachable(e, true)
		}
	}
}

// Reached takes back the marks of Unreachable of the embedding worker
// id and of the dense workers at denseAddr ("" none): a call through
// them was answered. Free while no worker is marked.
func (r *Registry) Reached(id, denseAddr string) {
	if r.unreachable.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.workers[id]; e != nil {
		r.setUnreachable(e, false)
	}
	if denseAddr == "" {
		return
	}
	for _, e := range r.workers {
		if e.unreachable && e.info.GetRole() == prismv1.Role_ROLE_DENSE && e.info.GetAddr() == denseAddr {
			r.setUnreachable(e, false)
		}
	}
}

// isUnreachable says whether the worker id is marked by Unreachable.
// Free while no worker is.
func (r *Registry) isUnreachable(id string) bool {
	if r.unreachable.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.workers[id]
	return e != nil && e.unreachable
}

// setUnreachable sets e's mark and keeps the count; r.mu held.
func (r *Registry) setUnreachable(e *worker, down bool) {
	if e.unreachable == down {
		return
	}
	e.unreachable = down
	if down {
		r.unreachable.Add(1)
		if r.Log != nil {
			r.Log.Warn("worker unreachable: a call to it failed at the transport; picks leave it out until it announces again or answers", "id", e.info.GetId(), "addr", e.info.GetAddr(), "role", e.info.GetRole().Name())
		}
		return
	}
	r.unreachable.Add(-1)
}

// maxRetiredPerPeer bounds the bindings of dropped workers' ids kept
// per identity (a worker's own certificate has one id per start), and
// maxRetired those kept in all.
const (
	maxRetiredPerPeer = 64
	maxRetired        = 1 << 16
)

// drop removes a registered worker, keeping its id's binding; r.mu held.
func (r *Registry) drop(id string) {
	e := r.workers[id]
	r.setUnreachable(e, false)
	r.unindex(e)
	delete(r.workers, id)
	r.retireID(id, e.peer)
	// A worker that goes after another at its address announced without
	// one of its models (a dense worker restarted in place is dropped at
	// its old entry's expiry or Leave, after the new one announced): the
	// model is retired there too.
	ra := roleAddr{e.info.GetRole(), e.info.GetAddr()}
	if now, ok := r.lastAt[ra]; ok && !slices.Equal(now.models, e.info.GetModels()) && restartedThere(e.info.GetModels(), now.models, r.leaving == id) {
		for _, m := range e.info.GetModels() {
			if !slices.Contains(now.models, m) {
				r.retire(roleModel{ra.role, m}, ra.addr)
			}
		}
	}
	if e.info.GetRole() == prismv1.Role_ROLE_DENSE {
		r.listDense()
	}
	if r.gone != nil {
		r.gone(id)
	}
	r.notify()
}

// retireID keeps the binding of dropped worker id to peer (none for a
// worker bound to none); r.mu held.
func (r *Registry) retireID(id, peer string) {
	if peer == "" {
		return
	}
	if r.retired == nil {
		r.retired, r.retiredBy = map[string]string{}, map[string][]string{}
	}
	if _, ok := r.retired[id]; ok {
		return // it was this peer's already (Announce refuses another)
	}
	ids := r.retiredBy[peer]
	if len(ids) >= maxRetiredPerPeer {
		delete(r.retired, ids[0])
		ids = ids[1:]
	} else if len(r.retired) >= maxRetired {
		return
	}
	r.retired[id] = peer
	r.retiredBy[peer] = append(ids, id)
}

// Changed returns a channel closed at the next change of the worker set.
func (r *Registry) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Pick chooses the healthy worker of role serving model with the least
// outstanding work (what it reported plus what this router sent it since),
// skipping ids in exclude, and charges it n samples; release undoes the
// charge. Ties go to the lowest address, so the choice is deterministic.
func (r *Registry) Pick(role prismv1.Role, model string, n int64, exclude []string) (w *prismv1.WorkerInfo, release func(), err error) {
	return r.PickFor(role, model, n, exclude, "")
}

// PickFor is Pick of a dense worker for the embedding worker id
// sender: it prefers the dense workers sender has been told of (the
// only ones it sends to), and falls back to the others only when there
// are none (sender learns of them at its next heartbeat).
func (r *Registry) PickFor(role prismv1.Role, model string, n int64, exclude []string, sender string) (w *prismv1.WorkerInfo, release func(), err error) {
	return r.pickFor(role, model, n, exclude, sender, pickWant{})
}

// DenseWant narrows PickDense: Sharding (a fingerprint; "" any) keeps
// the dense workers that name it for the model, or, unless Exact, that
// name none (of earlier releases); ToldOnly keeps those the sender has
// been told of (PickFor falls back to the others when none is).
// Content (WorkerInfo.content; "" any) keeps the dense workers of that
// content or of none (unknown): never one of another.
type DenseWant struct {
	Sharding        string
	Exact, ToldOnly bool
	Content         string
}

// EmbeddingWant narrows PickEmbedding. Content ("" any) keeps the
// workers of that content only (a request pinned to it). Paired keeps
// those a live dense worker can score for: of a content some dense
// worker of the model serves, or of none, or any while some dense
// worker's content is unknown. Version (0 any) keeps the workers whose
// store serves that version number of the model (WorkerInfo.version),
// or that announce none: a micro-batch pinned to a number, as requests
// are where the workers announce no content, goes to a worker that
// answers it (a worker checks the number against its store's, and
// refuses another with NotFound).
type EmbeddingWant struct {
	Content string
	Version int64
	Paired  bool
}

// PickEmbedding is Pick of an embedding worker narrowed by want.
func (r *Registry) PickEmbedding(model string, n int64, exclude []string, want EmbeddingWant) (w *prismv1.WorkerInfo, release func(), err error) {
	return r.pickFor(prismv1.Role_ROLE_EMBEDDING, model, n, exclude, "", pickWant{embedding: want})
}

// pickWant is what a pick of either role keeps.
type pickWant struct {
	dense     DenseWant
	embedding EmbeddingWant
}

// PickDense is PickFor of a dense worker for a sharded fan-out, narrowed
// by want. Router.pickDense orders the tries.
func (r *Registry) PickDense(model string, n int64, exclude []string, sender string, want DenseWant) (w *prismv1.WorkerInfo, release func(), err error) {
	return r.pickFor(prismv1.Role_ROLE_DENSE, model, n, exclude, sender, pickWant{dense: want})
}

// hasDense says whether best finds a dense worker of sharding for model
// (naming it or none) that scores content ("" any): at all; among those
// the sender, told at told, was told of; and among those, one not in
// avoid; r.mu held.
func (r *Registry) hasDense(model, sharding, content string, avoid []string, told uint64) (has, hasTold, toldUnavoided bool) {
	found := func(exclude []string, told uint64) bool {
		w, _, _ := r.best(prismv1.Role_ROLE_DENSE, model, exclude, told, pickWant{dense: DenseWant{Sharding: sharding, Content: content}})
		return w != nil
	}
	return found(nil, 0), found(nil, told), found(avoid, told)
}

func (r *Registry) pickFor(role prismv1.Role, model string, n int64, exclude []string, sender string, want pickWant) (w *prismv1.WorkerInfo, release func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var told uint64
	if e := r.workers[sender]; e != nil && role == prismv1.Role_ROLE_DENSE {
		told = e.told
	}
	best, lagging, untold := r.best(role, model, exclude, told, want)
	if (best == nil || best.unreachable) && untold > 0 && !want.dense.ToldOnly {
		// A reachable worker the sender has not been told of yet beats
		// an unreachable one it has.
		if other, otherLagging, _ := r.best(role, model, exclude, 0, want); best == nil || (other != nil && !other.unreachable) {
			best, lagging = other, otherLagging
		}
	}
	if best == nil {
		if lagging > 0 {
			return nil, nil, fmt.Errorf("every %s worker of model %q lacks acknowledged embedding updates (%d catching up or stale; see the router's log)", role.Name(), model, lagging)
		}
		if err := r.contentMissing(role, model, exclude, want); err != nil {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("no healthy %s worker serves model %q", role.Name(), model)
	}
	best.inflight += n
	once := sync.Once{}
	return best.info, func() {
		once.Do(func() {
			r.mu.Lock()
			best.inflight -= n
			r.mu.Unlock()
		})
	}, nil
}

// best is the least-loaded eligible worker of role serving model, but
// those in exclude, when told is set those that joined after it, and
// when sharding is set those that name another for model (or, exact,
// that do not name it); r.mu held.
func (r *Registry) best(role prismv1.Role, model string, exclude []string, told uint64, want pickWant) (best *worker, lagging, untold int) {
	var bestLoad int64
	// The least loaded of the unreachable workers it would take
	// otherwise: picked only when every worker is so (the only worker
	// of its role, say: its calls fail fast rather than the pick).
	var down *worker
	var downLoad int64
	var set []*worker
	if s := r.byModel[roleModel{role, model}]; s != nil {
		set = s.ws
	}
	sharding, exact := want.dense.Sharding, want.dense.Exact
	// Content filters, each only while some worker would fail it.
	keep := r.embeddingFilter(model, want.embedding)
	denseContent := want.dense.Content
	if denseContent != "" && r.onlyContent(roleModel{role, model}, denseContent, true) {
		denseContent = ""
	}
	for _, e := range set {
		if slices.Contains(exclude, e.info.GetId()) {
			continue
		}
		if sharding != "" {
			// PickDense: a dense worker of another sharding, or (exact)
			// one that names none.
			if fp := e.info.GetSharding()[model]; fp != sharding && (exact || fp != "") {
				continue
			}
		}
		if denseContent != "" {
			// A dense worker of another model of this name.
			if wc := e.info.GetContent()[model]; wc != "" && wc != denseContent {
				continue
			}
		}
		if keep.active() && !keep.keeps(e.info.GetContent()[model], e.info.GetVersion()[model]) {
			continue
		}
		if told != 0 && e.joined >= told {
			untold++
			continue
		}
		if !e.info.GetHealthy() {
			continue
		}
		if r.eligible != nil && !r.eligible(e.info, model) {
			lagging++
			continue
		}
		load := e.info.GetOutstanding() + e.inflight
		if e.unreachable {
			if down == nil || load < downLoad || (load == downLoad && e.info.GetAddr() < down.info.GetAddr()) {
				down, downLoad = e, load
			}
			continue
		}
		if best == nil || load < bestLoad || (load == bestLoad && e.info.GetAddr() < best.info.GetAddr()) {
			best, bestLoad = e, load
		}
	}
	if best == nil {
		best = down
	}
	return best, lagging, untold
}

// embeddingFilter is what want keeps of model's embedding workers, by
// the content they announce: set up once per pick, each part only
// while some worker would fail it (outside a rollout, neither), and
// by the version number pinned, if any. r.mu held.
func (r *Registry) embeddingFilter(model string, want EmbeddingWant) contentFilter {
	var f contentFilter
	if want.Paired && !r.pairedAll(model) {
		f.dense = r.contents[roleModel{prismv1.Role_ROLE_DENSE, model}]
	}
	if want.Content != "" && !r.onlyContent(roleModel{prismv1.Role_ROLE_EMBEDDING, model}, want.Content, false) {
		f.pinned = want.Content
	}
	f.version = want.Version
	return f
}

// contentFilter keeps the embedding workers of content pinned ("" any)
// whose content a dense worker serves (dense, the dense workers' counts
// by content; nil any, and an unknown content is always kept), and of
// version number version (0 any; an unknown number is always kept).
type contentFilter struct {
	pinned  string
	dense   map[string]int
	version int64
}

// active: the filter may leave a worker out (else a pick need not read
// any worker's content).
func (f contentFilter) active() bool { return f.pinned != "" || f.dense != nil || f.version != 0 }

// keeps says whether a worker of content c whose store numbers its
// version v passes the filter.
func (f contentFilter) keeps(c string, v int64) bool {
	return (f.pinned == "" || c == f.pinned) && (f.dense == nil || c == "" || f.dense[c] > 0) && (f.version == 0 || v == 0 || v == f.version)
}

// pairedAll says whether a dense worker of model can score for every
// embedding worker of it: some dense worker's content is unknown (a
// worker of an earlier release, or a plan copy without every ONNX part,
// which pairs with any), there is no dense worker at all (the dense
// pick says so), or every embedding worker's content is unknown or
// one a dense worker serves. r.mu held.
func (r *Registry) pairedAll(model string) bool {
	dense := r.contents[roleModel{prismv1.Role_ROLE_DENSE, model}]
	if len(dense) == 0 || dense[""] > 0 {
		return true
	}
	for c := range r.contents[roleModel{prismv1.Role_ROLE_EMBEDDING, model}] {
		if c != "" && dense[c] == 0 {
			return false
		}
	}
	return true
}

// onlyContent says whether every worker of k announces content c (or,
// with unknown, no content): a filter by c would keep them all. r.mu
// held.
func (r *Registry) onlyContent(k roleModel, c string, unknown bool) bool {
	for wc := range r.contents[k] {
		if wc != c && (!unknown || wc != "") {
			return false
		}
	}
	return true
}

// contentMissing explains a pick that content alone made fail: the
// workers are there, but of another content than the pick wants;
// nil when that is not why. r.mu held.
func (r *Registry) contentMissing(role prismv1.Role, model string, exclude []string, want pickWant) error {
	if want.dense.Content == "" && want.embedding == (EmbeddingWant{}) {
		return nil
	}
	plain := want
	plain.dense.Content, plain.embedding = "", EmbeddingWant{}
	if w, _, _ := r.best(role, model, exclude, 0, plain); w == nil {
		return nil
	}
	if v := want.embedding.Version; v != 0 {
		// Pinned to a number: is it the number alone that leaves every
		// worker out?
		anyNumber := want
		anyNumber.embedding.Version = 0
		if w, _, _ := r.best(role, model, exclude, 0, anyNumber); w != nil {
			return status.Errorf(codes.NotFound, "no healthy embedding worker serves version %d of model %q (its embedding workers serve %v)", v, model, r.versionsOf(model))
		}
	}
	have := func(role prismv1.Role) []string {
		// The healthy workers' contents ("" unknown).
		return slices.Sorted(maps.Keys(r.contents[roleModel{role, model}]))
	}
	switch {
	case want.embedding.Content != "":
		// Pinned to a version no longer (or not yet) served.
		return status.Errorf(codes.NotFound, "no healthy embedding worker serves content %q of model %q (its embedding workers serve %q)", want.embedding.Content, model, have(prismv1.Role_ROLE_EMBEDDING))
	case want.dense.Content != "":
		return fmt.Errorf("no healthy dense worker serves content %q of model %q, its embedding worker's (its dense workers serve %q): roll both tiers to the same plan", want.dense.Content, model, have(prismv1.Role_ROLE_DENSE))
	}
	return fmt.Errorf("no dense worker serves the content of model %q's embedding workers (embedding %q, dense %q): while a retrained model rolls out, keep workers of one plan live in both tiers", model, have(prismv1.Role_ROLE_EMBEDDING), have(prismv1.Role_ROLE_DENSE))
}

// versionsOf lists the version numbers model's healthy embedding
// workers announce (0: one that announces none); r.mu held.
func (r *Registry) versionsOf(model string) []int64 {
	var out []int64
	if s := r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}]; s != nil {
		for _, e := range s.ws {
			if v := e.info.GetVersion()[model]; e.info.GetHealthy() && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// ContentVersion is the version number of model's content the router
// answers with: the highest number its live embedding workers give it
// (their stores number apart). 0: none numbers it.
func (r *Registry) ContentVersion(model, content string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var v int64
	for a := range r.numbers[model] {
		if a.content == content {
			v = max(v, a.version)
		}
	}
	return v
}

// VersionContent is the content a request pinned to version of model
// is served with: of the contents some live embedding worker numbers
// so, one whose highest number (ContentVersion, what responses name)
// it is, then the one most workers number so, then the least. Stores
// number apart: a replica ingested after a model update may call the
// current content 1 while the others call it 2, and two stores
// ingested apart may each call their own content 1. "": no worker
// announcing content numbers it (earlier releases: the request goes
// pinned to the number).
func (r *Registry) VersionContent(model string, version int64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	top := map[string]int64{} // content -> highest number given it
	count := map[string]int{} // content -> workers numbering it version
	for a, n := range r.numbers[model] {
		top[a.content] = max(top[a.content], a.version)
		if a.version == version {
			count[a.content] += n
		}
	}
	best := ""
	better := func(c string) bool {
		if (top[c] == version) != (top[best] == version) {
			return top[c] == version
		}
		return count[c] > count[best] || count[c] == count[best] && c < best
	}
	for c := range count {
		if best == "" || better(c) {
			best = c
		}
	}
	return best
}

// Serves says whether some live worker serves model (the per-request
// check; Models builds sorted lists for messages).
func (r *Registry) Serves(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}] != nil || r.byModel[roleModel{prismv1.Role_ROLE_DENSE, model}] != nil
}

// ServedBy says whether some live worker of role serves model.
func (r *Registry) ServedBy(role prismv1.Role, model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byModel[roleModel{role, model}] != nil
}

// Known says whether some worker served model and it was not retired
// since (retire).
func (r *Registry) Known(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[model]
}

// Models lists the models some worker of each role serves.
func (r *Registry) Models() (cpu, gpu []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.byModel {
		switch k.role {
		case prismv1.Role_ROLE_EMBEDDING:
			cpu = append(cpu, k.model)
		case prismv1.Role_ROLE_DENSE:
			gpu = append(gpu, k.model)
		}
	}
	sort.Strings(cpu)
	sort.Strings(gpu)
	return cpu, gpu
}
