package capacity

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Controller is the capacity-loaning state machine. It is not safe for
// concurrent use: one driver ticks it and reads its Stats.
type Controller struct {
	o       Options
	started bool
	now     time.Duration
	gap     time.Duration // between the last two ticks

	leases     map[string]*lease // by worker id
	pending    []pending         // borrows asked for, oldest first
	lastReturn map[string]time.Duration
	capacity   map[string]float64 // last measured, per model
	shed       map[string]float64 // shed fraction advised, per model

	stats Stats
}

// lease is one borrowed worker the controller holds.
type lease struct {
	worker, model string
	decidedAt     time.Duration // the borrow decision it answers
	servingAt     time.Duration
	serving       bool
	// down: it served, and is now observed starting (out of the
	// registry, its lender still lists it running) since downSince.
	down        bool
	downSince   time.Duration
	draining    bool
	drainedAt   time.Duration
	drainReason string // ReasonLowDemand, ReasonReclaim or ReasonLost
	// retry: adopted draining after a return the lender failed; it is
	// returned again in the tick that adopts it.
	retry bool
	// adopted: no borrow asked for it (a restarted lender's, or
	// driver's): its time to serving is no start-up (observeStartup).
	adopted  bool
	deadline time.Duration
	missing  int // observations in a row without it
}

type pending struct {
	model string
	n     int
	at    time.Duration
}

// New returns a controller; o is defaulted and validated.
func New(o Options) (*Controller, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Controller{
		o:          o,
		leases:     map[string]*lease{},
		lastReturn: map[string]time.Duration{},
		capacity:   map[string]float64{},
		shed:       map[string]float64{},
		stats:      newStats(),
	}, nil
}

// Options returns the options in use, defaults filled.
func (c *Controller) Options() Options { return c.o }

// Holds says whether the controller holds a lease on worker: it has
// seen it borrowed and not yet decided its return.
func (c *Controller) Holds(worker string) bool { return c.leases[worker] != nil }

func validate(obs *Observation) error {
	var errs []error
	if obs.LenderIdle < 0 {
		errs = append(errs, fmt.Errorf("lender idle %d is negative", obs.LenderIdle))
	}
	models := map[string]bool{}
	workers := map[string]bool{}
	for _, m := range obs.Models {
		if m.Model == "" {
			errs = append(errs, errors.New("a model without a name"))
		}
		if models[m.Model] {
			errs = append(errs, fmt.Errorf("model %q observed twice", m.Model))
		}
		models[m.Model] = true
		for _, v := range []struct {
			name string
			v    float64
		}{{"offered", m.Offered}, {"shed", m.Shed}} {
			if !(v.v >= 0) || math.IsInf(v.v, 0) {
				errs = append(errs, fmt.Errorf("model %q: %s %v is not a non-negative number", m.Model, v.name, v.v))
			}
		}
		if m.QueueDepth < 0 || m.P99 < 0 {
			errs = append(errs, fmt.Errorf("model %q: negative queue depth or p99", m.Model))
		}
		for _, w := range m.Workers {
			if w.ID == "" || workers[w.ID] {
				errs = append(errs, fmt.Errorf("model %q: worker id %q empty or seen twice", m.Model, w.ID))
			}
			workers[w.ID] = true
			if w.InFlight < 0 {
				errs = append(errs, fmt.Errorf("worker %q: in-flight %d is negative", w.ID, w.InFlight))
			}
		}
	}
	for _, f := range obs.BorrowFailures {
		if f.N <= 0 {
			errs = append(errs, fmt.Errorf("borrow failure of model %q: n %d must be positive", f.Model, f.N))
		}
	}
	return errors.Join(errs...)
}

