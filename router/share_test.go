package router

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestShareCtl drives the admission share window by window with a
// logical clock.
func TestShareCtl(t *testing.T) {
	type step struct {
		answers, misses int
		dt              time.Duration // between answers
		took            float64       // each answer's latency over its budget (default 0.8)
		want            float64       // the share after the step
	}
	cases := []struct {
		name    string
		ceiling float64
		steps   []step
	}{
		{"no misses: stays at the ceiling", 1, []step{
			{answers: 32, dt: 2 * time.Millisecond, want: 1},
			{answers: 64, dt: 2 * time.Millisecond, want: 1},
		}},
		{"misses over 2% of a window shrink it", 1, []step{
			{answers: 32, misses: 1, dt: 2 * time.Millisecond, want: 0.85},
			{answers: 32, misses: 4, dt: 2 * time.Millisecond, want: 0.85 * 0.85},
		}},
		{"a window closes only after 50 ms", 1, []step{
			// 32 answers in 31 ms: still open, then 9 more close it
			// with 5 misses of 41.
			{answers: 32, misses: 5, dt: time.Millisecond, want: 1},
			{answers: 9, dt: 3 * time.Millisecond, want: 0.85},
		}},
		{"misses at 2% of a window hold it", 1, []step{
			{answers: 32, misses: 1, dt: 2 * time.Millisecond, want: 0.85},
			// 50 answers in the 50 ms window, one missed.
			{answers: 50, misses: 1, dt: time.Millisecond, want: 0.85},
		}},
		{"windows without a miss grow it back, to the ceiling", 1, []step{
			{answers: 32, misses: 32, dt: 2 * time.Millisecond, want: 0.85},
			{answers: 32, dt: 2 * time.Millisecond, want: 0.85 * 1.05},
			{answers: 32 * 4, dt: 2 * time.Millisecond, want: 1},
		}},
		{"a window of fast answers resets it to the ceiling", 1, []step{
			{answers: 32 * 3, misses: 32 * 3, dt: 2 * time.Millisecond, want: 0.85 * 0.85 * 0.85},
			{answers: 32, dt: 2 * time.Millisecond, took: 0.45, want: 1},
		}},
		{"answers past the slack grow it gradually", 1, []step{
			{answers: 32, misses: 32, dt: 2 * time.Millisecond, want: 0.85},
			{answers: 32, dt: 2 * time.Millisecond, took: 0.55, want: 0.85 * 1.05},
		}},
		{"never below its floor", 1, []step{
			{answers: 32 * 20, misses: 32 * 20, dt: 2 * time.Millisecond, want: shareMin},
		}},
		{"a ceiling below the floor is the floor", 0.2, []step{
			{answers: 32, misses: 32, dt: 2 * time.Millisecond, want: 0.2},
			{answers: 32, dt: 2 * time.Millisecond, want: 0.2},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newShareCtl(c.ceiling)
			now := time.Unix(0, 0)
			for i, st := range c.steps {
				took := st.took
				if took == 0 {
					took = 0.8
				}
				const budget = 60 * time.Millisecond
				for k := range st.answers {
					now = now.Add(st.dt)
					s.record(now, time.Duration(took*float64(budget)), budget, k < st.misses)
				}
				if got := s.get(); math.Abs(got-st.want) > 1e-9 {
					t.Fatalf("step %d: share %v, want %v", i, got, st.want)
				}
			}
		})
	}
}

// TestRecommendAdmitsWithHeadroomAfterMisses: a request the whole time
// to its deadline would admit is admitted at the ceiling, and refused
// once admitted requests have missed their deadlines and the share has
// shrunk.
func TestRecommendAdmitsWithHeadroomAfterMisses(t *testing.T) {
	cn := &fakeCN{gate: make(chan struct{})}
	r := newRouter(t, Options{}, cn)
	r.preds.get("m").rate = 1000
	held := backlog(r, cn, 100)
	// 100 ahead + 10 at 1000/s: 110 ms, inside a 125 ms deadline.
	try := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 125*time.Millisecond)
		defer cancel()
		_, err := r.Recommend(ctx, request(10))
		return err
	}
	if err := try(); status.Code(err) == codes.ResourceExhausted {
		t.Fatalf("at the full share: %v, want admitted", err)
	}
	// Admitted requests miss their deadlines: two windows' worth.
	now := time.Now()
	for i := range 2 * shareWindowN {
		r.share.record(now.Add(time.Duration(i)*2*time.Millisecond), 130*time.Millisecond, 125*time.Millisecond, true)
	}
	if got := r.share.get(); got > 0.73 {
		t.Fatalf("share %v after two windows of misses, want 0.85^2", got)
	}
	err := try()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "predicted to finish in 110.0 ms") {
		t.Fatalf("after misses: %v, want ResourceExhausted predicting 110 ms", err)
	}
	// The refusal names the share: 110 ms is inside the deadline, and
	// "past its deadline" would say it was not.
	if msg := status.Convert(err).Message(); strings.Contains(msg, "past its deadline") || !strings.Contains(msg, "past 72% of the 1") {
		t.Fatalf("after misses: %q, want it to name the share (72%%) of the time to the deadline, not the deadline", msg)
	}
	close(cn.gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
}

// TestAdmitShareNaN: a share that is not a number (the flag parses
// "NaN") is no share: the default, 1, as for one out of range. Kept, it
// made every request's budget a negative duration once a rate was
// measured, and admission refused every request, lone ones included.
func TestAdmitShareNaN(t *testing.T) {
	r := newRouter(t, Options{AdmitShare: math.NaN()}, &fakeCN{})
	if got := r.share.get(); got != 1 {
		t.Errorf("share %v from AdmitShare NaN, want 1", got)
	}
	r.preds.get("m").rate = 1000 // 10 samples: 10 ms
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Recommend(ctx, request(10)); err != nil {
		t.Fatalf("a lone request of 10 ms with 10 s to its deadline: %v", err)
	}
}
