package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestDenseUnreachableNamed: a Lookup whose dense worker cannot be
// reached (nothing answers at its address) is answered Unavailable
// naming that dense worker (prismv1.DenseUnreachable), so the router
// stops picking it rather than this embedding worker; the dense
// worker's own answers, Unavailable included, go back as they are,
// naming nobody.
func TestDenseUnreachableNamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  codes.Code // the dense worker's answer
		nowhere bool       // the Lookup names an address nothing listens at
		want    codes.Code
		named   bool
	}{
		{name: "nothing at the address", nowhere: true, want: codes.Unavailable, named: true},
		{name: "the dense worker answers Unavailable", answer: codes.Unavailable, want: codes.Unavailable},
		{name: "the dense worker answers ResourceExhausted", answer: codes.ResourceExhausted, want: codes.ResourceExhausted},
		{name: "the dense worker answers InvalidArgument", answer: codes.InvalidArgument, want: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &leakDense{mode: func(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
				return nil, status.Errorf(tc.answer, "the dense worker says %v", tc.answer)
			}}
			s, addr := serveTestPlanWith(t, testPlan(3), Options{}, d)
			if tc.nowhere {
				addr = "passthrough:///nobody-listens-here"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.Lookup(ctx, idsLookup(addr, 4, make([]int64, 12)))
			if status.Code(err) != tc.want {
				t.Fatalf("lookup: %v, want %v", err, tc.want)
			}
			named, ok := prismv1.DenseUnreachable(err)
			if ok != tc.named || (ok && named != addr) {
				t.Errorf("lookup: %v names the dense worker %q unreachable (%v), want %v naming %q", err, named, ok, tc.named, addr)
			}
		})
	}
}
