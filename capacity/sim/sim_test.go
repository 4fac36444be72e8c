package sim

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/loadgen"
)

// spike is 2h of demand at 300 samples/s with a promotion tripling it
// from 1h for 20m; workers serve 100/s and take 90s to start.
func spike(policy capacity.Policy) Config {
	rates := make([]float64, 120)
	for i := range rates {
		rates[i] = 300
	}
	return Config{
		Step:              time.Minute,
		Rates:             rates,
		Promotions:        []capacity.Promotion{{Start: time.Hour, Duration: 20 * time.Minute, Factor: 3}},
		CapacityPerWorker: 100,
		Owned:             5,
		Controller:        capacity.Options{Policy: policy},
	}
}

// firstBorrow is when a run first holds a borrowed worker.
func firstBorrow(r *Result) time.Duration {
	for _, p := range r.Points {
		if p.Borrowed > 0 {
			return p.T
		}
	}
	return -1
}

func TestSpike(t *testing.T) {
	results := map[capacity.Policy]*Result{}
	for _, p := range []capacity.Policy{capacity.Reactive, capacity.Predictive} {
		r, err := Run(spike(p))
		if err != nil {
			t.Fatal(err)
		}
		results[p] = r
		rep := r.Report
		if rep.PeakDemand != 900 || rep.StaticGPUs != 9 {
			t.Errorf("%s: peak %v, static %d GPUs; want 900 and ceil(900/100) = 9", p, rep.PeakDemand, rep.StaticGPUs)
		}
		for _, pt := range r.Points {
			inSpike := pt.T >= time.Hour+5*time.Minute && pt.T < time.Hour+20*time.Minute
			after := pt.T >= time.Hour+40*time.Minute
			if inSpike && pt.Borrowed == 0 {
				t.Errorf("%s: nothing borrowed at %v in the spike", p, pt.T)
			}
			if after && pt.Borrowed != 0 {
				t.Errorf("%s: %d still borrowed at %v, 20m after the spike", p, pt.Borrowed, pt.T)
			}
			if pt.T < 50*time.Minute && pt.Borrowed != 0 {
				t.Errorf("%s: %d borrowed at %v, before any ramp", p, pt.Borrowed, pt.T)
			}
		}
		// Sizing to 70%: ceil(900/70) = 13 workers, 8 borrowed.
		if rep.PeakBorrowed != 8 {
			t.Errorf("%s: peak borrowed %d, want 8", p, rep.PeakBorrowed)
		}
		if rep.BorrowedGPUHours <= 0 || rep.LoanGPUHours >= rep.StaticGPUHours {
			t.Errorf("%s: borrowed %.2f GPU-hours, loaning %.2f against static %.2f", p, rep.BorrowedGPUHours, rep.LoanGPUHours, rep.StaticGPUHours)
		}
	}
	re, pr := results[capacity.Reactive], results[capacity.Predictive]
	if rb, pb := firstBorrow(re), firstBorrow(pr); !(pb >= 0 && pb < rb) {
		t.Errorf("predictive first borrowed at %v, reactive at %v: want predictive first", pb, rb)
	}
	// Reactive serves the spike 90s late (9 of 120 ten-second ticks of
	// the first 20 minutes at 500/900 covered); predictive on time.
	if re.Report.SLOAttainmentPct >= 100 || pr.Report.SLOAttainmentPct != 100 {
		t.Errorf("SLO attainment reactive %.3f%%, predictive %.3f%%: want reactive below 100, predictive 100", re.Report.SLOAttainmentPct, pr.Report.SLOAttainmentPct)
	}
	if d := re.Report.DecisionToServingS; d != 90 {
		t.Errorf("decision to serving %vs, want the 90s startup", d)
	}
}

