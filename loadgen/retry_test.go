package loadgen

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// outcome is one scripted attempt's answer: a code (OK: answered) and
// the pushback trailer's values, if any.
type outcome struct {
	code     codes.Code
	pushback []string
}

func refused(pushback ...string) outcome {
	return outcome{code: codes.ResourceExhausted, pushback: pushback}
}

// scripted answers the attempts of a run in turn, the last one for
// every attempt after the script.
type scripted struct {
	script []outcome
	n      atomic.Int64
}

func (s *scripted) Send(ctx context.Context, _ *prismv1.RecommendRequest) error {
	return s.script[min(int(s.n.Add(1))-1, len(s.script)-1)].err()
}

// err is the outcome as the client sees it: nil, or the code with the
// pushback trailer, if any.
func (o outcome) err() error {
	if o.code == codes.OK {
		return nil
	}
	var tr metadata.MD
	if len(o.pushback) > 0 {
		tr = metadata.MD{PushbackKey: o.pushback}
	}
	return withPushback(status.Error(o.code, "scripted"), tr)
}

// TestRetries: one request and its retries, in a synctest bubble (fake
// time moves only by the backoffs, so its latency is exact): attempts
// counted, latency from the first attempt's intended send time, no retry
// whose backoff ends past the deadline, none on a code not retried, and
// the server's pushback honoured as grpc-go honours it. The jitter's
// draw is 0.5: a factor of 1, backoffs of exactly 10, 20, 40 ms.
func TestRetries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  []outcome
		retry   Retry
		timeout time.Duration
		// want: attempts, the request's end, its latency (ms) and the
		// retry counters.
		attempts              int
		code                  codes.Code
		latencyMs             float64
		pushbacks, pbStops    int64
		deadlineStops, retrOK int64
	}{
		{name: "answered on the third attempt", script: []outcome{refused(), refused(), {}}, retry: Retry{Retries: 3},
			attempts: 3, code: codes.OK, latencyMs: 30, retrOK: 1},
		{name: "Unavailable is retried", script: []outcome{{code: codes.Unavailable}, {}}, retry: Retry{Retries: 3},
			attempts: 2, code: codes.OK, latencyMs: 10, retrOK: 1},
		{name: "retries run out", script: []outcome{refused()}, retry: Retry{Retries: 2},
			attempts: 3, code: codes.ResourceExhausted, latencyMs: 30},
		{name: "a code not retried ends it", script: []outcome{{code: codes.InvalidArgument}, {}}, retry: Retry{Retries: 3},
			attempts: 1, code: codes.InvalidArgument},
		// 10 + 20 ms of backoff, then 40 more would end at 70 ms, past
		// the 50 ms deadline: not sent.
		{name: "no retry past the deadline", script: []outcome{refused()}, retry: Retry{Retries: 5}, timeout: 50 * time.Millisecond,
			attempts: 3, code: codes.ResourceExhausted, deadlineStops: 1},
		{name: "pushback times the retry", script: []outcome{refused("5"), {}}, retry: Retry{Retries: 3},
			attempts: 2, code: codes.OK, latencyMs: 5, pushbacks: 1, retrOK: 1},
		// After a pushback the backoff starts again from the initial.
		{name: "backoff starts over after a pushback", script: []outcome{refused(), refused("7"), refused(), {}}, retry: Retry{Retries: 3},
			attempts: 4, code: codes.OK, latencyMs: 10 + 7 + 10, pushbacks: 1, retrOK: 1},
		{name: "negative pushback: no retry", script: []outcome{refused("-1"), {}}, retry: Retry{Retries: 3},
			attempts: 1, code: codes.ResourceExhausted, pbStops: 1},
		{name: "unparsable pushback: no retry", script: []outcome{refused("soon"), {}}, retry: Retry{Retries: 3},
			attempts: 1, code: codes.ResourceExhausted, pbStops: 1},
		{name: "several pushbacks: no retry", script: []outcome{refused("1", "2"), {}}, retry: Retry{Retries: 3},
			attempts: 1, code: codes.ResourceExhausted, pbStops: 1},
		{name: "pushback ignored: the client's backoff", script: []outcome{refused("-1"), {}}, retry: Retry{Retries: 3, IgnorePushback: true},
			attempts: 2, code: codes.OK, latencyMs: 10, retrOK: 1},
		{name: "a pushback past the deadline", script: []outcome{refused("80"), {}}, retry: Retry{Retries: 3}, timeout: 50 * time.Millisecond,
			attempts: 1, code: codes.ResourceExhausted, deadlineStops: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &scripted{script: tc.script}
				o := Options{Profile: Constant(1), Duration: time.Second, MaxRequests: 1, Timeout: tc.timeout, Retry: tc.retry, retryDraw: func() float64 { return 0.5 }}
				sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(4)), s)
				if err != nil {
					t.Fatal(err)
				}
				if sum.Sent != 1 || int(s.n.Load()) != tc.attempts {
					t.Fatalf("sent %d, %d attempts; want 1 and %d", sum.Sent, s.n.Load(), tc.attempts)
				}
				if tc.code == codes.OK {
					// The histogram keeps 3 significant digits.
					if sum.OK != 1 || sum.Max < tc.latencyMs || sum.Max > tc.latencyMs*1.002+0.002 {
						t.Fatalf("ok %d latency %v ms, want answered in %v ms from its first attempt's intended time", sum.OK, sum.Max, tc.latencyMs)
					}
				} else if sum.ErrorsByCode[tc.code.String()] != 1 {
					t.Fatalf("errors %v, want one %v", sum.ErrorsByCode, tc.code)
				}
				r := sum.Retry
				if r == nil || r.Attempts != int64(tc.attempts) || len(r.ByAttempts) != tc.attempts || r.ByAttempts[tc.attempts-1] != 1 ||
					r.Pushbacks != tc.pushbacks || r.PushbackStops != tc.pbStops || r.DeadlineStops != tc.deadlineStops || r.RetriedOK != tc.retrOK {
					t.Fatalf("retry stats %+v; want %d attempts, pushbacks %d, told not to %d, deadline stops %d, ok after a retry %d", r, tc.attempts, tc.pushbacks, tc.pbStops, tc.deadlineStops, tc.retrOK)
				}
				if want := float64(tc.attempts); r.AttemptsRPS != want {
					t.Fatalf("%v attempts/s over the 1 s run, want %v", r.AttemptsRPS, want)
				}
			})
		})
	}
}

