package loan

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/loadgen"
)

// fakeLender lends workers that serve (register) at the next tick.
type fakeLender struct {
	mu       sync.Mutex
	max, seq int
	// slowDrain: a drained worker runs on (it holds work) until returned.
	slowDrain bool
	// deadOnArrival: a borrowed worker never starts (no address, not
	// running): a failed borrow.
	deadOnArrival bool
	workers       map[string]*capacity.LentWorker
	reclaims      chan capacity.ProviderReclaim
	log           []string
}

func (f *fakeLender) Name() string { return "fake" }
func (f *fakeLender) Idle(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max - len(f.workers), nil
}
func (f *fakeLender) Borrow(_ context.Context, model string, n int) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for range n {
		f.seq++
		id := fmt.Sprintf("w%d", f.seq)
		f.workers[id] = &capacity.LentWorker{ID: id, Model: model, Addr: "addr-" + id, Running: true, Lent: time.Now()}
		if f.deadOnArrival {
			f.workers[id].Addr, f.workers[id].Running = "", false
		}
		ids = append(ids, id)
		f.log = append(f.log, "borrow "+id)
	}
	return ids, nil
}
func (f *fakeLender) Drain(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.workers[id]
	if w == nil {
		f.log = append(f.log, "drain "+id+": not lent")
		return fmt.Errorf("drain %s: not lent", id)
	}
	w.Draining, w.Running = true, f.slowDrain // exits at once: it held nothing
	f.log = append(f.log, "drain "+id)
	return nil
}
func (f *fakeLender) Return(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.workers[id] == nil {
		f.log = append(f.log, "return "+id+": not lent")
		return fmt.Errorf("return %s: not lent", id)
	}
	delete(f.workers, id)
	f.log = append(f.log, "return "+id)
	return nil
}
func (f *fakeLender) Workers() []capacity.LentWorker {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []capacity.LentWorker
	for _, w := range f.workers {
		out = append(out, *w)
	}
	return out
}
func (f *fakeLender) Reclaims() <-chan capacity.ProviderReclaim { return f.reclaims }

// rig is a driver over a fakeLender, a router's /metrics whose Recommend
// count the test moves, and a logical clock: step advances one second,
// counts add more requests (restart: the count starts again from zero,
// as a restarted router's does) and runs one tick.
type rig struct {
	t      *testing.T
	d      *Driver
	lender *fakeLender
	now    time.Time
	logs   []string
	mu     sync.Mutex
	total  float64
	down   bool // the router's /metrics answers 503
	// unlisted are lent workers the registry leaves out though they run
	// (crash-looping in place, hung).
	unlisted map[string]bool
}

