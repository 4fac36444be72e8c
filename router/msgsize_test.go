package router

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestMessageLimitToWorkers: a router whose message limit is
// raised (--max-message) passes a request that fits it on to the
// embedding workers; it used to accept the request and then fail every
// Lookup at a fixed 64 MiB with ResourceExhausted, which a client takes
// for "back off and retry".
//
// It runs in a synctest bubble: the request crosses bufconn window by
// window of gRPC's flow control, goroutines handing it on, which on a
// loaded machine took up to the router's 30 s default deadline (it
// failed 1 of 15 runs, 3 copies at once, and passed in 0.3 to 27 s). In
// the bubble that deadline is fake time, which stands still while the
// transfer works: only a transfer that stalls can reach it.
func TestMessageLimitToWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := testRouter(Options{MaxMessageBytes: 128 << 20})
		t.Cleanup(r.Close)
		echoStack(t, r, 0)
		req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "dense", Values: make([]float32, 18<<20)}}}} // 72 MiB
		if _, err := r.Recommend(context.Background(), req); err != nil {
			t.Fatalf("a 72 MiB request under a 128 MiB message limit: %v", err)
		}
	})
}
