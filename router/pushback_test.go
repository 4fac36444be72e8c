package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

const ms1 = time.Millisecond

// TestCountPushback: a request refused for a limit on what is in
// flight retries once the excess has finished, unless that and its own
// time pass its deadline.
func TestCountPushback(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rate           float64
		excess         int64
		own, remaining time.Duration
		u              float64
		wantRetry      bool
		wantWait       time.Duration
	}{
		{name: "100 samples over at 10,000/s", rate: 10000, excess: 100, own: 5 * ms1, remaining: time.Second, wantRetry: true, wantWait: 10 * ms1},
		{name: "jittered", rate: 10000, excess: 100, own: 5 * ms1, remaining: time.Second, u: 0.5, wantRetry: true, wantWait: 12500 * time.Microsecond},
		{name: "past the deadline", rate: 10000, excess: 500, own: 15 * ms1, remaining: 60 * ms1},
		{name: "no rate", excess: 100, own: 5 * ms1, remaining: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait, retry := countPushback(tc.rate, tc.excess, tc.own, tc.remaining, tc.u)
			if retry != tc.wantRetry || (retry && (wait-tc.wantWait).Abs() > time.Microsecond) {
				t.Fatalf("pushback %v retry %v, want %v retry %v", wait, retry, tc.wantWait, tc.wantRetry)
			}
		})
	}
}

// TestPushbackValue: the trailer's value is whole milliseconds, rounded
// up (0 would say "at once"), or -1 for "do not retry".
func TestPushbackValue(t *testing.T) {
	for _, tc := range []struct {
		r    refusal
		want string
	}{
		{refusal{wait: 20 * ms1, retry: true}, "20"},
		{refusal{wait: 20*ms1 + 1, retry: true}, "21"},
		{refusal{wait: 0, retry: true}, "0"},
		{refusal{wait: 5 * ms1}, "-1"},
	} {
		if got := tc.r.value(); got != tc.want {
			t.Errorf("%v retry %v: %q, want %q", tc.r.wait, tc.r.retry, got, tc.want)
		}
	}
	err := withPushback(status.Error(codes.ResourceExhausted, "full"), time.Second, true, true)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "full" {
		t.Fatalf("a refusal with its pushback reads as %v %q, want its own status", st.Code(), st.Message())
	}
}

// TestGRPCClientHonoursPushback: a grpc-go client retrying by a service
// config (retryPolicy on ResourceExhausted) against an in-process
// router refused by admission: with a pushback saying "retry in a few
// ms" it retries at once despite an initial backoff longer than its
// deadline; with one saying "do not retry" (the deadline cannot be met)
// it makes one attempt despite a backoff of 1 ms. Attempts are counted
// at the server; no timing is asserted.
func TestGRPCClientHonoursPushback(t *testing.T) {
	for _, tc := range []struct {
		name string
		// maxInflight bounds the samples in flight (the backlog takes 90).
		maxInflight int64
		n           int // the client's request's candidates
		deadline    time.Duration
		backoff     string
		want        int32 // attempts
		trailer     string
	}{
		// Over --max-inflight by 10 samples at 1,000 samples/s: retry
		// in 10-15 ms; the client's own backoff (20 s) would wait past
		// its 2 s deadline, so three attempts mean it waited the
		// pushback.
		{name: "count limit: retry after the excess drains", maxInflight: 100, n: 20, deadline: 2 * time.Second, backoff: "20s", want: 3},
		// Predicted (90+20)/1000 = 110 ms, past its 100 ms deadline at the
		// whole share: no wait makes it fit.
		{name: "deadline: do not retry", maxInflight: 1000, n: 20, deadline: 100 * time.Millisecond, backoff: "0.001s", want: 1, trailer: "-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cn := &fakeCN{gate: make(chan struct{})}
			r := newRouter(t, Options{MaxInflight: tc.maxInflight}, cn)
			r.preds.get("m").rate = 1000 // samples/s
			held := backlog(r, cn, 90)
			defer func() {
				close(cn.gate)
				if err := <-held; err != nil {
					t.Error(err)
				}
			}()
			var calls atomic.Int32
			addr := serveInprocOpts(t, []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				calls.Add(1)
				return h(ctx, req)
			})}, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) })
			sc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":"prism.v1.Recommender"}],"retryPolicy":{"maxAttempts":3,"initialBackoff":%q,"maxBackoff":%q,"backoffMultiplier":2,"retryableStatusCodes":["RESOURCE_EXHAUSTED","UNAVAILABLE"]}}]}`, tc.backoff, tc.backoff)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc), grpc.WithDefaultServiceConfig(sc))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			var tr metadata.MD
			_, err = prismv1.NewRecommenderClient(conn).Recommend(ctx, request(tc.n), grpc.Trailer(&tr))
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("Recommend: %v, want ResourceExhausted", err)
			}
			if tc.want > 1 && !strings.Contains(err.Error(), "max retries exhausted") {
				t.Errorf("Recommend: %v, want grpc-go's retries exhausted", err)
			}
			if got := calls.Load(); got != tc.want {
				t.Fatalf("%d attempts, want %d (pushback %q)", got, tc.want, tr.Get(PushbackKey))
			}
			if got := tr.Get(PushbackKey); len(got) != 1 || (tc.trailer != "" && got[0] != tc.trailer) {
				t.Fatalf("pushback trailer %q, want one value %q", got, tc.trailer)
			}
		})
	}
}