// TestRetryReport: the summary says how many attempts the requests
// made, and the load they made against the load offered.
func TestRetryReport(t *testing.T) {
	s := &Summary{Sent: 100, OfferedRPS: 10, Retry: &RetryStats{Retries: 3, Attempts: 250, AttemptsRPS: 25, ByAttempts: []int64{40, 30, 20, 10}, RetriedOK: 30, Pushbacks: 5, PushbackStops: 7, DeadlineStops: 2}}
	var b strings.Builder
	s.WriteText(&b)
	for _, want := range []string{"retries     up to 3: 250 attempts, 2.50 a request; 25.0 attempts/s against 10.0 req/s offered (2.50x); requests by attempts 1:40 2:30 3:20 4:10; 30 answered after a retry",
		"pushback: 5 retries timed by it, 7 requests told not to retry; 2 not retried past their deadline"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, b.String())
		}
	}
}

// refusing is a Recommender that refuses its first Refuse attempts
// with ResourceExhausted and the pushback trailer Pushback ("" for
// none), then answers.
type refusing struct {
	prismv1.UnimplementedRecommenderServer
	Refuse   int64
	Pushback string
	attempts atomic.Int64
}

func (f *refusing) Recommend(ctx context.Context, req *prismv1.RecommendRequest) (*prismv1.RecommendResponse, error) {
	if f.attempts.Add(1) <= f.Refuse {
		if f.Pushback != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, f.Pushback))
		}
		return nil, status.Error(codes.ResourceExhausted, "refused")
	}
	return &prismv1.RecommendResponse{Scores: make([]float32, req.NumCandidates)}, nil
}

