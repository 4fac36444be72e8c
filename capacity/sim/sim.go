// Package sim is the what-if simulation of capacity loaning: it replays a
// demand trace through the capacity controller on a simulated clock, with
// a lender that hands out workers which serve after a startup delay and
// reclaims some of them with a grace period, and reports what static
// provisioning for the peak would have needed against what loaning used.
//
// The model per tick: capacity is the serving workers (owned, and
// borrowed ones past their startup and not drained) times the capacity of
// one worker; the demand above it misses the SLO (shed or late). A
// drained worker finishes its in-flight work in Drain.
package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// Config is one simulation.
type Config struct {
	// Step and Rates are the demand trace, samples/s: Rates[i] over
	// [i*Step, (i+1)*Step). It is also the seasonal history the
	// predictive policy forecasts from.
	Step  time.Duration
	Rates []float64
	// Promotions multiply the demand (and are on the forecast's calendar).
	Promotions []capacity.Promotion
	// CapacityPerWorker is the samples/s one dense worker serves.
	CapacityPerWorker float64
	// Controller are the controller's options (policy included).
	Controller capacity.Options
	// Owned is the dense workers the service owns; 0 sizes it for the
	// median of the trace without promotions at the controller's target.
	Owned int
	// Tick is the controller's period (10s).
	Tick time.Duration
	// Startup is the time from a borrow to the worker serving (90s).
	Startup time.Duration
	// Drain is the time a drained worker needs to finish its in-flight
	// work (1s).
	Drain time.Duration
	// Reclaims are times at which the lender takes back one borrowed
	// worker (the newest), with Grace from then to release it (30s): at
	// the deadline the lender takes it, whatever it still serves or holds.
	Reclaims []time.Duration
	Grace    time.Duration
	// LenderIdle is how many workers the lender can lend at most (1000).
	LenderIdle int
	// Exact: a zero Tick, Startup, Drain, Grace or LenderIdle means zero,
	// not the default named beside it (prism plan loan sets every field
	// from its flags, whose defaults are those: a user who types
	// --lender-idle 0 asks what happens when the lender has nothing to
	// lend, and --tick 0 is refused).
	Exact bool
}

// EnsureDefaults fills zero fields (unless Exact, only the controller's
// and the ones that have no meaning at zero).
func (c *Config) EnsureDefaults() {
	if !c.Exact {
		if c.Tick == 0 {
			c.Tick = 10 * time.Second
		}
		if c.Startup == 0 {
			c.Startup = 90 * time.Second
		}
		if c.Drain == 0 {
			c.Drain = time.Second
		}
		if c.Grace == 0 {
			c.Grace = 30 * time.Second
		}
		if c.LenderIdle == 0 {
			c.LenderIdle = 1000
		}
	}
	if c.Controller.StartupEstimate == 0 && c.Startup > 0 {
		// The predictive policy looks ahead by the start-up until it
		// has measured one: the simulated one is known (a live run is
		// told it, startup=). With the controller's default (2m), a
		// longer start borrowed too late for the first promotion, the
		// only one of most what-ifs.
		c.Controller.StartupEstimate = c.Startup
	}
	if c.Controller.BorrowTimeout == 0 {
		// The simulated workers take Startup to serve: the controller
		// must not give up on them first (nor do its default's 10m
		// mean anything beside a longer start).
		// Nor before its next decision: a borrow is seen delivered a
		// tick after it was asked for at the soonest.
		c.Controller.BorrowTimeout = max(10*time.Minute, 2*c.Startup, 2*c.Controller.StartupEstimate, 2*c.Tick)
	}
	c.Controller.EnsureDefaults()
	if c.Owned == 0 && c.CapacityPerWorker > 0 && len(c.Rates) > 0 {
		s := slices.Clone(c.Rates)
		slices.Sort(s)
		c.Owned = max(1, int(math.Ceil(s[len(s)/2]/(c.CapacityPerWorker*c.Controller.Target))))
	}
}

