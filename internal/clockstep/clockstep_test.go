package clockstep

import (
	"testing"
	"time"
)

func TestStep(t *testing.T) {
	now := time.Now()
	for _, d := range []time.Duration{0, time.Nanosecond, -time.Nanosecond, 10 * time.Second, -10 * time.Second, -90 * time.Minute, 3*time.Hour + 7} {
		s, ok := Step(now, d)
		if !ok {
			t.Fatalf("Step(now, %v): not made", d)
		}
		if s.Sub(now) != 0 || !s.Equal(now) {
			t.Errorf("Step(now, %v): %v after now by the monotonic clock, want 0", d, s.Sub(now))
		}
		if got := s.UnixNano() - now.UnixNano(); got != int64(d) {
			t.Errorf("Step(now, %v): wall clock moved by %v", d, time.Duration(got))
		}
		// Later readings go on from it on both clocks.
		if l := s.Add(time.Second); l.Sub(now) != time.Second || l.UnixNano()-now.UnixNano() != int64(d+time.Second) {
			t.Errorf("Step(now, %v).Add(1s): %v by the monotonic clock, %v by the wall's", d, l.Sub(now), time.Duration(l.UnixNano()-now.UnixNano()))
		}
	}
	if _, ok := Step(now.Round(0), time.Second); ok {
		t.Error("a time without a monotonic reading was stepped")
	}
}
