package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/serve"
)

// A worker that goes silent (its node lost, its link cut: packets
// dropped, no reset) fails no call: the calls already sent to it wait,
// and gRPC's keepalive (at least 10 s between pings) notices it long
// after a request's deadline. The registry notices it sooner: its
// heartbeats stop, and three heartbeats later it expires. So the
// router keeps the Lookups in flight with the workers each waits on
// (the embedding worker by id, the dense worker by the address the
// Lookup names it by) and abandons those waiting on a worker when it
// expires (once a probe of its health failed too: a worker late to
// announce is not silent, below): each ends Unavailable, naming the worker, while its
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
	return c.abandonLocked(gone)
}

// abandonMore is abandon of workers expired between two sweeps (a probe
// that failed): the marks of the last sweep stay, these join them.
func (c *inflightCalls) abandonMore(gone []*prismv1.WorkerInfo) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.abandonLocked(gone)
}

// abandonLocked marks the workers of gone expired and cancels the calls
// waiting on them; c.mu held.
func (c *inflightCalls) abandonLocked(gone []*prismv1.WorkerInfo) map[string]int {
	if len(gone) == 0 {
		return nil
	}
	if c.expiredEmb == nil {
		c.expiredEmb, c.expiredDense = map[string]bool{}, map[string]bool{}
	}
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

// An overdue worker (three heartbeats without an announcement) is not
// always a silent one: a worker on a starved host (CI at load average
// 16, several processes on two cores) may be too slow to announce in
// time while it answers its calls, and abandoning them failed requests
// that had no other pair to retry on (two drain tests went red so).
// So before the sweep expires an overdue worker, it probes it: a gRPC health check (grpc.health.v1, which every tier
// serves, internal/serve), over the connection the calls use (a dense
// worker, which the router does not call, over one dialled for the
// probe with Options.DenseDialOptions). A worker that answers SERVING
// within probeTimeout is live but late: it stays registered (picked as
// before: the only worker of its role still serves) and its calls stay
// in flight; the next sweep probes it again if it has still not
// announced, and after maxProbes such answers the worker is expired
// all the same (it answers its health check but cannot announce: its
// calls may be as stuck). Any other outcome (no answer in time, a
// refused or broken connection, NOT_SERVING, a draining server's
// refusal) expires it at once and abandons its calls, as before, only
// up to probeTimeout later. A worker nothing waits on is probed too:
// expired unprobed, a live worker that happened to have no call in
// flight at the sweep was dropped, and with no other worker of its role
// every request failed until it announced again (CI: 9,492 Unavailable
// in TestLateWorkerKeepsCalls). A worker that announces while its probe
// runs stays (expireIDs checks again). Probes run in goroutines of
// their own, one per overdue worker at a time, outside every lock: a
// sweep that finds no worker overdue costs what it did.

// maxProbes is how many health checks in a row an overdue worker may
// answer SERVING and keep its registration and calls: with three
// heartbeats of expiry, a worker that proves itself live has seven
// heartbeats to announce before its calls are abandoned.
const maxProbes = 4

// probeTimeout bounds one probe: a heartbeat, so a probe ends before
// the next sweep, and at most a second, so a silent worker's calls wait
// at most that much longer than the expiry for a router whose heartbeat
// is longer. A live worker's gRPC server answers a health check without
// touching the model: in well under a millisecond unloaded, and within
// a heartbeat on a host where announcements (one RPC a heartbeat) still
// got through one in three.
func probeTimeout(heartbeat time.Duration) time.Duration {
	return min(heartbeat, time.Second)
}

// probes are the overdue workers with calls in flight that the sweep
// probes, by id.
type probes struct {
	mu sync.Mutex
	m  map[string]*probeState
	// wg counts the probes running: Run waits for them.
	wg sync.WaitGroup
}

// probeState is one overdue worker's: a probe of it is running, and how
// many answered SERVING so far.
type probeState struct {
	running bool
	served  int
}

// plan decides the fate of the overdue workers over: expire (drop)
// those that answered maxProbes probes, probe (start) those not being
// probed now, and keep the rest waiting for their probe's answer. It
// forgets the workers no longer overdue (announced again, or gone).
func (p *probes) plan(over []*prismv1.WorkerInfo) (drop []string, start []*prismv1.WorkerInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) > 0 {
		still := make(map[string]bool, len(over))
		for _, w := range over {
			still[w.GetId()] = true
		}
		for id := range p.m {
			if !still[id] {
				delete(p.m, id)
			}
		}
	}
	for _, w := range over {
		id := w.GetId()
		st := p.m[id]
		switch {
		case st != nil && !st.running && st.served >= maxProbes:
			delete(p.m, id)
			drop = append(drop, id)
		case st == nil:
			if p.m == nil {
				p.m = map[string]*probeState{}
			}
			p.m[id] = &probeState{running: true}
			start = append(start, w)
		case !st.running:
			st.running = true
			start = append(start, w)
		}
	}
	return drop, start
}

