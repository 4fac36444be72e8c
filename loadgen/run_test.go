package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// dialFake serves f in process over bufconn and returns a sender to it.
func dialFake(t *testing.T, f *Fake) Sender {
	t.Helper()
	return serveBufconn(t, grpc.NewServer(), f)
}

// serveBufconn serves f on srv over bufconn until the test ends and
// returns a sender to it.
func serveBufconn(t *testing.T, srv *grpc.Server, f *Fake) GRPCSender {
	t.Helper()
	var bn grpctest.Net
	lis := bn.MustListen(t, "recommender")
	prismv1.RegisterRecommenderServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return dialAddr(t, lis.Addr().String(), bn.DialOption()).(GRPCSender)
}

// dialAddr is a sender to addr: a loopback port for the benchmarks, a
// bufconn target (with its Net's DialOption) for the tests.
func dialAddr(t testing.TB, addr string, opts ...grpc.DialOption) Sender {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return GRPCSender{Client: prismv1.NewRecommenderClient(cc), Conn: cc}
}

func tinyRequests(t testing.TB, cand Candidates) *Requests {
	q, err := NewRequests(RequestOptions{Model: "m", Sig: tinySig(t), Candidates: cand, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// stall makes the server freeze for [from, to) after start, as a GC pause
// or a failover would: every request that arrives then is answered at to.
func stall(start time.Time, from, to time.Duration) func(*prismv1.RecommendRequest) time.Duration {
	return func(*prismv1.RecommendRequest) time.Duration {
		el := time.Since(start)
		if el >= from && el < to {
			return to - el
		}
		return 0
	}
}

// The coordinated-omission check: a 1s stall in a 3s run must show in
// p99, both when the generator keeps sending through it and when it is
// itself blocked (one request in flight, like a naive closed-loop
// client), because latency counts from each request's intended time.
//
// The run is in a synctest bubble: the generator's clock and sleeps (the
// wall clock) and the fake server's stall all keep the bubble's fake
// time, which moves on only when every goroutine of the run (generator,
// senders, gRPC's over bufconn) is blocked. Only the stall takes time, so
// the summary is exact whatever the load on the machine: it is checked
// against one recorded from the schedule and the stall alone.
func TestStallShowsInP99(t *testing.T) {
	for _, inflight := range []int{0, 1} {
		t.Run(fmt.Sprintf("inflight=%d", inflight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := Options{Profile: Constant(200), Duration: 3 * time.Second, MaxRequests: 1e6, MaxInFlight: inflight, Seed: 1, SLO: 100 * time.Millisecond}
				from, to := time.Second, 2*time.Second
				start := time.Now()
				s := dialFake(t, &Fake{Delay: stall(start, from, to)})
				sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(10)), s)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("sent %d p50 %.2fms p99 %.2fms max %.2fms lag max %.2fms attainment %.4f", sum.Sent, sum.P50, sum.P99, sum.Max, sum.SendLagMaxMs, sum.SLOAttained)

				// The run as it must go: every request is answered at
				// once, except those that reach the server in [from, to),
				// answered at to. With max in-flight 1 the requests
				// intended during the stall wait for the one in flight
				// and are sent at to; they are answered at once then,
				// but their latency still runs from their intended time.
				sched, err := NewSchedule(o.Profile, false, o.Seed)
				if err != nil {
					t.Fatal(err)
				}
				want := NewRecorder(o.SLO)
				want.cutoff = o.Duration + o.SLO
				var last time.Duration
				for at := sched.Next(); at < o.Duration; at = sched.Next() {
					sent, done := at, at
					if at >= from && at < to {
						done = to
						if inflight == 1 && at > from {
							sent = to
						}
					}
					want.Sent(at, sent)
					want.Done(at, done, 10, codes.OK)
					last = at
				}
				w := want.summary(o, o.Duration, true)
				if el := time.Since(start); el != last {
					t.Fatalf("the run ended at %v of fake time, want at its last arrival, %v", el, last)
				}
				if sum.Sent != w.Sent || sum.OK != w.Sent || sum.P50 != w.P50 || sum.P99 != w.P99 || sum.Max != w.Max || sum.SLOAttained != w.SLOAttained || sum.SendLagMaxMs != w.SendLagMaxMs {
					t.Fatalf("sent %d ok %d p50 %v p99 %v max %v attainment %v lag max %v; want sent and ok %d p50 %v p99 %v max %v attainment %v lag max %v",
						sum.Sent, sum.OK, sum.P50, sum.P99, sum.Max, sum.SLOAttained, sum.SendLagMaxMs, w.Sent, w.P50, w.P99, w.Max, w.SLOAttained, w.SendLagMaxMs)
				}
				// What that means: of about 600 requests, the third
				// intended during the stall waited up to its whole second,
				// which p99 shows; the others were answered at once (the
				// histograms' least latency is 1 µs).
				if sum.Sent < 600 || sum.P99 < 900 || sum.P50 > 0.001 || sum.SLOAttained < 0.65 || sum.SLOAttained > 0.75 {
					t.Fatalf("sent %d p50 %.1fms p99 %.1fms attainment %.3f: the stall does not show", sum.Sent, sum.P50, sum.P99, sum.SLOAttained)
				}
			})
		})
	}
}