// newRig starts a rig whose registry lists an owned dense worker and,
// with registerLent, every running lent worker not draining.
func newRig(t *testing.T, ctl capacity.Options, registerLent bool) *rig {
	t.Helper()
	r := &rig{t: t, now: time.Unix(1000, 0),
		lender: &fakeLender{max: 2, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 4)}, unlisted: map[string]bool{}}
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.down {
			http.Error(w, "router down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "prism_rpc_requests_total{code=\"OK\",method=%q} %g\n", recommendMethod, r.total)
	}))
	t.Cleanup(metrics.Close)
	d, err := New(Options{
		Provider: r.lender, Model: "m", CapacityPerWorker: 100, Controller: ctl,
		Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
			ws := []*prismv1.WorkerInfo{{Id: "owned", Role: prismv1.Role_ROLE_DENSE, Addr: "addr-owned"}}
			if registerLent {
				for _, w := range r.lender.Workers() {
					if w.Running && !w.Draining && !r.unlisted[w.ID] {
						ws = append(ws, &prismv1.WorkerInfo{Id: "reg-" + w.ID, Role: prismv1.Role_ROLE_DENSE, Addr: w.Addr})
					}
				}
			}
			return ws, nil
		},
		RouterMetrics: func() string { return metrics.URL },
		Now:           func() time.Time { return r.now },
		Logf:          func(f string, a ...any) { r.logs = append(r.logs, fmt.Sprintf(f, a...)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	return r
}

func (r *rig) step(add float64, restart bool) {
	r.t.Helper()
	r.now = r.now.Add(time.Second)
	r.mu.Lock()
	if restart {
		r.total = 0
	}
	r.total += add
	r.mu.Unlock()
	if err := r.d.Step(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

// TestDriver: demand over one owned worker's capacity borrows; the
// borrowed worker registers and serves; a reclaim drains and returns it
// and the controller replaces it; when the demand falls all go back.
func TestDriver(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: 3 * time.Second, CoolDown: time.Second, MaxBorrowed: 2}, true)
	lender, d := r.lender, r.d
	step := func(rate float64) {
		t.Helper()
		r.step(rate, false)
	}
	step(0)
	for range 3 {
		step(180) // 1.8 owned workers' worth: borrow 2 at a 70% target
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed, want 2; %v", n, lender.log)
	}
	step(180)
	lender.reclaims <- capacity.ProviderReclaim{Worker: "w1", Grace: 5 * time.Second}
	for range 4 {
		step(180)
	}
	for range 12 {
		step(10)
	}
	want := "borrow w1,borrow w2,drain w1,return w1,borrow w3"
	if got := strings.Join(lender.log, ","); !strings.HasPrefix(got, want) || len(lender.workers) != 0 {
		t.Errorf("lender saw %s, want it to start with %s and end with nothing lent", got, want)
	}
	st := d.Status()
	kinds := map[string]int{}
	for _, e := range st.Events {
		kinds[e.Kind]++
	}
	if kinds["reclaim"] != 1 || kinds["serving"] != 3 || kinds["return"] != 3 || st.Borrowed != 0 {
		t.Errorf("timeline %+v", st.Events)
	}
	if s := d.Stats(); s.StartupCount != 3 || s.ReleasedWithInFlight != 0 {
		t.Errorf("stats %+v", s)
	}
	if !strings.Contains(strings.Join(r.logs, "\n"), "loan: the fake lender reclaims w1") {
		t.Errorf("log lacks the reclaim:\n%s", strings.Join(r.logs, "\n"))
	}
}

// TestRouterRestartKeepsDemand: a router restarting mid-peak sets its
// request counters back to zero; the tick that sees it does not read
// that as no demand (which drained every borrowed worker, borrowed again
// a tick later), and the window starts again from the new counters.
func TestRouterRestartKeepsDemand(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: 3 * time.Second, CoolDown: time.Second, MaxBorrowed: 2}, true)
	lender, step := r.lender, r.step
	step(0, false)
	for range 8 {
		step(180, false)
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed at 180 requests/s, want 2; %v", n, lender.log)
	}
	before := len(lender.log)
	step(180, true) // the router restarts; the demand goes on
	for range 4 {
		step(180, false)
	}
	if after := lender.log[before:]; len(after) > 0 {
		t.Fatalf("a router restart at a steady 180 requests/s: %v", after)
	}
	if !strings.Contains(strings.Join(r.logs, "\n"), "counters went back") {
		t.Errorf("the restart is not logged: %q", r.logs)
	}
	// The demand after the restart is measured from the new counters: it
	// falls, and the borrowed workers go back.
	for range 8 {
		step(10, false)
	}
	if n := len(lender.Workers()); n != 0 {
		t.Fatalf("%d still borrowed at 10 requests/s: %v", n, lender.log[before:])
	}
}

