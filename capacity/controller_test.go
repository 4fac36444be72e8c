package capacity

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestController runs the scripts in testdata/controller: ticks in,
// decisions out, on a logical clock. The script's world carries the
// decisions out as a driver would: a borrow adds workers b1, b2, ...
// (starting) unless delivery is off, a drain takes a worker out of
// serving, a return removes it.
//
//	new [policy=] [target=] [high=] [low=] [p99-limit=] [queue-limit=]
//	    [min-lease=] [cool-down=] [max-borrowed=] [startup=]
//	    [borrow-timeout=] [drain-timeout=] [lost-after=] [deliver=on|off]
//	model <name> cap=<samples/s> [owned=N]       a model and its owned workers
//	demand step=<d> rates=r,r,... [promotion=START,DUR,FACTOR] [forecast]
//	                                             offered load for run (and
//	                                             the seasonal forecast)
//	tick at=<d> [model=m] [offered=] [shed=] [p99=] [queue=] [lender=N]
//	     [cap=]                                  cap: the capacity per worker
//	                                             observed at this tick only
//	run to=<d> every=<d> [serve-after=<d>] [lender=N]
//	                                             ticks from the last time on,
//	                                             offered from demand, borrowed
//	                                             workers serving serve-after
//	                                             after they arrive
//	serving <worker>... | all                    starting workers now serve
//	stop <worker>...                             serving workers leave the
//	                                             registry, still lent and
//	                                             running (a crashed container
//	                                             restarting, a hung worker):
//	                                             observed starting
//	inflight <worker>=<n>...
//	reclaim <worker> grace=<d>                   at the next tick
//	fail <model> <n>                             a borrow failed, next tick
//	vanish <worker>                              gone without notice
//	return-fails <worker>...                     their next return fails: the
//	                                             lender keeps them, draining
//	miss <worker>...                             missing from the next
//	                                             tick's observation only (a
//	                                             failed scrape)
//	workers                                      the world's workers
//	stats                                        the controller's counters
func TestController(t *testing.T) {
	datadriven.Walk(t, "testdata/controller", func(t *testing.T, path string) {
		var w *world
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "new" && w == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			switch d.Cmd {
			case "new":
				o, deliver := parseOptions(t, d)
				c, err := New(o)
				if err != nil {
					return "error: " + strings.ReplaceAll(err.Error(), "\n", "\n  ")
				}
				w = &world{c: c, deliver: deliver, models: map[string]*wmodel{}, workers: map[string]*wworker{}, lender: 100}
				return ""
			case "model":
				name := d.CmdArgs[0].Key
				m := &wmodel{name: name}
				d.ScanArgs(t, "cap", &m.cap)
				owned := 0
				d.MaybeScanArgs(t, "owned", &owned)
				w.models[name] = m
				for i := 1; i <= owned; i++ {
					id := fmt.Sprintf("o%d", i)
					w.workers[id] = &wworker{Worker: Worker{ID: id, State: Serving}, model: name}
				}
				return ""
			case "demand":
				s := &Seasonal{}
				var rates string
				d.ScanArgs(t, "step", &rates)
				s.Step = dur(t, d, rates)
				d.ScanArgs(t, "rates", &rates)
				for _, r := range strings.Split(rates, ",") {
					v, err := strconv.ParseFloat(r, 64)
					if err != nil {
						d.Fatalf(t, "rates: %v", err)
					}
					s.Rates = append(s.Rates, v)
				}
				if a, ok := d.Arg("promotion"); ok {
					p, err := ParsePromotion(strings.Join(a.Vals, ","))
					if err != nil {
						return "error: " + err.Error()
					}
					s.Promotions = []Promotion{p}
				}
				w.demand = s
				w.forecast = d.HasArg("forecast")
				return ""
			case "tick":
				var at string
				d.ScanArgs(t, "at", &at)
				m := w.only(t, d)
				o := tickObs{}
				d.MaybeScanArgs(t, "offered", &o.offered)
				d.MaybeScanArgs(t, "shed", &o.shed)
				d.MaybeScanArgs(t, "queue", &o.queue)
				if a, ok := d.Arg("cap"); ok {
					v, err := strconv.ParseFloat(a.Vals[0], 64)
					if err != nil {
						d.Fatalf(t, "cap: %v", err)
					}
					o.cap = &v
				}
				if a, ok := d.Arg("p99"); ok {
					o.p99 = dur(t, d, a.Vals[0])
				}
				d.MaybeScanArgs(t, "lender", &w.lender)
				return strings.Join(w.tick(dur(t, d, at), map[string]tickObs{m: o}), "\n")
			case "run":
				var to, every, after string
				d.ScanArgs(t, "to", &to)
				d.ScanArgs(t, "every", &every)
				serveAfter := time.Duration(0)
				if d.MaybeScanArgs(t, "serve-after", &after) {
					serveAfter = dur(t, d, after)
				}
				d.MaybeScanArgs(t, "lender", &w.lender)
				m := w.only(t, d)
				var lines []string
				for now := w.now + dur(t, d, every); now <= dur(t, d, to); now += dur(t, d, every) {
					offered := w.demand.Rate(now)
					for _, id := range slices.Sorted(maps.Keys(w.workers)) {
						if ww := w.workers[id]; ww.Borrowed && ww.State == Starting && now-ww.arrived >= serveAfter {
							ww.State = Serving
							lines = append(lines, fmt.Sprintf("%v offered=%g: %s serving", now, offered, id))
						}
					}
					for _, l := range w.tick(now, map[string]tickObs{m: {offered: offered}}) {
						lines = append(lines, fmt.Sprintf("%v offered=%g: %s", now, offered, l))
					}
				}
				return strings.Join(lines, "\n")
			case "serving":
				for _, a := range d.CmdArgs {
					for _, ww := range w.workers {
						if (a.Key == "all" || a.Key == ww.ID) && ww.State == Starting {
							ww.State = Serving
						}
					}
				}
				return ""
			case "lent":
				// lent MODEL ID: a borrowed worker serving that this
				// controller never asked for (a restarted lender adopted
				// it from the run before).
				id := d.CmdArgs[1].Key
				w.workers[id] = &wworker{Worker: Worker{ID: id, State: Serving, Borrowed: true}, model: d.CmdArgs[0].Key, arrived: w.now}
				return ""
			case "stop":
				for _, a := range d.CmdArgs {
					if ww := w.worker(t, d, a.Key); ww.State == Serving {
						ww.State = Starting
					}
				}
				return ""
			case "inflight":
				for _, a := range d.CmdArgs {
					ww := w.worker(t, d, a.Key)
					n, err := strconv.Atoi(a.Vals[0])
					if err != nil {
						d.Fatalf(t, "%v", err)
					}
					ww.InFlight = n
				}
				return ""
			case "reclaim":
				var grace string
				d.ScanArgs(t, "grace", &grace)
				w.reclaims = append(w.reclaims, pendingReclaim{d.CmdArgs[0].Key, dur(t, d, grace)})
				return ""
			case "fail":
				n, err := strconv.Atoi(d.CmdArgs[1].Key)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				w.failures = append(w.failures, BorrowFailure{Model: d.CmdArgs[0].Key, N: n})
				return ""
			case "vanish":
				delete(w.workers, d.CmdArgs[0].Key)
				return ""
			case "return-fails":
				if w.returnFails == nil {
					w.returnFails = map[string]bool{}
				}
				for _, a := range d.CmdArgs {
					w.worker(t, d, a.Key)
					w.returnFails[a.Key] = true
				}
				return ""
			case "miss":
				if w.missing == nil {
					w.missing = map[string]bool{}
				}
				for _, a := range d.CmdArgs {
					w.worker(t, d, a.Key)
					w.missing[a.Key] = true
				}
				return ""
			case "workers":
				var lines []string
				for _, id := range slices.Sorted(maps.Keys(w.workers)) {
					ww := w.workers[id]
					kind := "owned"
					if ww.Borrowed {
						kind = "borrowed"
					}
					lines = append(lines, fmt.Sprintf("%s %s %s %s in-flight=%d", id, ww.model, kind, ww.State, ww.InFlight))
				}
				return strings.Join(lines, "\n")
			case "stats":
				return statsText(w.c.Stats())
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func dur(t *testing.T, d *datadriven.TestData, s string) time.Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return v
}

func parseOptions(t *testing.T, d *datadriven.TestData) (Options, bool) {
	var o Options
	deliver := true
	for _, a := range d.CmdArgs {
		v := a.Vals[0]
		f := func() float64 {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				d.Fatalf(t, "%s: %v", a.Key, err)
			}
			return x
		}
		i := func() int {
			x, err := strconv.Atoi(v)
			if err != nil {
				d.Fatalf(t, "%s: %v", a.Key, err)
			}
			return x
		}
		switch a.Key {
		case "policy":
			o.Policy = Policy(v)
		case "target":
			o.Target = f()
		case "high":
			o.High = f()
		case "low":
			o.Low = f()
		case "p99-limit":
			o.P99Limit = dur(t, d, v)
		case "queue-limit":
			o.QueueLimit = i()
		case "min-lease":
			o.MinLease = dur(t, d, v)
		case "cool-down":
			o.CoolDown = dur(t, d, v)
		case "max-borrowed":
			o.MaxBorrowed = i()
		case "startup":
			o.StartupEstimate = dur(t, d, v)
		case "borrow-timeout":
			o.BorrowTimeout = dur(t, d, v)
		case "drain-timeout":
			o.DrainTimeout = dur(t, d, v)
		case "lost-after":
			o.LostAfter = i()
		case "deliver":
			deliver = v == "on"
		default:
			d.Fatalf(t, "unknown option %q", a.Key)
		}
	}
	return o, deliver
}

type world struct {
	c        *Controller
	deliver  bool
	now      time.Duration
	lender   int
	next     int
	models   map[string]*wmodel
	workers  map[string]*wworker
	reclaims []pendingReclaim
	failures []BorrowFailure
	missing  map[string]bool // left out of the next observation
	// returnFails are workers whose next return fails (the lender
	// keeps them, draining).
	returnFails map[string]bool
	demand      *Seasonal
	forecast    bool
}

type wmodel struct {
	name string
	cap  float64
}

type wworker struct {
	Worker
	model   string
	arrived time.Duration
}

type pendingReclaim struct {
	worker string
	grace  time.Duration
}

type tickObs struct {
	offered, shed float64
	queue         int
	p99           time.Duration
	cap           *float64 // the capacity per worker observed, when set
}

func (w *world) only(t *testing.T, d *datadriven.TestData) string {
	var m string
	if d.MaybeScanArgs(t, "model", &m) {
		return m
	}
	if len(w.models) != 1 {
		d.Fatalf(t, "%d models: say model=", len(w.models))
	}
	for name := range w.models {
		m = name
	}
	return m
}

func (w *world) worker(t *testing.T, d *datadriven.TestData, id string) *wworker {
	ww := w.workers[id]
	if ww == nil {
		d.Fatalf(t, "no worker %q", id)
	}
	return ww
}

// tick observes the world, ticks the controller and carries its
// decisions out.
func (w *world) tick(now time.Duration, per map[string]tickObs) []string {
	w.now = now
	obs := Observation{LenderIdle: w.lender, BorrowFailures: w.failures}
	for _, r := range w.reclaims {
		obs.Reclaims = append(obs.Reclaims, Reclaim{Worker: r.worker, Deadline: now + r.grace})
	}
	w.reclaims, w.failures = nil, nil
	defer func() { w.missing = nil }()
	for _, name := range slices.Sorted(maps.Keys(w.models)) {
		m := w.models[name]
		o := per[name]
		mo := ModelObs{Model: name, Offered: o.offered, Shed: o.shed, QueueDepth: o.queue, P99: o.p99, CapacityPerWorker: m.cap}
		if o.cap != nil {
			mo.CapacityPerWorker = *o.cap
		}
		if w.forecast && w.demand != nil {
			mo.Forecast = w.demand
		}
		for _, id := range slices.Sorted(maps.Keys(w.workers)) {
			if ww := w.workers[id]; ww.model == name && !w.missing[id] {
				mo.Workers = append(mo.Workers, ww.Worker)
			}
		}
		obs.Models = append(obs.Models, mo)
	}
	ds, err := w.c.Tick(now, obs)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var lines []string
	for _, d := range ds {
		lines = append(lines, d.String())
		switch d.Kind {
		case Borrow:
			if !w.deliver {
				continue
			}
			w.lender -= d.N
			for range d.N {
				w.next++
				id := fmt.Sprintf("b%d", w.next)
				w.workers[id] = &wworker{Worker: Worker{ID: id, Borrowed: true, State: Starting}, model: d.Model, arrived: now}
			}
		case Drain:
			if ww := w.workers[d.Worker]; ww != nil {
				ww.State = Draining
			}
		case Return:
			if w.returnFails[d.Worker] {
				delete(w.returnFails, d.Worker)
				lines[len(lines)-1] += " (fails: still lent)"
				continue
			}
			if w.workers[d.Worker] != nil {
				w.lender++
			}
			delete(w.workers, d.Worker)
		}
	}
	return lines
}

func statsText(s Stats) string {
	var b strings.Builder
	for _, m := range slices.Sorted(maps.Keys(s.Borrowed)) {
		fmt.Fprintf(&b, "borrowed %s: %d\n", m, s.Borrowed[m])
	}
	for _, m := range slices.Sorted(maps.Keys(s.Pending)) {
		fmt.Fprintf(&b, "pending %s: %d\n", m, s.Pending[m])
	}
	fmt.Fprintf(&b, "borrowed workers so far: %d\n", s.BorrowedWorkers)
	keys := slices.SortedFunc(maps.Keys(s.Events), func(a, b EventKey) int {
		return strings.Compare(a.Kind+"/"+a.Reason, b.Kind+"/"+b.Reason)
	})
	for _, k := range keys {
		fmt.Fprintf(&b, "event %s/%s: %d\n", k.Kind, k.Reason, s.Events[k])
	}
	if s.StartupCount > 0 {
		fmt.Fprintf(&b, "decision to serving: n=%d mean=%v max=%v\n", s.StartupCount, s.StartupSum/time.Duration(s.StartupCount), s.StartupMax)
	}
	fmt.Fprintf(&b, "borrowed GPU-hours: %.3f\n", s.BorrowedGPUSeconds/3600)
	fmt.Fprintf(&b, "released with work in flight: %d", s.ReleasedWithInFlight)
	return b.String()
}

// TestFailedReturnRetriedNextTick: a worker released at a reclaim's
// deadline whose return the lender failed (it still lists the worker,
// draining, with work in flight) is returned again at the next tick, and
// the work it held is counted as cut off once. Adopted with a fresh drain
// timeout, it went back a minute late and was counted again.
func TestFailedReturnRetriedNextTick(t *testing.T) {
	c, err := New(Options{MinLease: time.Second, CoolDown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	obs := func(st WorkerState, inflight int, rec ...Reclaim) Observation {
		return Observation{LenderIdle: 4, Reclaims: rec, Models: []ModelObs{{Model: "m", Offered: 180, CapacityPerWorker: 100,
			Workers: []Worker{{ID: "o1", State: Serving}, {ID: "b1", Borrowed: true, State: st, InFlight: inflight}}}}}
	}
	tick := func(at time.Duration, o Observation) []Decision {
		t.Helper()
		ds, err := c.Tick(at, o)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	tick(0, obs(Serving, 0))
	tick(10*time.Second, obs(Serving, 2, Reclaim{Worker: "b1", Deadline: 40 * time.Second}))
	var ret []Decision
	for _, d := range tick(40*time.Second, obs(Draining, 2)) {
		if d.Kind == Return {
			ret = append(ret, d)
		}
	}
	if len(ret) != 1 {
		t.Fatalf("no return at the grace's end: %v", ret)
	}
	cut := c.Stats().ReleasedWithInFlight
	// The return failed: the lender still lists b1, draining, same work.
	retried := time.Duration(-1)
	for at := 50 * time.Second; at <= 3*time.Minute; at += 10 * time.Second {
		for _, d := range tick(at, obs(Draining, 2)) {
			if d.Kind == Return && d.Worker == "b1" && retried < 0 {
				retried = at
			}
		}
	}
	if retried != 50*time.Second || c.Stats().ReleasedWithInFlight != cut {
		t.Fatalf("a return that failed past the lender's deadline (40s) was retried at %v (want the next tick, 50s); work cut off counted %d then %d",
			retried, cut, c.Stats().ReleasedWithInFlight)
	}
}

// TestCeilTolerant: worker counts and shed advice are ceilings of
// quotients that float rounding puts a hair above a whole number (1.1 /
// 0.1 = 11.000000000000002): they were one worker and one point over.
func TestCeilTolerant(t *testing.T) {
	for _, c := range []struct {
		rate, per float64
		want      int
	}{
		{1.1, 0.1, 11}, {300, 100, 3}, {300.5, 100, 4}, {0.3, 0.1, 3}, {1e-12, 1, 1}, {0, 1, 0},
	} {
		if got := workersFor(c.rate, c.per); got != c.want {
			t.Errorf("workersFor(%v, %v) = %d, want %d", c.rate, c.per, got, c.want)
		}
	}
	if got := ceilTolerant((1 - 7.0/10) * 100); got != 30 {
		t.Errorf("shed of 7 covered of 10: %v%%, want 30%%", got)
	}
}
