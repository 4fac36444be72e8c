package capacity

import (
	"testing"
	"time"
)

// A local lender's worker serves tens of milliseconds after the decision
// (README: 63 ms); the histogram must tell that from a second's start,
// which its first bound (1 s) did not.
func TestStartupBucketsResolveLocalStarts(t *testing.T) {
	s := newStats()
	s.observeStartup(63 * time.Millisecond)
	s.observeStartup(900 * time.Millisecond)
	first := -1
	for i, n := range s.StartupHist {
		if n > 0 {
			first = i
			break
		}
	}
	if first < 0 || s.StartupHist[first] != 1 {
		t.Fatalf("a 63 ms and a 900 ms start share a bucket: %v over bounds %v", s.StartupHist, StartupBuckets)
	}
}