// TestHeldWorkerFailsToStart: a borrowed worker the controller already
// holds (seen starting) that exits before it serves is returned as lost
// under its own lease. Taken for a failed borrow, it was handed back
// while its lease went on counting it (then drained and returned again:
// "not lent"), and another, unrelated pending borrow was cancelled.
func TestHeldWorkerFailsToStart(t *testing.T) {
	r := newRig(t, capacity.Options{MaxBorrowed: 2}, false)
	lender, d := r.lender, r.d
	step := func(add float64) {
		t.Helper()
		r.step(add, false)
	}
	step(0)
	step(180)
	step(180)
	// Both borrowed workers start without an address yet; the
	// controller takes them as starting.
	lender.mu.Lock()
	for _, w := range lender.workers {
		w.Addr = ""
	}
	lender.mu.Unlock()
	step(180)
	if b := d.Stats().Borrowed["m"]; b != 2 {
		t.Fatalf("controller holds %d, want 2 starting", b)
	}
	lender.mu.Lock()
	lender.workers["w1"].Running = false // w1 exits before it serves
	lender.mu.Unlock()
	for range 6 {
		step(180)
	}
	for _, l := range lender.log {
		if strings.Contains(l, "not lent") {
			t.Errorf("the driver acted on a worker already handed back: %v", lender.log)
			break
		}
	}
	if _, ok := lender.workers["w1"]; ok {
		t.Errorf("w1 still lent after it died: %v", lender.log)
	}
	// The controller counts what the lender lends, no ghost lease.
	st := d.Stats()
	if held := st.Borrowed["m"] + st.Pending["m"]; held != len(lender.Workers()) {
		t.Errorf("controller holds %d (and has %d asked for), the lender lends %d: %v", st.Borrowed["m"], st.Pending["m"], len(lender.Workers()), lender.log)
	}
	if ev := d.Stats().Events[capacity.EventKey{Kind: "borrow failed", Reason: "provider"}]; ev != 0 {
		t.Errorf("a held worker's death reported as %d failed borrows", ev)
	}
}

// TestWatchBorrowedNothingBorrowed: with nothing borrowed the driver's
// /metrics still has its model's borrowed workers, at 0, so the load
// generator's --watch-borrowed reads 0 and not "no such metric" (every
// second of a promotion before its first borrow read as a failed read).
func TestWatchBorrowedNothingBorrowed(t *testing.T) {
	lender := &fakeLender{max: 2, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 4)}
	d, err := New(Options{
		Provider: lender, Model: "m", CapacityPerWorker: 100,
		Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
			return []*prismv1.WorkerInfo{{Id: "owned", Role: prismv1.Role_ROLE_DENSE, Addr: "addr-owned"}}, nil
		},
		RouterMetrics: func() string { return "" },
		Now:           func() time.Time { return time.Unix(1000, 0) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	w := loadgen.GaugeWatch("borrowed workers", srv.URL+"/metrics", "prism_capacity_borrowed_workers", nil)
	v, err := w.Read(context.Background())
	if err != nil || v != 0 {
		t.Fatalf("nothing borrowed: read %v, %v; want 0 and no error", v, err)
	}
}

// TestDeadWorkerReturnedAsLost: a serving borrowed worker whose process
// dies (kill -9) is drained as lost and returned as lost. The lender
// still lists it, draining and not running, after the drain: taken for a
// worker seen draining with nothing in flight, its return was counted
// as "return: drained", and prism_capacity_events_total had no lost
// return for a worker that was lost.
func TestDeadWorkerReturnedAsLost(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: time.Minute, MaxBorrowed: 2}, true)
	lender, d := r.lender, r.d
	r.step(0, false)
	for range 3 {
		r.step(180, false)
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed, want 2; %v", n, lender.log)
	}
	lender.mu.Lock()
	lender.workers["w1"].Running = false // killed: it leaves the registry too
	lender.mu.Unlock()
	for range 6 {
		r.step(180, false)
	}
	if _, ok := lender.workers["w1"]; ok {
		t.Fatalf("w1 still lent after it died: %v", lender.log)
	}
	ev := d.Stats().Events
	if ev[capacity.EventKey{Kind: "drain", Reason: capacity.ReasonLost}] != 1 || ev[capacity.EventKey{Kind: "return", Reason: capacity.ReasonLost}] != 1 || ev[capacity.EventKey{Kind: "return", Reason: capacity.ReasonDrained}] != 0 {
		t.Errorf("a dead worker's drain and return counted as %v, want drain: lost 1, return: lost 1", ev)
	}
}