// Tick advances the controller to now with what was observed and
// returns what to do. An observation that does not make sense (time going
// back, negative rates, a worker seen twice) is an error, and the
// controller is left as it was.
func (c *Controller) Tick(now time.Duration, obs Observation) ([]Decision, error) {
	if c.started && now < c.now {
		return nil, fmt.Errorf("capacity tick at %v goes back from %v", now, c.now)
	}
	if err := validate(&obs); err != nil {
		return nil, fmt.Errorf("capacity tick at %v: %w", now, err)
	}
	if c.started {
		c.gap = now - c.now
		c.stats.BorrowedGPUSeconds += float64(len(c.leases)) * (now - c.now).Seconds()
	}
	c.started, c.now = true, now

	var out []Decision
	emit := func(d Decision) {
		out = append(out, d)
		c.stats.Events[EventKey{d.Kind.String(), d.Reason}]++
	}
	seen := map[string]Worker{}
	workerModel := map[string]string{}
	for _, m := range obs.Models {
		for _, w := range m.Workers {
			seen[w.ID] = w
			workerModel[w.ID] = m.Model
		}
		// A capacity per worker that is not a positive number (a
		// glitched measurement) is unknown: the last one stands.
		if m.CapacityPerWorker > 0 && !math.IsInf(m.CapacityPerWorker, 0) {
			c.capacity[m.Model] = m.CapacityPerWorker
		}
	}

	// Borrows the provider could not deliver, and borrows never delivered.
	for _, f := range obs.BorrowFailures {
		c.stats.Events[EventKey{"borrow failed", "provider"}]++
		c.dropPending(f.Model, f.N)
	}
	kept := c.pending[:0]
	for _, p := range c.pending {
		if now-p.at >= c.o.BorrowTimeout {
			c.stats.Events[EventKey{"borrow failed", "timeout"}] += p.n
			continue
		}
		kept = append(kept, p)
	}
	c.pending = kept

	// New borrowed workers answer the oldest borrow of their model; a
	// worker nobody asked for (a restart of the driver) is adopted.
	for _, id := range slices.Sorted(maps.Keys(seen)) {
		w := seen[id]
		if !w.Borrowed {
			continue
		}
		l := c.leases[id]
		if l == nil {
			model := workerModel[id]
			l = &lease{worker: id, model: model, decidedAt: now}
			if w.State == Draining {
				// Drained and returned before, its return failed (the
				// lender still lists it): return it again. No borrow
				// asked for it, nor is it a new one.
				l.draining, l.drainedAt, l.drainReason, l.deadline, l.retry = true, now, ReasonDrained, now, true
				c.stats.Events[EventKey{"adopt", "draining"}]++
			} else {
				if at, ok := c.takePending(model); ok {
					l.decidedAt = at
				} else {
					l.adopted = true
					c.stats.Events[EventKey{"adopt", "unrequested"}]++
				}
				c.stats.BorrowedWorkers++
			}
			c.leases[id] = l
		}
		if w.State == Serving && !l.serving {
			l.serving, l.servingAt = true, now
			if !l.adopted {
				c.stats.observeStartup(now - l.decidedAt)
			}
		}
		switch {
		case w.State == Serving:
			l.down = false
		case l.serving && w.State == Starting && !l.down:
			l.down, l.downSince = true, now
		}
	}

	// Reclaims: drain at once, release by the lender's deadline.
	for _, r := range obs.Reclaims {
		l := c.leases[r.Worker]
		if l == nil {
			c.stats.Events[EventKey{"reclaim", "not held"}]++
			continue
		}
		c.stats.Events[EventKey{"reclaim", "lender"}]++
		if l.draining {
			l.drainReason = ReasonReclaim
			l.deadline = min(l.deadline, r.Deadline)
			continue
		}
		l.draining, l.drainedAt, l.drainReason, l.deadline = true, now, ReasonReclaim, r.Deadline
		emit(Decision{Kind: Drain, Model: l.model, Worker: l.worker, Reason: ReasonReclaim})
	}

	// Releases: a worker drained at an earlier tick goes back once it
	// holds nothing, at its deadline, or when it has vanished. A worker
	// missing from LostAfter observations in a row (not one failed
	// scrape) is drained as lost first.
	for _, id := range slices.Sorted(maps.Keys(c.leases)) {
		l := c.leases[id]
		w, ok := seen[id]
		if ok {
			l.missing = 0
		} else {
			l.missing++
		}
		switch {
		case ok && !l.draining && !l.serving && now-l.decidedAt >= c.o.BorrowTimeout:
			// Lent but never serving (a Pod left Pending, a worker that
			// crash-loops): held, it would count as capacity and keep
			// every other borrowed worker of its model from going back.
			l.draining, l.drainedAt, l.drainReason, l.deadline = true, now, ReasonNoStart, now+c.o.DrainTimeout
			emit(Decision{Kind: Drain, Model: l.model, Worker: id, Reason: ReasonNoStart})
		case ok && !l.draining && l.down && now-l.downSince >= c.o.BorrowTimeout:
			// Served, then out of the registry for the borrow timeout
			// while its lender lists it running (a container that
			// crash-loops in place, a hung worker): held, it counted as
			// capacity for the rest of the loan and kept its device.
			l.draining, l.drainedAt, l.drainReason, l.deadline = true, now, ReasonStopped, now+c.o.DrainTimeout
			emit(Decision{Kind: Drain, Model: l.model, Worker: id, Reason: ReasonStopped})
		case !ok && !l.draining:
			if l.missing >= c.o.LostAfter {
				l.draining, l.drainedAt, l.drainReason, l.deadline = true, now, ReasonLost, now+c.o.DrainTimeout
				emit(Decision{Kind: Drain, Model: l.model, Worker: id, Reason: ReasonLost})
			}
		case l.retry:
			// A return the lender failed: again at once, its work in
			// flight counted at the first release already.
			delete(c.leases, id)
			emit(Decision{Kind: Return, Model: l.model, Worker: id, Reason: ReasonRetry})
		case !l.draining || l.drainedAt == now:
		case !ok || w.InFlight == 0:
			delete(c.leases, id)
			reason := ReasonDrained
			if !ok && l.drainReason == ReasonLost {
				reason = ReasonLost
			}
			emit(Decision{Kind: Return, Model: l.model, Worker: id, Reason: reason})
		case now >= l.deadline:
			delete(c.leases, id)
			c.stats.ReleasedWithInFlight += w.InFlight
			reason := ReasonTimeout
			if l.drainReason == ReasonReclaim {
				reason = ReasonGraceEnd
			}
			emit(Decision{Kind: Return, Model: l.model, Worker: id, Reason: reason})
		}
	}

	idle := obs.LenderIdle
	held := len(c.leases) + c.pendingCount("")
	models := slices.Clone(obs.Models)
	slices.SortFunc(models, func(a, b ModelObs) int {
		switch {
		case a.Model < b.Model:
			return -1
		case a.Model > b.Model:
			return 1
		}
		return 0
	})
	for i := range models {
		m := &models[i]
		cp := c.capacity[m.Model]
		if cp <= 0 {
			continue // nothing to size with yet
		}
		owned, borrowed, starting, replacing := 0, 0, 0, false
		for _, w := range m.Workers {
			if !w.Borrowed && w.State != Draining {
				owned++
			}
		}
		for _, l := range c.leases {
			if l.model != m.Model {
				continue
			}
			if l.draining {
				replacing = replacing || l.drainReason == ReasonReclaim
				continue
			}
			borrowed++
			if !l.serving {
				starting++
			}
		}
		pend := c.pendingCount(m.Model)
		active := owned + borrowed + pend
		capa := float64(active) * cp

		size := m.Offered
		forecast := 0.0
		if c.o.Policy == Predictive && m.Forecast != nil {
			// A forecast that is not a number (or negative) is none.
			if f := m.Forecast.Peak(now, now+c.lead()); f >= 0 {
				forecast = f
				size = math.Max(size, forecast)
			}
		}
		need := workersFor(m.Offered, cp*c.o.Target) - active
		cool := false
		if t, ok := c.lastReturn[m.Model]; ok && now-t < c.o.CoolDown {
			cool = true
		}
		reason := ""
		switch {
		case m.Shed > 0:
			reason = ReasonShedding
		case m.Offered > capa:
			reason = ReasonHighWater
		case cool:
		case m.Offered > c.o.High*capa:
			reason = ReasonHighWater
		case c.o.P99Limit > 0 && m.P99 > c.o.P99Limit:
			reason = ReasonLatency
		case c.o.QueueLimit > 0 && m.QueueDepth > c.o.QueueLimit:
			reason = ReasonQueue
		}
		n := 0
		if reason != "" {
			n = need
			if n < 1 && reason != ReasonHighWater && pend == 0 && starting == 0 {
				n = 1 // latency pressure at a size that looks right: one more
			}
			if replacing {
				reason = ReasonReplace
			}
		}
		// Predictive: the forecast peak within the lead time crosses the
		// high-water mark of what is counted: size for it now, so the
		// workers serve when it comes.
		if forecast > c.o.High*capa {
			if fn := workersFor(forecast, cp*c.o.Target) - active; fn > n {
				n, reason = fn, ReasonForecast
			}
		}
		if c.o.MaxBorrowed > 0 {
			n = min(n, c.o.MaxBorrowed-held)
		}
		n = min(n, idle)
		if n > 0 {
			idle -= n
			held += n
			active += n
			c.pending = append(c.pending, pending{m.Model, n, now})
			emit(Decision{Kind: Borrow, Model: m.Model, N: n, Reason: reason})
		}

		// Shed advice: the demand the workers counted (starting and asked
		// for included) cannot cover, once nothing more can be borrowed.
		frac := 0.0
		if covered := float64(active) * cp; m.Offered > covered {
			frac = ceilTolerant((1-covered/m.Offered)*100) / 100
		}
		if frac != c.shed[m.Model] {
			r := ReasonUncovered
			if frac == 0 {
				r = ReasonCovered
			}
			c.shed[m.Model] = frac
			emit(Decision{Kind: Shed, Model: m.Model, Frac: frac, Reason: r})
		}

		// Returns: nothing pressing, nothing on its way, past the
		// cool-down, and the demand (or forecast) fits under Low without
		// the workers returned.
		if reason != "" || n > 0 || cool || pend > 0 || starting > 0 || frac > 0 {
			continue
		}
		k := active - max(1, workersFor(size, c.o.Low*cp))
		if k <= 0 {
			continue
		}
		var cand []*lease
		for _, l := range c.leases {
			if l.model == m.Model && l.serving && !l.draining && now-l.servingAt >= c.o.MinLease {
				cand = append(cand, l)
			}
		}
		slices.SortFunc(cand, func(a, b *lease) int {
			if a.servingAt != b.servingAt {
				return int(a.servingAt - b.servingAt)
			}
			if a.worker < b.worker {
				return -1
			}
			return 1
		})
		for _, l := range cand[:min(k, len(cand))] {
			l.draining, l.drainedAt, l.drainReason, l.deadline = true, now, ReasonLowDemand, now+c.o.DrainTimeout
			c.lastReturn[m.Model] = now
			emit(Decision{Kind: Drain, Model: m.Model, Worker: l.worker, Reason: ReasonLowDemand})
		}
	}
	return out, nil
}