// TestClosedLoop: 4 clients, each answer 5 ms, a 1s run. In a synctest
// bubble (see TestStallShowsInP99) only the answers take time: each
// client sends 200 requests, so the run answers exactly 800 req/s, all
// in 5 ms.
func TestClosedLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := dialFake(t, &Fake{Delay: func(*prismv1.RecommendRequest) time.Duration { return 5 * time.Millisecond }})
		sum, err := Run(context.Background(), Options{Clients: 4, Duration: time.Second, MaxRequests: 1e6}, tinyRequests(t, Fixed(8)), s)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Mode != "closed" || sum.Sent != 800 || sum.OK != 800 || sum.RPS != 800 || sum.P50 < 5 || sum.Max > 5.01 {
			t.Fatalf("closed loop: %s sent %d ok %d, %.0f req/s p50 %.3fms max %.3fms; want 800 answered, all in 5 ms", sum.Mode, sum.Sent, sum.OK, sum.RPS, sum.P50, sum.Max)
		}
		if sum.SamplesPS != 8*sum.RPS {
			t.Fatalf("samples/s %.0f for %.0f req/s of 8", sum.SamplesPS, sum.RPS)
		}
	})
}

type flaky struct{ n atomic.Int64 }

func (f *flaky) Send(ctx context.Context, req *prismv1.RecommendRequest) error {
	if f.n.Add(1)%4 == 0 {
		return status.Error(codes.Unavailable, "down")
	}
	return nil
}

// TestCapErrorsAndReports: a cap of 400 requests at 1000 req/s stops a
// 10 s run at its 400th arrival, 399 ms in, with a live line every 100 ms
// on the way. The run is in a synctest bubble (see TestStallShowsInP99):
// its pacing and the live ticker keep fake time, so it ends at exactly
// 399 ms with exactly 3 live lines however loaded the machine is. On the
// wall clock it had to end within 2 s (it took up to 1.25 s with 8 copies
// at once), and a live goroutine starved until the run's end could miss
// its ticks.
func TestCapErrorsAndReports(t *testing.T) {
	var live bytes.Buffer
	var sum *Summary
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var err error
		sum, err = Run(context.Background(), Options{Profile: Constant(1000), Duration: 10 * time.Second, MaxRequests: 400, Live: &live, LiveEvery: 100 * time.Millisecond}, tinyRequests(t, Fixed(3)), &flaky{})
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el != 399*time.Millisecond {
			t.Fatalf("a cap of 400 at 1000/s ended the run at %v of fake time, want at its 400th arrival, 399ms", el)
		}
	})
	if sum.Sent != 400 || sum.OK != 300 || sum.ErrorsByCode["Unavailable"] != 100 {
		t.Fatalf("sent %d ok %d errors %v", sum.Sent, sum.OK, sum.ErrorsByCode)
	}
	if n := strings.Count(live.String(), "loadgen:"); n != 3 {
		t.Fatalf("%d live lines in 399 ms at one per 100 ms, want 3: %q", n, live.String())
	}
	var text bytes.Buffer
	sum.WriteText(&text)
	for _, want := range []string{"sent 400  ok 300  errors 100", "Unavailable 100", "p99.9"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, text.String())
		}
	}
	dir := t.TempDir()
	if err := sum.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	csv, _ := os.ReadFile(filepath.Join(dir, "timeseries.csv"))
	if !strings.HasPrefix(string(csv), "second,offered_rps,completed_rps,ok,errors,samples,p99_ms\n0,400,") {
		t.Fatalf("timeseries.csv:\n%s", csv)
	}
	f, err := os.Open(filepath.Join(dir, "plot.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("plot.png: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "summary.json")); err != nil {
		t.Fatal(err)
	}
}

