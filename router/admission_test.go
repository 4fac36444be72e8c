package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// withContext is request(n) carrying a shared context of about size bytes.
func withContext(n, size int) *prismv1.RecommendRequest {
	req := request(n)
	req.Context = &prismv1.Features{Inputs: []*prismv1.Input{{Name: "user", Values: make([]float32, size/4)}}}
	return req
}

// A request's shared context is capped.
func TestContextSizeCap(t *testing.T) {
	r := newRouter(t, Options{MaxContextBytes: 1 << 20}, &fakeCN{})
	_, err := r.Recommend(context.Background(), withContext(1, 2<<20))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "the limit is 1048576") {
		t.Fatalf("2 MiB context: %v, want InvalidArgument naming the size and the cap", err)
	}
	if _, err := r.Recommend(context.Background(), withContext(1, 512<<10)); err != nil {
		t.Fatal(err)
	}
}

// One candidate with a big context costs its bytes, not one unit.
func TestAdmissionByBytes(t *testing.T) {
	r := newRouter(t, Options{MaxInflightBytes: 3 << 20, MaxContextBytes: 4 << 20}, &fakeCN{delay: 300 * time.Millisecond})
	done := make(chan error)
	go func() { _, err := r.Recommend(context.Background(), withContext(1, 2<<20)); done <- err }()
	for r.inflight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := r.Recommend(context.Background(), withContext(1, 2<<20)); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("a second 2 MiB request over a 3 MiB budget: %v, want ResourceExhausted", err)
	}
	if _, err := r.Recommend(context.Background(), request(5)); err != nil {
		t.Fatalf("a small request still fits: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.inflightBytes.Load() != 0 || r.inflight.Load() != 0 {
		t.Fatalf("admission not given back: %d bytes, %d samples", r.inflightBytes.Load(), r.inflight.Load())
	}
	// The context travels with each micro-batch: it is charged per cut
	// (twice here, over the budget on its own: never admitted).
	r.opts.MicroBatch = 1
	if _, err := r.Recommend(context.Background(), withContext(2, 2<<20)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a 2 MiB context sent twice over a 3 MiB budget: %v, want InvalidArgument", err)
	}
}

// Concurrent streams are bounded.
func TestStreamLimit(t *testing.T) {
	r := newRouter(t, Options{MaxStreams: 1}, &fakeCN{})
	first := streamClient(t, r)
	if err := first.Send(request(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	second := streamClient(t, r)
	second.Send(request(1))
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second stream over a limit of 1: %v, want ResourceExhausted", err)
	}
	first.CloseSend()
	for {
		if _, err := first.Recv(); err != nil {
			break
		}
	}
	third := streamClient(t, r)
	if err := third.Send(request(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Recv(); err != nil {
		t.Fatalf("a stream after the first closed: %v", err)
	}
}

// TestRequestOverAdmissionLimits: a request over MaxInflight or
// MaxInflightBytes on its own is never admitted, the router idle or
// not: InvalidArgument naming the flag, not ResourceExhausted, which
// tells its client to retry later (and counted it as load refused).
func TestRequestOverAdmissionLimits(t *testing.T) {
	r := newRouter(t, Options{MaxInflight: 100, MaxInflightBytes: 1 << 20, MaxContextBytes: 4 << 20}, &fakeCN{})
	for _, c := range []struct {
		name string
		req  *prismv1.RecommendRequest
		flag string
	}{
		{"candidates", request(101), "--max-inflight)"},
		{"bytes", withContext(1, 2<<20), "--max-inflight-bytes)"},
	} {
		_, err := r.Recommend(context.Background(), c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%s over the limit on an idle router: %v, want InvalidArgument naming %s", c.name, err, c.flag)
		}
	}
	if _, err := r.Recommend(context.Background(), request(100)); err != nil {
		t.Fatalf("a request at the limit: %v", err)
	}
}