// maxWorkers bounds what workersFor answers: far more workers than any
// lender has, far from overflowing an int in the sums it goes into.
const maxWorkers = 1 << 30

// workersFor is how many workers of perWorker samples/s each carry rate:
// ceilTolerant is math.Ceil of x less a float's rounding error: 1.1 /
// 0.1 is 11.000000000000002, and (1 - 7/10) * 100 is 30.000000000000004;
// their ceilings were 12 workers and 31% shed, one over.
func ceilTolerant(x float64) float64 {
	return math.Ceil(x - 1e-9*math.Abs(x))
}

// ceil(rate / perWorker), clamped to [0, maxWorkers] before it is an int
// (a tiny capacity or a huge forecast would overflow: int of an
// out-of-range float is not defined), 0 for a rate that is not a
// positive number.
func workersFor(rate, perWorker float64) int {
	if !(rate > 0) {
		return 0
	}
	x := ceilTolerant(rate / perWorker)
	if !(x < maxWorkers) { // +Inf and NaN (perWorker 0) included
		return maxWorkers
	}
	return int(x)
}

// lead is how far ahead the predictive policy looks: the measured time
// from a borrow decision to serving (the estimate until one is measured)
// plus one tick, since the next decision comes a tick later.
func (c *Controller) lead() time.Duration {
	s := c.o.StartupEstimate
	if c.stats.StartupCount > 0 {
		s = c.stats.StartupSum / time.Duration(c.stats.StartupCount)
	}
	return s + c.gap
}

func (c *Controller) pendingCount(model string) int {
	n := 0
	for _, p := range c.pending {
		if model == "" || p.model == model {
			n += p.n
		}
	}
	return n
}

// takePending consumes one worker of the oldest borrow of model.
func (c *Controller) takePending(model string) (time.Duration, bool) {
	for i := range c.pending {
		if p := &c.pending[i]; p.model == model {
			at := p.at
			if p.n--; p.n == 0 {
				c.pending = slices.Delete(c.pending, i, i+1)
			}
			return at, true
		}
	}
	return 0, false
}

// dropPending forgets n workers of model's newest borrows.
func (c *Controller) dropPending(model string, n int) {
	for i := len(c.pending) - 1; i >= 0 && n > 0; i-- {
		p := &c.pending[i]
		if p.model != model {
			continue
		}
		d := min(n, p.n)
		p.n -= d
		n -= d
		if p.n == 0 {
			c.pending = slices.Delete(c.pending, i, i+1)
		}
	}
}
