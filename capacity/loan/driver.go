// Package loan is the driver of capacity loaning: beside the router (in
// prism up) it ticks the capacity controller with what the router's
// /metrics and registry say, carries out its decisions through a
// capacity.Provider, logs each with its reason and keeps their timeline.
// The controller decides; the driver does the IO.
package loan

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
)

// Options configure a Driver.
type Options struct {
	Provider capacity.Provider
	// Controller are the controller's options (defaulted by New).
	Controller capacity.Options
	// Model names the dense pool in the observation and the metrics:
	// every dense worker serves every model of prism up, so the pool is
	// sized as one.
	Model string
	// Registry lists the router's registry.
	Registry func(ctx context.Context) ([]*prismv1.WorkerInfo, error)
	// RouterMetrics is the router's /metrics URL now ("" while unknown),
	// or several, comma-separated: with several routers (on Kubernetes)
	// the demand is the sum of theirs.
	RouterMetrics func() string
	// CapacityPerWorker is one dense worker's requests/s; 0 measures it
	// when the workers saturate (requests shed, or the p99 over its
	// limit): the requests/s served then over the serving workers.
	CapacityPerWorker float64
	// Tick is the controller's period (default 1s).
	Tick time.Duration
	// Window is how far back the demand's rates and p99 are measured
	// (default 2s, at least a tick): a short tick sees Poisson noise.
	Window time.Duration
	// Logf gets one line per borrow, drain, return, reclaim and shed
	// advice (default: discarded).
	Logf func(format string, args ...any)
	// Promotions are the promotion calendar policy=predictive forecasts
	// with (capacity.Scaled: the demand measured now scaled by it).
	Promotions []Promotion
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Client *http.Client
}

// minShedFrac is the share of the offered requests shed that reads as
// saturation, for a capacity measured (no CapacityPerWorker): a request
// or two refused in a burst at low load (admission's own bound) set the
// capacity per worker to the low rate served then, which only a later
// saturation could raise, and with the workers it had the controller
// borrow none came.
const minShedFrac = 0.01

// registrySettle is how long after a router restart (its counters went
// back, the routers scraped changed, a scrape failed) an owned dense
// worker the registry no longer lists still counts: a restarted
// router's registry starts empty and fills as the workers announce
// again (within a few heartbeats; their reconnection backs off to 2 s).
// Taken at its word, the owned workers were gone, the demand that
// stands looked uncovered, and the controller borrowed the owned
// workers' worth from the lender, held then for the minimum lease.
const registrySettle = 30 * time.Second

type timedSample struct {
	at time.Time
	s  sample
}

