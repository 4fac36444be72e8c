package capacity

import (
	"testing"
	"time"
)

// TestScaledPeak: the demand measured now, the calendar's factor now
// divided out, times the highest factor in the window.
func TestScaledPeak(t *testing.T) {
	h := time.Hour
	promo := []Promotion{{Start: 2 * h, Duration: h, Factor: 3}, {Start: 2*h + 30*time.Minute, Duration: 10 * time.Minute, Factor: 2}}
	for _, c := range []struct {
		name          string
		now, from, to time.Duration
		offered, want float64
	}{
		{"before, window short of it", h, h, h + 30*time.Minute, 100, 100},
		{"before, window reaching its start", h + 50*time.Minute, h + 50*time.Minute, 2*h + time.Minute, 100, 300},
		{"both on in the window", h + 50*time.Minute, h + 50*time.Minute, 2*h + 35*time.Minute, 100, 600},
		{"during: the measured demand holds the factor", 2*h + 10*time.Minute, 2*h + 10*time.Minute, 2*h + 20*time.Minute, 300, 300},
		{"during, the window past its end", 2*h + 50*time.Minute, 2*h + 50*time.Minute, 3*h + 10*time.Minute, 300, 300},
		{"after", 4 * h, 4 * h, 5 * h, 100, 100},
		{"window reversed", h, h, 0, 100, 0},
	} {
		s := &Scaled{Now: c.now, Offered: c.offered, Promotions: promo}
		if got := s.Peak(c.from, c.to); got != c.want {
			t.Errorf("%s: Peak = %v, want %v", c.name, got, c.want)
		}
	}
}
