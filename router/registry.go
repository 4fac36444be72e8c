// Package router is Prism's front door: it accepts Recommend, cuts each
// request into micro-batches, pipelines them across the embedding and
// dense tiers, and keeps the registry of their workers.
package router

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Registry is the set of live workers. Its core is deterministic: time
// comes from the clock it is given, and expiry happens in Expire.
type Registry struct {
	prismv1.UnimplementedRegistryServer
	mu        sync.Mutex
	now       func() time.Time
	heartbeat time.Duration
	workers   map[string]*worker
	// known holds every model any worker ever announced: a known model
	// without live workers is Unavailable (retry), an unknown one NotFound.
	known map[string]bool
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
}

type worker struct {
	info     *prismv1.WorkerInfo
	lastSeen time.Time
	// inflight is what this router has sent the worker and not heard back.
	inflight int64
}

// NewRegistry makes an empty registry; workers are expected every
// heartbeat and removed after three missed ones.
func NewRegistry(heartbeat time.Duration, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{now: now, heartbeat: heartbeat, workers: map[string]*worker{}, known: map[string]bool{}, changed: make(chan struct{})}
}

func (r *Registry) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Announce registers or refreshes a worker.
func (r *Registry) Announce(_ context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	w := req.GetWorker()
	if w.GetId() == "" || w.GetAddr() == "" || (w.GetRole() != prismv1.Role_ROLE_EMBEDDING && w.GetRole() != prismv1.Role_ROLE_DENSE) {
		return nil, status.Errorf(codes.InvalidArgument, "announce: a worker needs an id, an address and the role embedding or dense (got id %q addr %q role %s)", w.GetId(), w.GetAddr(), w.GetRole())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.workers[w.GetId()]
	if !ok {
		e = &worker{}
		r.workers[w.GetId()] = e
	}
	e.info, e.lastSeen = w, r.now()
	if r.observe != nil {
		r.observe(w)
	}
	for _, m := range w.GetModels() {
		r.known[m] = true
	}
	if !ok {
		r.notify()
	}
	return &prismv1.AnnounceResponse{HeartbeatMs: r.heartbeat.Milliseconds()}, nil
}

// Leave removes a worker at once.
func (r *Registry) Leave(_ context.Context, req *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.workers[req.GetId()]; ok {
		r.drop(req.GetId())
	}
	return &prismv1.LeaveResponse{}, nil
}

// List returns the live workers, sorted by role and address.
func (r *Registry) List(context.Context, *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*prismv1.WorkerInfo
	for _, e := range r.workers {
		out = append(out, e.info)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Role != out[j].Role {
			return out[i].Role < out[j].Role
		}
		return out[i].Addr < out[j].Addr
	})
	return &prismv1.ListResponse{Workers: out}, nil
}

// Expire removes workers not heard from for three heartbeats and returns
// their ids.
func (r *Registry) Expire() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gone []string
	limit := 3 * r.heartbeat
	for id, e := range r.workers {
		if r.now().Sub(e.lastSeen) > limit {
			gone = append(gone, id)
		}
	}
	sort.Strings(gone)
	for _, id := range gone {
		r.drop(id)
	}
	return gone
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

// drop removes a registered worker; r.mu held.
func (r *Registry) drop(id string) {
	delete(r.workers, id)
	if r.gone != nil {
		r.gone(id)
	}
	r.notify()
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
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *worker
	var bestLoad int64
	lagging := 0
	for _, e := range r.workers {
		if e.info.GetRole() != role || !slices.Contains(e.info.GetModels(), model) || slices.Contains(exclude, e.info.GetId()) {
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
		if best == nil || load < bestLoad || (load == bestLoad && e.info.GetAddr() < best.info.GetAddr()) {
			best, bestLoad = e, load
		}
	}
	if best == nil {
		if lagging > 0 {
			return nil, nil, fmt.Errorf("every %s worker of model %q lacks acknowledged embedding updates (%d catching up or stale; see the router's log)", role.Name(), model, lagging)
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

// Serves says whether some live worker serves model (the per-request
// check; Models builds sorted lists for messages).
func (r *Registry) Serves(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.workers {
		if slices.Contains(e.info.GetModels(), model) {
			return true
		}
	}
	return false
}

// Known says whether some worker ever served model.
func (r *Registry) Known(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[model]
}

// Models lists the models some worker of each role serves.
func (r *Registry) Models() (cpu, gpu []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[prismv1.Role]map[string]bool{prismv1.Role_ROLE_EMBEDDING: {}, prismv1.Role_ROLE_DENSE: {}}
	for _, e := range r.workers {
		for _, m := range e.info.GetModels() {
			seen[e.info.GetRole()][m] = true
		}
	}
	for m := range seen[prismv1.Role_ROLE_EMBEDDING] {
		cpu = append(cpu, m)
	}
	for m := range seen[prismv1.Role_ROLE_DENSE] {
		gpu = append(gpu, m)
	}
	sort.Strings(cpu)
	sort.Strings(gpu)
	return cpu, gpu
}