// Validate checks c after EnsureDefaults.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Controller.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Step <= 0 || len(c.Rates) == 0 {
		errs = append(errs, errors.New("the demand trace is empty"))
	}
	if !(c.CapacityPerWorker > 0) || math.IsInf(c.CapacityPerWorker, 0) {
		errs = append(errs, fmt.Errorf("capacity per worker must be a positive number, got %v", c.CapacityPerWorker))
	}
	end := c.Step * time.Duration(len(c.Rates)) // the trace's length
	for _, p := range c.Promotions {
		if err := p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("promotion: %w", err))
		} else if end > 0 && p.Start >= end {
			errs = append(errs, fmt.Errorf("promotion at %v starts past the trace's end (%v): it would change nothing", p.Start, end))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"tick", c.Tick}, {"startup", c.Startup}, {"drain", c.Drain}, {"grace", c.Grace}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.Tick <= 0 {
		errs = append(errs, fmt.Errorf("tick %v must be positive", c.Tick))
	} else if end > 0 && end/c.Tick > maxTicks {
		// Every tick is a point of the result: a tick of 1ms over a
		// day's trace grew past 6 GB in 30 s on its way to the OOM
		// killer.
		least := (end + maxTicks - 1) / maxTicks
		if least > time.Millisecond {
			least = (least + time.Millisecond - 1).Truncate(time.Millisecond)
		}
		errs = append(errs, fmt.Errorf("tick %v: the trace's %v is %d ticks of it, more than %d: want a tick of at least %v", c.Tick, end, end/c.Tick, maxTicks, least))
	} else if c.Controller.BorrowTimeout <= c.Tick {
		errs = append(errs, fmt.Errorf("borrow timeout %v must exceed the tick (%v): a borrow is seen delivered a tick after it is asked for at the soonest", c.Controller.BorrowTimeout, c.Tick))
	}
	if c.Owned < 0 || c.LenderIdle < 0 {
		errs = append(errs, fmt.Errorf("owned %d and lender idle %d must not be negative", c.Owned, c.LenderIdle))
	}
	// Each owned worker is simulated: a billion grew past 3 GB in 30 s.
	if c.Owned > MaxOwned {
		errs = append(errs, fmt.Errorf("owned %d: want at most %d, more than any cluster has", c.Owned, MaxOwned))
	}
	if c.CapacityPerWorker > 0 && !math.IsInf(c.CapacityPerWorker, 0) && len(c.Rates) > 0 {
		// The peak, bounded above: the highest rate times the highest
		// product of factors in force at once. Past a float or past any cluster, the report's GPU
		// counts overflowed an int (static for the peak: a negative
		// number of GPUs), or the controller refused a demand of +Inf
		// at the tick that met it, naming no cause.
		f := maxFactor(c.Promotions)
		peak := slices.Max(c.Rates) * f
		if w := peak / c.CapacityPerWorker; !(w <= maxWorkers) {
			errs = append(errs, fmt.Errorf("the peak demand, %g samples/s (the trace's highest rate %g times promotion factors up to %g), needs %g workers of %g samples/s: more than any cluster has; check the trace's scale, the capacity per worker and the promotion factors", peak, slices.Max(c.Rates), f, w, c.CapacityPerWorker))
		}
	}
	for _, r := range c.Reclaims {
		switch {
		case r < 0:
			errs = append(errs, fmt.Errorf("reclaim at %v is negative", r))
		case end > 0 && r >= end:
			errs = append(errs, fmt.Errorf("reclaim at %v is past the trace's end (%v): it would never be injected", r, end))
		}
	}
	return errors.Join(errs...)
}

// maxWorkers bounds the workers a simulation's peak may need (as the
// controller's own bound): far more than any cluster has, far from
// overflowing the report's counts.
const maxWorkers = 1 << 30

// maxTicks bounds a simulation's ticks, each a point of its result
// (about 1.2 KB a tick for the two policies of prism plan loan): a
// day's trace at 100ms ticks is 864,000.
const maxTicks = 1 << 20

// MaxOwned bounds the owned workers, each simulated: a million GPUs,
// more than any cluster has.
const MaxOwned = 1 << 20

// maxFactor bounds the product of promotion factors in force at once:
// 1 (no promotion on), or the product at a promotion's start or end,
// where alone the promotions on change (at an end too: a factor below
// 1 ending inside a larger one raises the product).
func maxFactor(ps []capacity.Promotion) float64 {
	f := 1.0
	for _, p := range ps {
		f = math.Max(f, math.Max(capacity.Factor(ps, p.Start), capacity.Factor(ps, p.Start+p.Duration)))
	}
	return f
}

