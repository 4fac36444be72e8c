package loadgen

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/prism-serve/prism/api/prismv1"
)

// traceSeer records the traceparent of every request it is sent and
// answers after a delay that grows with each request.
type traceSeer struct {
	mu      sync.Mutex
	parents []string
	delay   map[string]time.Duration // trace id: its delay
}

func (s *traceSeer) Send(ctx context.Context, _ *prismv1.RecommendRequest) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	tp := strings.Join(md.Get("traceparent"), ",")
	s.mu.Lock()
	d := time.Duration(len(s.parents)%7) * time.Millisecond
	s.parents = append(s.parents, tp)
	if len(tp) > 35 {
		s.delay[tp[3:35]] = d
	}
	s.mu.Unlock()
	time.Sleep(d)
	return nil
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$`)

// TestTraceRatio: with a trace ratio every request carries a valid W3C
// traceparent with a trace id of its own, sampled for about that share;
// the summary counts the sampled ones and names the slowest, slowest
// first, each with its latency. Without one, no request carries any.
func TestTraceRatio(t *testing.T) {
	s := &traceSeer{delay: map[string]time.Duration{}}
	o := Options{Clients: 8, Duration: 10 * time.Second, MaxRequests: 400, TraceRatio: 0.25, Seed: 3}
	sum, err := Run(context.Background(), o, tinyRequests(t, Fixed(4)), s)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	sampled := 0
	for _, tp := range s.parents {
		m := traceparentRE.FindStringSubmatch(tp)
		if m == nil {
			t.Fatalf("traceparent %q is not W3C's version 00 form", tp)
		}
		if ids[m[1]] {
			t.Fatalf("trace id %s sent twice", m[1])
		}
		ids[m[1]] = true
		if m[3] == "01" {
			sampled++
		}
	}
	if len(s.parents) != 400 || sampled < 60 || sampled > 140 {
		t.Fatalf("%d requests, %d sampled: want 400, about a quarter", len(s.parents), sampled)
	}
	tr := sum.Traced
	if tr == nil || tr.Sampled != int64(sampled) || tr.Ratio != 0.25 {
		t.Fatalf("summary's traced: %+v, want %d sampled at 0.25", tr, sampled)
	}
	if len(tr.Slowest) != TracedSlowest || !slices.IsSortedFunc(tr.Slowest, func(a, b TracedRequest) int {
		return int(1000 * (b.LatencyMs - a.LatencyMs))
	}) {
		t.Fatalf("slowest: %+v, want %d, slowest first", tr.Slowest, TracedSlowest)
	}
	for _, r := range tr.Slowest {
		d, ok := s.delay[r.TraceID]
		if !ok || r.Code != "OK" || r.LatencyMs < float64(d)/1e6 {
			t.Errorf("slowest %+v: sent with delay %v (%v)", r, d, ok)
		}
		// Only sampled requests are named: the server traced them.
		for _, tp := range s.parents {
			if strings.Contains(tp, r.TraceID) && !strings.HasSuffix(tp, "-01") {
				t.Errorf("%s was not sampled (%s)", r.TraceID, tp)
			}
		}
	}
	var b strings.Builder
	sum.WriteText(&b)
	if !strings.Contains(b.String(), "traced      ") || !strings.Contains(b.String(), tr.Slowest[0].TraceID) {
		t.Errorf("the text report does not name the slowest trace:\n%s", b.String())
	}

	s = &traceSeer{delay: map[string]time.Duration{}}
	o.TraceRatio = 0
	sum, err = Run(context.Background(), o, tinyRequests(t, Fixed(4)), s)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Traced != nil || strings.Join(s.parents, "") != "" {
		t.Errorf("without a trace ratio: traced %+v, a traceparent sent %q", sum.Traced, strings.Join(s.parents, "")[:min(80, len(strings.Join(s.parents, "")))])
	}
}