// serveInprocOpts is serveInproc with server options.
func serveInprocOpts(t testing.TB, opts []grpc.ServerOption, register func(*grpc.Server)) string {
	t.Helper()
	addr, lis := listen(t)
	s := grpc.NewServer(opts...)
	register(s)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return addr
}

// TestAdmitPushback: each kind of admission refusal carries its
// pushback: a refusal for the deadline says not to retry; one for the
// samples in flight says when the excess will have drained, or not to
// retry when that would pass the deadline; before a rate is measured,
// none.
func TestAdmitPushback(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxInflight int64
		rate        float64
		n           int64
		remaining   time.Duration
		want        string // the trailer's value; "" none
	}{
		// 90 ahead + 20 at 1,000/s: 110 ms, past 100 ms.
		{name: "deadline", maxInflight: 1000, rate: 1000, n: 20, remaining: 100 * ms1, want: "-1"},
		// 10 over the limit of 100 at 1,000/s: 10 ms, spread by 0.5: 12.5.
		{name: "in flight, time to drain", maxInflight: 100, rate: 1000, n: 20, remaining: time.Second, want: "13"},
		// 12.5 ms of wait and 20 ms alone past 30 ms.
		{name: "in flight, past the deadline", maxInflight: 100, rate: 1000, n: 20, remaining: 30 * ms1, want: "-1"},
		{name: "in flight, no rate yet", maxInflight: 100, n: 20, remaining: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(j func() float64) { jitter = j }(jitter)
			jitter = func() float64 { return 0.5 }
			r := newRouter(t, Options{MaxInflight: tc.maxInflight}, &fakeCN{})
			r.preds.get("m").rate = tc.rate
			rel, err := r.admit("m", 90, 90, 100, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer rel(nil)
			_, err = r.admit("m", tc.n, tc.n, 100, tc.remaining)
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("admit: %v, want ResourceExhausted", err)
			}
			var rf *refusal
			got := ""
			if errors.As(err, &rf) {
				got = rf.value()
			}
			if got != tc.want {
				t.Fatalf("pushback %q, want %q (%v)", got, tc.want, err)
			}
		})
	}
}

// TestPushbackOnlyOnUnaryRefusals: the pushback trailer goes out on a
// unary Recommend's overload refusal only: not on its success, not on
// a refusal that is not for overload (InvalidArgument), and not on a
// RecommendStream, whose refusals go in its answers and whose one
// trailer is the stream's own.
func TestPushbackOnlyOnUnaryRefusals(t *testing.T) {
	cn := &fakeCN{gate: make(chan struct{})}
	r := newRouter(t, Options{MaxInflight: 100}, cn)
	r.preds.get("m").rate = 1000 // samples/s
	addr := serveInprocOpts(t, nil, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := prismv1.NewRecommenderClient(conn)
	unary := func(req *prismv1.RecommendRequest) (codes.Code, []string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var tr metadata.MD
		_, err := client.Recommend(ctx, req, grpc.Trailer(&tr))
		return status.Code(err), tr.Get(PushbackKey)
	}
	held := backlog(r, cn, 90)
	// The refusal the others are checked against: 10 over the limit.
	if code, pb := unary(request(20)); code != codes.ResourceExhausted || len(pb) != 1 {
		t.Fatalf("refused: %v, pushback %q; want ResourceExhausted with one", code, pb)
	}
	if code, pb := unary(request(0)); code != codes.InvalidArgument || len(pb) != 0 {
		t.Errorf("invalid: %v, pushback %q; want InvalidArgument with none", code, pb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := client.RecommendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(request(20)); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if c := codes.Code(resp.GetError().GetCode()); c != codes.ResourceExhausted {
		t.Errorf("stream answer %v, want ResourceExhausted", resp.GetError())
	}
	s.CloseSend()
	if _, err := s.Recv(); err == nil {
		t.Fatal("stream: another answer, want its end")
	}
	if pb := s.Trailer().Get(PushbackKey); len(pb) != 0 {
		t.Errorf("stream trailer carries pushback %q, want none", pb)
	}
	close(cn.gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if code, pb := unary(request(20)); code != codes.OK || len(pb) != 0 {
		t.Errorf("answered: %v, pushback %q; want OK with none", code, pb)
	}
}