// Event is one line of the loan timeline.
type Event struct {
	// T is seconds since the driver started.
	T      float64 `json:"t"`
	Kind   string  `json:"kind"` // borrow, drain, return, shed, reclaim, borrow failed, serving
	Worker string  `json:"worker,omitempty"`
	// Workers are a borrow's workers, as the lender named them.
	Workers []string `json:"workers,omitempty"`
	N       int      `json:"n,omitempty"`
	Frac    float64  `json:"frac,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Borrowed is the workers borrowed after it (asked for, starting,
	// serving or draining).
	Borrowed int `json:"borrowed"`
}

// Driver runs the controller. Its methods are safe for concurrent use.
type Driver struct {
	o     Options
	mu    sync.Mutex
	ctl   *capacity.Controller
	start time.Time
	// samples are the router's metrics over the last Window, oldest first.
	samples []timedSample
	// lastDemand is the last demand measured: it stands at a tick that
	// cannot measure one (a router restarted, no router to scrape).
	lastDemand demand
	// shedLogged is the last shed advice logged.
	shedLogged float64
	cap        float64 // measured capacity per worker
	// failures are borrowed workers the provider did not deliver, for
	// the next observation; failed the ids already reported.
	failures int
	failed   map[string]bool
	serving  map[string]bool // lent workers seen serving
	// owned are the owned dense workers the registry listed, by id;
	// settleUntil ends the refill of a restarted router's registry
	// (registrySettle), during which an owned worker it does not list
	// yet still counts.
	owned         map[string]string // id: its address
	settleUntil   time.Time
	scrapeFailing bool // the last scrape failed
	// events is the timeline (record), dropped how many of its oldest
	// events were let go (maxEvents).
	events  []Event
	dropped int
	lastObs capacity.ModelObs
}

// New returns a driver; it starts nothing.
func New(o Options) (*Driver, error) {
	if o.Provider == nil || o.Registry == nil || o.RouterMetrics == nil {
		return nil, errors.New("loan: a provider, the registry and the router's metrics are needed")
	}
	if o.Model == "" {
		o.Model = "dense"
	}
	if o.Tick <= 0 {
		o.Tick = time.Second
	}
	if o.Window <= 0 {
		o.Window = 2 * time.Second
	}
	o.Window = max(o.Window, o.Tick)
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 5 * time.Second}
	}
	ctl, err := capacity.New(o.Controller)
	if err != nil {
		return nil, err
	}
	return &Driver{o: o, ctl: ctl, start: o.Now(), failed: map[string]bool{}, serving: map[string]bool{}, owned: map[string]string{}}, nil
}

// Options returns the controller's options, defaults filled.
func (d *Driver) Options() capacity.Options { return d.ctl.Options() }

// Run ticks until ctx ends.
func (d *Driver) Run(ctx context.Context) {
	t := time.NewTicker(d.o.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := d.Step(ctx); err != nil && ctx.Err() == nil {
			d.o.Logf("loan: tick: %v", err)
		}
	}
}

// Step is one tick: observe, decide, act.
func (d *Driver) Step(ctx context.Context) error {
	now := d.o.Now()
	pl, returns, err := d.tick(ctx, now)
	for _, id := range returns {
		_ = d.o.Provider.Return(ctx, id)
	}
	if err != nil {
		return err
	}
	for _, dec := range pl.Decisions {
		d.act(ctx, now, dec)
	}
	return nil
}

// Plan is what a tick observed and what the controller decided.
type Plan struct {
	// Routers are the /metrics URLs scraped; ScrapeErr is why one failed
	// (then none is summed: the demand is the last one measured).
	Routers   []string
	ScrapeErr error
	// Measured: the demand is a rate since a scrape a window before, not
	// the last one measured (none yet, or a router restarted).
	Measured bool
	// Obs is what the controller was given: the demand, the dense
	// workers and their states, the capacity per worker.
	Obs capacity.ModelObs
	// Idle is what the lender said it could lend.
	Idle      int
	Decisions []capacity.Decision
}

// DryRun is a tick that carries nothing out (prism loan --dry-run): it
// scrapes the routers, waits the window, then lists the registry,
// scrapes them again, asks the lender's idle count and ticks the
// controller as Step does, and returns what it would decide now from
// the demand between the two scrapes; nothing is borrowed, drained or
// returned. The first scrape takes no tick: a decision of its own (one
// more worker for a queue over its limit) would be pending at the
// second, which then showed none.
func (d *Driver) DryRun(ctx context.Context) (Plan, error) {
	_, _, _, _ = d.measure(ctx, d.o.Now()) // a failure shows again at the tick
	select {
	case <-ctx.Done():
		return Plan{}, ctx.Err()
	case <-time.After(d.o.Window):
	}
	pl, _, err := d.tick(ctx, d.o.Now())
	return pl, err
}

// Window is how far back the demand is measured.
func (d *Driver) Window() time.Duration { return d.o.Window }

// tick observes and decides; returns are lent workers that never
// started, to hand back.
func (d *Driver) tick(ctx context.Context, now time.Time) (Plan, []string, error) {
	var pl Plan
	ws, err := d.o.Registry(ctx)
	if err != nil {
		return pl, nil, fmt.Errorf("list the registry: %w", err)
	}
	dem, urls, measured, scrapeErr := d.measure(ctx, now)
	if scrapeErr != nil && ctx.Err() != nil {
		return pl, nil, scrapeErr
	}
	if urls != "" {
		pl.Routers = strings.Split(urls, ",")
	}
	pl.ScrapeErr, pl.Measured = scrapeErr, measured
	idle, err := d.o.Provider.Idle(ctx)
	if err != nil {
		return pl, nil, fmt.Errorf("lender idle: %w", err)
	}
	pl.Idle = idle
	lent := d.o.Provider.Workers()

	d.mu.Lock()
	obs, returns := d.observe(now, dem, ws, lent, idle)
	pl.Obs = d.lastObs
	pl.Decisions, err = d.ctl.Tick(now.Sub(d.start), obs)
	d.mu.Unlock()
	return pl, returns, err
}

// measure scrapes the routers and keeps the sample: dem is the demand
// since the window's oldest sample (measured), else the last one
// measured, which stands; urls are the /metrics URLs scraped, err why a
// scrape failed.
func (d *Driver) measure(ctx context.Context, now time.Time) (dem demand, urls string, measured bool, err error) {
	d.mu.Lock()
	dem = d.lastDemand // what stands when this tick does not measure it
	d.mu.Unlock()
	// The routers' samples summed, each read on its own (sample.add: the
	// routers' latency buckets may differ).
	s := sample{buckets: map[float64]float64{}}
	var scrapeErr error
	urls = d.o.RouterMetrics()
	if urls != "" {
		for url := range strings.SplitSeq(urls, ",") {
			l, err := scrape(ctx, d.o.Client, url)
			if err != nil {
				scrapeErr = err
				break
			}
			s.add(routerSample(l))
		}
	}
	switch {
	case scrapeErr != nil && ctx.Err() != nil:
		return dem, urls, false, scrapeErr
	case scrapeErr != nil:
		// A router down or restarting (one of several gone from the
		// headless Service): the demand is unknown, and the last one
		// measured stands, as for a router's counters going back. The
		// tick goes on: failing it left reclaims undrained past the
		// lender's grace and drained workers unreturned until the
		// metrics came back.
		d.o.Logf("loan: scrape the router's metrics: %v; the last demand measured, %.1f requests/s, stands", scrapeErr, dem.offered)
		d.mu.Lock()
		if !d.scrapeFailing {
			// A router going down or restarting: its registry may
			// refill. Only at the first failure, so that a router whose
			// metrics stay down does not keep dead owned workers counted.
			d.settle(now)
		}
		d.scrapeFailing = true
		d.mu.Unlock()
	case urls != "":
		s.routers = urls
		d.mu.Lock()
		d.scrapeFailing = false
		// The base is the oldest sample within the window.
		for len(d.samples) > 1 && now.Sub(d.samples[1].at) >= d.o.Window {
			d.samples = d.samples[1:]
		}
		dem.queue = int(s.inflight)
		if len(d.samples) > 0 {
			base := d.samples[0]
			if base.s.routers != s.routers {
				// A router joined the addresses scraped, or left them (a
				// readiness probe failed, a scale-out): the sum gained or
				// lost a whole router's count since it started, which is
				// no demand of this window. Read as one, a router back
				// after a tick away was a phantom peak of its lifetime's
				// requests that borrowed all the lender had. As for a
				// restart, the last demand stands and the window starts
				// again from this sample.
				d.o.Logf("loan: the routers scraped changed (%d, were %d): the last demand measured, %.1f requests/s, stands until the next tick measures one", strings.Count(urls, ",")+1, strings.Count(base.s.routers, ",")+1, d.lastDemand.offered)
				d.samples = d.samples[:0]
				d.settle(now)
			} else if got, ok := between(base.s, s, now.Sub(base.at)); ok {
				dem, d.lastDemand, measured = got, got, true
			} else if s.requests < base.s.requests || s.shed < base.s.shed {
				// A router restarted: its counters start again from this
				// sample, and the last demand stands until the window has
				// one after it. Read as no demand, it drained every
				// borrowed worker in the middle of a peak.
				d.o.Logf("loan: the router's request counters went back (a router restarted): the last demand measured, %.1f requests/s, stands until the next tick measures one", d.lastDemand.offered)
				d.samples = d.samples[:0]
				d.settle(now)
			}
		}
		d.samples = append(d.samples, timedSample{now, s})
		d.mu.Unlock()
	}
	return dem, urls, measured, scrapeErr
}

// observe builds the observation; returns are lent workers that never
// started, to hand back. d.mu is held.
func (d *Driver) observe(now time.Time, dem demand, ws []*prismv1.WorkerInfo, lent []capacity.LentWorker, idle int) (capacity.Observation, []string) {
	byAddr := map[string]*prismv1.WorkerInfo{}
	for _, w := range ws {
		if w.GetRole() == prismv1.Role_ROLE_DENSE {
			byAddr[w.GetAddr()] = w
		}
	}
	m := capacity.ModelObs{Model: d.o.Model, Offered: dem.offered, Shed: dem.shed, P99: dem.p99, QueueDepth: dem.queue}
	if len(d.o.Promotions) > 0 {
		// The calendar is in wall time, the controller's time the
		// monotonic time since the start: placed from now's wall clock,
		// not the start's, so that a step of the clock since (NTP
		// correcting a clock wrong at the start, a VM resumed from a
		// snapshot) does not shift every promotion by the step for the
		// rest of the run.
		elapsed := now.Sub(d.start)
		m.Forecast = &capacity.Scaled{Now: elapsed, Offered: dem.offered, Promotions: Relative(d.o.Promotions, now.Add(-elapsed))}
	}
	var returns []string
	lentAddr, lentIDs := map[string]bool{}, map[string]bool{}
	serving := 0
	for _, lw := range lent {
		lentIDs[lw.ID] = true
		if lw.Addr != "" {
			lentAddr[lw.Addr] = true
		}
		reg := byAddr[lw.Addr]
		w := capacity.Worker{ID: lw.ID, Borrowed: true}
		switch {
		case !lw.Running && lw.Addr == "" && !lw.Draining && !d.ctl.Holds(lw.ID):
			// Never served, never seen by the controller: a failed
			// borrow. (One the controller saw starting holds its lease:
			// it died, and is returned as lost below; reported as a
			// failed borrow, it was handed back under a lease that went
			// on counting it, and cancelled another borrow.)
			if !d.failed[lw.ID] {
				d.failed[lw.ID] = true
				d.failures++
				d.record(now, Event{Kind: "borrow failed", Worker: lw.ID, Reason: "did not start"})
			}
			returns = append(returns, lw.ID)
			continue
		case !lw.Running && !lw.Draining:
			continue // it died: the controller returns it as lost
		case !lw.Running && d.ctl.Holds(lw.ID):
			// Drained and exited (or dead, then drained as lost): gone,
			// and returned as its drain's reason says. Shown draining
			// with nothing in flight, a lost worker's return was counted
			// as drained. (One the controller does not hold is shown, so
			// that a return the lender failed is adopted and retried.)
			continue
		case lw.Draining:
			w.State = capacity.Draining
			if lw.Running {
				w.InFlight = 1 // until it exits: it holds what it was given
				if reg != nil {
					w.InFlight = max(1, int(reg.GetOutstanding()))
				}
			}
		case reg != nil:
			w.State, w.InFlight = capacity.Serving, int(reg.GetOutstanding())
			serving++
			if !d.serving[lw.ID] {
				d.serving[lw.ID] = true
				d.record(now, Event{Kind: "serving", Worker: lw.ID, Reason: fmt.Sprintf("%.2fs after it was lent", now.Sub(lw.Lent).Seconds())})
			}
		default:
			w.State = capacity.Starting
		}
		m.Workers = append(m.Workers, w)
	}
	// A worker the lender no longer lends (returned) is forgotten: kept,
	// one per borrow, they grew without bound (an id lent again is a new
	// worker, reported anew).
	maps.DeleteFunc(d.failed, func(id string, _ bool) bool { return !lentIDs[id] })
	maps.DeleteFunc(d.serving, func(id string, _ bool) bool { return !lentIDs[id] })
	listed := map[string]string{}
	for _, w := range ws {
		if w.GetRole() != prismv1.Role_ROLE_DENSE || lentAddr[w.GetAddr()] {
			continue
		}
		m.Workers = append(m.Workers, capacity.Worker{ID: w.GetId(), State: capacity.Serving, InFlight: int(w.GetOutstanding())})
		listed[w.GetId()] = w.GetAddr()
		serving++
	}
	if now.Before(d.settleUntil) {
		// A restarted router's registry refills: the owned workers it
		// listed before and does not list again yet still count (as
		// capacity, not as serving for the measured capacity).
		for _, id := range slices.Sorted(maps.Keys(d.owned)) {
			if _, ok := listed[id]; !ok && !lentIDs[id] && !lentAddr[d.owned[id]] {
				m.Workers = append(m.Workers, capacity.Worker{ID: id, State: capacity.Serving})
				listed[id] = d.owned[id]
			}
		}
	}
	d.owned = listed
	m.CapacityPerWorker = d.o.CapacityPerWorker
	if m.CapacityPerWorker == 0 {
		p99 := d.ctl.Options().P99Limit
		if served := dem.offered - dem.shed; serving > 0 && served > 0 && (dem.shed >= minShedFrac*dem.offered && dem.shed > 0 || (p99 > 0 && dem.p99 > p99)) {
			if c := served / float64(serving); c > d.cap {
				d.cap = c
				d.o.Logf("loan: measured capacity %.1f requests/s per dense worker (%.1f served by %d while saturated)", c, served, serving)
			}
		}
		m.CapacityPerWorker = d.cap
	}
	obs := capacity.Observation{Models: []capacity.ModelObs{m}, LenderIdle: idle}
	if d.failures > 0 {
		obs.BorrowFailures = []capacity.BorrowFailure{{Model: d.o.Model, N: d.failures}}
		d.failures = 0
	}
	for {
		select {
		case r := <-d.o.Provider.Reclaims():
			// The grace runs from the lender's reclaim, not from this
			// tick: timed from the tick, a worker of a lender that
			// takes its device back at the grace's end (the local one
			// relies on the controller for it) was held up to a tick
			// past it.
			at := now
			if !r.At.IsZero() && r.At.Before(now) {
				at = r.At
			}
			obs.Reclaims = append(obs.Reclaims, capacity.Reclaim{Worker: r.Worker, Deadline: at.Sub(d.start) + r.Grace})
			d.record(now, Event{Kind: "reclaim", Worker: r.Worker, Reason: fmt.Sprintf("lender, %s grace", r.Grace)})
			d.o.Logf("loan: the %s lender reclaims %s (grace %s)", d.o.Provider.Name(), r.Worker, r.Grace)
			continue
		default:
		}
		break
	}
	d.lastObs = m
	return obs, returns
}

// settle starts (or extends) the refill of a restarted router's
// registry: see registrySettle. d.mu is held.
func (d *Driver) settle(now time.Time) {
	d.settleUntil = now.Add(max(registrySettle, 3*d.o.Tick))
}

// act carries out one decision and logs it.
func (d *Driver) act(ctx context.Context, now time.Time, dec capacity.Decision) {
	ev := Event{Kind: dec.Kind.String(), Worker: dec.Worker, N: dec.N, Frac: dec.Frac, Reason: dec.Reason}
	d.mu.Lock()
	obs := d.lastObs
	d.mu.Unlock()
	switch dec.Kind {
	case capacity.Borrow:
		ids, err := d.o.Provider.Borrow(ctx, dec.Model, dec.N)
		ev.Workers = ids
		d.o.Logf("loan: borrow %d dense worker(s) from %s (%s: %.1f requests/s offered, %.1f shed, p99 %s, capacity %.1f per worker): %v",
			dec.N, d.o.Provider.Name(), dec.Reason, obs.Offered, obs.Shed, obs.P99, obs.CapacityPerWorker, ids)
		if err != nil {
			d.o.Logf("loan: borrow: %v", err)
			d.mu.Lock()
			d.failures += dec.N - len(ids)
			d.mu.Unlock()
		}
	case capacity.Drain:
		d.o.Logf("loan: drain %s (%s): it leaves the registry and finishes what it holds", dec.Worker, dec.Reason)
		if err := d.o.Provider.Drain(ctx, dec.Worker); err != nil {
			d.o.Logf("loan: drain %s: %v", dec.Worker, err)
		}
	case capacity.Return:
		d.o.Logf("loan: return %s to %s (%s)", dec.Worker, d.o.Provider.Name(), dec.Reason)
		if err := d.o.Provider.Return(ctx, dec.Worker); err != nil {
			d.o.Logf("loan: return %s: %v", dec.Worker, err)
		}
	case capacity.Shed:
		// The router has no hook to shed a fraction early: its admission
		// already refuses, with ResourceExhausted, what it predicts would
		// finish past the deadline. The advice is logged and counted.
		// Logged when it moves by 5 points or more, or to or from none:
		// the advice follows the offered rate, which moves every tick.
		d.mu.Lock()
		last := d.shedLogged
		show := math.Abs(dec.Frac-last) >= 0.05 || (dec.Frac == 0) != (last == 0)
		if show {
			d.shedLogged = dec.Frac
		}
		d.mu.Unlock()
		if show {
			d.o.Logf("loan: shed advice %.0f%% of %s (%s); not applied: the router's admission sheds on its own", 100*dec.Frac, dec.Model, dec.Reason)
		}
	}
	d.mu.Lock()
	d.record(now, ev)
	d.mu.Unlock()
}

// maxEvents bounds the timeline GET /loan shows: its newest events. A
// loan runs for weeks, borrowing for every peak (and, with a lender that
// cannot start workers, retrying every few ticks); the whole history
// grew the process and every GET /loan copied and sent it. The counts
// (Status.Counts by kind and reason, Status.Startup's count of workers
// serving) cover the whole run.
const maxEvents = 1000

// record appends ev to the timeline. d.mu is held.
func (d *Driver) record(now time.Time, ev Event) {
	ev.T = now.Sub(d.start).Seconds()
	st := d.ctl.Stats()
	for _, n := range st.Borrowed {
		ev.Borrowed += n
	}
	for _, n := range st.Pending {
		ev.Borrowed += n
	}
	d.events = append(d.events, ev)
	if n := len(d.events) - maxEvents; n >= maxEvents {
		// Dropped in bulk, into a new array, so that a record costs O(1)
		// over time and the old events are freed.
		d.dropped += n
		d.events = append(make([]Event, 0, 2*maxEvents), d.events[n:]...)
	}
}

// timeline is the newest maxEvents events, a copy, and how many older
// ones were dropped. d.mu is held.
func (d *Driver) timeline() ([]Event, int) {
	skip := max(0, len(d.events)-maxEvents)
	return append([]Event{}, d.events[skip:]...), d.dropped + skip
}

// Stats are the controller's counters.
func (d *Driver) Stats() capacity.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctl.Stats()
}

// Collector exports the controller's counters.
// Its borrowed workers' gauge has the driver's model at 0 when nothing
// is borrowed: absent, a reader (prism loadgen --watch-borrowed) could
// not tell none from a wrong URL.
func (d *Driver) Collector() *capacity.Collector {
	return capacity.NewCollector(func() capacity.Stats {
		s := d.Stats()
		if _, ok := s.Borrowed[d.o.Model]; !ok {
			s.Borrowed[d.o.Model] = 0
		}
		return s
	})
}

// Status is what GET /loan answers.
type Status struct {
	Provider string                `json:"provider"`
	Borrowed int                   `json:"borrowed"`
	Workers  []capacity.LentWorker `json:"workers"`
	Events   []Event               `json:"events"`
	// EventsDropped counts the events older than Events, no longer kept
	// (maxEvents); Counts and Startup still count them.
	EventsDropped int                `json:"events_dropped"`
	Counts        map[string]int     `json:"events_by_kind_reason"`
	Startup       map[string]float64 `json:"decision_to_serving_s"`
	GPUHours      float64            `json:"borrowed_gpu_hours"`
	Capacity      float64            `json:"capacity_per_worker_rps"`
	// CutOff is the work still in flight on workers released at a
	// deadline (a reclaim's grace ended): requests dropped.
	CutOff int            `json:"released_in_flight"`
	Last   map[string]any `json:"last_observation"`
}

// Status reports the driver's state.
func (d *Driver) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.ctl.Stats()
	// Empty lists are [], not null, for the readers of GET /loan.
	events, dropped := d.timeline()
	st := Status{Provider: d.o.Provider.Name(), Workers: append([]capacity.LentWorker{}, d.o.Provider.Workers()...), Events: events, EventsDropped: dropped, Counts: map[string]int{},
		GPUHours: s.BorrowedGPUSeconds / 3600, Capacity: d.lastObs.CapacityPerWorker, CutOff: s.ReleasedWithInFlight,
		Last: map[string]any{"offered_rps": d.lastObs.Offered, "shed_rps": d.lastObs.Shed, "p99_s": d.lastObs.P99.Seconds(), "queue": d.lastObs.QueueDepth}}
	for _, n := range s.Borrowed {
		st.Borrowed += n
	}
	for k, n := range s.Events {
		st.Counts[k.Kind+": "+k.Reason] = n
	}
	st.Startup = map[string]float64{"count": float64(s.StartupCount), "max": s.StartupMax.Seconds()}
	if s.StartupCount > 0 {
		st.Startup["mean"] = (s.StartupSum / time.Duration(s.StartupCount)).Seconds()
	}
	return st
}
