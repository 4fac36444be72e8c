package router

import (
	"context"
	"fmt"
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

// TestFairShareAcrossModels: admission predicts each model from its own
// rate and samples in flight, so a model overloaded beside others
// filled the shared workers' queues to its whole budget, and the
// others' requests waited behind it. With another model active, one
// holding more than its share of the samples in flight fills only
// fairShare of its budget; a model under its share keeps all of it.
func TestFairShareAcrossModels(t *testing.T) {
	const deadline = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		// cold: a request of another model was admitted (and is in
		// flight, or was answered: active either way).
		cold, answered bool
		// want: the hot model's samples admitted before a refusal.
		want int64
	}{
		{name: "alone", want: 100},
		{name: "beside a model in flight", cold: true, want: 50},
		{name: "beside a model active, nothing of it in flight", cold: true, answered: true, want: 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t, Options{}, &fakeCN{})
			for _, m := range []string{"hot", "cold"} {
				r.preds.get(m).rate = 1000 // samples/s: 10 samples take 10 ms
			}
			var releases []func(error)
			defer func() {
				for _, rel := range releases {
					rel(nil)
				}
			}()
			if tc.cold {
				rel, err := r.admit("cold", 1, 1, 100, deadline)
				if err != nil {
					t.Fatal(err)
				}
				if tc.answered {
					rel(nil)
				} else {
					releases = append(releases, rel)
				}
			}
			var admitted int64
			for {
				rel, err := r.admit("hot", 10, 10, 100, deadline)
				if err != nil {
					if status.Code(err) != codes.ResourceExhausted {
						t.Fatal(err)
					}
					break
				}
				releases = append(releases, rel)
				admitted += 10
			}
			if admitted != tc.want {
				t.Errorf("hot model admitted %d samples, want %d", admitted, tc.want)
			}
			// The other model, under its share, still has its whole
			// budget: 45 samples, 46 ms of its work with its first
			// request's, are admitted beside the hot one's 50 (its
			// share would refuse it at 50 ms).
			if tc.cold && !tc.answered {
				rel, err := r.admit("cold", 45, 45, 100, deadline)
				if err != nil {
					t.Fatalf("a request of the model under its share beside the hot one: %v", err)
				}
				releases = append(releases, rel)
			}
			// Every refusal of the hot model beside another is by its
			// share, and says so.
			_, err := r.admit("hot", 10, 10, 100, deadline)
			if want := "more than its share"; tc.cold != strings.Contains(fmt.Sprint(err), want) {
				t.Errorf("hot refused with %v: mentions %q: %v, want %v", err, want, !tc.cold, tc.cold)
			}
		})
	}
}

// A request of a model over its share that fits its budget on its own
// work is not refused for the share: the share bounds what it queues.
func TestFairShareBoundsQueueingOnly(t *testing.T) {
	const deadline = 100 * time.Millisecond
	r := newRouter(t, Options{}, &fakeCN{})
	for _, m := range []string{"hot", "cold"} {
		r.preds.get(m).rate = 1000
	}
	var releases []func(error)
	defer func() {
		for _, rel := range releases {
			rel(nil)
		}
	}()
	for _, req := range []struct {
		model string
		n     int64
	}{{"cold", 1}, {"hot", 10}, {"hot", 80}} {
		rel, err := r.admit(req.model, req.n, req.n, 100, deadline)
		if err != nil {
			// 90 ms predicted, over half the 100 ms: a share of the whole
			// budget refused it; of what its 80 ms leave, 90 ms is allowed.
			t.Fatalf("%s request of %d samples: %v", req.model, req.n, err)
		}
		releases = append(releases, rel)
	}
	if _, err := r.admit("hot", 10, 10, 100, deadline); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a hot request queued 90 ms behind its own model: %v, want ResourceExhausted", err)
	}
}

// Under --admit-limit, a model within its share of the limit is
// admitted over it while another model fills it.
func TestFairShareUnderAdmitLimit(t *testing.T) {
	const deadline = time.Second
	r := newRouter(t, Options{AdmitLimit: true}, &fakeCN{})
	r.lim.limit = 100
	var releases []func(error)
	defer func() {
		for _, rel := range releases {
			rel(nil)
		}
	}()
	admit := func(model string, n int64) error {
		rel, err := r.admit(model, n, n, 100, deadline)
		if err == nil {
			releases = append(releases, rel)
		}
		return err
	}
	if err := admit("cold", 1); err != nil {
		t.Fatal(err)
	}
	hot := int64(0)
	for admit("hot", 10) == nil {
		hot += 10
	}
	if hot != 90 {
		t.Fatalf("hot admitted %d samples under a limit of 100 with 1 of cold's in flight, want 90", hot)
	}
	if err := admit("cold", 20); err != nil {
		t.Fatalf("cold, 21 samples with this request's, within its share (50) of the limit: %v", err)
	}
	if err := admit("cold", 40); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("cold past its share of the limit, over it: %v, want ResourceExhausted", err)
	}
	if err := admit("hot", 10); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("hot over its share and the limit: %v, want ResourceExhausted", err)
	}
}

