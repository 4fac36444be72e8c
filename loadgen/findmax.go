package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
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
	Rate float64 `json:"rate_rps"`
	Pass bool    `json:"pass"`
	Why  string  `json:"why,omitempty"`
	// Bound names the model of a mix whose errors, p99 or throughput
	// failed the trial (the worst, when several did); "" for one model.
	Bound   string   `json:"bound_model,omitempty"`
	Summary *Summary `json:"summary"`
}

// FindMaxResult is the search's outcome: MaxRate is the highest rate that
// passed, 0 if none did.
type FindMaxResult struct {
	MaxRate float64 `json:"max_rate_rps"`
	Trials  []Trial `json:"trials"`
	// WarmUp is the unjudged run before the first trial, if any.
	WarmUp *Summary `json:"warm_up,omitempty"`
	// BoundBy is, for a mix of models, the model that failed the
	// lowest failing trial: the one that keeps the total rate from
	// going higher at the mix ("" when no trial failed, or a failure
	// was the totals' and no model's).
	BoundBy string `json:"bound_by,omitempty"`
}

// Judge says whether a trial at rate met the SLO, and if not why.
func (o FindMaxOptions) Judge(rate float64, s *Summary) (bool, string) {
	ok, why, _ := o.judge(rate, s)
	return ok, why
}

// judge is Judge and, for a mix of models, the model that failed the
// trial. A mixed trial passes only when every model passes on its own
// requests: a model of a small share whose requests all fail, or whose
// p99 is over the SLO, hides within the totals (its 1% of the requests
// all failing is within the totals' error budget, and its slow answers
// are below the totals' 99th percentile).
func (o FindMaxOptions) judge(rate float64, s *Summary) (bool, string, string) {
	if s.Sent > 0 && len(s.Models) > 0 {
		// Errors first, the worst share of them named: a model's
		// failures are why its p99 may be low (failed at once).
		worst, share := -1, 0.0
		for i, m := range s.Models {
			if m.Sent > 0 && float64(m.Errors) > o.MaxErrors*float64(m.Sent) && float64(m.Errors)/float64(m.Sent) > share {
				worst, share = i, float64(m.Errors)/float64(m.Sent)
			}
		}
		if worst >= 0 {
			m := s.Models[worst]
			return false, fmt.Sprintf("model %s: %d of %d requests failed", m.Model, m.Errors, m.Sent), m.Model
		}
		var over []string
		worst = -1
		for i, m := range s.Models {
			if m.P99 > float64(o.SLO)/1e6 {
				over = append(over, fmt.Sprintf("%s %.2fms", m.Model, m.P99))
				if worst < 0 || m.P99 > s.Models[worst].P99 {
					worst = i
				}
			}
		}
		if worst >= 0 {
			return false, fmt.Sprintf("p99 over the SLO %v: %s", o.SLO, strings.Join(over, ", ")), s.Models[worst].Model
		}
		for _, m := range s.Models {
			if m.Sent > 0 && m.RPS < o.MinAchieved*m.OfferedRPS {
				return false, fmt.Sprintf("model %s: answered %.1f req/s of %.1f offered", m.Model, m.RPS, m.OfferedRPS), m.Model
			}
		}
	}
	ok, why := o.judgeTotals(s)
	return ok, why, ""
}

// judgeTotals judges the run's totals.
func (o FindMaxOptions) judgeTotals(s *Summary) (bool, string) {
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
		ok, why, bound := o.judge(rate, s)
		res.Trials = append(res.Trials, Trial{Rate: rate, Pass: ok, Why: why, Bound: bound, Summary: s})
		if log != nil {
			verdict := "pass"
			if !ok {
				verdict = "fail: " + why
			}
			models := ""
			if len(s.Models) > 0 {
				parts := make([]string, len(s.Models))
				for i, m := range s.Models {
					parts[i] = fmt.Sprintf("%s %.2fms", m.Model, m.P99)
				}
				models = " (" + strings.Join(parts, ", ") + ")"
			}
			fmt.Fprintf(log, "find-max: %.1f req/s  p99 %.2fms%s  throughput %.1f req/s  %s\n", rate, s.P99, models, s.RPS, verdict)
		}
		if ok {
			pass = rate
		} else {
			fail = rate
			res.BoundBy = bound // the search only lowers fail: the last failure is the lowest
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