func TestRunNeedsBounds(t *testing.T) {
	q := tinyRequests(t, Fixed(1))
	if _, err := Run(context.Background(), Options{Profile: Constant(1), MaxRequests: 1}, q, &flaky{}); err == nil {
		t.Fatal("a run without a duration was accepted")
	}
	if _, err := Run(context.Background(), Options{Profile: Constant(1), Duration: time.Second}, q, &flaky{}); err == nil {
		t.Fatal("a run without a request cap was accepted")
	}
}

func TestFindMax(t *testing.T) {
	const capacity = 1234.0
	trial := func(_ context.Context, rate float64) (*Summary, error) {
		s := &Summary{Sent: 1000, OK: 1000, RPS: rate, OfferedRPS: rate, P99: 5}
		if rate > capacity {
			s.P99 = 500
		}
		return s, nil
	}
	res, err := FindMax(context.Background(), FindMaxOptions{Start: 100, SLO: 60 * time.Millisecond, Tolerance: 0.02, MaxTrials: 30}, trial, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxRate > capacity || res.MaxRate < 0.98*capacity {
		t.Fatalf("max rate %.1f, want within 2%% under %v (%d trials)", res.MaxRate, capacity, len(res.Trials))
	}
	// A start above capacity searches down.
	res, err = FindMax(context.Background(), FindMaxOptions{Start: 10000, SLO: 60 * time.Millisecond}, trial, nil)
	if err != nil || res.MaxRate > capacity || res.MaxRate < 0.95*capacity {
		t.Fatalf("from above: max rate %.1f err %v", res.MaxRate, err)
	}
}

// stepClock is a fake clock: Sleep advances it.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *stepClock) Sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// slowLast answers at once, except request lg-<last>, which takes slow.
type slowLast struct {
	clock *stepClock
	last  string
	slow  time.Duration
}

func (s *slowLast) Send(_ context.Context, req *prismv1.RecommendRequest) error {
	if req.RequestId == s.last {
		s.clock.Sleep(context.Background(), s.slow)
	}
	return nil
}

// TestStragglerKeepsThroughput: one straggler at the end of a find-max
// trial (answered 1 s late, within the request timeout) does not halve
// the throughput: divided by the time to the last answer, it did, and
// Judge failed the trial as "answered 100.3 req/s of 200.0 offered"
// although 199 of 200 requests were answered at once.
func TestStragglerKeepsThroughput(t *testing.T) {
	clk := &stepClock{now: time.Unix(1000, 0)}
	s := &slowLast{clock: clk, last: "lg-200", slow: time.Second}
	o := Options{Profile: Constant(200), Poisson: false, Duration: time.Second, MaxRequests: 1e6, MaxInFlight: 1, Clock: clk, SLO: 60 * time.Millisecond}
	sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(1)), s)
	if err != nil {
		t.Fatal(err)
	}
	fm := FindMaxOptions{SLO: 60 * time.Millisecond, MaxErrors: 0.01, MinAchieved: 0.95}
	ok, why := fm.Judge(200, sum)
	t.Logf("sent %d ok %d duration %.3fs offered %.1f rps throughput %.1f rps p99 %.2fms", sum.Sent, sum.OK, sum.DurationS, sum.OfferedRPS, sum.RPS, sum.P99)
	if sum.RPS < 0.95*200 || !ok {
		t.Fatalf("throughput %.1f req/s for 200 answered within a 1s run; Judge: pass=%v %q", sum.RPS, ok, why)
	}
}