// TestRouterMetricsDownKeepsTicking: while the router's /metrics cannot
// be scraped (the router restarting, one of several gone from the
// headless Service), the last demand stands and the controller goes on:
// a reclaim is drained and returned within its grace, and the borrowed
// workers stay, since the demand measured last still needs them.
// Failing the whole tick, the driver left the reclaimed worker in the
// registry past the lender's grace and decided nothing at all.
func TestRouterMetricsDownKeepsTicking(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: 3 * time.Second, CoolDown: time.Second, MaxBorrowed: 2}, true)
	lender := r.lender
	r.step(0, false)
	for range 4 {
		r.step(180, false)
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed, want 2; %v", n, lender.log)
	}
	before := len(lender.log)
	r.mu.Lock()
	r.down = true
	r.mu.Unlock()
	lender.reclaims <- capacity.ProviderReclaim{Worker: "w1", Grace: 5 * time.Second}
	for range 4 { // within the grace
		r.now = r.now.Add(time.Second)
		_ = r.d.Step(context.Background())
	}
	if got, want := strings.Join(lender.log[before:], ","), "drain w1,return w1"; !strings.HasPrefix(got, want) {
		t.Errorf("with the router's metrics down the lender saw %q, want it to start with %q", got, want)
	}
	if !slices.ContainsFunc(lender.Workers(), func(w capacity.LentWorker) bool { return w.ID == "w2" }) {
		t.Errorf("w2 went back while the demand could not be measured: %v", lender.log[before:])
	}
	if !strings.Contains(strings.Join(r.logs, "\n"), "503") {
		t.Errorf("the failed scrape is not logged: %q", r.logs)
	}
}

// TestRouterSetChangeKeepsDemand: with several routers the demand is the
// sum of their counters. One that drops out of the headless Service's
// addresses for a tick (its readiness probe failed under load) and comes
// back brings its whole count since it started into the sum at once: read
// as the demand of one window, a million requests made a phantom peak
// that borrowed all the lender had. A change in the routers scraped is
// read as a restart is: the last demand stands, the window starts again.
func TestRouterSetChangeKeepsDemand(t *testing.T) {
	var mu sync.Mutex
	counts := []float64{1e6, 2e6} // long-running routers
	var urls []string
	for i := range counts {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(w, "prism_rpc_requests_total{code=\"OK\",method=%q} %g\n", recommendMethod, counts[i])
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	scraped := strings.Join(urls, ",")
	now := time.Unix(1000, 0)
	lender := &fakeLender{max: 2, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 4)}
	d, err := New(Options{
		Provider: lender, Model: "m", CapacityPerWorker: 100, Controller: capacity.Options{MaxBorrowed: 2},
		Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
			return []*prismv1.WorkerInfo{{Id: "owned", Role: prismv1.Role_ROLE_DENSE, Addr: "addr-owned"}}, nil
		},
		RouterMetrics: func() string { mu.Lock(); defer mu.Unlock(); return scraped },
		Now:           func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	step := func(set string) {
		t.Helper()
		mu.Lock()
		counts[0] += 15 // 30 requests/s in all: the owned worker carries it
		counts[1] += 15
		scraped = set
		mu.Unlock()
		now = now.Add(time.Second)
		if err := d.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		step(strings.Join(urls, ","))
	}
	step(urls[0]) // the second router out of the addresses for a tick
	for range 4 {
		step(strings.Join(urls, ","))
	}
	if len(lender.log) > 0 {
		t.Errorf("30 requests/s on one worker of 100, a router gone for a tick and back: the lender saw %v", lender.log)
	}
	if got := d.Status().Last["offered_rps"]; got != 30.0 {
		t.Errorf("offered %v requests/s after the routers settled, want 30", got)
	}
}

// TestPredictiveBorrowsAheadOfPromotion: with policy=predictive and a
// promotion calendar, the driver forecasts the demand measured now
// scaled by the calendar, and borrows the start-up time (plus a tick)
// ahead of the promotion, so the workers serve when it comes; reactive,
// the same demand borrows only once the peak is measured.
func TestPredictiveBorrowsAheadOfPromotion(t *testing.T) {
	firstBorrow := func(policy capacity.Policy) time.Duration {
		t.Helper()
		r := newRig(t, capacity.Options{Policy: policy, StartupEstimate: 5 * time.Second, MinLease: time.Minute, CoolDown: time.Second, MaxBorrowed: 2}, true)
		start := r.now
		r.d.o.Promotions = []Promotion{{Start: start.Add(30 * time.Second), Duration: time.Hour, Factor: 3}}
		for range 40 {
			rate := 50.0 // half an owned worker: nothing to borrow for
			if r.now.Add(time.Second).Sub(start) > 30*time.Second {
				rate = 150 // the promotion: three times the baseline
			}
			r.step(rate, false)
			if len(r.lender.log) > 0 {
				return r.now.Sub(start)
			}
		}
		t.Fatalf("%v: nothing borrowed in 40 s", policy)
		return 0
	}
	if at := firstBorrow(capacity.Predictive); at < 20*time.Second || at >= 30*time.Second {
		t.Errorf("predictive borrowed at %v, want ahead of the promotion at 30s by about the start-up time (5s) and a tick", at)
	}
	if at := firstBorrow(capacity.Reactive); at <= 30*time.Second {
		t.Errorf("reactive borrowed at %v, before the promotion's demand was measured", at)
	}
}

// TestServedWorkerOutOfRegistryReturned: a borrowed worker that served,
// then left the registry while its lender still lists it running (a Pod
// whose container crash-loops in place: the Pod stays Running), is
// drained and returned after the borrow timeout, and replaced. Held, it
// counted as capacity for the rest of the loan while serving nothing.
func TestServedWorkerOutOfRegistryReturned(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: time.Hour, CoolDown: time.Hour, MaxBorrowed: 2, StartupEstimate: 2 * time.Second, BorrowTimeout: 5 * time.Second}, true)
	lender, d := r.lender, r.d
	r.step(0, false)
	for range 3 {
		r.step(180, false)
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed, want 2; %v", n, lender.log)
	}
	r.mu.Lock()
	r.unlisted["w1"] = true
	r.mu.Unlock()
	for range 10 {
		r.step(180, false)
	}
	if got := strings.Join(lender.log, ","); !strings.Contains(got, "drain w1,return w1,borrow w3") {
		t.Errorf("lender saw %s; want w1, out of the registry past the borrow timeout, drained, returned and replaced", got)
	}
	if ev := d.Stats().Events[capacity.EventKey{Kind: "drain", Reason: capacity.ReasonStopped}]; ev != 1 {
		t.Errorf("drains for a worker that stopped serving: %d, want 1", ev)
	}
}

