package router

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prism-serve/prism/api/prismv1"
)

// A worker that goes silent (its node lost, its link cut: packets
// dropped, no reset) fails no call: the calls already sent to it wait,
// and gRPC's keepalive (at least 10 s between pings) notices it long
// after a request's deadline. The registry notices it sooner: its
// heartbeats stop, and three heartbeats later it expires. So the
// router keeps the Lookups in flight with the workers each waits on
// (the embedding worker by id, the dense worker by the address the
// Lookup names it by) and abandons those waiting on a worker when it
// expires: each ends Unavailable, naming the worker, while its
// request is live, and microBatch (or a fan-out) retries it on another
// pair as it does a call whose connection broke. Only expiry does so:
// a per-attempt timeout would give up calls a loaded worker is still
// answering, adding their work elsewhere just when the tier is
// overloaded, where an expired worker has stopped announcing. A worker
// that leaves (drains) or is removed otherwise answers its calls, and
// a slow worker keeps announcing. Lookups are idempotent (a
// micro-batch scored twice is harmless); updates have their own bound
// (Options.UpdateWorkerTimeout) and are not abandoned here.

// inflightCalls are the Lookups in flight, each with the workers it
// waits on. A sweep that expires none costs nothing, and one that does
// goes over the calls in flight (up to the router's admission bound).
type inflightCalls struct {
	mu    sync.Mutex
	calls map[*watchedCall]struct{}
	// expired are the workers the last sweep expired, embedding workers
	// by id and dense workers by address: a call picked before that
	// sweep and registered after it is abandoned at once (the next
	// sweep forgets them: a worker back by then takes calls again).
	expiredEmb, expiredDense map[string]bool
	// registered, when set, says whether a worker is registered now
	// (Registry.registered): an expired worker's marks spare one that
	// is, a dense worker restarted at the address under a new id (the
	// old id expires after it announced) or a worker announcing again
	// since its expiry. Called with mu held.
	registered func(role prismv1.Role, name string) bool
}

// watchedCall is a Lookup to the embedding worker id naming the dense
// worker at dense.
type watchedCall struct {
	id, dense string
	cancel    context.CancelCauseFunc
}

// silentWorker is the cause of an abandoned call: the worker it waited
// on expired.
type silentWorker struct {
	role prismv1.Role
	name string // id, or the dense worker's address
}

func (s *silentWorker) Error() string {
	role := "embedding"
	if s.role == prismv1.Role_ROLE_DENSE {
		role = "dense"
	}
	return fmt.Sprintf("%s worker %s stopped announcing (its registration expired, three heartbeats after its last) with the call in flight", role, s.name)
}

// watch registers a Lookup to the embedding worker id naming the dense
// worker at dense ("": none): the context returned is cancelled with a
// *silentWorker cause when either expires; done unregisters it.
func (c *inflightCalls) watch(ctx context.Context, id, dense string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &watchedCall{id: id, dense: dense, cancel: cancel}
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[*watchedCall]struct{}{}
	}
	c.calls[w] = struct{}{}
	if s := c.expiredBy(w); s != nil {
		cancel(s)
	}
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(c.calls, w)
		c.mu.Unlock()
		cancel(nil)
	}
}

// expiredBy is the worker of w that the last sweep expired and that is
// not registered again (nil: none); c.mu is held.
func (c *inflightCalls) expiredBy(w *watchedCall) *silentWorker {
	switch {
	case c.expiredEmb[w.id] && !c.back(prismv1.Role_ROLE_EMBEDDING, w.id):
		return &silentWorker{role: prismv1.Role_ROLE_EMBEDDING, name: w.id}
	case w.dense != "" && c.expiredDense[w.dense] && !c.back(prismv1.Role_ROLE_DENSE, w.dense):
		return &silentWorker{role: prismv1.Role_ROLE_DENSE, name: w.dense}
	}
	return nil
}

// back says whether the worker of role named name (an embedding
// worker's id, a dense worker's address) is registered now; c.mu is
// held.
func (c *inflightCalls) back(role prismv1.Role, name string) bool {
	return c.registered != nil && c.registered(role, name)
}

// abandon cancels the calls waiting on the workers that expired (one
// sweep's), and returns how many per worker, by id.
func (c *inflightCalls) abandon(gone []*prismv1.WorkerInfo) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expiredEmb, c.expiredDense = nil, nil
	if len(gone) == 0 {
		return nil
	}
	c.expiredEmb, c.expiredDense = map[string]bool{}, map[string]bool{}
	ids := map[string]string{} // "role name" -> id, to count by id
	for _, w := range gone {
		if w.GetRole() == prismv1.Role_ROLE_DENSE {
			c.expiredDense[w.GetAddr()] = true
			ids["d "+w.GetAddr()] = w.GetId()
		} else {
			c.expiredEmb[w.GetId()] = true
			ids["e "+w.GetId()] = w.GetId()
		}
	}
	var out map[string]int
	for w := range c.calls {
		s := c.expiredBy(w)
		if s == nil {
			continue
		}
		w.cancel(s)
		delete(c.calls, w)
		if out == nil {
			out = map[string]int{}
		}
		if s.role == prismv1.Role_ROLE_DENSE {
			out[ids["d "+s.name]]++
		} else {
			out[ids["e "+s.name]]++
		}
	}
	return out
}

// abandoned is the silent worker whose expiry ended a call made with
// ctx (from watch) while its caller's own context (parent) is live; nil
// otherwise.
func abandoned(parent, ctx context.Context) *silentWorker {
	var s *silentWorker
	if parent.Err() != nil || !errors.As(context.Cause(ctx), &s) {
		return nil
	}
	return s
}
