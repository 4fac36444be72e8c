package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// FindMaxOptions configure the search for the highest rate that meets the
// SLO, as MLPerf's Server scenario searches its target QPS.
type FindMaxOptions struct {
	// Start is the first rate tried, requests/s.
	Start float64
	// SLO is the p99 bound; a trial also fails when more than MaxErrors
	// of its requests fail, or when it answers less than MinAchieved of
	// the offered rate (the server fell behind).
	SLO         time.Duration
	MaxErrors   float64 // default 0.01
	MinAchieved float64 // default 0.95
	// Tolerance ends the search when the bracket [pass, fail] is within
	// it, relative (default 0.05). MaxTrials bounds it (default 12).
	Tolerance float64
	MaxTrials int
}

// Trial is one rate tried by FindMax.
type Trial struct {
	Rate    float64  `json:"rate_rps"`
	Pass    bool     `json:"pass"`
	Why     string   `json:"why,omitempty"`
	Summary *Summary `json:"summary"`
}

// FindMaxResult is the search's outcome: MaxRate is the highest rate that
// passed, 0 if none did.
type FindMaxResult struct {
	MaxRate float64 `json:"max_rate_rps"`
	Trials  []Trial `json:"trials"`
	// WarmUp is the unjudged run before the first trial, if any.
	WarmUp *Summary `json:"warm_up,omitempty"`
}

// Judge says whether a trial at rate met the SLO, and if not why.
func (o FindMaxOptions) Judge(rate float64, s *Summary) (bool, string) {
	switch {
	case s.Sent == 0:
		return false, "nothing sent"
	case float64(s.Errors) > o.MaxErrors*float64(s.Sent):
		return false, fmt.Sprintf("%d of %d requests failed", s.Errors, s.Sent)
	case s.P99 > float64(o.SLO)/1e6:
		return false, fmt.Sprintf("p99 %.2fms over the SLO %v", s.P99, o.SLO)
	case s.RPS < o.MinAchieved*s.OfferedRPS:
		return false, fmt.Sprintf("answered %.1f req/s of %.1f offered", s.RPS, s.OfferedRPS)
	}
	return true, ""
}

// FindMax searches: it doubles the rate from Start until a trial fails,
// then bisects between the last pass and the first fail. trial runs one
// rate; its errors end the search. log, if set, gets a line per trial.
// Interrupted by ctx, it returns the trials that ran whole and ctx's
// error.
func FindMax(ctx context.Context, o FindMaxOptions, trial func(ctx context.Context, rate float64) (*Summary, error), log io.Writer) (*FindMaxResult, error) {
	if o.MaxErrors == 0 {
		o.MaxErrors = 0.01
	}
	if o.MinAchieved == 0 {
		o.MinAchieved = 0.95
	}
	if o.Tolerance == 0 {
		o.Tolerance = 0.05
	}
	if o.MaxTrials == 0 {
		o.MaxTrials = 12
	}
	if !(o.Start > 0) || o.SLO <= 0 {
		return nil, errors.New("find-max: needs a positive start rate and SLO")
	}
	res := &FindMaxResult{}
	pass, fail := 0.0, math.Inf(1)
	rate := o.Start
	for len(res.Trials) < o.MaxTrials && ctx.Err() == nil {
		s, err := trial(ctx, rate)
		if err != nil {
			return res, fmt.Errorf("find-max: trial at %.1f req/s: %w", rate, err)
		}
		if ctx.Err() != nil {
			// Interrupted: the trial covers a moment of its rate, not the
			// rate held, and is not judged (its few fast answers passed
			// a rate the server was never shown to hold).
			break
		}
		ok, why := o.Judge(rate, s)
		res.Trials = append(res.Trials, Trial{Rate: rate, Pass: ok, Why: why, Summary: s})
		if log != nil {
			verdict := "pass"
			if !ok {
				verdict = "fail: " + why
			}
			fmt.Fprintf(log, "find-max: %.1f req/s  p99 %.2fms  throughput %.1f req/s  %s\n", rate, s.P99, s.RPS, verdict)
		}
		if ok {
			pass = rate
		} else {
			fail = rate
		}
		switch {
		case math.IsInf(fail, 1):
			rate *= 2
		case pass == 0:
			rate /= 2
		default:
			if (fail-pass)/fail <= o.Tolerance {
				res.MaxRate = pass
				return res, nil
			}
			rate = (pass + fail) / 2
		}
		if rate < 1e-3 {
			break
		}
	}
	res.MaxRate = pass
	return res, ctx.Err()
}