// TestReclaimGraceFromTheReclaim: a reclaim's grace runs from the
// lender's reclaim, not from the tick that hears of it. A worker
// reclaimed 10s before the tick (a tick of 10s) with a 10s grace, still
// running with work, is past its deadline at that tick: drained then and
// released at the next. Timed from the tick, the deadline was 10s later,
// and the lender's device was held 10s past the grace it gave.
func TestReclaimGraceFromTheReclaim(t *testing.T) {
	r := newRig(t, capacity.Options{MinLease: time.Hour, CoolDown: time.Hour, MaxBorrowed: 2}, true)
	lender, d := r.lender, r.d
	lender.slowDrain = true
	r.step(0, false)
	for range 3 {
		r.step(180, false)
	}
	if n := len(lender.Workers()); n != 2 {
		t.Fatalf("%d borrowed, want 2; %v", n, lender.log)
	}
	lender.reclaims <- capacity.ProviderReclaim{Worker: "w1", Grace: 10 * time.Second, At: r.now.Add(-9 * time.Second)}
	r.step(180, false) // hears of it 10s after the reclaim: its grace is over
	r.step(180, false)
	if got := strings.Join(lender.log, ","); !strings.Contains(got, "drain w1,return w1") {
		t.Fatalf("lender saw %s; want w1 drained and returned a tick after its grace ended", got)
	}
	if s := d.Stats(); s.ReleasedWithInFlight != 1 {
		t.Errorf("released with work in flight: %d, want 1 (w1 still held its work at the grace's end)", s.ReleasedWithInFlight)
	}
}