// served records a probe of id answered SERVING and returns how many
// have (0: the worker was forgotten meanwhile).
func (p *probes) served(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.m[id]
	if st == nil {
		return 0
	}
	st.running = false
	st.served++
	return st.served
}

// forget drops id's state (its probe failed).
func (p *probes) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, id)
}

// sweep expires the overdue workers, probing them first, and abandons
// the calls waiting on those expired; the probes it starts run on after
// it returns (Run waits for them).
func (r *Router) sweep(ctx context.Context) {
	over := r.Reg.overdue()
	drop, start := r.probing.plan(over)
	gone := r.Reg.expireIDs(drop)
	// Their calls in flight are abandoned and retried elsewhere.
	abandoned := r.calls.abandon(gone)
	r.logExpired(gone, abandoned, nil)
	for _, w := range start {
		r.probing.wg.Go(func() { r.probe(ctx, w) })
	}
}

// probe checks the health of the overdue worker w: live, it keeps its
// calls until the next sweep; otherwise it is expired now (unless it
// announced meanwhile) and its calls are abandoned.
func (r *Router) probe(ctx context.Context, w *prismv1.WorkerInfo) {
	began := time.Now()
	err := r.checkHealth(ctx, w)
	if ctx.Err() != nil {
		return // Run has ended: nothing is in flight any more
	}
	if err == nil {
		if n := r.probing.served(w.GetId()); n == 1 {
			r.log.Warn("worker overdue (no announcement for three heartbeats) but it answers its health check: kept, its calls in flight go on", "worker", w.GetId(), "addr", w.GetAddr(), "probe", time.Since(began).Round(time.Microsecond))
		}
		return
	}
	r.probing.forget(w.GetId())
	gone := r.Reg.expireIDs([]string{w.GetId()})
	r.logExpired(gone, r.calls.abandonMore(gone), fmt.Errorf("its health check: %w (after %v)", err, time.Since(began).Round(time.Millisecond)))
}

// logExpired says which workers expired, and how many calls in flight
// each had abandoned; probed is what a failed probe answered (nil when
// none ran).
func (r *Router) logExpired(gone []*prismv1.WorkerInfo, abandoned map[string]int, probed error) {
	for _, w := range gone {
		args := []any{"worker", w.GetId()}
		if probed != nil {
			args = append(args, "probe", probed.Error())
		}
		if n := abandoned[w.GetId()]; n > 0 {
			r.log.Warn("worker stopped answering; removed, and its calls in flight retried elsewhere", append(args, "calls", n)...)
			continue
		}
		r.log.Warn("worker stopped answering; removed", args...)
	}
}

// checkHealth is one probe of w: nil when it answers SERVING within
// probeTimeout.
func (r *Router) checkHealth(ctx context.Context, w *prismv1.WorkerInfo) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(r.opts.Heartbeat))
	defer cancel()
	var c *grpc.ClientConn
	var err error
	if w.GetRole() == prismv1.Role_ROLE_DENSE {
		// Not a connection of the router's calls: the embedding workers
		// call the dense tier. One for this probe, with the router's
		// identity towards a dense worker.
		opts := r.opts.DenseDialOptions
		if opts == nil {
			opts = r.opts.DialOptions
		}
		if c, err = grpc.NewClient(w.GetAddr(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			append(serve.DialOptions(), opts...)...)...); err != nil {
			return err
		}
		defer c.Close()
	} else if c, err = r.conn(w.GetAddr()); err != nil {
		// The connection its calls are on.
		return err
	}
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("it answered %s", s)
	}
	return nil
}
