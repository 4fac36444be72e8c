package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestDenseAddrsFromRouter(t *testing.T) {
	s := &Server{}
	if err := s.checkDense("d:1"); status.Code(err) != codes.Unavailable {
		t.Fatalf("before any router answer: %v, want Unavailable", err)
	}
	s.SetDenseAddrs([]string{"d:1", "d:2"})
	if err := s.checkDense("d:1"); err != nil {
		t.Fatal(err)
	}
	if err := s.checkDense("evil:1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("unregistered dense_addr: %v, want PermissionDenied", err)
	}
	s.SetDenseAddrs([]string{"d:2"})
	if err := s.checkDense("d:1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("dense worker gone from the router's list: %v", err)
	}
	s.opts.AnyDenseAddr = true
	if err := s.checkDense("evil:1"); err != nil {
		t.Fatalf("AnyDenseAddr: %v", err)
	}
}

func TestLookupAdmission(t *testing.T) {
	s := &Server{opts: Options{MaxInflightSamples: 100}}
	if err := s.admit(60); err != nil {
		t.Fatal(err)
	}
	if err := s.admit(60); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over the bound: %v, want ResourceExhausted", err)
	}
	if got := s.Outstanding(); got != 60 {
		t.Fatalf("a refused lookup stays charged: %d", got)
	}
	s.outstanding.Add(-60)
	if err := s.admit(100); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkCheckDense(b *testing.B) {
	s := &Server{}
	addrs := make([]string, 64)
	for i := range addrs {
		addrs[i] = "10.0.0." + string(rune('a'+i%26)) + ":1"
	}
	s.SetDenseAddrs(addrs)
	for range b.N {
		if s.checkDense(addrs[7]) != nil {
			b.Fatal("refused")
		}
	}
}
