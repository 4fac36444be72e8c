package server

import (
	"context"
	"runtime"
	"testing"
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
			// goroutines stay, cached.
			if err := call(); status.Code(err) != tc.want {
				t.Fatalf("Lookup: %v, want %v", err, tc.want)
			}
			time.Sleep(20 * time.Millisecond)
			base := runtime.NumGoroutine()
			for range 5 {
				if err := call(); status.Code(err) != tc.want {
					t.Fatalf("Lookup: %v, want %v", err, tc.want)
				}
				if s.Outstanding() != 0 || s.inflightBytes.Load() != 0 {
					t.Fatalf("after an answer: %d samples, %d bytes in flight", s.Outstanding(), s.inflightBytes.Load())
				}
			}
			deadline := time.Now().Add(15 * time.Second) // a leak stays; a loaded host (CI) only settles late
			for runtime.NumGoroutine() > base {
				if time.Now().After(deadline) {
					buf := make([]byte, 1<<20)
					t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
