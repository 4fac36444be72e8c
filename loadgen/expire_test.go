package loadgen

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestBehindGeneratorEndsWithItsDeadlines: an open-loop run whose sender
// cannot keep up with its rate (here one request in flight, each
// answered in 90 ms, at 100 req/s) ends a request timeout after its
// window, not once every arrival of the window has been sent however
// late: those later than the timeout are recorded as the client would
// see them, DeadlineExceeded at their deadline, and never sent. Before,
// the run sent all 100 one after the other and ended 9 s into a 1 s
// window (--rate 1e6 --duration 2s ran on toward --max-requests).
func TestBehindGeneratorEndsWithItsDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := Options{Profile: Constant(100), Duration: time.Second, MaxRequests: 1e6, MaxInFlight: 1, Timeout: 100 * time.Millisecond, Seed: 1}
		var answered int
		s := dialFake(t, &Fake{Delay: func(*prismv1.RecommendRequest) time.Duration { answered++; return 90 * time.Millisecond }})
		start := time.Now()
		sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(10)), s)
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		expired := sum.ErrorsByCode["DeadlineExceeded"]
		t.Logf("ended at %v: sent %d ok %d expired %d answered %d", el, sum.Sent, sum.OK, expired, answered)
		if el > o.Duration+o.Timeout+90*time.Millisecond {
			t.Errorf("the run ended %v after its start, want by its window plus the request timeout and one answer (%v)", el, o.Duration+o.Timeout+90*time.Millisecond)
		}
		if sum.Sent != 100 || sum.OK+expired != 100 || expired == 0 || int64(answered) != sum.OK {
			t.Errorf("sent %d ok %d expired %d answered %d: want the window's 100 arrivals each answered or expired unsent", sum.Sent, sum.OK, expired, answered)
		}
		if msg := sum.FirstErrors["DeadlineExceeded"]; !strings.Contains(msg, "not sent: the generator was 100ms or more behind its schedule") {
			t.Errorf("first DeadlineExceeded %q, want it to say the arrival was not sent and why", msg)
		}
		if sum.P99 < 100 {
			t.Errorf("p99 %.1fms: the expired arrivals' deadlines do not show", sum.P99)
		}
	})
}