// TestWatchReads: GaugeWatch sums a metric's samples; a page without it
// and a URL nobody answers are errors (read as 0, a wrong URL looked like
// nothing borrowed), and a run whose reads all failed says so and why
// instead of "peak NaN".
func TestWatchReads(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP prism_capacity_borrowed_workers x\nprism_capacity_borrowed_workers{model=\"a\"} 2\nprism_capacity_borrowed_workers{model=\"b\"} 1\nprism_capacity_borrowed_workers_total 9\n")
	}))
	defer srv.Close()
	ctx := context.Background()
	if v, err := GaugeWatch("borrowed", srv.URL, "prism_capacity_borrowed_workers", nil).Read(ctx); err != nil || v != 3 {
		t.Fatalf("read %v, %v; want 3", v, err)
	}
	if _, err := GaugeWatch("borrowed", srv.URL, "prism_other", nil).Read(ctx); err == nil || !strings.Contains(err.Error(), "no prism_other in it") {
		t.Fatalf("a page without the metric: %v", err)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	w := GaugeWatch("borrowed workers", deadURL, "prism_capacity_borrowed_workers", nil)
	if _, err := w.Read(ctx); err == nil {
		t.Fatal("a URL nobody answers read without an error")
	}
	o := Options{Profile: Constant(50), Duration: 1500 * time.Millisecond, MaxRequests: 1e6, SLO: 60 * time.Millisecond, Watch: w}
	sum, err := Run(ctx, o, tinyRequests(t, Fixed(1)), nopSender{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sum.WriteText(&b)
	if sum.WatchFailed == 0 || !strings.Contains(b.String(), "watched     borrowed workers: no read of") || strings.Contains(b.String(), "NaN") {
		t.Fatalf("WatchFailed %d, report:\n%s", sum.WatchFailed, b.String())
	}
}

// nopSender answers every request at once.
type nopSender struct{}

func (nopSender) Send(context.Context, *prismv1.RecommendRequest) error { return nil }

// TestFindMaxInterruptedTrialNotJudged: a trial cut short by the
// search's context (Ctrl-C) covers a moment of its rate, not the rate
// held: judged, its few fast answers made it a pass, and the rate
// found was one the server was never shown to hold.
func TestFindMaxInterruptedTrialNotJudged(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trial := func(_ context.Context, rate float64) (*Summary, error) {
		if rate > 100 {
			cancel() // interrupted during this trial: what it sent was answered at once
		}
		return &Summary{Sent: 10, OK: 10, RPS: rate, OfferedRPS: rate, P99: 1}, nil
	}
	res, err := FindMax(ctx, FindMaxOptions{Start: 100, SLO: 60 * time.Millisecond}, trial, nil)
	if err != context.Canceled {
		t.Fatalf("error %v, want the interruption", err)
	}
	if len(res.Trials) != 1 || res.MaxRate != 100 {
		t.Fatalf("max rate %.1f over %d trials, want 100 from the one trial that ran whole", res.MaxRate, len(res.Trials))
	}
}

// hung answers no request: each waits for its own deadline.
type hung struct{ n atomic.Int64 }

func (h *hung) Send(ctx context.Context, _ *prismv1.RecommendRequest) error {
	h.n.Add(1)
	<-ctx.Done()
	return status.Error(codes.DeadlineExceeded, "hung")
}

// TestInterruptAtMaxInFlight: a run interrupted while --max-inflight
// requests are out sends nothing more; the dispatcher waited for a slot
// (up to --timeout) and then sent one more request after the interrupt.
func TestInterruptAtMaxInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &hung{}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		sum, err := Run(ctx, Options{Profile: Constant(100), Duration: 10 * time.Second, MaxRequests: 1e6, MaxInFlight: 1, Timeout: time.Second}, tinyRequests(t, Fixed(1)), h)
		if err != nil && sum == nil {
			t.Fatal(err)
		}
		if n := h.n.Load(); n != 1 {
			t.Errorf("%d requests sent, want 1 (the one in flight when interrupted)", n)
		}
	})
}
