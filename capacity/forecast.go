package capacity

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Forecaster says the highest demand, samples/s, expected in [from, to].
type Forecaster interface {
	Peak(from, to time.Duration) float64
}

// Promotion is a calendar entry: from Start for Duration the demand is
// Factor times the seasonal baseline.
type Promotion struct {
	Start, Duration time.Duration
	Factor          float64
}

// ParsePromotion reads START,DURATION,FACTOR, as "14h,2h,3": durations
// from the trace's start and a factor on the baseline.
func ParsePromotion(s string) (Promotion, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return Promotion{}, fmt.Errorf("promotion %q: want START,DURATION,FACTOR (as 14h,2h,3)", s)
	}
	var p Promotion
	var err error
	if p.Start, err = time.ParseDuration(strings.TrimSpace(parts[0])); err != nil {
		return Promotion{}, fmt.Errorf("promotion %q: start: %w", s, err)
	}
	if p.Duration, err = time.ParseDuration(strings.TrimSpace(parts[1])); err != nil {
		return Promotion{}, fmt.Errorf("promotion %q: duration: %w", s, err)
	}
	if p.Factor, err = strconv.ParseFloat(strings.TrimSpace(parts[2]), 64); err != nil {
		return Promotion{}, fmt.Errorf("promotion %q: factor: %w", s, err)
	}
	if err := p.Validate(); err != nil {
		return Promotion{}, fmt.Errorf("promotion %q: %w", s, err)
	}
	return p, nil
}

// Validate checks the entry.
func (p Promotion) Validate() error {
	switch {
	case p.Start < 0:
		return fmt.Errorf("start %v is negative", p.Start)
	case p.Duration <= 0:
		return fmt.Errorf("duration %v must be positive", p.Duration)
	case !(p.Factor > 0) || math.IsInf(p.Factor, 0):
		return fmt.Errorf("factor %v must be a positive number", p.Factor)
	}
	return nil
}

// Factor is the product of the factors of the promotions on at t.
func Factor(ps []Promotion, t time.Duration) float64 {
	f := 1.0
	for _, p := range ps {
		if t >= p.Start && t < p.Start+p.Duration {
			f *= p.Factor
		}
	}
	return f
}

// Scaled forecasts demand as the demand measured now scaled by the
// promotion calendar: the baseline is Offered over the factor at Now (a
// promotion under way is in what was measured), and the forecast at t is
// the baseline times the factor at t. A live run has no trace of past
// days to be seasonal with, but the people planning a promotion know
// its calendar: this borrows ahead of a promotion's start by the
// measured start-up time, and no sooner.
type Scaled struct {
	Now        time.Duration
	Offered    float64
	Promotions []Promotion
}

var _ Forecaster = (*Scaled)(nil)

// Peak is the baseline times the highest factor in [from, to]: at from,
// at to and at each promotion's start inside.
func (s *Scaled) Peak(from, to time.Duration) float64 {
	if to < from || !(s.Offered >= 0) {
		return 0
	}
	f := max(Factor(s.Promotions, from), Factor(s.Promotions, to))
	for _, p := range s.Promotions {
		if p.Start > from && p.Start <= to {
			f = max(f, Factor(s.Promotions, p.Start))
		}
	}
	return s.Offered / Factor(s.Promotions, s.Now) * f
}

// Seasonal forecasts demand as a seasonal baseline, the rates of a past
// period (Rates[i] over [i*Step, (i+1)*Step), repeating every Period),
// times the promotion calendar.
type Seasonal struct {
	Step  time.Duration
	Rates []float64
	// Period is the season's length; zero takes len(Rates) x Step.
	Period     time.Duration
	Promotions []Promotion
}

var _ Forecaster = (*Seasonal)(nil)

// Rate is the forecast at t.
func (s *Seasonal) Rate(t time.Duration) float64 {
	if len(s.Rates) == 0 || s.Step <= 0 {
		return 0
	}
	period := s.Period
	if period <= 0 {
		period = time.Duration(len(s.Rates)) * s.Step
	}
	tt := t % period
	if tt < 0 {
		tt += period
	}
	i := min(int(tt/s.Step), len(s.Rates)-1)
	return s.Rates[i] * Factor(s.Promotions, t)
}

// Peak is the highest forecast in [from, to], looked at every step and
// at each promotion's start inside the window.
func (s *Seasonal) Peak(from, to time.Duration) float64 {
	if s.Step <= 0 || to < from {
		return 0
	}
	m := s.Rate(from)
	for t := from - from%s.Step + s.Step; t <= to; t += s.Step {
		m = math.Max(m, s.Rate(t))
	}
	for _, p := range s.Promotions {
		if p.Start > from && p.Start <= to {
			m = math.Max(m, s.Rate(p.Start))
		}
	}
	return math.Max(m, s.Rate(to))
}