// Point is the state at one tick.
type Point struct {
	T time.Duration
	// Demand and Capacity are samples/s; Capacity is what serves.
	Demand, Capacity float64
	// Serving counts the serving workers, Borrowed the borrowed ones held.
	Serving, Borrowed int
}

// Result is a simulation's outcome.
type Result struct {
	Points []Point
	Report Report
}

// worker is one simulated dense worker.
type worker struct {
	id        string
	borrowed  bool
	arrived   time.Duration
	draining  bool
	drainedAt time.Duration
}

func (w *worker) serving(now, startup time.Duration) bool {
	return !w.draining && (!w.borrowed || now-w.arrived >= startup)
}

func (w *worker) inFlight(now, drain time.Duration) int {
	if w.draining && now-w.drainedAt < drain {
		return 1
	}
	return 0
}

// rate is the demand at t: the trace times the promotions on.
func (c *Config) rate(t time.Duration) float64 {
	i := min(int(t/c.Step), len(c.Rates)-1)
	return c.Rates[i] * capacity.Factor(c.Promotions, t)
}

// Run simulates c.
func Run(c Config) (*Result, error) {
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("capacity simulation: %w", err)
	}
	ctl, err := capacity.New(c.Controller)
	if err != nil {
		return nil, err
	}
	const model = "m"
	var forecast capacity.Forecaster
	if c.Controller.Policy == capacity.Predictive {
		forecast = &capacity.Seasonal{Step: c.Step, Rates: c.Rates, Promotions: c.Promotions}
	}
	workers := map[string]*worker{}
	for i := range c.Owned {
		id := fmt.Sprintf("owned-%d", i+1)
		workers[id] = &worker{id: id}
	}
	reclaims := slices.Clone(c.Reclaims)
	slices.Sort(reclaims)
	// reclaimed is the lender's deadline for each worker it reclaimed;
	// recl the reclaims the controller hears of at its next tick; cutOff
	// the workers the lender took at their deadline still serving or
	// holding work.
	reclaimed := map[string]time.Duration{}
	var recl []capacity.Reclaim
	cutOff := 0
	rep := Report{Policy: string(c.Controller.Policy), CapacityPerWorker: c.CapacityPerWorker, OwnedGPUs: c.Owned}
	var res Result
	var offered, served float64
	next := 0
	duration := time.Duration(len(c.Rates)) * c.Step
	// lender is what the lender does by now, between the controller's
	// ticks as well: at each reclaim time it takes back the newest
	// borrowed worker with Grace from then (the controller hears of it at
	// its next tick), and at the deadline it takes a worker still lent,
	// whatever it holds. Timed from the controller's tick, the grace ran
	// past the lender's: with a tick longer than the grace a worker still
	// serving at the real deadline counted as survived.
	lender := func(now time.Duration) {
		for len(reclaims) > 0 && reclaims[0] <= now {
			at := reclaims[0]
			reclaims = reclaims[1:]
			var newest *worker
			for _, w := range workers {
				_, taken := reclaimed[w.id]
				if w.borrowed && !w.draining && !taken && (newest == nil || w.arrived > newest.arrived || w.arrived == newest.arrived && w.id > newest.id) {
					newest = w
				}
			}
			if newest == nil {
				rep.ReclaimsSkipped++
				continue
			}
			rep.Reclaims++
			reclaimed[newest.id] = at + c.Grace
			recl = append(recl, capacity.Reclaim{Worker: newest.id, Deadline: at + c.Grace})
		}
		for id, deadline := range reclaimed {
			w := workers[id]
			if w == nil || now < deadline {
				continue
			}
			if w.draining && w.inFlight(now, c.Drain) == 0 {
				rep.ReclaimsSurvived++
			} else {
				cutOff++
			}
			delete(workers, id)
		}
	}
	// nextLender is the lender's next reclaim or deadline after now.
	nextLender := func(now time.Duration) time.Duration {
		t := duration
		if len(reclaims) > 0 {
			t = min(t, reclaims[0])
		}
		for id, deadline := range reclaimed {
			if workers[id] != nil && deadline > now {
				t = min(t, deadline)
			}
		}
		return t
	}
	// nextStart is when the next borrowed worker still starting serves
	// after now: from then it adds its capacity. Stepping past it to
	// the next tick or step, a 90s start under a 1m tick served from
	// 2m and the report counted the 30s between as missing the SLO.
	nextStart := func(now time.Duration) time.Duration {
		t := duration
		for _, w := range workers {
			if at := w.arrived + c.Startup; w.borrowed && !w.draining && at > now {
				t = min(t, at)
			}
		}
		return t
	}
	// tick is one decision of the controller at now: the observation,
	// with the lender's reclaims since the last tick, and the decisions
	// carried out.
	tick := func(now time.Duration, d, capa float64, borrowed int) error {
		mo := capacity.ModelObs{Model: model, Offered: d, CapacityPerWorker: c.CapacityPerWorker, Forecast: forecast}
		ids := make([]string, 0, len(workers))
		for id := range workers {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			w := workers[id]
			st := capacity.Starting
			switch {
			case w.draining:
				st = capacity.Draining
			case w.serving(now, c.Startup):
				st = capacity.Serving
			}
			mo.Workers = append(mo.Workers, capacity.Worker{ID: id, Borrowed: w.borrowed, State: st, InFlight: w.inFlight(now, c.Drain)})
		}
		mo.Shed = math.Max(0, d-capa)
		ds, err := ctl.Tick(now, capacity.Observation{Models: []capacity.ModelObs{mo}, LenderIdle: max(0, c.LenderIdle-borrowed), Reclaims: recl})
		if err != nil {
			return err
		}
		recl = nil
		for _, dec := range ds {
			switch dec.Kind {
			case capacity.Borrow:
				for range dec.N {
					next++
					id := fmt.Sprintf("borrowed-%d", next)
					workers[id] = &worker{id: id, borrowed: true, arrived: now}
				}
			case capacity.Drain:
				if w := workers[dec.Worker]; w != nil {
					w.draining, w.drainedAt = true, now
				}
			case capacity.Return:
				w := workers[dec.Worker]
				if w == nil {
					continue
				}
				if _, ok := reclaimed[w.id]; ok && w.inFlight(now, c.Drain) == 0 {
					rep.ReclaimsSurvived++
				}
				delete(workers, dec.Worker)
			}
		}
		return nil
	}
	// Time advances to the controller's next tick or the trace's next
	// step, whichever is first: a controller that decides every hour
	// still faces the trace's minute-by-minute demand, which is what its
	// workers serve (or shed) between its decisions, and a tick that
	// does not divide the step (10s against a 57s trace) neither carries
	// a step's demand into the next one nor runs past the trace's end.
	var inSLO time.Duration
	nextTick, lastTick := time.Duration(0), time.Duration(0)
	for now := time.Duration(0); now < duration; {
		lender(now)
		d := c.rate(now)
		rep.PeakDemand = math.Max(rep.PeakDemand, d)
		serving, borrowed := 0, 0
		for _, w := range workers {
			if !w.draining && w.serving(now, c.Startup) {
				serving++
			}
			if w.borrowed {
				borrowed++
			}
		}
		capa := float64(serving) * c.CapacityPerWorker
		if now >= nextTick {
			nextTick += c.Tick
			lastTick = now
			if err := tick(now, d, capa, borrowed); err != nil {
				return nil, err
			}
		}
		end := min(nextTick, (now/c.Step+1)*c.Step, nextLender(now), nextStart(now))
		dt := end - now
		// What this step served: the workers serving when it began.
		offered += d * dt.Seconds()
		served += math.Min(d, capa) * dt.Seconds()
		if d <= capa {
			inSLO += dt
		}
		rep.PeakBorrowed = max(rep.PeakBorrowed, borrowed)
		res.Points = append(res.Points, Point{T: now, Demand: d, Capacity: capa, Serving: serving, Borrowed: borrowed})
		now = end
	}
	// The controller counts a lease's time up to its last tick: the
	// workers it still holds are held to the trace's end too.
	held := 0
	for id := range workers {
		if ctl.Holds(id) {
			held++
		}
	}
	st := ctl.Stats()
	hours := duration.Hours()
	rep.TraceHours = hours
	rep.StaticGPUs = int(math.Ceil(rep.PeakDemand / c.CapacityPerWorker))
	rep.BorrowedGPUHours = (st.BorrowedGPUSeconds + float64(held)*(duration-lastTick).Seconds()) / 3600
	rep.StaticGPUHours = float64(rep.StaticGPUs) * hours
	rep.LoanGPUHours = float64(c.Owned)*hours + rep.BorrowedGPUHours
	if rep.StaticGPUHours > 0 {
		rep.GPUHoursSavedPct = 100 * (1 - rep.LoanGPUHours/rep.StaticGPUHours)
	}
	if extra := float64(rep.StaticGPUs-c.Owned) * hours; extra > 0 {
		rep.PeakGPUHoursSavedPct = 100 * (1 - rep.BorrowedGPUHours/extra)
	}
	if offered > 0 {
		rep.SLOAttainmentPct = 100 * served / offered
	} else {
		rep.SLOAttainmentPct = 100
	}
	rep.TicksInSLOPct = 100 * inSLO.Seconds() / duration.Seconds()
	rep.ReleasedWithInFlight = st.ReleasedWithInFlight + cutOff
	if st.StartupCount > 0 {
		rep.DecisionToServingS = (st.StartupSum / time.Duration(st.StartupCount)).Seconds()
	}
	rep.Events = map[string]int{}
	for k, n := range st.Events {
		rep.Events[k.Kind+": "+k.Reason] += n
	}
	rep.BorrowedWorkers = st.BorrowedWorkers
	rep.Claim = PaperClaim
	res.Report = rep
	return &res, nil
}

