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
func TestStallShowsInP99(t *testing.T) {
	for _, inflight := range []int{0, 1} {
		start := time.Now()
		s := dialFake(t, &Fake{Delay: stall(start, time.Second, 2*time.Second)})
		sum, err := Run(context.Background(), Options{Profile: Constant(200), Duration: 3 * time.Second, MaxRequests: 1e6, MaxInFlight: inflight, Seed: 1, SLO: 100 * time.Millisecond}, tinyRequests(t, Fixed(10)), s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("max in-flight %d: sent %d p50 %.2fms p99 %.2fms max %.2fms lag max %.2fms attainment %.3f", inflight, sum.Sent, sum.P50, sum.P99, sum.Max, sum.SendLagMaxMs, sum.SLOAttained)
		if sum.Sent < 590 || sum.OK != sum.Sent {
			t.Fatalf("sent %d ok %d, want about 600 all ok", sum.Sent, sum.OK)
		}
		if sum.P99 < 900 {
			t.Fatalf("p99 %.1fms hides a 1s stall", sum.P99)
		}
		// The checks above and the attainment's upper bound hold however
		// loaded the machine is (load only adds latency). The lower bounds
		// below are loose for the same reason: on a quiet machine p50 is
		// under 5 ms and attainment about 0.7. With the tighter bounds it
		// had (p50 under 50 ms, attainment over 0.55) this test failed
		// once while three other test runs shared the machine's two cores.
		if sum.P50 > 300 {
			t.Fatalf("p50 %.1fms: two thirds of the run were not stalled", sum.P50)
		}
		// About a third of the requests hit the stall, most over the SLO.
		if sum.SLOAttained > 0.75 || sum.SLOAttained < 0.3 {
			t.Fatalf("SLO attainment %.3f, want about 0.7", sum.SLOAttained)
		}
	}
}

func TestClosedLoop(t *testing.T) {
	s := dialFake(t, &Fake{Delay: func(*prismv1.RecommendRequest) time.Duration { return 5 * time.Millisecond }})
	sum, err := Run(context.Background(), Options{Clients: 4, Duration: time.Second, MaxRequests: 1e6}, tinyRequests(t, Fixed(8)), s)
	if err != nil {
		t.Fatal(err)
	}
	// 4 clients, 5ms each: at most 800 req/s.
	if sum.Mode != "closed" || sum.RPS < 300 || sum.RPS > 820 || sum.P50 < 5 {
		t.Fatalf("closed loop: %s %.0f req/s p50 %.2fms", sum.Mode, sum.RPS, sum.P50)
	}
	if sum.SamplesPS != 8*sum.RPS {
		t.Fatalf("samples/s %.0f for %.0f req/s of 8", sum.SamplesPS, sum.RPS)
	}
}

type flaky struct{ n atomic.Int64 }

func (f *flaky) Send(ctx context.Context, req *prismv1.RecommendRequest) error {
	if f.n.Add(1)%4 == 0 {
		return status.Error(codes.Unavailable, "down")
	}
	return nil
}

func TestCapErrorsAndReports(t *testing.T) {
	var live bytes.Buffer
	start := time.Now()
	sum, err := Run(context.Background(), Options{Profile: Constant(1000), Duration: 10 * time.Second, MaxRequests: 400, Live: &live, LiveEvery: 100 * time.Millisecond}, tinyRequests(t, Fixed(3)), &flaky{})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a cap of 400 at 1000/s took %v", el)
	}
	if sum.Sent != 400 || sum.OK != 300 || sum.ErrorsByCode["Unavailable"] != 100 {
		t.Fatalf("sent %d ok %d errors %v", sum.Sent, sum.OK, sum.ErrorsByCode)
	}
	if !strings.Contains(live.String(), "loadgen:") {
		t.Fatalf("no live lines: %q", live.String())
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
	if v, err := GaugeWatch("borrowed", srv.URL, "prism_capacity_borrowed_workers").Read(ctx); err != nil || v != 3 {
		t.Fatalf("read %v, %v; want 3", v, err)
	}
	if _, err := GaugeWatch("borrowed", srv.URL, "prism_other").Read(ctx); err == nil || !strings.Contains(err.Error(), "no prism_other in it") {
		t.Fatalf("a page without the metric: %v", err)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	w := GaugeWatch("borrowed workers", deadURL, "prism_capacity_borrowed_workers")
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
