package router

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// The rule: floor + (ahead+n)/rate against the time left; no rate, no
// refusal.
func TestPredictFinish(t *testing.T) {
	for _, c := range []struct {
		name      string
		rate      float64
		floor     time.Duration
		ahead, n  int64
		remaining time.Duration
		predicted time.Duration
		ok        bool
	}{
		{"cold start admits anything", 0, 0, 1 << 20, 270, time.Millisecond, 0, true},
		{"idle system, loose deadline", 10000, 0, 0, 100, 60 * time.Millisecond, 10 * time.Millisecond, true},
		{"backlog within the deadline", 10000, 0, 400, 100, 60 * time.Millisecond, 50 * time.Millisecond, true},
		{"exactly at the deadline", 10000, 0, 500, 100, 60 * time.Millisecond, 60 * time.Millisecond, true},
		{"backlog past the deadline", 10000, 0, 600, 100, 60 * time.Millisecond, 70 * time.Millisecond, false},
		{"same backlog, loose deadline", 10000, 0, 600, 100, 30 * time.Second, 70 * time.Millisecond, true},
		{"deadline already passed", 10000, 0, 0, 1, -time.Millisecond, 100 * time.Microsecond, false},
		// A rate measured low once (a slow first window, a stall) must
		// not refuse a request with nothing ahead: it frees nothing, and
		// only answered requests move the rate again.
		{"nothing ahead, rate measured low", 500, 0, 0, 100, 100 * time.Millisecond, 200 * time.Millisecond, true},
		// The pipeline's floor: a request alone still takes its lookups
		// and scoring one after the other.
		{"floor pushes a backlog past the deadline", 10000, 15 * time.Millisecond, 400, 100, 60 * time.Millisecond, 65 * time.Millisecond, false},
		{"floor within a loose deadline", 10000, 15 * time.Millisecond, 400, 100, 100 * time.Millisecond, 65 * time.Millisecond, true},
		{"floor past the deadline, nothing ahead", 10000, 80 * time.Millisecond, 0, 100, 60 * time.Millisecond, 90 * time.Millisecond, true},
		{"floor without a rate", 0, 15 * time.Millisecond, 1 << 20, 270, time.Millisecond, 0, true},
		// (ahead+n)/rate past what a Duration holds: converted as it was,
		// it wrapped negative and the request was admitted.
		{"backlog at a rate near zero", 1e-9, 0, 1 << 20, 270, time.Second, math.MaxInt64, false},
		{"backlog at a rate near zero, with a floor", 1e-9, 15 * time.Millisecond, 1 << 20, 270, 30 * time.Second, math.MaxInt64, false},
		{"just past a Duration", 1, time.Hour, math.MaxInt64 / int64(time.Second), 0, 30 * time.Second, math.MaxInt64, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := predictFinish(c.rate, c.floor, c.ahead, c.n, c.remaining)
			if ok != c.ok || (got-c.predicted).Abs() > time.Microsecond {
				t.Fatalf("predictFinish(%v, %v, %d, %d, %v) = %v, %v; want %v, %v", c.rate, c.floor, c.ahead, c.n, c.remaining, got, ok, c.predicted, c.ok)
			}
		})
	}
}

// The estimator on a logical clock: samples per busy second, windows of
// at least predictWindow, EWMA across windows, idle time not counted.
func TestPredictorRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type ev struct {
		kind string // begin, end, answered
		ms   int
		n    int64
	}
	for _, c := range []struct {
		name string
		evs  []ev
		rate float64
	}{
		{"no data", nil, 0},
		{"window not yet full", []ev{{"begin", 0, 0}, {"answered", 20, 100}}, 0},
		// A cold first request of 4 candidates, 62 ms: no rate from it
		// (it read 64 samples/s and refused requests at light load).
		{"one small request sets no rate", []ev{{"begin", 0, 0}, {"answered", 62, 4}, {"end", 62, 0}}, 0},
		{"a small window waits for more samples", []ev{
			{"begin", 0, 0}, {"answered", 62, 4}, {"end", 62, 0},
			{"begin", 1000, 0}, {"answered", 1038, 540}, {"end", 1038, 0},
		}, 544 / 0.1},
		{"one window: 500 samples in 50 ms", []ev{{"begin", 0, 0}, {"answered", 25, 250}, {"answered", 50, 250}}, 10000},
		{"idle gaps are not busy time", []ev{
			{"begin", 0, 0}, {"answered", 25, 250}, {"end", 25, 0},
			{"begin", 5000, 0}, {"answered", 5025, 250}, {"end", 5025, 0},
		}, 10000},
		{"overlapping requests count busy time once", []ev{
			{"begin", 0, 0}, {"begin", 10, 0}, {"answered", 30, 300}, {"end", 30, 0}, {"answered", 50, 200}, {"end", 50, 0},
		}, 10000},
		{"EWMA across windows", []ev{
			{"begin", 0, 0}, {"answered", 50, 500}, // 10000/s
			{"answered", 100, 1500}, // 30000/s: 0.3*30000 + 0.7*10000
		}, 16000},
		{"a stall lowers the rate", []ev{
			{"begin", 0, 0}, {"answered", 50, 500}, // 10000/s
			{"answered", 1050, 500}, // 500/s: 0.3*500 + 0.7*10000
		}, 7150},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p predictor
			for _, e := range c.evs {
				switch e.kind {
				case "begin":
					p.begin(at(e.ms))
				case "end":
					p.end(at(e.ms))
				case "answered":
					p.answered(at(e.ms), e.n)
				}
			}
			if got := p.rateNow(); math.Abs(got-c.rate) > 1e-6*c.rate+1e-9 {
				t.Fatalf("rate %v, want %v", got, c.rate)
			}
		})
	}
}

