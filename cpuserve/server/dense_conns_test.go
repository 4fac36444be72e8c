package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestDenseConnsOfGoneWorkersClosed: a dense worker missing from the
// router's new list (drained, returned to its lender) has its connection
// closed, with its goroutines and keepalive pings; one a Lookup still
// sends on is closed once that Lookup has its answer, which it gets.
// They were kept until 1024 connections had piled up.
func TestDenseConnsOfGoneWorkersClosed(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		name := "idle"
		if inFlight {
			name = "lookup in flight"
		}
		t.Run(name, func(t *testing.T) {
			gate, entered := make(chan struct{}), make(chan struct{}, 1)
			d := &leakDense{mode: func(_ context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-gate
				return &prismv1.ScoreResponse{Scores: make([]float32, req.GetNumSamples())}, nil
			}}
			s, addr := serveTestPlanWith(t, testPlan(3), Options{}, d)
			s.opts.AnyDenseAddr = false // the router's list decides, as in prism serve embedding --router
			s.SetDenseAddrs([]string{addr})
			conn := func() *grpc.ClientConn {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.conns[addr]
			}
			done := make(chan error, 1)
			go func() {
				_, err := s.Lookup(context.Background(), idsLookup(addr, 4, make([]int64, 12)))
				done <- err
			}()
			<-entered
			c := conn()
			if c == nil {
				t.Fatal("no connection to the dense worker")
			}
			if !inFlight {
				close(gate)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			s.SetDenseAddrs([]string{"dense-elsewhere:1"}) // the dense worker left
			if conn() != nil {
				t.Fatal("the connection to a dense worker the router no longer lists is still cached")
			}
			if inFlight {
				if st := c.GetState(); st == connectivity.Shutdown {
					t.Fatal("the connection was closed under a Lookup sending on it")
				}
				close(gate)
				if err := <-done; err != nil {
					t.Fatalf("the Lookup in flight when its dense worker left: %v", err)
				}
			}
			if st := c.GetState(); st != connectivity.Shutdown {
				t.Fatalf("the connection to the dense worker that left is %v, want SHUTDOWN", st)
			}
		})
	}
}