// Reclaims inside the spike: each is drained and released within the
// grace with nothing in flight, and replaced; a grace shorter than the
// in-flight work's drain cuts it off.
func TestReclaims(t *testing.T) {
	c := spike(capacity.Reactive)
	// Sized to 70%, 13 workers carry the spike; with High at 75% the
	// first reclaim leaves 12 (75%), the second 11 (82%): replaced.
	c.Controller.High = 0.75
	c.Reclaims = []time.Duration{time.Hour + 5*time.Minute, time.Hour + 10*time.Minute, 30 * time.Minute}
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	rep := r.Report
	if rep.Reclaims != 2 || rep.ReclaimsSurvived != 2 || rep.ReclaimsSkipped != 1 || rep.ReleasedWithInFlight != 0 {
		t.Errorf("reclaims %d, survived %d, skipped %d, cut off %d; want 2, 2, 1, 0", rep.Reclaims, rep.ReclaimsSurvived, rep.ReclaimsSkipped, rep.ReleasedWithInFlight)
	}
	if rep.Events["borrow: replace reclaimed"] == 0 {
		t.Errorf("no replacement borrow: %v", rep.Events)
	}
	c.Drain, c.Grace = 40*time.Second, 5*time.Second
	r, err = Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if rep := r.Report; rep.ReclaimsSurvived != 0 || rep.ReleasedWithInFlight != 2 {
		t.Errorf("grace 5s under a 40s drain: survived %d, cut off %d; want 0 and 2", rep.ReclaimsSurvived, rep.ReleasedWithInFlight)
	}
}

// A lender with too little idle: shed advice, and the SLO shortfall.
func TestLenderShort(t *testing.T) {
	c := spike(capacity.Reactive)
	c.LenderIdle = 2
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if r.Report.PeakBorrowed != 2 || r.Report.Events["shed: demand uncovered"] == 0 {
		t.Errorf("peak borrowed %d, events %v: want 2 and shed advice", r.Report.PeakBorrowed, r.Report.Events)
	}
}

// Exact: zeros typed are zeros (prism plan loan): a lender with nothing
// to lend borrows nothing and the peak goes unserved; a zero startup
// serves at the next tick; a zero tick is refused. Without Exact a zero
// is the default (the lender lends).
func TestExactZeros(t *testing.T) {
	c := spike(capacity.Reactive)
	c.Exact, c.Tick, c.Startup, c.Drain, c.Grace, c.LenderIdle = true, 10*time.Second, 0, 0, 0, 0
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if rep := r.Report; rep.PeakBorrowed != 0 || rep.SLOAttainmentPct > 90 {
		t.Errorf("lender idle 0: peak borrowed %d, SLO %.1f%%; want 0 and the promotion unserved", rep.PeakBorrowed, rep.SLOAttainmentPct)
	}
	c.LenderIdle = 1000
	if r, err = Run(c); err != nil {
		t.Fatal(err)
	}
	if got := r.Report.DecisionToServingS; got != 10 {
		t.Errorf("startup 0: decision to serving %vs, want one tick (10s)", got)
	}
	c.Tick = 0
	if _, err := Run(c); err == nil || !strings.Contains(err.Error(), "tick 0s must be positive") {
		t.Errorf("tick 0 with Exact: %v", err)
	}
	c = spike(capacity.Reactive)
	if r, err = Run(c); err != nil || r.Report.PeakBorrowed == 0 {
		t.Errorf("zeros without Exact (defaults): %v, peak borrowed %d", err, r.Report.PeakBorrowed)
	}
}