// PaperClaim is the production result the simulation is set against.
const PaperClaim = "Prism (NSDI'25): during promotions, loaning GPUs from training clusters saved over 90% of the GPUs that static provisioning for the peak would need"

// Report sums a simulation up.
type Report struct {
	Policy            string  `json:"policy"`
	TraceHours        float64 `json:"trace_hours"`
	PeakDemand        float64 `json:"peak_demand"`
	CapacityPerWorker float64 `json:"capacity_per_worker"`
	// StaticGPUs is ceil(peak demand / capacity per worker): one GPU per
	// worker, provisioned for the peak all the time.
	StaticGPUs int `json:"static_gpus"`
	OwnedGPUs  int `json:"owned_gpus"`
	// PeakBorrowed is the most workers borrowed at once.
	PeakBorrowed     int     `json:"peak_borrowed"`
	BorrowedWorkers  int     `json:"borrowed_workers"`
	BorrowedGPUHours float64 `json:"borrowed_gpu_hours"`
	// StaticGPUHours is StaticGPUs over the trace; LoanGPUHours the owned
	// workers over the trace plus the borrowed GPU-hours.
	StaticGPUHours float64 `json:"static_gpu_hours"`
	LoanGPUHours   float64 `json:"loan_gpu_hours"`
	// GPUHoursSavedPct is 1 - LoanGPUHours/StaticGPUHours;
	// PeakGPUHoursSavedPct 1 - borrowed GPU-hours over the GPU-hours of
	// the GPUs static provisioning adds above the owned ones.
	GPUHoursSavedPct     float64 `json:"gpu_hours_saved_pct"`
	PeakGPUHoursSavedPct float64 `json:"peak_gpu_hours_saved_pct"`
	// SLOAttainmentPct is the share of offered samples the serving
	// capacity covered; TicksInSLOPct the share of the trace's time with
	// demand within capacity.
	SLOAttainmentPct float64 `json:"slo_attainment_pct"`
	TicksInSLOPct    float64 `json:"ticks_in_slo_pct"`
	// Reclaims were injected; ReclaimsSurvived released with no work in
	// flight (no accepted request dropped); ReclaimsSkipped found no
	// borrowed worker to take.
	Reclaims             int            `json:"reclaims"`
	ReclaimsSurvived     int            `json:"reclaims_survived"`
	ReclaimsSkipped      int            `json:"reclaims_skipped"`
	ReleasedWithInFlight int            `json:"released_with_in_flight"`
	DecisionToServingS   float64        `json:"decision_to_serving_s"`
	Events               map[string]int `json:"events"`
	Claim                string         `json:"paper_claim"`
}