// TestFairShareCountsSamples: a model's share is of the samples in
// flight, counted as the router counts them (a request's candidates):
// a model fixed at a batch (fixedbatch.go) runs its micro-batches
// padded, its work more than its samples, and comparing that work with
// the router's samples took it for over its share beside a model
// holding several times its samples, so its budget was halved.
func TestFairShareCountsSamples(t *testing.T) {
	const deadline = 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		other bool // the other model holds 40 samples in flight
	}{{name: "alone"}, {name: "beside a model holding more", other: true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t, Options{}, &fakeCN{})
			for _, m := range []string{"fixed", "other"} {
				r.preds.get(m).rate = 1000 // work units a second: 16 take 16 ms
			}
			var releases []func(error)
			defer func() {
				for _, rel := range releases {
					rel(nil)
				}
			}()
			if tc.other {
				rel, err := r.admit("other", 40, 40, 100, deadline)
				if err != nil {
					t.Fatal(err)
				}
				releases = append(releases, rel)
			}
			// 2 candidates, one micro-batch of 16 (the batch) each: up to
			// 6 (96 ms of work) fit the 100 ms; 12 samples at most, under
			// half of the 52 in flight beside the other model's.
			var admitted int
			for {
				rel, err := r.admit("fixed", 2, 16, 100, deadline)
				if err != nil {
					if status.Code(err) != codes.ResourceExhausted {
						t.Fatal(err)
					}
					if tc.other && strings.Contains(err.Error(), "more than its share") {
						t.Errorf("refused for its share holding %d of %d samples: %v", 2*admitted, 40+2*admitted+2, err)
					}
					break
				}
				releases = append(releases, rel)
				admitted++
			}
			if admitted != 6 {
				t.Errorf("the fixed-batch model had %d requests admitted, want 6", admitted)
			}
		})
	}
}

// TestFairShareAfterClockStep: a model's last admission is a wall-clock
// time (Unix nanoseconds): after the clock is stepped back (NTP), a
// model admitted before the step is stamped in the future, and was
// counted active until the clock caught up (an hour for an hour's step):
// the one model still served was held to half of its budget, alone.
func TestFairShareAfterClockStep(t *testing.T) {
	const deadline = 100 * time.Millisecond
	r := newRouter(t, Options{}, &fakeCN{})
	r.preds.get("hot").rate = 1000
	// Its last request admitted an hour ahead of the clock as it reads
	// now: the clock was stepped back an hour since.
	r.preds.get("gone").admitted.Store(time.Now().Add(time.Hour).UnixNano())
	var releases []func(error)
	defer func() {
		for _, rel := range releases {
			rel(nil)
		}
	}()
	var admitted int64
	for {
		rel, err := r.admit("hot", 10, 10, 100, deadline)
		if err != nil {
			if strings.Contains(err.Error(), "more than its share") {
				t.Errorf("the only model served refused for its share: %v", err)
			}
			break
		}
		releases = append(releases, rel)
		admitted += 10
	}
	if admitted != 100 {
		t.Errorf("hot model admitted %d samples, want 100 (alone)", admitted)
	}
}

// Under --admit-limit too, a fixed-batch model's share of the limit is
// of its samples (the limit's unit), not its padded work.
func TestFairShareUnderAdmitLimitCountsSamples(t *testing.T) {
	r, admit := admitLimitRig(t)
	if err := admit("fixed", 2, 16); err != nil {
		t.Fatal(err)
	}
	for admit("hot", 10, 10) == nil {
	}
	// 2 candidates a request, one batch of 16 each: its share (50 of
	// the limit's 100 samples) is 25 requests.
	fixed := 1
	for admit("fixed", 2, 16) == nil {
		fixed++
	}
	if fixed != 25 {
		t.Fatalf("the fixed-batch model had %d requests admitted, want 25 (50 samples, its share of the limit %.0f)", fixed, r.lim.limitNow())
	}
}

// TestFairShareUnderAdmitLimitLateModel: a model whose first request
// comes while another fills the limit is given its share too: only
// models with a request admitted counted as active, so one whose every
// request was refused never counted, and was refused for as long as
// the other kept the limit full.
func TestFairShareUnderAdmitLimitLateModel(t *testing.T) {
	_, admit := admitLimitRig(t)
	for admit("hot", 10, 10) == nil {
	}
	late := 0
	for admit("late", 10, 10) == nil {
		late++
	}
	if late != 5 {
		t.Fatalf("the model arriving at a full limit had %d requests admitted, want 5 (50 samples, its share)", late)
	}
}

// admitLimitRig is a router under --admit-limit at a limit of 100
// samples, and admit, which keeps what it admits in flight until the
// test ends.
func admitLimitRig(t *testing.T) (*Router, func(model string, n, work int64) error) {
	r := newRouter(t, Options{AdmitLimit: true}, &fakeCN{})
	r.lim.limit = 100
	var releases []func(error)
	t.Cleanup(func() {
		for _, rel := range releases {
			rel(nil)
		}
	})
	return r, func(model string, n, work int64) error {
		rel, err := r.admit(model, n, work, 100, time.Second)
		if err == nil {
			releases = append(releases, rel)
		}
		return err
	}
}