// A tick longer than the trace's step: demand is still the trace's at
// each step (the peak, the promotion), and the borrows are seen
// delivered at the next tick, not given up as timed out. The 25m tick
// first sees the promotion (at 1h) at 1h15m: its workers serve 15m
// later than the 10s tick's. (A 30m tick decides at 1h as the 10s one
// does, and its workers serve as soon.)
func TestTickLongerThanStep(t *testing.T) {
	short, long := spike(capacity.Reactive), spike(capacity.Reactive)
	long.Tick = 25 * time.Minute
	rs, err := Run(short)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := Run(long)
	if err != nil {
		t.Fatal(err)
	}
	if rl.Report.PeakDemand != rs.Report.PeakDemand {
		t.Errorf("peak demand %v with a 25m tick, %v with 10s: the trace's own", rl.Report.PeakDemand, rs.Report.PeakDemand)
	}
	if n := rl.Report.Events["borrow failed: timeout"]; n > 0 {
		t.Errorf("%d borrows timed out with a 25m tick: %v", n, rl.Report.Events)
	}
	if got := rl.Report.DecisionToServingS; got < 25*60 {
		t.Errorf("decision to serving %vs with a 25m tick: seen at the next tick at the soonest", got)
	}
	if rl.Report.SLOAttainmentPct >= rs.Report.SLOAttainmentPct {
		t.Errorf("SLO %.2f%% with a 25m tick, %.2f%% with 10s: a slower controller serves the promotion later", rl.Report.SLOAttainmentPct, rs.Report.SLOAttainmentPct)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.CapacityPerWorker = 0 }, "capacity per worker must be a positive number"},
		{func(c *Config) { c.Rates = nil }, "the demand trace is empty"},
		{func(c *Config) { c.Tick = -time.Second }, "tick -1s is negative"},
		{func(c *Config) { c.Controller.Low = 0.9 }, "0 < low <= target < high <= 1"},
		{func(c *Config) { c.Promotions[0].Factor = -1 }, "factor -1 must be a positive number"},
		{func(c *Config) { c.Owned = -1 }, "owned -1"},
		// Each simulated: a tick of 1ms over a day's trace grew past
		// 6 GB in 30 s, a billion owned workers past 3 GB.
		{func(c *Config) { c.Tick = c.Step * time.Duration(len(c.Rates)) / (maxTicks + 1) }, "ticks of it, more than 1048576: want a tick of at least"},
		{func(c *Config) { c.Owned = MaxOwned + 1 }, "owned 1048577: want at most 1048576"},
		{func(c *Config) { c.Reclaims = []time.Duration{c.Step * time.Duration(len(c.Rates))} }, "past the trace's end"},
		{func(c *Config) { c.Promotions[0].Start = c.Step * time.Duration(len(c.Rates)+1) }, "starts past the trace's end"},
		// A peak no cluster has: the report's GPU counts overflowed (a
		// negative static GPU count), or a demand of +Inf failed a tick.
		{func(c *Config) { c.CapacityPerWorker = 1e-300 }, "more than any cluster has"},
		{func(c *Config) { c.Promotions[0].Factor = 1e308 }, "more than any cluster has"},
		{func(c *Config) {
			c.Promotions = append(c.Promotions, capacity.Promotion{Start: c.Promotions[0].Start, Duration: time.Minute, Factor: 1e200})
			c.Promotions[0].Factor = 1e200
		}, "promotion factors up to +Inf"},
		// A promotion of a factor below 1 (a dip) ending inside a
		// larger one: the product peaks at the dip's end, not at a
		// start (1 at both starts here, 1e300 from the dip's end).
		{func(c *Config) {
			c.Promotions = append(c.Promotions, capacity.Promotion{Start: c.Promotions[0].Start, Duration: c.Promotions[0].Duration / 2, Factor: 1e-300})
			c.Promotions[0].Factor = 1e300
		}, "more than any cluster has"},
	} {
		cfg := spike(capacity.Reactive)
		c.mod(&cfg)
		if _, err := Run(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

func TestOwnedAuto(t *testing.T) {
	c := spike(capacity.Reactive)
	c.Owned = 0
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	// The median 300/s at 70%: ceil(300/70) = 5.
	if r.Report.OwnedGPUs != 5 {
		t.Errorf("owned %d, want 5", r.Report.OwnedGPUs)
	}
}

// A trace of two containers whose rows jitter by a second: the
// inferred window (the smallest gap, 1 s) never sums them, and the peak
// reads half the demand; TraceOptions.Window (plan loan --trace-window)
// sums them.
func TestLoanTraceWindow(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "qps.csv")
	var b strings.Builder
	b.WriteString("timestamp_anon,value,container_ip\n")
	for i := range 60 {
		b.WriteString(ftoa(float64(i*60)) + ",100,a\n")
		b.WriteString(ftoa(float64(i*60+1)) + ",100,b\n")
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		window time.Duration
		want   string
	}{
		{0, "peak demand 100 samples/s"},
		{time.Minute, "peak demand 200 samples/s"},
	} {
		var w strings.Builder
		err := Loan(&w, LoanConfig{Trace: trace, Scale: 1, TraceOptions: loadgen.TraceOptions{Window: c.window}, Policies: []capacity.Policy{capacity.Reactive}, Base: Config{CapacityPerWorker: 100, Owned: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.String(), c.want) {
			t.Errorf("window %v: want %q in\n%s", c.window, c.want, w.String())
		}
	}
}

// TestLoanNotesGaps: a trace with rows missing (the gateway trace has
// 265 of its 1410 windows empty, the longest gap 57 minutes) is planned
// with the rate before each gap standing through it, and the summary
// says so: silently, a trace with hours missing was planned on as if it
// had them. A trace with none missing has no note.
func TestLoanNotesGaps(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		rows string
		want string
	}{
		{"0,100\n60,100\n120,300\n300,100\n360,100\n", "note: the trace has no row in 2 of its 7 windows of 1m0s (the longest gap 2m0s)"},
		{"0,100\n60,100\n120,300\n", ""},
	} {
		trace := filepath.Join(dir, "qps.csv")
		if err := os.WriteFile(trace, []byte("timestamp_anon,value\n"+c.rows), 0o644); err != nil {
			t.Fatal(err)
		}
		var w strings.Builder
		if err := Loan(&w, LoanConfig{Trace: trace, Scale: 1, Policies: []capacity.Policy{capacity.Reactive}, Base: Config{CapacityPerWorker: 100, Owned: 1}}); err != nil {
			t.Fatal(err)
		}
		switch out := w.String(); {
		case c.want != "" && !strings.Contains(out, c.want):
			t.Errorf("want %q in\n%s", c.want, out)
		case c.want == "" && strings.Contains(out, "note: the trace"):
			t.Errorf("no gap, a note:\n%s", out)
		}
	}
}

func TestLoanOutputs(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "qps.csv")
	var b strings.Builder
	b.WriteString("timestamp_anon,value,container_ip,request_type\n")
	for i := range 120 {
		v := 1.0
		if i >= 60 && i < 80 {
			v = 3
		}
		// Two containers per minute: their values are summed.
		for c := range 2 {
			b.WriteString(strings.Join([]string{ftoa(float64(i * 60)), ftoa(v / 2), "c" + strconv.Itoa(c), "x"}, ",") + "\n")
		}
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var w strings.Builder
	err := Loan(&w, LoanConfig{Trace: trace, Scale: 300, Policies: []capacity.Policy{capacity.Reactive, capacity.Predictive}, Base: Config{CapacityPerWorker: 100, Owned: 5}, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.String(), "static for the peak:  9 GPUs") || !strings.Contains(w.String(), "over 90%") {
		t.Errorf("summary:\n%s", w.String())
	}
	var reps []Report
	raw, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &reps); err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].Policy != "reactive" || reps[1].Policy != "predictive" || reps[0].StaticGPUs != 9 || math.Abs(reps[0].TraceHours-2) > 1e-9 {
		t.Errorf("report.json: %+v", reps)
	}
	if st, err := os.Stat(filepath.Join(out, "loan.png")); err != nil || st.Size() < 1000 {
		t.Errorf("loan.png: %v", err)
	}
	if err := Loan(&w, LoanConfig{Trace: filepath.Join(dir, "none.csv"), Scale: 1, Policies: []capacity.Policy{capacity.Reactive}}); err == nil || !strings.Contains(err.Error(), "open trace") {
		t.Errorf("missing trace: %v", err)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TestSlowStartupServes: a simulated start longer than the controller's
// default borrow timeout (10m) is not given up: the sim's controller
// waits twice the start. Given up at 10m, no borrowed worker ever served
// a 12m start, and the what-if borrowed twice as many.
func TestSlowStartupServes(t *testing.T) {
	c := spike(capacity.Reactive)
	c.Promotions[0].Duration = 50 * time.Minute // long enough for a 12m start
	c.Startup = 12 * time.Minute
	r, err := Run(c)
	if err != nil {
		t.Fatalf("Run: %v", err) // a refusal naming the clash would be a fix too
	}
	served := 0
	for _, p := range r.Points {
		if p.Serving > c.Owned {
			served++
		}
	}
	borrowedPeak := r.Report.PeakBorrowed
	if served == 0 {
		t.Fatalf("no borrowed worker ever served in a 50m promotion with a 12m startup (peak borrowed %d, SLO attainment %.1f%%)", borrowedPeak, r.Report.SLOAttainmentPct)
	}
}

// TestTickNotDividingStep: a 10s tick against a 15s trace step (the
// gateway trace's is 57s). Demand is the trace's at every instant:
// 100/s, 1000/s, 100/s for 15s each, against 5 owned workers of 100/s
// and nothing to borrow: 10500 of 18000 samples served, in the SLO two
// thirds of the time. Stepping by the tick, [10s,20s) was all 100/s,
// [30s,40s) too, and the run went on to 50s, past the trace's end:
// 9000 of 14000 samples (64.3%), 4 of 5 steps in the SLO.
func TestTickNotDividingStep(t *testing.T) {
	c := Config{
		Step: 15 * time.Second, Rates: []float64{100, 1000, 100}, CapacityPerWorker: 100, Owned: 5,
		Tick: 10 * time.Second, Startup: 90 * time.Second, Drain: time.Second, Grace: 30 * time.Second,
		LenderIdle: 0, Exact: true, Controller: capacity.Options{Policy: capacity.Reactive},
	}
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Report.SLOAttainmentPct, 100*10500.0/18000; math.Abs(got-want) > 1e-9 {
		t.Errorf("SLO attainment %.3f%%, want %.3f%%", got, want)
	}
	if got, want := r.Report.TicksInSLOPct, 100*2.0/3; math.Abs(got-want) > 1e-9 {
		t.Errorf("in the SLO %.3f%% of the time, want %.3f%%", got, want)
	}
}

// TestBorrowedGPUHoursToTheEnd: demand 10x the one owned worker for
// 3h, an hourly tick. The borrowed workers serve from the 1h tick (the
// controller's lease starts when it sees them) to the trace's end: 2h
// each. The controller counts a lease's time up to its last tick (2h):
// half of it went unreported.
func TestBorrowedGPUHoursToTheEnd(t *testing.T) {
	c := Config{
		Step: time.Hour, Rates: []float64{1000, 1000, 1000}, CapacityPerWorker: 100, Owned: 1,
		Tick: time.Hour, Startup: 0, Drain: time.Second, Grace: 30 * time.Second,
		LenderIdle: 1000, Exact: true, Controller: capacity.Options{Policy: capacity.Reactive},
	}
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	// The points' borrowed workers over their intervals.
	var held float64
	for i, p := range r.Points {
		end := 3 * time.Hour
		if i+1 < len(r.Points) {
			end = r.Points[i+1].T
		}
		held += float64(p.Borrowed) * (end - p.T).Hours()
	}
	rep := r.Report
	if rep.PeakBorrowed == 0 || math.Abs(rep.BorrowedGPUHours-held) > 1e-9 || math.Abs(rep.BorrowedGPUHours-2*float64(rep.PeakBorrowed)) > 1e-9 {
		t.Errorf("borrowed %.2f GPU-hours, %d workers at the peak: want %.2f, 2h each", rep.BorrowedGPUHours, rep.PeakBorrowed, held)
	}
}

// TestReclaimDeadlineFromTheReclaim: the lender's grace runs from its
// reclaim, not from the controller's next tick. With a 2m tick and a 30s
// grace, a reclaim 10s after a tick is seen 110s later: the lender took
// the worker 80s before, while it served, and the work it held was cut
// off. Timed from the tick, the deadline gave the controller a grace the
// lender never gave, and the report counted the reclaim as survived.
func TestReclaimDeadlineFromTheReclaim(t *testing.T) {
	for _, c := range []struct {
		tick              time.Duration
		survived, cutOffs int
	}{
		{10 * time.Second, 1, 0}, // seen within 10s, drained within the grace
		{2 * time.Minute, 0, 1},  // seen after the grace: taken while serving
	} {
		cfg := spike(capacity.Reactive)
		cfg.Tick = c.tick
		cfg.Reclaims = []time.Duration{time.Hour + 10*time.Minute + 10*time.Second}
		r, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rep := r.Report
		if rep.Reclaims != 1 || rep.ReclaimsSurvived != c.survived || rep.ReleasedWithInFlight != c.cutOffs {
			t.Errorf("tick %v, grace %v: %d reclaims, %d survived, %d released with work in flight; want 1, %d, %d",
				c.tick, 30*time.Second, rep.Reclaims, rep.ReclaimsSurvived, rep.ReleasedWithInFlight, c.survived, c.cutOffs)
		}
		// Taken at the lender's deadline, between two ticks: it serves
		// no more from then.
		if c.cutOffs > 0 {
			deadline := cfg.Reclaims[0] + 30*time.Second
			i := slices.IndexFunc(r.Points, func(p Point) bool { return p.T == deadline })
			if i < 1 || r.Points[i].Serving != r.Points[i-1].Serving-1 {
				t.Errorf("tick %v: no point at the lender's deadline %v with one worker fewer serving", c.tick, deadline)
			}
		}
	}
}
