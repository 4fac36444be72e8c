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
	type step struct {
		n, bytes int64
		refused  bool
	}
	for _, tc := range []struct {
		name  string
		opts  Options
		steps []step
	}{
		{"samples", Options{MaxInflightSamples: 100}, []step{{60, 0, false}, {60, 0, true}, {40, 0, false}, {1, 0, true}}},
		{"bytes", Options{MaxInflightSamples: 1000, MaxInflightBytes: 1000}, []step{{10, 600, false}, {10, 600, true}, {10, 400, false}, {1, 1, true}}},
		// One lookup alone is admitted whatever its bytes.
		{"one lookup over the byte budget", Options{MaxInflightSamples: 1000, MaxInflightBytes: 100}, []step{{10, 5000, false}, {1, 1, true}}},
		{"no byte budget", Options{MaxInflightSamples: 1000}, []step{{10, 1 << 40, false}, {10, 1 << 40, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{opts: tc.opts}
			var releases []func()
			for i, st := range tc.steps {
				release, err := s.admit(st.n, st.bytes)
				if st.refused != (status.Code(err) == codes.ResourceExhausted) || (!st.refused && err != nil) {
					t.Fatalf("step %d (%d samples, %d bytes): %v, want refused %v", i, st.n, st.bytes, err, st.refused)
				}
				if err == nil {
					releases = append(releases, release)
				}
			}
			for _, r := range releases {
				r()
			}
			// A refused lookup leaves nothing charged; released ones give
			// everything back.
			if s.Outstanding() != 0 || s.inflightBytes.Load() != 0 {
				t.Fatalf("after release: %d samples, %d bytes in flight", s.Outstanding(), s.inflightBytes.Load())
			}
		})
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