// The floor: what lone requests took beyond n/rate, smoothed; nothing
// before there is a rate; never below zero.
func TestPredictorFloor(t *testing.T) {
	var p predictor
	p.alone(50*time.Millisecond, 100)
	if p.floorNow() != 0 {
		t.Fatalf("floor %v before any rate, want 0", p.floorNow())
	}
	p.rate = 10000 // 100 samples: 10 ms of the system's time
	p.alone(20*time.Millisecond, 100)
	if got, want := p.floorNow(), 2*time.Millisecond; (got - want).Abs() > time.Microsecond {
		t.Fatalf("floor %v after one lone request 10 ms over n/rate, want %v (0.2 of it)", got, want)
	}
	for range 100 {
		p.alone(20*time.Millisecond, 100)
	}
	if got, want := p.floorNow(), 10*time.Millisecond; (got - want).Abs() > 10*time.Microsecond {
		t.Fatalf("floor %v after many, want %v", got, want)
	}
	for range 100 {
		p.alone(time.Millisecond, 100) // faster than n/rate: counts as 0
	}
	if got := p.floorNow(); got > 10*time.Microsecond {
		t.Fatalf("floor %v after requests faster than n/rate, want about 0", got)
	}
}

// Under a backlog, a request whose deadline the measured rate cannot
// meet is refused at once, without reaching a worker; one with a loose
// deadline is admitted and answered.
func TestRecommendAdmitsByPredictedTime(t *testing.T) {
	cn := &fakeCN{gate: make(chan struct{})}
	r := newRouter(t, Options{}, cn)
	// Measured: 1000 samples/s (as if from earlier answered micro-batches).
	r.preds.get("m").rate = 1000
	held := backlog(r, cn, 100)
	// 100 samples ahead + 10 at 1000/s: 110 ms, past a 50 ms deadline.
	tight, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := r.Recommend(tight, request(10))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "predicted to finish in 110.0 ms, past its deadline in") {
		t.Fatalf("tight deadline under a backlog: %v, want ResourceExhausted predicting 110 ms", err)
	}
	if tight.Err() != nil {
		t.Fatal("the refusal waited for the deadline instead of coming at once")
	}
	if got := cn.calls.Load(); got != 1 {
		t.Fatalf("%d Lookups, want only the backlog's: the refused request reached a worker", got)
	}
	if got := r.inflight.Load(); got != 100 {
		t.Fatalf("%d samples in flight after the refusal, want the backlog's 100", got)
	}
	// The same request with a loose deadline is admitted and answered.
	loose, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	answered := make(chan error, 1)
	go func() { _, err := r.Recommend(loose, request(10)); answered <- err }()
	for cn.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(cn.gate)
	if err := <-answered; err != nil {
		t.Fatalf("loose deadline: %v", err)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	// With FixedAdmission the tight request is admitted as before.
	r2 := newRouter(t, Options{FixedAdmission: true}, &fakeCN{})
	r2.preds.get("m").rate = 1
	tight2, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel3()
	if _, err := r2.Recommend(tight2, request(10)); err != nil {
		t.Fatalf("FixedAdmission: %v", err)
	}
}

// TestPredictorGauges: the router exports admission's rate and floor.
func TestPredictorGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(Options{}, reg)
	now := time.Unix(0, 0)
	r.preds.get("m").begin(now)
	now = now.Add(100 * time.Millisecond)
	r.preds.get("m").answered(now, 5000)
	r.preds.get("m").end(now)
	r.preds.get("m").alone(30*time.Millisecond, 500)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
			got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	// 5000 samples in 100 ms busy: 50,000/s; the lone 500 took 30 ms
	// against 10 ms at that rate: floor 0.2 x 20 ms.
	if v := got["prism_router_predicted_rate_samples_per_second"]; math.Abs(v-50000) > 1 {
		t.Errorf("rate gauge %v, want 50000", v)
	}
	if v := got["prism_router_predicted_floor_seconds"]; math.Abs(v-0.004) > 1e-6 {
		t.Errorf("floor gauge %v, want 0.004", v)
	}
}

