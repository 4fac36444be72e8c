package router

import (
	"context"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestMessageLimitToWorkers: a router whose message limit is
// raised (--max-message) passes a request that fits it on to the
// embedding workers; it used to accept the request and then fail every
// Lookup at a fixed 64 MiB with ResourceExhausted, which a client takes
// for "back off and retry".
func TestMessageLimitToWorkers(t *testing.T) {
	r := testRouter(Options{MaxMessageBytes: 128 << 20})
	echoStack(t, r, 0)
	req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 4, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "dense", Values: make([]float32, 18<<20)}}}} // 72 MiB
	if _, err := r.Recommend(context.Background(), req); err != nil {
		t.Fatalf("a 72 MiB request under a 128 MiB message limit: %v", err)
	}
}
