package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Profile is an offered rate over time, in requests per second, from the
// start of a run. Arrival processes draw send times from it; reports plot
// it as the offered rate.
type Profile interface {
	// Rate is the offered rate at t (t >= 0).
	Rate(t time.Duration) float64
	// MaxRate bounds Rate over the whole run; thinning draws against it.
	MaxRate() float64
}

// Constant is a flat profile.
type Constant float64

var _ Profile = Constant(0)

func (c Constant) Rate(time.Duration) float64 { return float64(c) }
func (c Constant) MaxRate() float64           { return float64(c) }

// Schedule draws the intended send times of an open-loop run from a
// profile and a seed: no wall clock, no goroutines, so a schedule is
// reproducible and testable on its own. The caller owns pacing.
type Schedule struct {
	p       Profile
	poisson bool
	r       *rand.Rand
	t       float64 // seconds since start of the last arrival
	max     float64
}

// NewSchedule returns the arrivals of p. With poisson the gaps are
// exponential (a non-homogeneous Poisson process, drawn by thinning);
// otherwise they are even, 1/Rate(t) apart.
func NewSchedule(p Profile, poisson bool, seed uint64) (*Schedule, error) {
	m := p.MaxRate()
	if !(m > 0) || math.IsInf(m, 0) {
		return nil, fmt.Errorf("schedule: the peak rate must be positive and finite, got %v", m)
	}
	return &Schedule{p: p, poisson: poisson, r: rand.New(rand.NewPCG(seed, 0xa771)), max: m, t: math.NaN()}, nil
}

// Next returns the intended send time of the next request, as an offset
// from the start of the run. Times never decrease.
func (s *Schedule) Next() time.Duration {
	if s.poisson {
		t := s.t
		if math.IsNaN(t) {
			t = 0
		}
		for {
			t += s.r.ExpFloat64() / s.max
			// A rate of zero over a long stretch would spin forever; thinning
			// against the peak still terminates because the peak is reached
			// somewhere, and the caller bounds the run by its duration.
			if s.r.Float64()*s.max <= s.p.Rate(secs(t)) || t > 1e7 {
				s.t = t
				return secs(t)
			}
		}
	}
	if math.IsNaN(s.t) {
		// The first even arrival is at 0; a profile starting at rate 0
		// moves forward in 10ms steps until it has traffic.
		s.t = 0
	} else {
		s.t += s.gap(s.t)
	}
	for s.p.Rate(secs(s.t)) <= 0 && s.t < 1e7 {
		s.t += 0.01
	}
	return secs(s.t)
}

// gap is the even spacing after t: 1/rate, with the rate taken at the
// middle of the gap so a ramp is followed without lag.
func (s *Schedule) gap(t float64) float64 {
	r := s.p.Rate(secs(t))
	if r <= 0 {
		return 0.01
	}
	mid := s.p.Rate(secs(t + 0.5/r))
	if mid > 0 {
		r = (r + mid) / 2
	}
	return 1 / r
}

func secs(t float64) time.Duration { return time.Duration(t * float64(time.Second)) }

// Promotion is a sales-promotion day compressed into a run: a diurnal
// baseline swinging between Peak/PeakToValley and Peak over one Day, and
// a promotion that ramps from the baseline to Spike x Peak at At, holds
// for Plateau and decays back over Decay. The defaults follow Prism's
// production traffic: a daily peak-to-valley ratio of 6.5 and promotions
// 1.3x above the normal peak.
type Promotion struct {
	// Peak is the normal daily peak, requests/s.
	Peak float64
	// PeakToValley is the daily peak over the daily valley (default 6.5).
	PeakToValley float64
	// Day is the length of one compressed day (default: the run's duration).
	Day time.Duration
	// Spike is the promotion's peak over the normal peak (default 1.3).
	Spike float64
	// At is when the ramp starts (default 0.45 Day, just before the
	// evening peak at Day/2); Ramp, Plateau and Decay default to 0.05,
	// 0.1 and 0.1 Day.
	At, Ramp, Plateau, Decay time.Duration
}

var _ Profile = (*Promotion)(nil)

// EnsureDefaults fills zero fields; day is used when Day is zero.
func (p *Promotion) EnsureDefaults(day time.Duration) {
	if p.PeakToValley == 0 {
		p.PeakToValley = 6.5
	}
	if p.Day == 0 {
		p.Day = day
	}
	if p.Spike == 0 {
		p.Spike = 1.3
	}
	frac := func(f float64) time.Duration { return time.Duration(f * float64(p.Day)) }
	if p.At == 0 {
		p.At = frac(0.45)
	}
	if p.Ramp == 0 {
		p.Ramp = frac(0.05)
	}
	if p.Plateau == 0 {
		p.Plateau = frac(0.1)
	}
	if p.Decay == 0 {
		p.Decay = frac(0.1)
	}
}

// Validate checks p after EnsureDefaults.
func (p *Promotion) Validate() error {
	switch {
	case !(p.Peak > 0):
		return fmt.Errorf("promotion: peak rate must be positive, got %v", p.Peak)
	case !(p.PeakToValley >= 1):
		return fmt.Errorf("promotion: peak-to-valley must be at least 1, got %v", p.PeakToValley)
	case !(p.Spike > 0):
		return fmt.Errorf("promotion: spike must be positive, got %v", p.Spike)
	case p.Day <= 0:
		return fmt.Errorf("promotion: day must be positive, got %v", p.Day)
	case p.At < 0 || p.Ramp < 0 || p.Plateau < 0 || p.Decay < 0:
		return fmt.Errorf("promotion: at, ramp, plateau and decay must not be negative")
	}
	return nil
}

// Diurnal is the baseline at t: the valley at the start of the day, the
// peak at its middle.
func (p *Promotion) Diurnal(t time.Duration) float64 {
	valley := p.Peak / p.PeakToValley
	phase := 2 * math.Pi * float64(t) / float64(p.Day)
	return valley + (p.Peak-valley)*(1-math.Cos(phase))/2
}

func (p *Promotion) Rate(t time.Duration) float64 {
	base := p.Diurnal(t)
	top := p.Spike * p.Peak
	rampEnd := p.At + p.Ramp
	plateauEnd := rampEnd + p.Plateau
	decayEnd := plateauEnd + p.Decay
	var r float64
	switch {
	case t < p.At || t >= decayEnd:
		return base
	case t < rampEnd:
		r = base + (top-base)*float64(t-p.At)/float64(p.Ramp)
	case t < plateauEnd:
		r = top
	default:
		r = top + (base-top)*float64(t-plateauEnd)/float64(p.Decay)
	}
	return math.Max(r, base)
}

func (p *Promotion) MaxRate() float64 { return math.Max(p.Peak, p.Spike*p.Peak) }