// rateNow and floorNow read one half of estimate.
func (p *predictor) rateNow() float64 { r, _ := p.estimate(); return r }

func (p *predictor) floorNow() time.Duration { _, f := p.estimate(); return f }

// TestAdmissionPerModel: each model is predicted from its own rate and
// its own samples in flight. A backlog of model m does not make a tight
// request of model b, served by its own workers, be refused (with one
// predictor for all models it was: 100 samples of m counted ahead of it
// at the mix's rate), while a tight request of m behind that backlog is.
//
// It runs in a synctest bubble: the 50 ms deadlines are fake time, so
// model b's request, which first connects to its worker, is not cut off
// by a loaded machine's scheduling before it is answered (it was in 2 of
// 15 runs, 3 copies at once: "deadline exceeded while waiting for
// connections to become ready"); only the predicted times decide.
func TestAdmissionPerModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cn := &fakeCN{gate: make(chan struct{})}
		release := sync.OnceFunc(func() { close(cn.gate) })
		var held <-chan error
		defer func() { // a failure still lets the backlog go, and waits for it
			release()
			if held != nil {
				<-held
			}
		}()
		r := newRouter(t, Options{}, cn)
		t.Cleanup(r.Close)
		other := &fakeCN{}
		addr := startCN(t, other)
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu-b", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"b"}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu-b", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:b", Models: []string{"b"}, Healthy: true}})
		r.preds.get("m").rate = 1000
		r.preds.get("b").rate = 1000
		held = backlog(r, cn, 100)
		tight := func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}
		ctx, cancel := tight()
		defer cancel()
		reqB := request(10)
		reqB.Model = "b"
		if _, err := r.Recommend(ctx, reqB); err != nil {
			t.Fatalf("model b, nothing of it in flight, behind model m's backlog: %v", err)
		}
		ctx2, cancel2 := tight()
		defer cancel2()
		if _, err := r.Recommend(ctx2, request(10)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("model m behind its own backlog: %v, want ResourceExhausted", err)
		}
		release()
		err := <-held
		held = nil
		if err != nil {
			t.Fatal(err)
		}
		if a, b := r.preds.get("m").inflight.Load(), r.preds.get("b").inflight.Load(); a != 0 || b != 0 {
			t.Fatalf("samples in flight after every answer: m %d, b %d", a, b)
		}
	})
}

// TestFloorLearnsFromAnswersOnly: the floor is learned from the lone
// requests that were answered. One that failed (its client gone, or
// held by a hung worker until the default timeout, 30 s) took what its
// client or the timeout allowed, not what the pipeline takes: counted,
// a single such request set a floor of seconds that refused every
// request with anything of its model ahead, and only lone requests,
// rare under load, brought it back down.
func TestFloorLearnsFromAnswersOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cn := &fakeCN{gate: make(chan struct{})}
		release := sync.OnceFunc(func() { close(cn.gate) })
		held := make(chan error, 1)
		held <- nil
		defer func() { // a failure still lets the backlog go, and waits for it
			release()
			<-held
		}()
		r := newRouter(t, Options{DefaultTimeout: 2 * time.Second}, cn)
		t.Cleanup(r.Close)
		mp := r.preds.get("m")
		mp.rate = 10000 // 10 samples: 1 ms

		// A hung worker: the lone request, without a deadline of its
		// own, ends at the default timeout (2 s here).
		if _, err := r.Recommend(context.Background(), request(10)); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a lone request on a hung worker: %v, want DeadlineExceeded", err)
		}
		if got := mp.floorNow(); got != 0 {
			t.Errorf("floor %v after a lone request held to the default timeout, want 0", got)
		}
		// A client that gives up after a second.
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		if _, err := r.Recommend(ctx, request(10)); status.Code(err) != codes.Canceled {
			t.Fatalf("a lone request its client cancelled: %v, want Canceled", err)
		}
		if got := mp.floorNow(); got != 0 {
			t.Errorf("floor %v after a lone request its client cancelled, want 0", got)
		}

		// With no floor learned from them, a request behind a backlog of
		// 100 samples (11 ms at the rate) is admitted with a 300 ms
		// deadline (and, the worker still hung, runs out of it there).
		<-held
		go func() { _, err := r.Recommend(context.Background(), request(100)); held <- err }()
		for mp.inflight.Load() != 100 {
			time.Sleep(time.Millisecond)
		}
		tight, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel2()
		if _, err := r.Recommend(tight, request(10)); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a request behind 100 samples with a 300 ms deadline: %v, want admitted (DeadlineExceeded at the hung worker)", err)
		}
		// The worker answers: the lone backlog's answer does move the
		// floor.
		release()
		err := <-held
		held <- nil
		if err != nil {
			t.Fatal(err)
		}
		if got := mp.floorNow(); got <= 0 {
			t.Fatalf("floor %v after an answered lone request that took 300 ms, want above 0", got)
		}
	})
}
