package server

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// leakDense is a dense worker double whose answer each test case picks:
// scores (zeros), an error, a wrong count, or no answer until the call
// ends.
type leakDense struct {
	prismv1.UnimplementedDenseTierServer
	mode func(ctx context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error)
}

func (d *leakDense) Score(ctx context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	return d.mode(ctx, req)
}

// TestLookupPathsReleaseCharges drives Lookup down its error and
// cancellation paths, each several times, and checks that every path
// gives back its in-flight samples and bytes and leaves no goroutine
// behind.
//
// Each case runs in a synctest bubble. Its goroutines are counted once
// every one of them is blocked (synctest.Wait), not after a wall-clock
// pause: the first call of the cancelled and deadline cases can end
// (20 and 30 ms) before its connection to the dense worker is up, and a
// loaded machine finished that connection after the 20 ms pause that
// preceded the count, which then missed its goroutines (4 of 15 runs
// failed, 3 copies at once: "73 goroutines, 64 before"). Waiting longer
// for them to settle cannot help: the connection's goroutines stay,
// cached. In the bubble the timeouts and cancellations are fake time,
// and only the bubble's goroutines are counted: none of another test's
// winding down.
func TestLookupPathsReleaseCharges(t *testing.T) {
	zeros := func(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
		return &prismv1.ScoreResponse{Scores: make([]float32, req.GetNumSamples())}, nil
	}
	cases := []struct {
		name    string
		dense   func(ctx context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error)
		req     func(addr string) *prismv1.LookupRequest
		timeout time.Duration
		cancel  bool // cancel once the dense call is in flight
		want    codes.Code
	}{
		{name: "scored", dense: zeros, want: codes.OK},
		{name: "dense error", dense: func(context.Context, *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
			return nil, status.Error(codes.Internal, "ort: boom")
		}, want: codes.Internal},
		{name: "dense short of scores", dense: func(context.Context, *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
			return &prismv1.ScoreResponse{Scores: []float32{1}}, nil
		}, want: codes.Internal},
		{name: "dense unreachable", dense: zeros, req: func(string) *prismv1.LookupRequest {
			return idsLookup(grpctest.Target("nobody"), 4, make([]int64, 12))
		}, timeout: time.Second, want: codes.Unavailable},
		{name: "cancelled in the dense call", dense: func(ctx context.Context, _ *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, cancel: true, want: codes.Canceled},
		{name: "deadline in the dense call", dense: func(ctx context.Context, _ *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, timeout: 30 * time.Millisecond, want: codes.DeadlineExceeded},
		{name: "malformed ids", dense: zeros, req: func(addr string) *prismv1.LookupRequest {
			return idsLookup(addr, 4, make([]int64, 5))
		}, want: codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &leakDense{mode: tc.dense}
				s, addr := serveTestPlanWith(t, testPlan(3), Options{MaxInflightSamples: 64, MaxInflightBytes: 1 << 20}, d)
				req := idsLookup(addr, 4, make([]int64, 12))
				if tc.req != nil {
					req = tc.req(addr)
				}
				call := func() error {
					ctx, cancel := context.WithCancel(context.Background())
					if tc.timeout > 0 {
						ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
					}
					defer cancel()
					if tc.cancel {
						time.AfterFunc(20*time.Millisecond, cancel)
					}
					_, err := s.Lookup(ctx, req)
					return err
				}
				// The first call dials the dense worker: its connection's
				// goroutines stay, cached. It may return (cancelled, past
				// its deadline) before that connection is up: the count is
				// taken once every goroutine of the bubble is blocked.
				if err := call(); status.Code(err) != tc.want {
					t.Fatalf("Lookup: %v, want %v", err, tc.want)
				}
				synctest.Wait()
				base := bubbleGoroutines(t)
				for range 5 {
					if err := call(); status.Code(err) != tc.want {
						t.Fatalf("Lookup: %v, want %v", err, tc.want)
					}
					if s.Outstanding() != 0 || s.inflightBytes.Load() != 0 {
						t.Fatalf("after an answer: %d samples, %d bytes in flight", s.Outstanding(), s.inflightBytes.Load())
					}
				}
				synctest.Wait()
				if n := bubbleGoroutines(t); n > base {
					buf := make([]byte, 1<<20)
					t.Fatalf("%d goroutines, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
				}
			})
		})
	}
}

// bubbleGoroutines counts the goroutines of the caller's synctest bubble,
// from the tracebacks, whose headers name a goroutine's bubble.
func bubbleGoroutines(t *testing.T) int {
	t.Helper()
	self := make([]byte, 256)
	self = self[:runtime.Stack(self, false)]
	header, _, _ := strings.Cut(string(self), "\n")
	i := strings.Index(header, ", synctest bubble ")
	if i < 0 {
		t.Fatalf("not in a synctest bubble: %q", header)
	}
	bubble := header[i:] // ", synctest bubble N]:"
	all := make([]byte, 1<<20)
	for {
		n := runtime.Stack(all, true)
		if n < len(all) {
			all = all[:n]
			break
		}
		all = make([]byte, 2*len(all))
	}
	count := 0
	for line := range strings.SplitSeq(string(all), "\n") {
		if strings.HasPrefix(line, "goroutine ") && strings.HasSuffix(line, bubble) {
			count++
		}
	}
	return count
}