// TestRetriesOverGRPC: the generator's retries and grpc-go's own
// (Retry.GRPC: a service config and the attempt counter) against a
// gRPC server that refuses each request's first two attempts, with a
// pushback or none: attempts counted either way, and a negative
// pushback stops both.
func TestRetriesOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grpc     bool
		pushback string
		want     int64 // attempts of the one request
		ok       bool
	}{
		{name: "loadgen", want: 3, ok: true},
		{name: "loadgen, pushback 1 ms", pushback: "1", want: 3, ok: true},
		{name: "loadgen, told not to retry", pushback: "-1", want: 1},
		{name: "grpc-go", grpc: true, want: 3, ok: true},
		{name: "grpc-go, pushback 1 ms", grpc: true, pushback: "1", want: 3, ok: true},
		{name: "grpc-go, told not to retry", grpc: true, pushback: "-1", want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &refusing{Refuse: 2, Pushback: tc.pushback}
			retry := Retry{Retries: 3, Initial: time.Millisecond, GRPC: tc.grpc}
			var bn grpctest.Net
			lis := bn.MustListen(t, "recommender")
			srv := grpc.NewServer()
			prismv1.RegisterRecommenderServer(srv, f)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			opts := []grpc.DialOption{bn.DialOption()}
			if tc.grpc {
				opts = append(opts, grpc.WithDefaultServiceConfig(ServiceConfig(retry, &RetryThrottling{MaxTokens: 10, TokenRatio: 0.1})), grpc.WithStatsHandler(AttemptCounter{}))
			}
			s := dialAddr(t, lis.Addr().String(), opts...)
			o := Options{Profile: Constant(1), Duration: time.Second, MaxRequests: 1, Retry: retry}
			sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(4)), s)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.attempts.Load(); got != tc.want || sum.Retry == nil || sum.Retry.Attempts != tc.want {
				t.Fatalf("server saw %d attempts, the report %+v; want %d", got, sum.Retry, tc.want)
			}
			if (sum.OK == 1) != tc.ok {
				t.Fatalf("ok %d, errors %v; want answered %v", sum.OK, sum.ErrorsByCode, tc.ok)
			}
		})
	}
}

// TestServiceConfig: the service config grpc-go parses, with the codes
// in its names, for Recommend and for Embeddings/Update, whose policy
// keeps only the codes an update is retried on (UpdateRetryCodes).
func TestServiceConfig(t *testing.T) {
	policy := func(codes string) string {
		return `"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.02s","maxBackoff":"0.5s","backoffMultiplier":2,"retryableStatusCodes":[` + codes + `]}`
	}
	for _, tc := range []struct {
		name  string
		codes []codes.Code
		want  string
	}{
		{name: "default codes", want: `{"methodConfig":[{"name":[{"service":"prism.v1.Recommender","method":"Recommend"}],` + policy(`"RESOURCE_EXHAUSTED","UNAVAILABLE"`) + `},` +
			`{"name":[{"service":"prism.v1.Embeddings","method":"Update"}],` + policy(`"RESOURCE_EXHAUSTED","UNAVAILABLE"`) + `}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}`},
		{name: "updates keep theirs", codes: []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Aborted},
			want: `{"methodConfig":[{"name":[{"service":"prism.v1.Recommender","method":"Recommend"}],` + policy(`"DEADLINE_EXCEEDED","UNAVAILABLE","ABORTED"`) + `},` +
				`{"name":[{"service":"prism.v1.Embeddings","method":"Update"}],` + policy(`"UNAVAILABLE"`) + `}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}`},
		{name: "no update code", codes: []codes.Code{codes.Aborted},
			want: `{"methodConfig":[{"name":[{"service":"prism.v1.Recommender","method":"Recommend"}],` + policy(`"ABORTED"`) + `}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}`},
	} {
		got := ServiceConfig(Retry{Retries: 3, Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond, Codes: tc.codes}, &RetryThrottling{MaxTokens: 10, TokenRatio: 0.1})
		if got != tc.want {
			t.Fatalf("%s: service config\n%s\nwant\n%s", tc.name, got, tc.want)
		}
		if _, err := grpc.NewClient("passthrough:///x", grpc.WithDefaultServiceConfig(got), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatalf("%s: grpc-go refuses it: %v", tc.name, err)
		}
	}
	// The names are the methods' own.
	for _, m := range []string{prismv1.Recommender_Recommend_FullMethodName, prismv1.Embeddings_Update_FullMethodName} {
		if parts := strings.Split(m, "/"); !strings.Contains(ServiceConfig(Retry{Retries: 1}, nil), `{"service":"`+parts[1]+`","method":"`+parts[2]+`"}`) {
			t.Fatalf("the service config names no %s", m)
		}
	}
}
